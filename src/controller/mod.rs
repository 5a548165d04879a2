//! The CocoonHibernation controller: pure rules in [`plan`], effects in [`reconcile`],
//! per-VM serialization in [`locks`], and the leader-gated run loop here.

pub mod census;
mod context;
mod deletes;
mod effects;
mod error_policy;
mod finalizer;
pub mod locks;
mod own_writes;
pub mod plan;
pub mod reconcile;
pub mod turns;

pub use context::{Context, context};
pub use error_policy::{Deferral, error_policy};
pub use finalizer::{add_finalizer_patch, remove_finalizer_patch};

#[cfg(test)]
mod mock_tests;

use crate::cache::Trigger;
use futures::StreamExt;
use kube::ResourceExt;
use kube::runtime::Controller;
use kube::runtime::controller::Config;
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// Runs the controller while `leading` is true and the cache has synced. Triggers that
/// arrive while not leading are dropped: a new term starts by enqueueing every CR.
pub async fn run(
    ctx: Arc<Context>,
    mut triggers: mpsc::UnboundedReceiver<Trigger>,
    mut leading: watch::Receiver<bool>,
    concurrency: u16,
    shutdown: CancellationToken,
) {
    loop {
        // Follower: wait for the lease (and a synced cache), discarding triggers.
        loop {
            if *leading.borrow() && ctx.cache.is_synced() {
                break;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = leading.changed() => if changed.is_err() { return },
                t = triggers.recv() => if t.is_none() { return },
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
            }
        }
        tracing::info!("leading: starting the controller");
        ctx.metrics.leader.set(1);
        let term = shutdown.child_token();
        let (tx, rx) = mpsc::unbounded_channel();
        for cr in ctx.cache.all_crs() {
            let _ = tx.send(ObjectRef::from_obj(cr.as_ref()));
        }
        let controller = run_term(ctx.clone(), rx, concurrency, term.clone());
        tokio::pin!(controller);
        let outcome = loop {
            tokio::select! {
                _ = &mut controller => break Term::Ended,
                t = triggers.recv() => match t {
                    Some(t) => { let _ = tx.send(t); }
                    None => break Term::Ended,
                },
                changed = leading.changed() => {
                    if changed.is_err() || !*leading.borrow() {
                        break Term::LostLease;
                    }
                }
                _ = shutdown.cancelled() => break Term::Shutdown,
            }
        };
        ctx.metrics.leader.set(0);
        match outcome {
            // P2: losing the lease stops reconciling at once; in-flight passes are dropped
            // at their next await, and every effect is safe to redo.
            Term::LostLease => {
                tracing::warn!("lost the lease: controller stopped");
                term.cancel();
            }
            Term::Shutdown => {
                term.cancel();
                let _ = tokio::time::timeout(Duration::from_secs(10), &mut controller).await;
                return;
            }
            Term::Ended => return,
        }
    }
}

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

enum Term {
    Ended,
    LostLease,
    Shutdown,
}

async fn run_term(
    ctx: Arc<Context>,
    mut rx: mpsc::UnboundedReceiver<Trigger>,
    concurrency: u16,
    stop: CancellationToken,
) {
    let store = ctx.cache.cr_store();
    let triggers = futures::stream::poll_fn(move |cx| rx.poll_recv(cx));
    // kube-runtime starts every ready pass at once; `Turns` decides which runs (turns.rs).
    let turns = turns::Turns::new(usize::from(concurrency));
    let pass = move |cr: Arc<crate::api::CocoonHibernation>, ctx: Arc<Context>| {
        let turns = turns.clone();
        async move {
            let (ns, name) = (cr.namespace().unwrap_or_default(), cr.name_any());
            // Our own last write counts before the cache shows it: the pass after a
            // transition's start is an ending pass at once.
            let ending = || {
                let now = ctx.cache.cr(&ns, &name).map(|cr| ctx.own_write_view(cr));
                now.is_some_and(|cr| plan::may_end_a_transition(&cr))
            };
            let queued = std::time::Instant::now();
            let Some(_turn) = turns.take(ending).await else {
                return Ok(kube::runtime::controller::Action::await_change());
            };
            let (waited, started) = (queued.elapsed(), std::time::Instant::now());
            // Boxed, so a pass waiting for its turn holds two Arcs, not a whole pass.
            let result = Box::pin(reconcile::reconcile(cr, ctx)).await;
            tracing::debug!(cr = %format_args!("{ns}/{name}"), waited_ms = waited.as_millis(),
                ran_ms = started.elapsed().as_millis(), "pass done");
            result
        }
    };
    Controller::for_stream(futures::stream::pending(), store)
        .with_config(Config::default().concurrency(0))
        .reconcile_on(triggers)
        .graceful_shutdown_on(async move { stop.cancelled().await })
        .run(pass, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                // Reconcile errors were handled by error_policy; the rest is routine.
                tracing::debug!(error = %e, "controller event");
            }
        })
        .await;
}
