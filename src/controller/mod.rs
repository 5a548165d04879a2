//! The CocoonHibernation controller. Pure rules in [`plan`]; one pass in [`reconcile`],
//! its tag deletes in `tag_delete`, `--pod-selector`'s fresh checks in `selection`, a
//! CR's deletion in `finalizer`, its other writes in `effects`, when it looks again in
//! `error_policy`; what passes share in `context` and `own_writes`; its trigger policy in
//! `triggers`, the leader-gated run loop in `term` (where a pass waits:
//! `runtime::limits`); the phase gauges here and in [`census`].

pub mod census;
mod context;
mod effects;
mod error_policy;
mod finalizer;
mod own_writes;
mod pacing;
/// The pure rules live in cocoon-core; re-exported under their old path.
pub use cocoon_core::plan;
pub mod reconcile;
mod selection;
mod tag_delete;
mod term;
mod triggers;

pub use context::{Context, context};
pub use error_policy::{Deferral, error_policy};
pub use term::run;
pub use triggers::{CrPolicy, Trigger};

#[cfg(test)]
mod mock_tests;
#[cfg(test)]
mod model_tests;

use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Keeps the phase gauges current from the cache, on every replica (alerts take the max).
pub async fn report_census(ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(10));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if !ctx.cache.is_synced() {
            continue;
        }
        let crs = ctx.cache.all_crs();
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(jiff::Timestamp::now());
        let c = census::census(crs.iter().map(Arc::as_ref), &now, &ctx.settings);
        for (phase, n) in census::PHASES.iter().zip(c.by_phase) {
            ctx.metrics
                .crs
                .get_or_create(&crate::metrics::PhaseGaugeLabels {
                    phase: phase.as_str(),
                })
                .set(n);
        }
        ctx.metrics.crs_overdue.set(c.overdue);
        ctx.metrics.snapshot_deletes_owed.set(c.deletes_owed);
    }
}
