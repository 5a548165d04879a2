//! The idle policy controller (I2–I6): one pass per policy reads the shared cache, the
//! activity Leases and the namespace's schedules, plans, writes, records status and
//! events, and requeues when the next pod may turn idle. Each hibernate is fenced (I3):
//! the Lease is taken on the version the decision read, and only then is the CR flipped.

use super::inputs::{self, Fetched};
use super::plan::{self, Action, Plan};
use super::spec::{CocoonIdlePolicy, CocoonIdlePolicyStatus};
use super::{validate, writes};
use crate::api::activity::{ACTIVITY_FOR, lease_name};
use crate::api::{CocoonHibernation, Condition, Time};
use crate::cache::SharedCache;
use crate::cache::arrivals::Arrival;
use crate::cache::change::Change;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::runtime::events::{Event, EventType, Recorder, Reporter};
use crate::runtime::finalizers;
use crate::runtime::gate::Gate;
use crate::runtime::retry::Failures;
use crate::runtime::trigger;
pub use crate::runtime::wiring::Wiring;
use crate::schedule::{Clock, CocoonHibernationSchedule};
use futures::StreamExt;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::controller::Action as Requeue;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{Controller, WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Holds the policy until its CRs are released (I4).
pub const FINALIZER: &str = "cocoonidlepolicy.cocoonset.cocoonstack.io/finalizer";
/// While a write failed or was fenced off: look again this soon.
const RETRY: Duration = Duration::from_secs(3);
/// Without a pod turning idle sooner: a pass this often.
const RESYNC: Duration = Duration::from_secs(30);
/// A pod due now but not settled: look again this soon (its transition's end is seen
/// by the CR watch too).
const SOONEST: Duration = Duration::from_secs(1);
/// A pass at a pod's idle instant comes this long after it, so the pass sees it passed.
const PAST_IDLE: Duration = Duration::from_millis(50);
/// `IdleHibernate` events waiting to be sent; a pass waits when this many are.
const EVENTS_QUEUED: usize = 4096;
/// `IdleHibernate` events in flight at once: few, so they leave the apiserver to flips.
const EVENTS_AT_ONCE: usize = 4;

pub struct Context {
    pub client: kube::Client,
    pub cache: SharedCache,
    pub policies: Store<CocoonIdlePolicy>,
    pub leases: Store<Lease>,
    pub metrics: Metrics,
    pub clock: Clock,
    pub gate: Gate,
    failures: Failures<String>,
    events: mpsc::Sender<(Event, ObjectReference)>,
    /// I3: by policy uid, the CRs it flipped and the version each flip was made on,
    /// until the cache shows them moved on ([`inputs::unseen_flips`]).
    flipped: std::sync::Mutex<HashMap<String, HashMap<String, String>>>,
}

/// The policies of `namespace`, as reconcile requests.
/// K9 for idle policies: a VM pod arriving, leaving or relabelled, or a CR new, changed
/// or gone, wakes the policies of its namespace (selectors are cheap to re-check in the
/// pass; most namespaces have none). A pod change a CR pass reads wakes nothing here.
struct IdleTriggers {
    policies: Store<CocoonIdlePolicy>,
}

impl trigger::Policy for IdleTriggers {
    type Kind = CocoonIdlePolicy;

    fn wakes(&self, change: &Change, _cache: &SharedCache) -> Vec<ObjectRef<CocoonIdlePolicy>> {
        let namespace = match change {
            Change::Arrival(Arrival::Pod { namespace, .. }) | Change::CrGone { namespace, .. } => {
                namespace.as_str()
            }
            Change::Cr(key) => key.namespace(),
            Change::Pod(_) | Change::VmReleased(_) => return Vec::new(),
        };
        policies_in(&self.policies, Some(namespace.to_owned()))
    }
}

fn policies_in(
    store: &Store<CocoonIdlePolicy>,
    namespace: Option<String>,
) -> Vec<ObjectRef<CocoonIdlePolicy>> {
    store
        .state()
        .iter()
        .filter(|p| p.namespace() == namespace)
        .map(|p| ObjectRef::from_obj(p.as_ref()))
        .collect()
}

/// Watches policies and activity Leases and drives the policies until `shutdown`. A
/// Lease changing (a report, a new Lease), a pod or CR arriving, or the gate opening
/// brings the policies of its namespace to a pass.
pub async fn run(w: Wiring, shutdown: CancellationToken) {
    let controller = Controller::new(w.watched::<CocoonIdlePolicy>(), w.watch_config());
    let policies = controller.store();
    let (leases, writer) = reflector::store();
    let lease_events = reflector::reflector(
        writer,
        watcher(w.watched::<Lease>(), w.watch_config().labels(ACTIVITY_FOR)),
    )
    .default_backoff()
    .touched_objects();
    let by_lease = {
        let policies = policies.clone();
        lease_events.flat_map(move |lease| {
            let refs = match lease {
                Ok(lease) => policies_in(&policies, lease.namespace()),
                Err(e) => {
                    tracing::debug!(error = %e, "activity lease watch");
                    Vec::new()
                }
            };
            futures::stream::iter(refs)
        })
    };
    let by_change = trigger::stream(trigger::subscribe(
        &w.cache,
        IdleTriggers {
            policies: policies.clone(),
        },
    ));
    let controller = controller
        .reconcile_on(by_lease)
        .reconcile_on(by_change)
        .reconcile_all_on(w.gate.clone().openings());
    let reporter = Reporter {
        controller: "cocoon-hibernation".into(),
        instance: None,
    };
    let recorder = Recorder::new(w.client.clone(), reporter);
    let (events, queued) = mpsc::channel(EVENTS_QUEUED);
    // Ends when the controller (its Context) is gone.
    drop(tokio::spawn(send_events(recorder.clone(), queued)));
    let ctx = Arc::new(Context {
        events,
        policies,
        leases,
        client: w.client,
        cache: w.cache,
        metrics: w.metrics,
        clock: w.clock,
        gate: w.gate,
        failures: Failures::default(),
        flipped: std::sync::Mutex::default(),
    });
    controller
        .graceful_shutdown_on(async move { shutdown.cancelled().await })
        .run(reconcile, error_policy, ctx)
        .for_each(|res| async move {
            if let Err(e) = res {
                tracing::debug!(error = %e, "idle controller event");
            }
        })
        .await;
}

impl Context {
    /// The flips policy `uid` made that the cache may not have seen yet.
    fn flips<T>(&self, uid: &str, f: impl FnOnce(&mut HashMap<String, String>) -> T) -> T {
        let mut all = self
            .flipped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        f(all.entry(uid.to_owned()).or_default())
    }
}

fn error_policy(p: Arc<CocoonIdlePolicy>, e: &Error, ctx: Arc<Context>) -> Requeue {
    crate::runtime::retry::policy_retry(p.as_ref(), e, &ctx.failures, "idle policy")
}

async fn reconcile(p: Arc<CocoonIdlePolicy>, ctx: Arc<Context>) -> Result<Requeue> {
    let requeue = pass(&p, &ctx).await?;
    ctx.failures.clear(&p.uid().unwrap_or_default());
    Ok(requeue)
}

/// What one hibernate came to.
#[derive(Debug, PartialEq, Eq)]
pub enum Fenced {
    /// The Lease was taken and the CR flipped.
    Hibernated,
    /// A report landed between the read and the take: nothing was flipped (I3).
    Activity,
    /// The Lease was taken but the CR changed since the read: not flipped.
    CrChanged,
}

/// I3: take the pod's Lease on the version the decision read; only then flip the CR.
pub async fn hibernate_fenced(
    leases: &Api<Lease>,
    crs: &Api<CocoonHibernation>,
    pod: &str,
    lease_version: &str,
    cr_version: &str,
    policy: (&str, &str),
    now: Timestamp,
) -> std::result::Result<Fenced, kube::Error> {
    let Some(lease) = lease_name(pod) else {
        return Ok(Fenced::Activity);
    };
    let conflict = |e: &kube::Error| matches!(e, kube::Error::Api(s) if s.code == 409);
    match writes::patch(leases, &lease, &writes::take_patch(lease_version, now)).await {
        Err(e) if conflict(&e) => return Ok(Fenced::Activity),
        other => other?,
    }
    let flip = writes::hibernate_patch(policy.0, policy.1, now, cr_version);
    match writes::patch(crs, pod, &flip).await {
        Err(e) if conflict(&e) => Ok(Fenced::CrChanged),
        other => other.map(|()| Fenced::Hibernated),
    }
}

async fn pass(p: &CocoonIdlePolicy, ctx: &Context) -> Result<Requeue> {
    // P2: not leading: end quietly; the gate's opening brings this policy back.
    if !ctx.gate.is_open() {
        return Ok(Requeue::await_change());
    }
    let ns = p.namespace().unwrap_or_default();
    let (name, uid) = (p.name_any(), p.uid().unwrap_or_default());
    let api: Api<CocoonIdlePolicy> = Api::namespaced(ctx.client.clone(), &ns);
    let has_finalizer = p.finalizers().iter().any(|f| f == FINALIZER);
    let deleting = p.metadata.deletion_timestamp.is_some();
    if deleting && !has_finalizer {
        return Ok(Requeue::await_change());
    }
    if !has_finalizer {
        let patch = finalizers::add(&p.metadata, FINALIZER);
        api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await?;
        return Ok(Requeue::await_change());
    }
    let settings = match validate::settings(&p.spec) {
        Ok(s) => s,
        // Releasing needs no settings.
        Err(_) if deleting => validate::Settings {
            idle_after: validate::MIN_IDLE_AFTER,
            min_awake: validate::DEFAULT_MIN_AWAKE,
        },
        Err(errors) => {
            let st = invalid(p, &errors.join("; "));
            patch_status(&api, &name, &st).await?;
            return Ok(Requeue::requeue(RESYNC));
        }
    };
    let now = ctx.clock.now();
    let started = std::time::Instant::now();
    // I4: the schedules of the namespace; a CR of a pod one selects is the schedule's.
    let schedules = if deleting {
        Vec::new()
    } else {
        Api::<CocoonHibernationSchedule>::namespaced(ctx.client.clone(), &ns)
            .list(&ListParams::default())
            .await?
            .items
    };
    let crs = ctx.cache.all_crs();
    let read = inputs::read(
        p,
        &Fetched {
            policies: &ctx.policies.state(),
            schedules: &schedules,
            pods: &ctx.cache.pods_in(&ns),
            crs: &crs,
            leases: &ctx.leases.state(),
        },
    );
    let mut input = plan::Inputs {
        now,
        uid: uid.clone(),
        idle_after: settings.idle_after,
        min_awake: settings.min_awake,
        suspend: p.spec.suspend,
        pods: read.pods.clone(),
        strays: read.strays.clone(),
        deleting,
    };
    // I3: a pod whose flip the cache has not seen yet is asleep, not due again.
    for pod in ctx.flips(&uid, |mine| inputs::unseen_flips(mine, &read.cr_versions)) {
        if let Some(cr) = input.pods.get_mut(&pod).and_then(|p| p.cr.as_mut()) {
            cr.desire = crate::api::Desire::Hibernate;
        }
    }
    let plan = plan::plan(&input);
    let planned = started.elapsed();
    let lease_api: Api<Lease> = Api::namespaced(ctx.client.clone(), &ns);
    let cr_api: Api<CocoonHibernation> = Api::namespaced(ctx.client.clone(), &ns);
    // I3: each action concerns one pod's objects, so they go out together (bounded): pods
    // that turn idle at once are not flipped one after another.
    let writer = PassWriter {
        ctx,
        leases: &lease_api,
        crs: &cr_api,
        read: &read,
        policy: (&name, &uid),
        now,
    };
    let writes: Vec<_> = plan.actions.iter().map(|a| writer.carry_out(a)).collect();
    let outcomes: Vec<_> = futures::stream::iter(writes)
        .buffer_unordered(crate::runtime::limits::IDLE_WRITES_AT_ONCE)
        .collect()
        .await;
    let written = started.elapsed();
    let mut retry = false;
    let mut hibernated = Vec::new();
    for (action, done, fenced_out) in outcomes {
        retry |= fenced_out;
        match done {
            Ok(Some(pod)) => {
                let version = PassWriter::version(&read.cr_versions, &pod);
                ctx.flips(&uid, |mine| mine.insert(pod.clone(), version));
                hibernated.push(pod);
            }
            Ok(None) => {}
            Err(e) => {
                tracing::info!(policy = %name, ?action, error = %e, "idle policy write not made");
                retry = true;
            }
        }
    }
    if deleting {
        if retry {
            return Ok(Requeue::requeue(RETRY));
        }
        ctx.flips(&uid, HashMap::clear);
        let patch = finalizers::at_version(&p.metadata, finalizers::remove(&p.metadata, FINALIZER));
        api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch))
            .await?;
        return Ok(Requeue::await_change());
    }
    let st = status(p, &plan);
    // C3: a pass that changed nothing writes nothing.
    if p.status.as_ref() != Some(&st) {
        patch_status(&api, &name, &st).await?;
    }
    let statused = started.elapsed();
    publish(ctx, p, &hibernated).await;
    let requeue = requeue_after(&plan, now, retry);
    tracing::debug!(policy = %name, %now, actions = plan.actions.len(), hibernated = hibernated.len(),
        planned_ms = planned.as_millis(), written_ms = written.as_millis(),
        status_ms = statused.as_millis(), total_ms = started.elapsed().as_millis(),
        requeue_ms = requeue.as_millis(), next = ?plan.next, "idle pass");
    Ok(Requeue::requeue(requeue))
}

