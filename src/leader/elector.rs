//! The election loop and its watchdog. The loop reads the Lease, asks
//! [`super::decide::decide`], and carries the decision out with a create or a merge patch
//! guarded by the resourceVersion it read (so two replicas never both win). The watchdog
//! closes the fence and stops leading the instant the last renewal gets too old, on this
//! replica's own clock, whatever the loop is blocked on.

use super::Fence;
use super::decide::{
    Decision, Observed, Readiness, Replica, SAFETY_EPOCH_ANNOTATION, StepDownReason, Timing,
    decide, epoch_to_record, recorded_epoch,
};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const FIELD_MANAGER: &str = "cocoon-hibernation";

/// The leader state shared by the loop and the watchdog. Every change happens under the
/// fence's lock, so `leading` and the fence never disagree for long: a renewal and an
/// expiry cannot interleave.
pub(super) struct Leadership {
    pub fence: Fence,
    pub leading: watch::Sender<bool>,
    pub span: Duration,
}

impl Leadership {
    /// A renewal (or acquisition) sent at `sent` succeeded.
    fn renewed(&self, sent: Instant) -> bool {
        let until = sent + self.span;
        self.fence.with(|cur| {
            // A slow reply to an older request must not pull the deadline back.
            let until = cur.map_or(until, |c| c.max(until));
            if until <= Instant::now() {
                return false;
            }
            *cur = Some(until);
            self.leading
                .send_if_modified(|l| !std::mem::replace(l, true))
        })
    }

    /// Closes the fence if its deadline has passed. True if this call stepped down.
    pub fn expire_if_due(&self, now: Instant) -> bool {
        self.fence.with(|cur| match *cur {
            Some(until) if until <= now => {
                *cur = None;
                self.leading.send_replace(false);
                true
            }
            _ => false,
        })
    }

    /// Stops leading now, whatever the fence's deadline. True if this call stepped down.
    pub fn step_down(&self) -> bool {
        self.fence.with(|cur| {
            *cur = None;
            self.leading.send_replace(false)
        })
    }

    /// When the request of the last successful renewal was sent, while leading.
    fn last_renewal(&self) -> Option<Instant> {
        self.fence.deadline().map(|until| until - self.span)
    }

    /// S1: sleeps until the fence's deadline and closes it unless a renewal moved it.
    pub async fn watchdog(&self) {
        let mut leading = self.leading.subscribe();
        loop {
            match self.fence.deadline() {
                Some(until) => {
                    tokio::time::sleep_until(until).await;
                    if self.expire_if_due(Instant::now()) {
                        tracing::warn!(
                            "no successful lease renewal for the fence span: stopped leading"
                        );
                    }
                }
                // The sender lives in `self`, so this wakes on every change of leader.
                None => {
                    let _ = leading.changed().await;
                }
            }
        }
    }
}

pub(super) struct Elector {
    pub api: Api<Lease>,
    pub name: String,
    pub identity: String,
    pub timing: Timing,
    pub leadership: Arc<Leadership>,
    /// S8: the cache's fitness to lead on, asked before every decision.
    pub readiness: Arc<dyn Fn() -> Readiness + Send + Sync>,
    /// S11: the safety epoch this replica runs with (the build's, unless a test lowers it).
    pub safety_epoch: u64,
    /// S11: the newer epoch last reported as outranking us, so the error is logged once
    /// per stamp rather than every retry period.
    pub outranked_by: AtomicU64,
}

/// The last version of the Lease this replica read or wrote.
struct Seen {
    lease: Option<Lease>,
    observed: Option<Observed>,
}

