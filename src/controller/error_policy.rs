//! When a pass looks again: after an error (capped backoff), after a deferral (one
//! table of reasons and delays), and after a delete the registry refuses for good (S5).

use super::context::Context;
use super::effects::key;
use crate::api::CocoonHibernation;
use crate::error::Error;
use crate::runtime::retry::{self, CONFLICT_RETRY};
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use std::time::Duration;

/// Why a pass ended early without an error, to look again soon.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Deferral {
    /// The pod cache has not seen our own patch yet; its watch event usually comes first.
    OwnPodWrite,
    /// Every registry slot stayed busy (C2).
    RegistryBusy,
    /// F2, D1: the apiserver holds a newer CR than the one the plan was made from.
    StaleView,
    /// S7: the cache showed the VM running, the fresh pod does not; the pod watch
    /// usually catches up first.
    StalePod,
}

impl Deferral {
    /// The `reason` label of `cocoon_hibernation_pass_deferrals_total`.
    pub fn label(self) -> &'static str {
        match self {
            Deferral::OwnPodWrite => "own_pod_write",
            Deferral::RegistryBusy => "registry_busy",
            Deferral::StaleView => "stale_view",
            Deferral::StalePod => "stale_pod",
        }
    }

    pub fn delay(self) -> Duration {
        match self {
            Deferral::OwnPodWrite | Deferral::RegistryBusy => Duration::from_secs(1),
            Deferral::StaleView => CONFLICT_RETRY,
            Deferral::StalePod => Duration::from_secs(2),
        }
    }
}

impl Context {
    /// Ends a pass early, to look again after the deferral's delay; counted by reason.
    pub(super) fn defer(&self, why: Deferral) -> Action {
        let (reason, delay) = (why.label(), why.delay());
        self.metrics.deferral(reason);
        tracing::debug!(reason, ?delay, "pass deferred");
        Action::requeue(delay)
    }

    /// S5: a delete that went through ends the slow backoff of earlier refusals.
    pub(super) fn forget_refusals(&self, cr: &CocoonHibernation) {
        self.refusals.lock().remove(&ObjectRef::from_obj(cr));
    }

    pub(super) fn permanent_backoff(&self, cr: &CocoonHibernation) -> Duration {
        let attempts = bump(&mut self.refusals.lock(), cr);
        refusal_backoff(attempts, self.settings.refused_delete_backoff)
    }
}

/// Counts one more consecutive failure of `cr`.
fn bump(
    counts: &mut std::collections::HashMap<ObjectRef<CocoonHibernation>, u32>,
    cr: &CocoonHibernation,
) -> u32 {
    let n = counts.entry(ObjectRef::from_obj(cr)).or_insert(0);
    *n = n.saturating_add(1);
    *n
}

/// Logs, counts and retries with the backoff every controller uses (`runtime::retry`).
pub fn error_policy(cr: Arc<CocoonHibernation>, err: &Error, ctx: Arc<Context>) -> Action {
    let attempts = bump(&mut ctx.failures.lock(), &cr);
    ctx.metrics
        .reconcile_errors
        .get_or_create(&crate::metrics::ErrorLabels {
            error: err.metric_label(),
        })
        .inc();
    tracing::warn!(
        cr = %key(&cr),
        attempts,
        error = %err,
        "reconcile failed; retrying"
    );
    Action::requeue(retry::after_failure(err, attempts))
}

/// S5: with the default base of a minute, 1, 2, 4, 8 minutes, then every 10 minutes.
fn refusal_backoff(attempts: u32, base: Duration) -> Duration {
    let doublings = attempts.clamp(1, 5) - 1;
    base.saturating_mul(1 << doublings)
        .min(base.saturating_mul(10))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC S5: a delete the registry refuses for good backs off to minutes.
    #[test]
    fn s5_refused_deletes_back_off_to_minutes() {
        let minute = Duration::from_secs(60);
        let mins: Vec<u64> = (1..=7)
            .map(|n| refusal_backoff(n, minute).as_secs() / 60)
            .collect();
        assert_eq!(mins, vec![1, 2, 4, 8, 10, 10, 10]);
        assert_eq!(refusal_backoff(0, minute), minute);
    }
}