/// What one pass's writes need, read once.
struct PassWriter<'a> {
    ctx: &'a Context,
    leases: &'a Api<Lease>,
    crs: &'a Api<CocoonHibernation>,
    read: &'a inputs::Read,
    policy: (&'a str, &'a str),
    now: Timestamp,
}

impl PassWriter<'_> {
    fn version(m: &HashMap<String, String>, k: &str) -> String {
        m.get(k).cloned().unwrap_or_default()
    }

    /// One action: the pod it hibernated, if any; `true` when a fence or a changed CR
    /// stopped it (look again soon).
    async fn carry_out<'x>(
        &self,
        action: &'x Action,
    ) -> (&'x Action, Result<Option<String>, kube::Error>, bool) {
        let (ctx, read, now) = (self.ctx, self.read, self.now);
        let (name, uid) = self.policy;
        match action {
            Action::CreateLease { pod } => {
                let pod_uid = Self::version(&read.pod_uids, pod);
                let done = match writes::lease(pod, &pod_uid, now) {
                    Some(l) => writes::create(self.leases, &l)
                        .await
                        .map(|made| count(ctx, made, "lease_create")),
                    None => Ok(()),
                };
                (action, done.map(|()| None), false)
            }
            Action::CreateCr { pod } => {
                let cr = writes::new_cr(pod, name, uid, now);
                let done = writes::create(self.crs, &cr)
                    .await
                    .map(|made| count(ctx, made, "cr_create"));
                (action, done.map(|()| None), false)
            }
            Action::Release { cr } => {
                let patch = writes::release_patch(&Self::version(&read.cr_versions, cr));
                let done = writes::patch(self.crs, cr, &patch)
                    .await
                    .map(|()| count(ctx, true, "release"));
                (action, done.map(|()| None), false)
            }
            Action::Hibernate { pod } => {
                let outcome = hibernate_fenced(
                    self.leases,
                    self.crs,
                    pod,
                    &Self::version(&read.lease_versions, pod),
                    &Self::version(&read.cr_versions, pod),
                    (name, uid),
                    now,
                )
                .await;
                if let Ok(fenced) = &outcome {
                    record(ctx, fenced);
                }
                match outcome {
                    Ok(Fenced::Hibernated) => (action, Ok(Some(pod.clone())), false),
                    Ok(fenced) => {
                        tracing::info!(policy = %name, pod = %pod, ?fenced,
                            "idle hibernate not made: the pod changed since the decision read it");
                        (action, Ok(None), true)
                    }
                    Err(e) => (action, Err(e), false),
                }
            }
        }
    }
}

