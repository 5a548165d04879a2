//! The elector's rules as one pure function (S1, P2, P4, S8, S11): what to do with the
//! Lease as last read, judged on this replica's own monotonic clock. The operator's async
//! elector only carries the decision out. `std`'s `Instant`, not tokio's: core has no
//! runtime; the elector converts (`tokio::time::Instant::into_std`), paused test clocks
//! included.

use std::time::Duration;
use std::time::Instant;

/// S11: the safety rules this build knows, as one number. Bump it in the change that adds
/// or tightens a rule that keeps a snapshot safe: a build that knows the new rule then
/// stamps it on the Lease, and every older build that reads the stamp stops leading. 3:
/// the third safety round (W2's fresh VMID, pods holding a tag, S4's cut relist, S10-S12).
pub const SAFETY_EPOCH: u64 = 3;

/// S11: the Lease annotation that records the highest [`SAFETY_EPOCH`] that has led.
pub const SAFETY_EPOCH_ANNOTATION: &str = "cocoonset.cocoonstack.io/safety-epoch";

/// The epoch a Lease records, from its annotation: `None` when absent (only builds from
/// before S11 led). An unreadable value is taken as newer than any build: a stamp this
/// build cannot read is no proof that it knows every rule the writer knew.
pub fn recorded_epoch(annotation: Option<&str>) -> Option<u64> {
    annotation.map(|a| a.trim().parse().unwrap_or(u64::MAX))
}

/// S11: the epoch a leader writes: its own, never below what the Lease records.
pub fn epoch_to_record(recorded: Option<u64>, ours: u64) -> u64 {
    recorded.map_or(ours, |r| r.max(ours))
}

/// Who is deciding: this replica's Lease identity and the safety epoch it runs with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replica<'a> {
    pub identity: &'a str,
    pub safety_epoch: u64,
}

/// The election's timing, all derived from the lease duration (client-go's leaseDuration,
/// renewDeadline and retryPeriod).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long a holder's record stays valid for the others (leaseDurationSeconds).
    pub lease_duration: Duration,
    /// `max(duration / 5, 1 s)`: the fence closes this long before the earliest instant
    /// another replica could take the lease. It absorbs clock-rate drift between replicas
    /// and the tail of a tag delete already on the wire when the fence closes.
    pub margin: Duration,
    /// `min(duration / 5, 2 s)`: the leader renews, and followers poll the Lease, this
    /// often; a released lease is taken within about one period.
    pub retry_period: Duration,
    /// Bound of one Lease request: `min(--apiserver-timeout, fence span / 2)`, so a hung
    /// request leaves time for another try before the fence closes.
    pub request_timeout: Duration,
}

impl Timing {
    /// `lease_duration` is rounded down to whole seconds (what the Lease can carry), and
    /// to at least 2 s (what `--lease-duration` accepts).
    pub fn new(lease_duration: Duration, apiserver_timeout: Duration) -> Self {
        let lease_duration = Duration::from_secs(lease_duration.as_secs().max(2));
        let fifth = lease_duration / 5;
        let margin = fifth.max(Duration::from_secs(1));
        let retry_period = fifth.min(Duration::from_secs(2));
        let span = lease_duration.saturating_sub(margin);
        let request_timeout = apiserver_timeout
            .min(span / 2)
            .max(Duration::from_millis(100));
        Self {
            lease_duration,
            margin,
            retry_period,
            request_timeout,
        }
    }

    /// How long one successful renewal keeps the fence open, counted from the instant
    /// the renewal request was sent.
    pub fn fence_span(&self) -> Duration {
        self.lease_duration.saturating_sub(self.margin)
    }

    pub fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }
}

/// One version of the Lease record, as this replica saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    /// `holderIdentity`; `None` or empty means free (never held, or released).
    pub holder: Option<String>,
    /// The record's `leaseDurationSeconds`, as its holder wrote it.
    pub lease_duration: Duration,
    /// S11: the safety epoch the Lease records ([`recorded_epoch`]).
    pub epoch: Option<u64>,
    /// When this replica first received this version (same resourceVersion). Expiry is
    /// counted from here on our own clock, never from the record's `renewTime`, so clock
    /// skew between replicas cannot shorten a lease. Receipt is after the holder sent the
    /// write, so `seen_at + duration` is after the holder's fence has closed.
    pub seen_at: Instant,
}

impl Observed {
    fn holder(&self) -> Option<&str> {
        self.holder.as_deref().filter(|h| !h.is_empty())
    }
}

