//! The schedule controller (K2, K4–K8): one pass per schedule reads the shared cache,
//! plans, writes, records status and events, and requeues at the next boundary. Runs in
//! the same process as the CR controller, while this replica leads.

use super::Clock;
use super::plan::{self, Action, Plan};
use super::spec::{self, CocoonHibernationSchedule, CocoonHibernationScheduleStatus, OnDelete};
use super::writes::{Writer, desire_str};
use super::{inputs, status, wakeup};
use crate::api::{CocoonHibernation, Desire};
use crate::cache::SharedCache;
use crate::error::{Error, Result};
use crate::metrics::{Metrics, ScheduleLabels, ScheduleWriteLabels};
use crate::runtime::events::{Event, EventType, Recorder, Reporter};
use crate::runtime::finalizers;
use crate::runtime::gate::Gate;
use crate::runtime::retry::Failures;
use crate::runtime::trigger;
pub use crate::runtime::wiring::Wiring;
use futures::StreamExt;
use jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::Controller;
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::Store;
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// Holds the schedule until its CRs are released (K4).
pub const FINALIZER: &str = "cocoonhibernationschedule.cocoonset.cocoonstack.io/finalizer";
/// While a write is deferred (K7) or failed: look again this soon.
const PENDING_RETRY: Duration = Duration::from_secs(3);
/// Without a boundary sooner: a pass this often. Selected pods and CRs appearing or
/// changing do not wait for it (K9, `wakeup.rs`); another schedule of the namespace
/// appearing or leaving (K6) is seen at the latest by then.
const RESYNC: Duration = Duration::from_secs(30);

pub struct Context {
    pub client: kube::Client,
    pub cache: SharedCache,
    pub schedules: Store<CocoonHibernationSchedule>,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub clock: Clock,
    /// Passes write only while it is open (P2).
    pub gate: Gate,
    /// (schedule uid, CR, boundary) already reported as `OverrideKept`.
    reported: Mutex<HashSet<(String, String, Timestamp)>>,
    /// Overrides kept now, per schedule uid, for the gauge.
    overrides: Mutex<HashMap<String, u32>>,
    /// Consecutive failed passes per schedule uid, for the error backoff.
    failures: Failures<String>,
}

/// Watches schedules and drives them until `shutdown`; a selected pod or CR appearing or
/// changing in the cache wakes the schedules it concerns at once (K9).
pub async fn run(w: Wiring, shutdown: CancellationToken) {
    let controller = Controller::new(w.watched::<CocoonHibernationSchedule>(), w.watch_config());
    let schedules = controller.store();
    let gate = w.gate;
    // K9: the cache's changes wake the schedules they concern, by this controller's
    // trigger policy; P2: a gate that opens wakes them all, since passes on a closed gate
    // ended without a requeue.
    let policy = wakeup::SchedulePolicy {
        schedules: schedules.clone(),
    };
    let controller = controller
        .reconcile_on(trigger::stream(trigger::subscribe(&w.cache, policy)))
        .reconcile_all_on(gate.clone().openings());
    let reporter = Reporter {
        controller: "cocoon-hibernation".into(),
        instance: None,
    };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(w.client.clone(), reporter),
        schedules,
        client: w.client,
        cache: w.cache,
        metrics: w.metrics,
        clock: w.clock,
        gate,
        reported: Mutex::default(),
        overrides: Mutex::default(),
        failures: Failures::default(),
    });
    controller
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "schedule controller event");
            }
        })
        .await;
}

fn error_policy(s: Arc<CocoonHibernationSchedule>, e: &Error, ctx: Arc<Context>) -> Requeue {
    crate::runtime::retry::policy_retry(s.as_ref(), e, &ctx.failures, "schedule")
}

async fn reconcile(s: Arc<CocoonHibernationSchedule>, ctx: Arc<Context>) -> Result<Requeue> {
    let requeue = pass(&s, &ctx).await?;
    ctx.failures.clear(&s.uid().unwrap_or_default());
    Ok(requeue)
}