/// I6: a write made (`made`: false when the object existed already).
fn count(ctx: &Context, made: bool, kind: &'static str) {
    if made {
        ctx.metrics.idle_write(kind);
    }
}

/// I6: how a fenced decision ended, and the writes it made.
fn record(ctx: &Context, fenced: &Fenced) {
    let (outcome, writes): (_, &[&'static str]) = match fenced {
        Fenced::Hibernated => ("hibernated", &["take", "flip"]),
        Fenced::Activity => ("fenced_out", &[]),
        Fenced::CrChanged => ("cr_changed", &["take"]),
    };
    ctx.metrics.idle_decision(outcome);
    for kind in writes {
        ctx.metrics.idle_write(kind);
    }
}

/// I3: when the next pod turns idle (just after, so the pass sees it passed), a little
/// later for a pod due but in transition, sooner after a failed or fenced write, and at
/// least every [`RESYNC`].
fn requeue_after(plan: &Plan, now: Timestamp, retry: bool) -> Duration {
    if retry {
        return RETRY;
    }
    let until = match plan.next {
        None => RESYNC,
        Some(at) if at <= now => SOONEST,
        Some(at) => Duration::try_from(at.duration_since(now)).map_or(SOONEST, |d| d + PAST_IDLE),
    };
    until.min(RESYNC)
}

fn condition(
    p: &CocoonIdlePolicy,
    type_: &str,
    ok: bool,
    reason: &str,
    message: String,
) -> Condition {
    let status = if ok { "True" } else { "False" };
    let previous = p
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == type_));
    let since = previous.filter(|c| c.status == status).map_or_else(
        || Time(Timestamp::now()),
        |c| c.last_transition_time.clone(),
    );
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: p.metadata.generation,
        last_transition_time: since,
    }
}