impl Elector {
    /// Runs until `stop`, then releases the lease if held (P4).
    pub async fn run(self, stop: CancellationToken) {
        let mut seen = Seen {
            lease: None,
            observed: None,
        };
        let watchdog = self.leadership.watchdog();
        tokio::pin!(watchdog);
        loop {
            let pause = tokio::select! {
                _ = stop.cancelled() => break,
                _ = &mut watchdog => Duration::ZERO,
                pause = self.step(&mut seen) => pause,
            };
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = &mut watchdog => {}
                _ = tokio::time::sleep(pause) => {}
            }
        }
        // Nothing leader-only may run once the release is on its way.
        self.leadership.step_down();
        self.release(&mut seen).await;
    }

    /// One read and, if the rules say so, one write. Returns the pause before the next.
    async fn step(&self, seen: &mut Seen) -> Duration {
        let retry = self.timing.retry_period;
        let read = self.read(seen).await;
        let readiness = (self.readiness)();
        if !read {
            // S8: a frozen cache ends the term even while the Lease cannot be read.
            if readiness == Readiness::Stalled && self.leadership.step_down() {
                tracing::error!("informer cache stalled: stopped leading");
            }
            return retry;
        }
        let now = Instant::now();
        let last = self.leadership.last_renewal();
        match decide(
            seen.observed.as_ref(),
            self.me(),
            now.into_std(),
            last.map(Instant::into_std),
            false,
            readiness,
            &self.timing,
        ) {
            Decision::Wait => retry,
            Decision::Outranked => {
                self.report_outranked(seen);
                retry
            }
            Decision::StepDown(reason) => {
                // The fence closes now, open or not (S8: another holder).
                if self.leadership.step_down() {
                    match reason {
                        StepDownReason::RenewalTooOld => {
                            tracing::warn!("last lease renewal too old: stopped leading");
                        }
                        StepDownReason::OtherHolder => tracing::error!(
                            holder = seen.observed.as_ref().and_then(|o| o.holder.as_deref()),
                            "the lease names another holder: stopped leading"
                        ),
                        StepDownReason::Stalled => {
                            tracing::error!("informer cache stalled: stopped leading");
                        }
                        StepDownReason::NewerSafetyEpoch => self.report_outranked(seen),
                    }
                }
                Duration::ZERO
            }
            // S8: holding the Lease while unfit to lead: give it to a healthy replica.
            // S11: or while a newer build has led.
            Decision::Release => {
                if seen.observed.as_ref().and_then(|o| o.epoch).unwrap_or(0) > self.safety_epoch {
                    self.report_outranked(seen);
                }
                self.release(seen).await;
                retry
            }
            Decision::Create => self.write(seen, Write::Create).await,
            Decision::Acquire => self.write(seen, Write::Acquire).await,
            Decision::Renew => self.write(seen, Write::Renew).await,
            // Only returned while stopping.
            Decision::Exit => retry,
        }
    }

    fn me(&self) -> Replica<'_> {
        Replica {
            identity: &self.identity,
            safety_epoch: self.safety_epoch,
        }
    }

    /// S11: says, once per stamp, that a newer build has led and this one will not.
    fn report_outranked(&self, seen: &Seen) {
        let recorded = seen.observed.as_ref().and_then(|o| o.epoch).unwrap_or(0);
        if self.outranked_by.swap(recorded, Ordering::Relaxed) != recorded {
            tracing::error!(
                lease = self.name,
                recorded,
                ours = self.safety_epoch,
                "a newer build has led: the lease records safety epoch {recorded}, this build \
                 knows only {}; this replica will not lead (it still serves the webhook). \
                 Upgrade it to the newer build",
                self.safety_epoch
            );
        }
    }

    /// GETs the Lease into `seen`; false if the read failed.
    async fn read(&self, seen: &mut Seen) -> bool {
        let got = tokio::time::timeout(self.timing.request_timeout, self.api.get_opt(&self.name));
        let lease = match got.await {
            Ok(Ok(lease)) => lease,
            Ok(Err(e)) => {
                tracing::warn!(error = %e, lease = self.name, "reading the lease failed");
                return false;
            }
            Err(_) => {
                tracing::warn!(lease = self.name, timeout = ?self.timing.request_timeout, "reading the lease timed out");
                return false;
            }
        };
        self.remember(seen, lease, Instant::now());
        true
    }

    /// Records a version of the Lease, keeping the first-seen instant of an unchanged one.
    fn remember(&self, seen: &mut Seen, lease: Option<Lease>, at: Instant) {
        let rv = |l: &Option<Lease>| l.as_ref().and_then(|l| l.metadata.resource_version.clone());
        let unchanged = seen.lease.is_some() && rv(&seen.lease) == rv(&lease);
        let seen_at = match (&seen.observed, unchanged) {
            (Some(o), true) => o.seen_at,
            _ => at.into_std(),
        };
        seen.observed = lease.as_ref().map(|l| {
            let spec = l.spec.clone().unwrap_or_default();
            let secs = spec
                .lease_duration_seconds
                .and_then(|s| u64::try_from(s).ok())
                .unwrap_or(self.timing.lease_duration.as_secs());
            Observed {
                holder: spec.holder_identity,
                lease_duration: Duration::from_secs(secs),
                epoch: recorded_epoch(
                    l.metadata
                        .annotations
                        .as_ref()
                        .and_then(|a| a.get(SAFETY_EPOCH_ANNOTATION))
                        .map(String::as_str),
                ),
                seen_at,
            }
        });
        seen.lease = lease;
    }

    async fn write(&self, seen: &mut Seen, kind: Write) -> Duration {
        let now = MicroTime(jiff::Timestamp::now());
        let previous = seen.lease.as_ref().and_then(|l| l.spec.clone());
        let transitions = previous
            .as_ref()
            .and_then(|s| s.lease_transitions)
            .unwrap_or(0);
        let holder_changes = previous.as_ref().and_then(|s| s.holder_identity.as_deref())
            != Some(self.identity.as_str());
        let spec = LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(self.timing.lease_duration_seconds()),
            renew_time: Some(now.clone()),
            acquire_time: if holder_changes {
                Some(now)
            } else {
                previous.as_ref().and_then(|s| s.acquire_time.clone())
            },
            lease_transitions: Some(if holder_changes && previous.is_some() {
                transitions.saturating_add(1)
            } else {
                transitions
            }),
            ..LeaseSpec::default()
        };
        // S11: stamp our epoch, never lowering the record (decide refused a newer one).
        let epoch = epoch_to_record(
            seen.observed.as_ref().and_then(|o| o.epoch),
            self.safety_epoch,
        );
        // The fence may only count from before the request leaves (S1).
        let sent = Instant::now();
        let result = match kind {
            Write::Create => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        annotations: Some(BTreeMap::from([(
                            SAFETY_EPOCH_ANNOTATION.to_owned(),
                            epoch.to_string(),
                        )])),
                        ..ObjectMeta::default()
                    },
                    spec: Some(spec),
                };
                let pp = PostParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..PostParams::default()
                };
                tokio::time::timeout(self.timing.request_timeout, self.api.create(&pp, &lease))
                    .await
            }
            Write::Acquire | Write::Renew => {
                let mut patch = guarded_patch(seen.lease.as_ref(), &spec);
                patch["metadata"]["annotations"] =
                    serde_json::json!({ SAFETY_EPOCH_ANNOTATION: epoch.to_string() });
                let pp = PatchParams {
                    field_manager: Some(FIELD_MANAGER.into()),
                    ..PatchParams::default()
                };
                tokio::time::timeout(
                    self.timing.request_timeout,
                    self.api.patch(&self.name, &pp, &Patch::Merge(&patch)),
                )
                .await
            }
        };
        match result {
            Ok(Ok(lease)) => {
                self.remember(seen, Some(lease), Instant::now());
                if self.leadership.renewed(sent) {
                    tracing::info!(
                        identity = self.identity,
                        lease = self.name,
                        "acquired the lease: leading"
                    );
                }
                self.timing.retry_period
            }
            // Another replica wrote first (or the object appeared): read again soon.
            Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                tracing::debug!(lease = self.name, ?kind, "lease write conflicted");
                self.timing.retry_period / 4
            }
            Ok(Err(e)) => {
                tracing::warn!(error = %e, lease = self.name, ?kind, "lease write failed");
                self.timing.retry_period
            }
            Err(_) => {
                tracing::warn!(lease = self.name, ?kind, "lease write timed out");
                self.timing.retry_period
            }
        }
    }

    /// P4: clears the holder and sets leaseDurationSeconds=1 (as client-go's
    /// ReleaseOnCancel does), so a polling follower takes it within one retry period
    /// instead of waiting for the old record to expire.
    async fn release(&self, seen: &mut Seen) {
        let timeout = self.timing.request_timeout;
        // A fresh read: a write cut short by the stop may have landed.
        self.read(seen).await;
        for _ in 0..3 {
            let decision = decide(
                seen.observed.as_ref(),
                self.me(),
                Instant::now().into_std(),
                None,
                true,
                Readiness::Ready,
                &self.timing,
            );
            if decision != Decision::Release {
                tracing::info!(
                    lease = self.name,
                    "not holding the lease: nothing to release"
                );
                return;
            }
            let now = MicroTime(jiff::Timestamp::now());
            let spec = LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(now.clone()),
                renew_time: Some(now),
                lease_transitions: seen
                    .lease
                    .as_ref()
                    .and_then(|l| l.spec.as_ref())
                    .and_then(|s| s.lease_transitions),
                ..LeaseSpec::default()
            };
            let patch = guarded_patch(seen.lease.as_ref(), &spec);
            let pp = PatchParams {
                field_manager: Some(FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            let res = tokio::time::timeout(
                timeout,
                self.api.patch(&self.name, &pp, &Patch::Merge(&patch)),
            )
            .await;
            match res {
                Ok(Ok(_)) => {
                    tracing::info!(lease = self.name, "lease released");
                    return;
                }
                // Our view was stale (e.g. a renewal whose reply we dropped): re-read.
                Ok(Err(kube::Error::Api(s))) if s.code == 409 => {
                    if !self.read(seen).await {
                        break;
                    }
                }
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "releasing the lease failed");
                    break;
                }
                Err(_) => {
                    tracing::warn!("releasing the lease timed out");
                    break;
                }
            }
        }
        tracing::warn!(
            lease = self.name,
            "lease not released: a follower takes it when it expires"
        );
    }
}

#[derive(Clone, Copy, Debug)]
enum Write {
    Create,
    Acquire,
    Renew,
}

/// A merge patch of the whole spec that the apiserver applies only if the object still
/// has the resourceVersion we read (409 otherwise): optimistic concurrency with `patch`
/// alone, which is all the chart's Role grants besides get and create.
fn guarded_patch(read: Option<&Lease>, spec: &LeaseSpec) -> serde_json::Value {
    let rv = read.and_then(|l| l.metadata.resource_version.clone());
    serde_json::json!({
        "metadata": { "resourceVersion": rv },
        "spec": {
            "holderIdentity": spec.holder_identity,
            "leaseDurationSeconds": spec.lease_duration_seconds,
            "acquireTime": spec.acquire_time,
            "renewTime": spec.renew_time,
            "leaseTransitions": spec.lease_transitions,
        }
    })
}
