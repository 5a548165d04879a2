//! The elector's rules as one pure function (S1, P2, P4): what to do with the Lease as
//! last read, judged on this replica's own monotonic clock. The async loop in
//! [`super::elector`] only carries the decision out.

use std::time::Duration;
use tokio::time::Instant;

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
}

/// The rules. `lease` is `None` when no Lease object exists; `last_renewal` is when the
/// request of our last successful renewal was sent, while we lead; `readiness` is the
/// cache's (S8).
pub fn decide(
    lease: Option<&Observed>,
    identity: &str,
    now: Instant,
    last_renewal: Option<Instant>,
    stopping: bool,
    readiness: Readiness,
    timing: &Timing,
) -> Decision {
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
            seen_at: t0 + secs(seen),
        });
        let got = decide(
            observed.as_ref(),
            ME,
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