/// I5 I6: counts, the next idle instant, Ready, and why wake on request stopped.
fn status(p: &CocoonIdlePolicy, plan: &Plan) -> CocoonIdlePolicyStatus {
    let previous = p.status.clone().unwrap_or_default();
    let ready = if p.spec.suspend {
        condition(
            p,
            "Ready",
            false,
            "Suspended",
            "spec.suspend is set: nothing is written".into(),
        )
    } else {
        condition(
            p,
            "Ready",
            true,
            "Watching",
            format!(
                "{} pods managed, {} left to a person, {} driven by another policy",
                plan.managed, plan.overridden, plan.conflicting
            ),
        )
    };
    let mut conditions = vec![ready];
    if !plan.wake_stopped.is_empty() {
        conditions.push(condition(
            p,
            "WakeOnRequest",
            false,
            "WakesFailed",
            plan.wake_stopped.join("; "),
        ));
    }
    CocoonIdlePolicyStatus {
        observed_generation: p.metadata.generation,
        managed: plan.managed,
        idle: plan.idle,
        awake: plan.awake,
        // The wake proxy's to count.
        held_requests: previous.held_requests,
        // Whole seconds, as the apiserver keeps a Time: a status read back compares equal.
        next_idle: plan
            .next
            .and_then(|t| Timestamp::from_second(t.as_second()).ok())
            .map(Time),
        conditions,
    }
}

