//! The leader-gated run loop: a follower discards triggers; each leader term runs one
//! kube-runtime `Controller` that reads the cache's trigger channel directly.
//!
//! The path of a trigger (docs/architecture.md): the cache's driver tells the trigger
//! policy (`triggers.rs`) of a change, which sends the CRs it wakes on this controller's
//! channel → the term's `Controller` (`reconcile_on`) schedules a pass → the limits
//! (`runtime::limits`) give it a worker, its VM and a registry slot.

use super::pacing::{self, Pacing};
use super::triggers::Trigger;
use super::{Context, error_policy, plan, reconcile};
use crate::api::CocoonHibernation;
use crate::api::annotations::PodView;
use crate::runtime::gate::Gate;
use crate::runtime::limits::Turns;
use crate::runtime::trigger::Triggers;
use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::Controller;
use kube::runtime::controller::{Action, Config};
use kube::runtime::reflector::ObjectRef;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

/// This controller's trigger channel, read by the current term's Controller or drained by
/// the follower; a mutex rather than a second channel per term, so nothing forwards.
type Shared = Arc<Mutex<Triggers<CocoonHibernation>>>;

/// Runs the controller while the gate is open: this replica leads and both stores have
/// listed. Triggers that
/// arrive while not leading are dropped: a new term starts by enqueueing every CR.
pub async fn run(
    ctx: Arc<Context>,
    triggers: Triggers<CocoonHibernation>,
    mut gate: Gate,
    concurrency: u16,
    shutdown: CancellationToken,
) {
    let triggers: Shared = Arc::new(Mutex::new(triggers));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            may_lead = follow(&mut gate, &triggers) => if !may_lead { return },
        }
        tracing::info!("leading: starting the controller");
        ctx.metrics.leader.set(1);
        let term = shutdown.child_token();
        let closed = CancellationToken::new();
        // Every CR first: triggers dropped while following are not replayed.
        let initial: Vec<Trigger> = ctx
            .cache
            .all_crs()
            .iter()
            .map(|cr| ObjectRef::from_obj(cr.as_ref()))
            .collect();
        let pacing = Pacing::new(pacing::IN_FLIGHT);
        let stream = pacing.beside(
            initial,
            ctx.cache.clone(),
            read(triggers.clone(), closed.clone()),
        );
        let controller = run_term(ctx.clone(), stream, pacing, concurrency, term.clone());
        tokio::pin!(controller);
        let outcome = tokio::select! {
            _ = &mut controller => Term::Ended,
            _ = closed.cancelled() => Term::Ended,
            _ = gate.closed() => Term::LostLease,
            _ = shutdown.cancelled() => Term::Shutdown,
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

enum Term {
    Ended,
    LostLease,
    Shutdown,
}

/// Waits, discarding triggers, until the gate opens: this replica holds the lease and
/// both stores hold their first list (S8: the elector leads only on a synced cache that
/// is not relisting). False when the lease watch, the trigger channel or a store's writer
/// is gone.
async fn follow(gate: &mut Gate, triggers: &Shared) -> bool {
    let mut rx = triggers.lock().await;
    let discard = async { while rx.recv().await.is_some() {} };
    tokio::select! {
        _ = discard => false,
        may_lead = gate.opened() => may_lead,
    }
}

/// The trigger channel as a stream for one term; it releases the receiver when the term's
/// Controller is dropped, and cancels `closed` if the cache's driver is gone.
fn read(triggers: Shared, closed: CancellationToken) -> impl Stream<Item = Trigger> + Send {
    futures::stream::unfold((triggers, closed), |(triggers, closed)| async move {
        let next = triggers.lock().await.recv().await;
        if next.is_none() {
            closed.cancel();
        }
        next.map(|t| (t, (triggers, closed)))
    })
}

async fn run_term(
    ctx: Arc<Context>,
    triggers: impl Stream<Item = Trigger> + Send + 'static,
    pacing: Pacing,
    concurrency: u16,
    stop: CancellationToken,
) {
    let store = ctx.cache.cr_store();
    // kube-runtime starts every ready pass at once; `Turns` decides which runs.
    let turns = Turns::new(usize::from(concurrency));
    let pass = move |cr: Arc<crate::api::CocoonHibernation>, ctx: Arc<Context>| {
        let turns = turns.clone();
        let pacing = pacing.clone();
        async move {
            let _paced = Done(&pacing, ObjectRef::from_obj(cr.as_ref()));
            let (ns, name) = (cr.namespace().unwrap_or_default(), cr.name_any());
            // Our own last write counts before the cache shows it: the pass after a
            // transition's start is an ending pass at once.
            let ending = || {
                let now = ctx.cache.cr(&ns, &name).map(|cr| ctx.own_write_view(cr));
                now.is_some_and(|cr| plan::may_end_a_transition(&cr))
            };
            // C2 (issue 38): a pass that may start a transition has the intake lane besides.
            // Per-VM order still holds: the lane only grants the turn; the pass takes its
            // VM's lock before it reads or writes, so a tag delete of that VM (which holds
            // the lock through its fresh reads and its DELETE) ends before a new start of
            // the same VM plans, and a start ends before a later delete reads fresh.
            let start = ctx.cache.cr(&ns, &name).is_some_and(|cr| {
                let cr = ctx.own_write_view(cr);
                let pod = ctx.cache.pod(&ns, &cr.spec.pod_ref.name);
                let view = pod.as_deref().map(PodView::from_pod);
                plan::may_start_a_transition(&cr, view.as_ref())
            });
            let queued = std::time::Instant::now();
            let turn = if start {
                turns.take_intake(ending).await
            } else {
                turns.take(ending).await
            };
            let Some(_turn) = turn else {
                return Ok(Action::await_change());
            };
            let (waited, started) = (queued.elapsed(), std::time::Instant::now());
            // Boxed, so a pass waiting for its turn holds two Arcs, not a whole pass.
            let result = Box::pin(reconcile::reconcile(cr, ctx)).await;
            tracing::debug!(cr = %format_args!("{ns}/{name}"), waited_ms = waited.as_millis(),
                ran_ms = started.elapsed().as_millis(), start, "pass done");
            result
        }
    };
    // The CRs come only through `reconcile_on`: the main stream is the trigger channel's
    // job, not a second watch.
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

/// Frees a paced CR's permit however its pass ends, cancelled ones included.
struct Done<'a>(&'a Pacing, Trigger);

impl Drop for Done<'_> {
    fn drop(&mut self) {
        self.0.done(&self.1);
    }
}