async fn pass(s: &CocoonHibernationSchedule, ctx: &Context) -> Result<Requeue> {
    // P2: not leading: end quietly; the gate's opening brings this schedule back.
    if !ctx.gate.is_open() {
        return Ok(Requeue::await_change());
    }
    let ns = s.namespace().unwrap_or_default();
    let (name, uid) = (s.name_any(), s.uid().unwrap_or_default());
    let api: Api<CocoonHibernationSchedule> = Api::namespaced(ctx.client.clone(), &ns);
    let has_finalizer = s.finalizers().iter().any(|f| f == FINALIZER);
    let deleting = s.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer {
        return Ok(Requeue::await_change());
    }
    if !has_finalizer {
        let patch = finalizers::add(&s.metadata, FINALIZER);
        api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await?;
        return Ok(Requeue::await_change());
    }
    let calendar = match spec::calendar(&s.spec) {
        Ok(c) => Some(c),
        // K4: a schedule whose spec became invalid (K9 after an upgrade) still releases
        // its CRs when deleted; releasing needs no calendar.
        Err(_) if deleting => None,
        Err(errors) => {
            let st = status::invalid(s, &errors.join("; "));
            patch_status(&api, &name, &st).await?;
            return Ok(Requeue::requeue(RESYNC));
        }
    };
    let now = ctx.clock.now();
    let desire = if calendar.as_ref().is_some_and(|c| c.awake(now)) {
        Desire::Wake
    } else {
        Desire::Hibernate
    };
    let boundary = calendar
        .as_ref()
        .and_then(|c| c.latest_boundary(now))
        .map_or(Timestamp::UNIX_EPOCH, |b| b.at);
    let last_applied = s
        .status
        .as_ref()
        .and_then(|st| st.last_applied_boundary.as_ref())
        .map(|t| t.0);
    let due = calendar.as_ref().and_then(|c| c.due(now, last_applied));
    let pods = inputs::selected_pods(s, &ctx.schedules.state(), &ctx.cache.pods_in(&ns));
    let in_ns: Vec<Arc<CocoonHibernation>> = ctx
        .cache
        .all_crs()
        .into_iter()
        .filter(|cr| cr.metadata.namespace.as_deref() == Some(ns.as_str()))
        .collect();
    let (crs, versions) = inputs::crs(&uid, &pods, &in_ns);
    let input = plan::Inputs {
        now,
        desire,
        boundary,
        uid: uid.clone(),
        suspend: s.spec.suspend,
        max_in_flight: s.spec.max_in_flight,
        deleting,
        wake_on_delete: s.spec.on_delete == OnDelete::Wake,
        pods,
        crs,
    };
    let mut plan = plan::plan(&input);
    let cr_api: Api<CocoonHibernation> = Api::namespaced(ctx.client.clone(), &ns);
    let writer = Writer {
        api: &cr_api,
        schedule: &name,
        uid: &uid,
        boundary,
    };
    let mut failed = false;
    for action in &plan.actions {
        let cr = match action {
            Action::Create { pod, .. } => pod,
            Action::Flip { cr, .. } | Action::Mark { cr, .. } | Action::Release { cr, .. } => cr,
        };
        match writer.execute(action, versions.get(cr).cloned()).await {
            Ok(true) => count_write(&ctx.metrics, action),
            Ok(false) => {}
            Err(e) => {
                // 409: a person changed the CR since the cache showed it; look again.
                tracing::info!(schedule = %name, cr = %cr, error = %e, "schedule write not made");
                failed = true;
            }
        }
    }
    plan.pending |= failed;
    if deleting {
        if !plan.pending {
            // The CRs were released by the spec this pass read: only from that version.
            let patch =
                finalizers::at_version(&s.metadata, finalizers::remove(&s.metadata, FINALIZER));
            api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
                .await?;
            forget(ctx, &uid);
            return Ok(Requeue::await_change());
        }
        return Ok(Requeue::requeue(PENDING_RETRY));
    }
    let applied = due.filter(|_| !s.spec.suspend);
    let next = calendar.as_ref().and_then(|c| c.next_boundary(now));
    let st = status::of(
        s,
        &plan,
        desire,
        next,
        applied.map(|b| b.at).or(last_applied),
    );
    patch_status(&api, &name, &st).await?;
    publish(ctx, s, &uid, &plan, applied.map(|b| b.wake), boundary).await;
    Ok(Requeue::requeue(requeue_after(&plan, now, next)))
}

/// K2: at the next boundary (a little after, so the pass sees it passed), sooner while a
/// write waits, and at least every [`RESYNC`].
fn requeue_after(plan: &Plan, now: Timestamp, next: Option<super::calendar::Boundary>) -> Duration {
    if plan.pending {
        return PENDING_RETRY;
    }
    let until = next
        .and_then(|b| Duration::try_from(b.at.duration_since(now)).ok())
        .map_or(RESYNC, |d| d + Duration::from_millis(200));
    until.min(RESYNC)
}

fn count_write(metrics: &Metrics, action: &Action) {
    let kind = match action {
        Action::Create { .. } => "create",
        Action::Flip { .. } => "flip",
        Action::Mark { .. } => "mark",
        Action::Release { .. } => "release",
    };
    metrics
        .schedule_writes
        .get_or_create(&ScheduleWriteLabels { kind })
        .inc();
}