/// Whether this replica's view of the cluster is fit to lead on (S8), from the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Readiness {
    /// Synced, not relisting, making progress.
    Ready,
    /// Not synced yet, or relisting: a leader keeps leading, nobody begins.
    Syncing,
    /// An informer made no progress for the stall limit: must not lead at all.
    Stalled,
}

/// Why a leader stops leading.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepDownReason {
    /// S1: our last successful renewal is older than the fence span.
    RenewalTooOld,
    /// S8: the Lease names another holder; whatever our fence says, two must not lead.
    OtherHolder,
    /// S8: our informer cache is frozen.
    Stalled,
    /// S11: the Lease records a newer safety epoch than ours: a build that knows a rule
    /// we do not has led.
    NewerSafetyEpoch,
}

/// What the elector does next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    /// No Lease object yet: create it, holding it.
    Create,
    /// Free, released or expired: take it (guarded by the read's resourceVersion).
    Acquire,
    /// Ours: renew it (guarded by the read's resourceVersion).
    Renew,
    /// Held by another replica and not yet expired.
    Wait,
    /// Stop leading now: close the fence (and, next round, give the Lease up if it is
    /// still ours and we may not lead).
    StepDown(StepDownReason),
    /// Holding it but must not lead (shutting down, or a stalled cache): clear the holder
    /// so a follower takes it at once.
    Release,
    /// Shutting down without holding it: nothing to write.
    Exit,
    /// S11: a build with a newer safety epoch has led; never take the Lease (not even a
    /// free or expired one).
    Outranked,
}