fn invalid(p: &CocoonIdlePolicy, message: &str) -> CocoonIdlePolicyStatus {
    let mut st = p.status.clone().unwrap_or_default();
    st.observed_generation = p.metadata.generation;
    st.conditions = vec![condition(
        p,
        "Ready",
        false,
        "InvalidSpec",
        message.to_owned(),
    )];
    st
}

async fn patch_status(
    api: &Api<CocoonIdlePolicy>,
    name: &str,
    st: &CocoonIdlePolicyStatus,
) -> Result<()> {
    let patch = serde_json::json!({ "status": st });
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// I6: `IdleHibernate` once per pod hibernated, on the policy, naming the pod's CR.
/// Queued for [`send_events`], not sent in the pass: sent one after another, they took
/// most of a pass that flipped many pods (11 of 16 s for 98), and pods that turned idle
/// meanwhile waited for the next pass.
async fn publish(ctx: &Context, p: &CocoonIdlePolicy, hibernated: &[String]) {
    let reference = p.object_ref(&());
    let ns = p.namespace();
    for pod in hibernated {
        let ev = Event {
            type_: EventType::Normal,
            reason: "IdleHibernate".into(),
            note: Some(format!(
                "{pod}: idle for {}; hibernating",
                p.spec.idle_after
            )),
            action: "Hibernate".into(),
            // One event per pod: the recorder folds events with one key into a series
            // that keeps the first note, and sends them one at a time.
            secondary: Some(ObjectReference {
                api_version: Some(CocoonHibernation::api_version(&()).into_owned()),
                kind: Some(CocoonHibernation::kind(&()).into_owned()),
                name: Some(pod.clone()),
                namespace: ns.clone(),
                ..ObjectReference::default()
            }),
        };
        if ctx.events.send((ev, reference.clone())).await.is_err() {
            tracing::warn!(policy = %p.name_any(), "event sender gone");
        }
    }
}

/// Sends queued events, [`EVENTS_AT_ONCE`] at a time, until every sender is gone.
async fn send_events(recorder: Recorder, queued: mpsc::Receiver<(Event, ObjectReference)>) {
    let queued = futures::stream::unfold(queued, |mut q| async move {
        q.recv().await.map(|item| (item, q))
    });
    queued
        .for_each_concurrent(EVENTS_AT_ONCE, |(ev, reference)| {
            let recorder = recorder.clone();
            async move {
                if let Err(e) = recorder.publish(&ev, &reference).await {
                    tracing::warn!(reason = %ev.reason, error = %e, "could not publish event");
                }
            }
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::{Request, Response};
    use kube::client::Body;
    use tower_test::mock::{self, Handle};

    type ApiHandle = Handle<Request<Body>, Response<Body>>;

    fn at() -> Timestamp {
        "2026-06-10T12:00:00Z".parse().unwrap()
    }

    async fn answer(
        handle: &mut ApiHandle,
        code: u16,
    ) -> (http::Method, String, serde_json::Value) {
        let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
            .await
            .expect("a request")
            .expect("the client is alive");
        let (method, path) = (req.method().clone(), req.uri().path().to_owned());
        let bytes = req.into_body().collect_bytes().await.unwrap();
        let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        let reply = if code == 409 {
            serde_json::json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure",
                "reason": "Conflict", "code": 409, "message": "the object has been modified" })
        } else {
            serde_json::json!({ "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": { "name": "cocoon-activity-web-0", "resourceVersion": "42" } })
        };
        send.send_response(
            Response::builder()
                .status(code)
                .body(Body::from(serde_json::to_vec(&reply).unwrap()))
                .unwrap(),
        );
        (method, path, body)
    }

    /// SPEC I6 I5: the status shows the plan's counts and next idle instant, keeps the
    /// proxy's held count, and says why wake on request stopped.
    #[test]
    fn i6_status_counts_next_idle_and_wake_stopped() {
        let mut p = CocoonIdlePolicy::new(
            "sleepy",
            crate::idle::CocoonIdlePolicySpec {
                selector: Default::default(),
                idle_after: "30m".into(),
                min_awake: None,
                suspend: false,
                wake_on_request: None,
            },
        );
        p.status = Some(CocoonIdlePolicyStatus {
            held_requests: 4,
            ..Default::default()
        });
        let plan = Plan {
            managed: 3,
            idle: 1,
            awake: 2,
            next: Some(at()),
            wake_stopped: vec!["web-0: 3 wakes in a row ended Failed".into()],
            ..Plan::default()
        };
        let st = status(&p, &plan);
        assert_eq!(
            (st.managed, st.idle, st.awake, st.held_requests),
            (3, 1, 2, 4)
        );
        assert_eq!(st.next_idle, Some(Time(at())));
        let wake = st
            .conditions
            .iter()
            .find(|c| c.type_ == "WakeOnRequest")
            .unwrap();
        assert_eq!(
            (wake.status.as_str(), wake.reason.as_str()),
            ("False", "WakesFailed")
        );
        assert!(wake.message.contains("web-0"));
    }

    /// SPEC I3: the next pass comes just after the soonest idle instant (however soon
    /// after the last pass), a second on for a pod due but in transition, after `RETRY`
    /// when a write failed or was fenced off, and at least every `RESYNC`.
    #[rstest::rstest]
    #[case::i3_just_after_the_next_idle_instant(Some(2_300), false, 2_350)]
    #[case::i3_soon_after_the_last_pass(Some(120), false, 170)]
    #[case::i3_due_but_in_transition(Some(0), false, 1_000)]
    #[case::i3_no_pod_to_wait_for(None, false, 30_000)]
    #[case::i3_far_ahead_resyncs(Some(600_000), false, 30_000)]
    #[case::i3_after_a_fenced_write(Some(2_300), true, 3_000)]
    fn i3_when_the_next_pass_comes(
        #[case] next_in_ms: Option<u64>,
        #[case] retry: bool,
        #[case] after_ms: u64,
    ) {
        let plan = Plan {
            next: next_in_ms.map(|ms| crate::api::activity::later(at(), Duration::from_millis(ms))),
            ..Plan::default()
        };
        assert_eq!(
            requeue_after(&plan, at(), retry),
            Duration::from_millis(after_ms)
        );
    }

    /// SPEC C3 I6: a status read back from the apiserver (times in whole seconds)
    /// compares equal to the one the next pass computes from the same plan, so a pass
    /// that changed nothing writes no status.
    #[test]
    fn c3_i6_an_unchanged_status_reads_back_equal() {
        let mut p = CocoonIdlePolicy::new(
            "sleepy",
            crate::idle::CocoonIdlePolicySpec {
                selector: Default::default(),
                idle_after: "1m".into(),
                min_awake: None,
                suspend: false,
                wake_on_request: None,
            },
        );
        let next: Timestamp = "2026-06-10T12:00:00.734512Z".parse().unwrap();
        let plan = Plan {
            managed: 2,
            awake: 2,
            next: Some(next),
            ..Plan::default()
        };
        let first = status(&p, &plan);
        let stored = serde_json::to_value(&first).unwrap();
        p.status = Some(serde_json::from_value(stored).unwrap());
        assert_eq!(p.status.as_ref(), Some(&status(&p, &plan)));
    }

    /// SPEC I3: the fence. The Lease is taken first, on the version the decision read;
    /// when a report landed in between (409), the CR is never written.
    #[tokio::test]
    async fn i3_a_report_between_read_and_take_flips_nothing() {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "dev");
        let leases: Api<Lease> = Api::namespaced(client.clone(), "dev");
        let crs: Api<CocoonHibernation> = Api::namespaced(client, "dev");
        let call = tokio::spawn(async move {
            hibernate_fenced(&leases, &crs, "web-0", "41", "7", ("sleepy", "u-1"), at()).await
        });
        let (method, path, body) = answer(&mut handle, 409).await;
        assert_eq!(method, http::Method::PATCH);
        assert!(
            path.ends_with("/namespaces/dev/leases/cocoon-activity-web-0"),
            "{path}"
        );
        assert_eq!(body["metadata"]["resourceVersion"], "41");
        let more = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
        assert!(
            !matches!(more, Ok(Some(_))),
            "a CR write went out after the fence failed"
        );
        assert_eq!(call.await.unwrap().unwrap(), Fenced::Activity);
    }

    /// SPEC I3: with the Lease taken, the CR is flipped on the version read.
    #[tokio::test]
    async fn i3_the_take_then_the_flip() {
        let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
        let client = kube::Client::new(service, "dev");
        let leases: Api<Lease> = Api::namespaced(client.clone(), "dev");
        let crs: Api<CocoonHibernation> = Api::namespaced(client, "dev");
        let call = tokio::spawn(async move {
            hibernate_fenced(&leases, &crs, "web-0", "41", "7", ("sleepy", "u-1"), at()).await
        });
        let (_, path, _) = answer(&mut handle, 200).await;
        assert!(path.ends_with("/leases/cocoon-activity-web-0"), "{path}");
        let (method, path, body) = answer(&mut handle, 409).await;
        assert_eq!(method, http::Method::PATCH);
        assert!(path.ends_with("/cocoonhibernations/web-0"), "{path}");
        assert_eq!(body["metadata"]["resourceVersion"], "7");
        assert_eq!(body["spec"]["desire"], "Hibernate");
        assert_eq!(call.await.unwrap().unwrap(), Fenced::CrChanged);
    }
}