async fn patch_status(
    api: &Api<CocoonHibernationSchedule>,
    name: &str,
    st: &CocoonHibernationScheduleStatus,
) -> Result<()> {
    let patch = serde_json::json!({ "status": st });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// K8: `ScheduledHibernate`/`ScheduledWake` once per boundary, `OverrideKept` once per
/// overridden CR and boundary; the metrics.
async fn publish(
    ctx: &Context,
    s: &CocoonHibernationSchedule,
    uid: &str,
    plan: &Plan,
    applied: Option<bool>,
    boundary: Timestamp,
) {
    let reference = s.object_ref(&());
    let mut events = Vec::new();
    if let Some(wake) = applied {
        let desire = if wake {
            Desire::Wake
        } else {
            Desire::Hibernate
        };
        ctx.metrics
            .schedule_boundaries
            .get_or_create(&ScheduleLabels {
                desire: desire_str(desire),
            })
            .inc();
        let reason = if wake {
            "ScheduledWake"
        } else {
            "ScheduledHibernate"
        };
        let note = format!(
            "boundary {boundary}: {} of {} pods to {}",
            plan.managed,
            plan.managed + plan.overridden + plan.conflicting,
            desire_str(desire)
        );
        events.push((reason, note));
    }
    let fresh: Vec<&String> = {
        let mut seen = ctx.reported.lock();
        seen.retain(|(u, _, b)| u != uid || *b >= boundary);
        plan.overrides
            .iter()
            .filter(|cr| seen.insert((uid.to_owned(), (*cr).clone(), boundary)))
            .collect()
    };
    for cr in fresh {
        events.push((
            "OverrideKept",
            format!("{cr}: desire changed by hand; left alone until the next boundary"),
        ));
    }
    {
        let mut counts = ctx.overrides.lock();
        counts.insert(uid.to_owned(), plan.overridden);
        ctx.metrics
            .schedule_overrides
            .set(i64::from(counts.values().sum::<u32>()));
    }
    for (reason, note) in events {
        let ev = Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note),
            action: "Schedule".into(),
            secondary: None,
        };
        if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
            tracing::warn!(schedule = %s.name_any(), reason, error = %e, "could not publish event");
        }
    }
}

fn forget(ctx: &Context, uid: &str) {
    let mut counts = ctx.overrides.lock();
    counts.remove(uid);
    ctx.metrics
        .schedule_overrides
        .set(i64::from(counts.values().sum::<u32>()));
    let mut seen = ctx.reported.lock();
    seen.retain(|(u, _, _)| u != uid);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::CocoonHibernationScheduleSpec;
    use http::{Request, Response};
    use kube::client::Body;
    use tokio::sync::watch;
    use tower_test::mock::{self, Handle};

    type ApiHandle = Handle<Request<Body>, Response<Body>>;

    fn context(leading: bool) -> (Arc<Context>, ApiHandle, watch::Sender<bool>) {
        let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "default");
        let cache = SharedCache::from_objects(Vec::new(), Vec::new());
        let (tx, rx) = watch::channel(leading);
        let reporter = Reporter {
            controller: "test".into(),
            instance: None,
        };
        let ctx = Arc::new(Context {
            recorder: Recorder::new(client.clone(), reporter),
            schedules: kube::runtime::reflector::store().0,
            client,
            gate: Gate::new(rx, cache.clone()),
            cache,
            metrics: Metrics::new(),
            clock: Clock::default(),
            reported: Mutex::default(),
            overrides: Mutex::default(),
            failures: Failures::default(),
        });
        (ctx, handle, tx)
    }

    fn office() -> Arc<CocoonHibernationSchedule> {
        let mut s = CocoonHibernationSchedule::new(
            "office",
            CocoonHibernationScheduleSpec::always_asleep(Default::default()),
        );
        s.metadata.namespace = Some("shop".into());
        s.metadata.uid = Some("uid-1".into());
        s.metadata.resource_version = Some("1".into());
        Arc::new(s)
    }

    /// SPEC P2 K1: a schedule pass on a replica that does not lead sends nothing to the
    /// apiserver and asks for no requeue (no poll: the gate's opening brings it back);
    /// the same pass once leading writes (its finalizer first, by JSON patch).
    #[tokio::test]
    async fn p2_k1_a_pass_while_not_leading_writes_nothing() {
        let (ctx, mut handle, leading) = context(false);
        let action = reconcile(office(), ctx.clone()).await.unwrap();
        assert_eq!(action, Requeue::await_change());
        let sent = tokio::time::timeout(Duration::from_millis(200), handle.next_request()).await;
        assert!(sent.is_err(), "a follower sent a request");

        leading.send_replace(true);
        let pass = tokio::spawn(reconcile(office(), ctx));
        let (req, _) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("the leader writes")
            .expect("the client is alive");
        assert_eq!(req.method(), http::Method::PATCH);
        assert!(
            req.uri()
                .path()
                .ends_with("/namespaces/shop/cocoonhibernationschedules/office")
        );
        let content_type = req
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok());
        assert_eq!(content_type, Some("application/json-patch+json"));
        pass.abort();
    }
}