/// The rules. `lease` is `None` when no Lease object exists; `last_renewal` is when the
/// request of our last successful renewal was sent, while we lead; `readiness` is the
/// cache's (S8).
pub fn decide(
    lease: Option<&Observed>,
    me: Replica<'_>,
    now: Instant,
    last_renewal: Option<Instant>,
    stopping: bool,
    readiness: Readiness,
    timing: &Timing,
) -> Decision {
    let identity = me.identity;
    let ours = lease.and_then(Observed::holder) == Some(identity);
    if stopping {
        return if ours {
            Decision::Release
        } else {
            Decision::Exit
        };
    }
    let leading = last_renewal.is_some();
    // S1: our own clock decides, before anything the Lease says.
    if let Some(sent) = last_renewal
        && now >= sent + timing.fence_span()
    {
        return Decision::StepDown(StepDownReason::RenewalTooOld);
    }
    // S8: another holder on the record means someone else believes it leads (a write we
    // did not see, a clock that ran fast): stop at once, open fence or not.
    if leading
        && lease
            .and_then(Observed::holder)
            .is_some_and(|h| h != identity)
    {
        return Decision::StepDown(StepDownReason::OtherHolder);
    }
    // S11: a newer build has led: it may rely on a rule we do not keep. Stop, hand the
    // Lease back if we hold it, and never take it again.
    if lease.and_then(|l| l.epoch).unwrap_or(0) > me.safety_epoch {
        return if leading {
            Decision::StepDown(StepDownReason::NewerSafetyEpoch)
        } else if ours {
            Decision::Release
        } else {
            Decision::Outranked
        };
    }
    match readiness {
        // S8: a frozen view must not lead, and must not keep the Lease from others.
        Readiness::Stalled if leading => return Decision::StepDown(StepDownReason::Stalled),
        Readiness::Stalled if ours => return Decision::Release,
        // S8: never begin leading on an unsynced or relisting cache.
        Readiness::Stalled | Readiness::Syncing if !leading => return Decision::Wait,
        _ => {}
    }
    let Some(lease) = lease else {
        return Decision::Create;
    };
    if ours {
        return Decision::Renew;
    }
    match lease.holder() {
        None => Decision::Acquire,
        Some(_) if now >= lease.seen_at + lease.lease_duration => Decision::Acquire,
        Some(_) => Decision::Wait,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const ME: &str = "replica-a";
    const OTHER: &str = "replica-b";

    fn timing() -> Timing {
        Timing::new(Duration::from_secs(10), Duration::from_secs(15))
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    /// The decision table. Times are seconds after an origin `t0`; the lease duration is
    /// 10 s, so the margin is 2 s, the fence span 8 s and the retry period 2 s.
    #[rstest]
    // S1 P2: acquiring.
    #[case::p2_no_lease_object_creates_it(None, 0.0, None, false, Decision::Create)]
    #[case::p2_free_lease_is_acquired(Some((None, 10, 0.0)), 0.5, None, false, Decision::Acquire)]
    #[case::p2_empty_holder_is_free(Some((Some(""), 10, 0.0)), 0.5, None, false, Decision::Acquire)]
    // S1 P2: renewing our own, including after a restart or a step-down.
    #[case::s1_own_lease_is_renewed(Some((Some(ME), 10, 0.0)), 2.0, Some(0.0), false, Decision::Renew)]
    #[case::s1_own_lease_reacquired_after_step_down(Some((Some(ME), 10, 0.0)), 9.0, None, false, Decision::Renew)]
    // P2: another holder's lease is waited on, counted from when we saw it.
    #[case::p2_held_lease_is_waited_on(Some((Some(OTHER), 10, 0.0)), 9.9, None, false, Decision::Wait)]
    #[case::p2_expired_lease_is_taken(Some((Some(OTHER), 10, 0.0)), 10.0, None, false, Decision::Acquire)]
    #[case::p2_expiry_uses_the_records_duration(Some((Some(OTHER), 3, 0.0)), 3.0, None, false, Decision::Acquire)]
    #[case::p2_expiry_counts_from_our_sighting(Some((Some(OTHER), 10, 5.0)), 14.0, None, false, Decision::Wait)]
    // S1: a renewal older than the fence span steps down on our own clock, even while the
    // Lease read (possibly stale, or unread) still names us.
    #[case::s1_step_down_when_renewal_too_old(Some((Some(ME), 10, 0.0)), 8.0, Some(0.0), false, STALE)]
    #[case::s1_still_leading_just_before_the_fence(Some((Some(ME), 10, 0.0)), 7.99, Some(0.0), false, Decision::Renew)]
    #[case::s1_step_down_when_lease_gone(None, 8.5, Some(0.0), false, STALE)]
    #[case::s1_step_down_when_other_holder_seen(Some((Some(OTHER), 10, 8.0)), 8.0, Some(0.0), false, STALE)]
    // P4: shutdown releases only a lease we hold.
    #[case::p4_release_own_lease_on_shutdown(Some((Some(ME), 10, 0.0)), 1.0, Some(0.0), true, Decision::Release)]
    #[case::p4_release_even_after_fence_closed(Some((Some(ME), 10, 0.0)), 20.0, Some(0.0), true, Decision::Release)]
    #[case::p4_follower_exits_without_writing(Some((Some(OTHER), 10, 0.0)), 1.0, None, true, Decision::Exit)]
    #[case::p4_no_lease_exits(None, 1.0, None, true, Decision::Exit)]
    fn elector_decision_table(
        #[case] lease: Option<(Option<&str>, u64, f64)>,
        #[case] now: f64,
        #[case] last_renewal: Option<f64>,
        #[case] stopping: bool,
        #[case] want: Decision,
    ) {
        table(lease, now, last_renewal, stopping, Readiness::Ready, want);
    }

    fn table(
        lease: Option<(Option<&str>, u64, f64)>,
        now: f64,
        last_renewal: Option<f64>,
        stopping: bool,
        readiness: Readiness,
        want: Decision,
    ) {
        let t0 = Instant::now();
        let observed = lease.map(|(holder, duration, seen)| Observed {
            holder: holder.map(str::to_owned),
            lease_duration: Duration::from_secs(duration),
            epoch: Some(SAFETY_EPOCH),
            seen_at: t0 + secs(seen),
        });
        let got = decide(
            observed.as_ref(),
            Replica {
                identity: ME,
                safety_epoch: SAFETY_EPOCH,
            },
            t0 + secs(now),
            last_renewal.map(|s| t0 + secs(s)),
            stopping,
            readiness,
            &timing(),
        );
        assert_eq!(got, want);
    }

    const STALE: Decision = Decision::StepDown(StepDownReason::RenewalTooOld);
    const OTHER_HOLDER: Decision = Decision::StepDown(StepDownReason::OtherHolder);
    const STALLED: Decision = Decision::StepDown(StepDownReason::Stalled);

    /// The S8 decisions: (lease, now, last renewal, readiness) with the same timing; a
    /// last renewal at 0 s means leading with the fence open until 8 s.
    #[rstest]
    // Another holder ends our term at once, with 5 s of fence left.
    #[case::s8_other_holder_while_the_fence_is_open(Some((Some(OTHER), 10, 3.0)), 3.0, Some(0.0), Readiness::Ready, OTHER_HOLDER)]
    #[case::s8_other_holder_just_after_our_renewal(Some((Some(OTHER), 10, 0.1)), 0.1, Some(0.0), Readiness::Ready, OTHER_HOLDER)]
    #[case::s8_a_released_record_is_not_another_holder(Some((Some(""), 10, 3.0)), 3.0, Some(0.0), Readiness::Ready, Decision::Acquire)]
    #[case::s8_a_follower_still_waits_on_the_holder(Some((Some(OTHER), 10, 3.0)), 3.0, None, Readiness::Ready, Decision::Wait)]
    // A stalled cache ends the term, gives the Lease up, and never takes it.
    #[case::s8_stalled_leader_steps_down(Some((Some(ME), 10, 0.0)), 2.0, Some(0.0), Readiness::Stalled, STALLED)]
    #[case::s8_stalled_after_step_down_releases_its_lease(Some((Some(ME), 10, 0.0)), 2.0, None, Readiness::Stalled, Decision::Release)]
    #[case::s8_stalled_does_not_take_a_free_lease(Some((None, 10, 0.0)), 2.0, None, Readiness::Stalled, Decision::Wait)]
    #[case::s8_stalled_does_not_take_an_expired_lease(Some((Some(OTHER), 10, 0.0)), 20.0, None, Readiness::Stalled, Decision::Wait)]
    #[case::s8_stalled_does_not_create_the_lease(
        None,
        2.0,
        None,
        Readiness::Stalled,
        Decision::Wait
    )]
    #[case::s8_fence_rule_still_comes_first(Some((Some(ME), 10, 0.0)), 9.0, Some(0.0), Readiness::Stalled, STALE)]
    // Syncing (first list or a relist): never begin, but a leader keeps renewing.
    #[case::s8_syncing_does_not_take_a_free_lease(Some((None, 10, 0.0)), 2.0, None, Readiness::Syncing, Decision::Wait)]
    #[case::s8_syncing_does_not_create_the_lease(
        None,
        2.0,
        None,
        Readiness::Syncing,
        Decision::Wait
    )]
    #[case::s8_syncing_does_not_renew_a_term_it_lost(Some((Some(ME), 10, 0.0)), 9.0, None, Readiness::Syncing, Decision::Wait)]
    #[case::s8_a_leader_keeps_leading_through_a_relist(Some((Some(ME), 10, 0.0)), 2.0, Some(0.0), Readiness::Syncing, Decision::Renew)]
    #[case::s8_ready_again_takes_the_lease(Some((None, 10, 0.0)), 2.0, None, Readiness::Ready, Decision::Acquire)]
    fn s8_elector_decision_table(
        #[case] lease: Option<(Option<&str>, u64, f64)>,
        #[case] now: f64,
        #[case] last_renewal: Option<f64>,
        #[case] readiness: Readiness,
        #[case] want: Decision,
    ) {
        table(lease, now, last_renewal, false, readiness, want);
    }

    const NEWER: Decision = Decision::StepDown(StepDownReason::NewerSafetyEpoch);

    /// S11: the safety epoch on the Lease against ours (3 here). The record was seen at
    /// 0 s with a duration of 10 s; a last renewal at 0 s means leading until 8 s.
    #[rstest]
    // A newer build has led: an older one never takes the Lease, free, expired or absent holder.
    #[case::s11_older_build_does_not_take_a_free_lease(
        Some(4),
        None,
        2.0,
        None,
        false,
        Decision::Outranked
    )]
    #[case::s11_older_build_does_not_take_an_expired_lease(
        Some(4),
        Some(OTHER),
        20.0,
        None,
        false,
        Decision::Outranked
    )]
    #[case::s11_older_build_waits_on_a_held_lease_for_good(
        Some(4),
        Some(OTHER),
        2.0,
        None,
        false,
        Decision::Outranked
    )]
    #[case::s11_far_newer_epoch_outranks_too(
        Some(1_000),
        Some(""),
        2.0,
        None,
        false,
        Decision::Outranked
    )]
    #[case::s11_unreadable_stamp_counts_as_newer(
        Some(u64::MAX),
        None,
        2.0,
        None,
        false,
        Decision::Outranked
    )]
    // While leading (a newer build stamped the record meanwhile): stop at once.
    #[case::s11_leader_steps_down_on_a_newer_stamp(Some(4), Some(ME), 2.0, Some(0.0), false, NEWER)]
    // Holding it without leading: hand it over now rather than at expiry.
    #[case::s11_holder_not_leading_releases(Some(4), Some(ME), 9.0, None, false, Decision::Release)]
    // Shutdown still releases our own, and a follower exits without writing.
    #[case::s11_shutdown_still_releases(Some(4), Some(ME), 2.0, Some(0.0), true, Decision::Release)]
    #[case::s11_shutdown_follower_exits(Some(4), None, 2.0, None, true, Decision::Exit)]
    // The S1 fence rule still comes first.
    #[case::s11_fence_rule_first(Some(4), Some(ME), 8.5, Some(0.0), false, STALE)]
    // The same, an older or no epoch on record: lead as before.
    #[case::s11_same_epoch_acquires(Some(3), None, 2.0, None, false, Decision::Acquire)]
    #[case::s11_older_stamp_acquires(Some(2), None, 2.0, None, false, Decision::Acquire)]
    #[case::s11_no_stamp_acquires(None, None, 2.0, None, false, Decision::Acquire)]
    #[case::s11_older_stamp_renews(Some(1), Some(ME), 2.0, Some(0.0), false, Decision::Renew)]
    #[case::s11_older_stamp_expired_is_taken(
        Some(2),
        Some(OTHER),
        10.0,
        None,
        false,
        Decision::Acquire
    )]
    fn s11_safety_epoch_decision_table(
        #[case] epoch: Option<u64>,
        #[case] holder: Option<&str>,
        #[case] now: f64,
        #[case] last_renewal: Option<f64>,
        #[case] stopping: bool,
        #[case] want: Decision,
    ) {
        let t0 = Instant::now();
        let observed = Observed {
            holder: holder.map(str::to_owned),
            lease_duration: Duration::from_secs(10),
            epoch,
            seen_at: t0,
        };
        let me = Replica {
            identity: ME,
            safety_epoch: 3,
        };
        let got = decide(
            Some(&observed),
            me,
            t0 + secs(now),
            last_renewal.map(|s| t0 + secs(s)),
            stopping,
            Readiness::Ready,
            &timing(),
        );
        assert_eq!(got, want);
    }

    /// S11: no Lease yet: an older build may create it (nothing newer has led).
    #[test]
    fn s11_no_lease_is_created_whatever_the_epoch() {
        let me = Replica {
            identity: ME,
            safety_epoch: 1,
        };
        let t = timing();
        let got = decide(None, me, Instant::now(), None, false, Readiness::Ready, &t);
        assert_eq!(got, Decision::Create);
    }

    /// S11: the stamp as read, and as written: never lowered.
    #[rstest]
    #[case::s11_absent_is_none(None, None)]
    #[case::s11_a_number(Some("3"), Some(3))]
    #[case::s11_spaces_trimmed(Some(" 7 "), Some(7))]
    #[case::s11_junk_is_newer_than_any(Some("three"), Some(u64::MAX))]
    #[case::s11_negative_is_junk(Some("-1"), Some(u64::MAX))]
    #[case::s11_empty_is_junk(Some(""), Some(u64::MAX))]
    fn s11_recorded_epoch_table(#[case] annotation: Option<&str>, #[case] want: Option<u64>) {
        assert_eq!(recorded_epoch(annotation), want);
    }

    #[rstest]
    #[case::s11_first_stamp_is_ours(None, 3, 3)]
    #[case::s11_raises_an_older_stamp(Some(2), 3, 3)]
    #[case::s11_keeps_the_same(Some(3), 3, 3)]
    #[case::s11_never_lowers(Some(5), 3, 5)]
    fn s11_epoch_to_record_never_lowers(
        #[case] recorded: Option<u64>,
        #[case] ours: u64,
        #[case] want: u64,
    ) {
        assert_eq!(epoch_to_record(recorded, ours), want);
    }

    /// S1 P4: the documented timing: margin max(d/5, 1 s), retry min(d/5, 2 s), and a
    /// fence that always closes before another replica could take the lease.
    #[rstest]
    #[case(2, 1_000, 400)]
    #[case(4, 1_000, 800)]
    #[case(6, 1_200, 1_200)]
    #[case(15, 3_000, 2_000)]
    #[case(60, 12_000, 2_000)]
    fn s1_p4_timing_from_the_lease_duration(
        #[case] duration: u64,
        #[case] margin_ms: u64,
        #[case] retry_ms: u64,
    ) {
        let t = Timing::new(Duration::from_secs(duration), Duration::from_secs(15));
        assert_eq!(t.margin, Duration::from_millis(margin_ms));
        assert_eq!(t.retry_period, Duration::from_millis(retry_ms));
        assert!(t.fence_span() < t.lease_duration);
        assert!(t.retry_period < t.fence_span());
        assert!(t.request_timeout <= t.fence_span() / 2);
    }

    #[test]
    fn timing_rounds_to_whole_seconds_of_at_least_two() {
        let t = Timing::new(Duration::from_millis(4_700), Duration::from_secs(15));
        assert_eq!(t.lease_duration, Duration::from_secs(4));
        assert_eq!(t.lease_duration_seconds(), 4);
        let t = Timing::new(Duration::from_millis(500), Duration::from_secs(15));
        assert_eq!(t.lease_duration, Duration::from_secs(2));
    }
}
