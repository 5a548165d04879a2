//! The thin async layer: fetch what a plan needs, carry out what it says.

use super::locks::VmLocks;
use super::plan::{
    self, Cleanup, Debt, DeleteResult, EventKind, Plan, PlannedEvent, PodPatch, Probe, Settings,
};
use crate::api::annotations::{self, PodView};
use crate::api::pod::PodSlice;
use crate::api::{CocoonHibernation, FINALIZER, Phase};
use crate::cache::SharedCache;
use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::registry::{DeleteOutcome, RegistryError, SnapshotStore};
use json_patch::{AddOperation, PatchOperation, ReplaceOperation, TestOperation};
use jsonptr::PointerBuf;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType, Recorder};
use kube::runtime::reflector::ObjectRef;
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::{Value, json};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

pub struct Context {
    pub client: Client,
    pub cache: SharedCache,
    pub registry: Arc<dyn SnapshotStore>,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub settings: Settings,
    pub locks: VmLocks,
    /// Consecutive failures per CR, for error backoff.
    pub failures: Mutex<HashMap<ObjectRef<CocoonHibernation>, u32>>,
    /// S1: tag deletes run only while this replica's lease is fresh.
    pub fence: crate::leader::Fence,
    /// C2: registry calls hold fewer slots than there are workers, so a slow registry
    /// never holds every worker; a pass waits for one briefly, then requeues.
    pub registry_slots: Arc<Semaphore>,
    /// Event writes sent after their pass ended, still in flight.
    pub event_slots: Arc<Semaphore>,
    /// S5: consecutive refusals-for-good of each CR's tag delete, for the slow backoff.
    /// Kept apart from `failures`, which a pass that returns Ok clears.
    pub refusals: Mutex<HashMap<ObjectRef<CocoonHibernation>, u32>>,
    /// What this process last wrote to each CR, as the apiserver answered, and the
    /// resourceVersions that write left behind. A pass that finds the cache at one of them
    /// plans from the answer instead: it never acts on a view older than its own write,
    /// and never waits for the watch to bring that write back.
    pub superseded: Mutex<HashMap<ObjectRef<CocoonHibernation>, OwnWrite>>,
    /// The same for pods (namespace, name): a pass that finds the pod cache still at the
    /// version our annotation patch replaced would send that patch again.
    pub superseded_pods: Mutex<HashMap<(String, String), String>>,
}

/// Event writes that may be in flight after their passes ended.
pub const EVENTS_IN_FLIGHT: usize = 64;

/// How soon a pass deferred because the pod cache has not seen our own patch looks
/// again; the watch event of that patch usually comes first.
const OWN_WRITE_RETRY: Duration = Duration::from_secs(1);
/// S7: how soon a delete that the fresh pod refused (the cache showed the VM running, the
/// apiserver does not) looks again; the pod watch usually catches up first.
const STALE_POD_RETRY: Duration = Duration::from_secs(2);

/// A CR as our last write left it (see `Context::superseded`).
pub struct OwnWrite {
    written: Arc<CocoonHibernation>,
    /// Versions older than `written` that the cache may still hold.
    behind: HashSet<String>,
}
/// A conflict is retried at once: the next pass reads what the cache holds by then.
const CONFLICT_RETRY: Duration = Duration::from_millis(200);

/// S1: the last registry request leaves this long before the fence closes.
const FENCE_SLACK: Duration = Duration::from_millis(500);
/// C2: how long a pass waits, holding its worker, for a registry slot (slots are served
/// in order); then it gives the worker up and looks again after `REGISTRY_BUSY_RETRY`.
const REGISTRY_SLOT_WAIT: Duration = Duration::from_millis(250);
/// How soon a pass that found every registry slot busy tries again.
const REGISTRY_BUSY_RETRY: Duration = Duration::from_secs(1);
/// S5: a kept (shared-digest) tag is looked at again this rarely.
const SHARED_DIGEST_RETRY: Duration = Duration::from_secs(600);

const FIELD_MANAGER: &str = "cocoon-hibernation";

fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

pub async fn reconcile(cr: Arc<CocoonHibernation>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconcile_passes.inc();
    // Debug logs inside a pass name its CR, so one CR's passes can be followed.
    let span = tracing::debug_span!("pass", cr = %key(&cr));
    let action = tracing::Instrument::instrument(reconcile_inner(cr.clone(), &ctx), span).await?;
    if let Ok(mut f) = ctx.failures.lock() {
        f.remove(&ObjectRef::from_obj(cr.as_ref()));
    }
    Ok(action)
}

/// Logs, counts and retries with a capped exponential backoff. The cap keeps timeouts
/// (H5, W4) detected promptly while the registry keeps failing (H4).
pub fn error_policy(cr: Arc<CocoonHibernation>, err: &Error, ctx: Arc<Context>) -> Action {
    let attempts = match ctx.failures.lock() {
        Ok(mut f) => {
            let n = f.entry(ObjectRef::from_obj(cr.as_ref())).or_insert(0);
            *n = n.saturating_add(1);
            *n
        }
        Err(_) => 1,
    };
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
    if matches!(err.metric_label(), "conflict" | "precondition") {
        return Action::requeue(CONFLICT_RETRY);
    }
    let delay = Duration::from_millis(500u64.saturating_mul(1 << attempts.min(5)));
    Action::requeue(delay.min(Duration::from_secs(10)))
}

async fn reconcile_inner(cr: Arc<CocoonHibernation>, ctx: &Context) -> Result<Action> {
    let ns = cr.namespace().unwrap_or_default();
    let name = cr.name_any();
    let api: Api<CocoonHibernation> = Api::namespaced(ctx.client.clone(), &ns);

    if cr.is_deleting() {
        return cleanup(&cr, &api, ctx).await;
    }

    let pod_name = cr.spec.pod_ref.name.clone();
    let lock_key = ctx
        .cache
        .pod(&ns, &pod_name)
        .and_then(|p| PodView::from_pod(&p).vm_name)
        .or_else(|| cr.vm_name().map(str::to_owned))
        .unwrap_or_else(|| format!("pod:{ns}/{pod_name}"));
    let _guard = ctx.locks.lock(&lock_key).await;

    // Another pass on this VM may have finished while we waited: read again.
    let Some(cr) = ctx.cache.cr(&ns, &name) else {
        return Ok(Action::await_change());
    };
    let cr = ctx.own_write_view(cr);
    let pod = ctx.cache.pod(&ns, &pod_name);
    if pod.as_deref().is_some_and(|p| ctx.pod_behind_own_write(p)) {
        return Ok(ctx.defer("own_pod_write", OWN_WRITE_RETRY));
    }
    let view = pod.as_deref().map(PodView::from_pod);
    let now = Time(jiff::Timestamp::now());
    let pod_vm = view.as_ref().and_then(|v| v.vm_name.as_deref());
    let same_pod = ctx.cache.crs_for_pod(&ns, &pod_name);
    let vm_holders = pod_vm
        .map(|vm| ctx.cache.crs_holding_vm(vm))
        .unwrap_or_default();
    let owner = plan::ownership(
        &cr,
        pod_vm,
        same_pod.iter().map(Arc::as_ref),
        vm_holders.iter().map(Arc::as_ref),
    );

    let mut plan = plan::plan(
        &cr,
        view.as_ref(),
        &owner,
        &Probe::NotProbed,
        now,
        &ctx.settings,
    );
    if plan.needs_probe {
        let asked = std::time::Instant::now();
        let Some(_slot) = ctx.registry_slot().await else {
            return Ok(ctx.defer("registry_busy", REGISTRY_BUSY_RETRY));
        };
        let slot_wait = asked.elapsed();
        // The timeouts are judged at the probe's time, after any wait for the slot.
        let now = Time(jiff::Timestamp::now());
        let mut digest = None;
        let probe = match ctx
            .registry
            .snapshot_digest(pod_vm.unwrap_or_default())
            .await
        {
            Ok(Some(d)) => {
                digest = Some(d);
                Probe::Present
            }
            Ok(None) => Probe::Absent,
            Err(e) => Probe::Failed(e.to_string()),
        };
        tracing::debug!(
            slot_wait_ms = slot_wait.as_millis(),
            probe_ms = (asked.elapsed() - slot_wait).as_millis(),
            "probed"
        );
        plan = plan::plan(&cr, view.as_ref(), &owner, &probe, now, &ctx.settings);
        plan::record_digest(&mut plan, digest);
    }
    execute(&cr, pod.as_deref(), plan, &api, ctx).await
}

async fn execute(
    cr: &CocoonHibernation,
    pod: Option<&PodSlice>,
    plan: Plan,
    api: &Api<CocoonHibernation>,
    ctx: &Context,
) -> Result<Action> {
    let name = cr.name_any();
    if plan.add_finalizer {
        // R1: the pass that adds the finalizer ends there.
        let written = api
            .patch(
                &name,
                &patch_params(),
                &Patch::Json::<()>(add_finalizer_patch(cr)),
            )
            .await?;
        ctx.wrote(cr, cr, written);
        return Ok(Action::await_change());
    }
    if let (Some(patch), Some(pod)) = (plan.pod_patch, pod) {
        // F2: a 409 on the status write cannot undo a pod patch, and vk acts on it at
        // once, so a transition starts or ends only from the CR's current version.
        let current = api.get(&name).await?;
        if current.metadata.resource_version != cr.metadata.resource_version {
            return Ok(ctx.defer("stale_view", CONFLICT_RETRY));
        }
        let pods: Api<PodSlice> =
            Api::namespaced(ctx.client.clone(), &cr.namespace().unwrap_or_default());
        let json = match patch {
            PodPatch::SetHibernate => annotations::set_hibernate_patch(&pod.metadata),
            PodPatch::ClearHibernate => annotations::clear_hibernate_patch(&pod.metadata),
        };
        let patched = pods
            .patch(&pod.name_any(), &patch_params(), &Patch::Json::<()>(json))
            .await?;
        ctx.wrote_pod(pod, &patched);
        tracing::info!(
            cr = %key(cr),
            pod = pod.name_any(),
            patch = match patch {
                PodPatch::SetHibernate => "set vm.cocoonstack.io/hibernate",
                PodPatch::ClearHibernate => "removed vm.cocoonstack.io/hibernate",
            },
            "patched pod annotation"
        );
    }
    // W2: a wake ends with the delete first, then one status write recording it.
    let mut after_write = None;
    let mut status_base = cr;
    let fresh_holder;
    let mut status = plan.status.clone();
    if plan.delete_first
        && let (Some(vm), Some(planned)) = (&plan.delete_tag, status.as_mut())
    {
        let probed = plan.probed_digest.as_deref();
        match fenced_delete(cr, vm, Debt::EndOfWake, probed, api, ctx).await? {
            // The CR is as planned, but the tag is not its to delete (its pod names another
            // VM now): the wake still ends, and nothing is owed.
            Attempt::NotOwed => planned
                .conditions
                .retain(|c| c.type_ != crate::api::conditions::SNAPSHOT_DELETED),
            Attempt::Deferred(action) => return Ok(action),
            Attempt::Done {
                fresh,
                result,
                then,
            } => {
                *planned = plan::after_delete(planned, vm, &result, Time(jiff::Timestamp::now()));
                fresh_holder = fresh;
                // The fresh read's resourceVersion guards the write.
                status_base = &fresh_holder;
                after_write = then;
            }
        }
    }
    if let Some(status) = &status {
        let written = write_status(status_base, api, status).await?;
        ctx.wrote(cr, status_base, written);
        tracing::info!(
            cr = %key(cr),
            phase = status.phase.map(Phase::as_str).unwrap_or("none"),
            reason = progress_reason(status),
            "status updated"
        );
    }
    // Recorded before the events are sent: the terminal status is already visible.
    if let Some(done) = plan.finished {
        record_finished(ctx, cr, done);
    }
    publish_after_pass(ctx, cr, &plan.events).await;
    if let Some(then) = after_write {
        return then;
    }
    if let (Some(vm), false) = (&plan.delete_tag, plan.delete_first) {
        // W3: a failed delete is recorded and retried on later passes of the settled CR.
        if let Some(action) = pay_wake_debt(cr, vm, api, ctx).await? {
            return Ok(action);
        }
    }
    if let Some(e) = plan.error {
        return Err(Error::Probe(e));
    }
    Ok(plan
        .requeue
        .map(Action::requeue)
        .unwrap_or_else(Action::await_change))
}

/// `namespace/name`, as every log line names a CR.
fn key(cr: &CocoonHibernation) -> String {
    format!("{}/{}", cr.namespace().unwrap_or_default(), cr.name_any())
}

fn progress_reason(status: &crate::api::CocoonHibernationStatus) -> &str {
    crate::api::conditions::find(&status.conditions, crate::api::conditions::PROGRESSING)
        .map(|c| c.reason.as_str())
        .unwrap_or("")
}

/// Phase duration, and the reaction time from the pod change that completed it.
fn record_finished(ctx: &Context, cr: &CocoonHibernation, done: plan::Finished) {
    let transition = done.transition;
    ctx.metrics
        .phase_done(transition, done.ending, done.seconds);
    if done.ending == plan::Ending::Done
        && let Some(at) = ctx
            .cache
            .pod_changed_at(&cr.namespace().unwrap_or_default(), &cr.spec.pod_ref.name)
    {
        ctx.metrics.reaction(transition, at.elapsed().as_secs_f64());
    }
}

/// How a delete attempt ended (S1, S5, S7); every caller matches this one enum.
enum Attempt {
    /// Nothing was asked of the registry; end the pass with this and look again.
    Deferred(Action),
    /// The fresh read shows the delete is no longer owed; the tag is kept.
    NotOwed,
    /// The registry was asked. `result` goes into status (S5); `then` ends the pass once
    /// the status is written, when the outcome calls for it.
    Done {
        fresh: Box<CocoonHibernation>,
        result: DeleteResult,
        then: Option<Result<Action>>,
    },
}

/// S1, S5, S6, S7: a tag is deleted only while this replica's lease is fresh; after fresh
/// reads of the CR and its pod from the apiserver show the delete still owed; only the
/// manifest this CR confirmed; loudly when it may be the VM's only copy; and never past
/// the fence. Returns what the outcome asks of the pass. `probed` is the digest this
/// pass's own probe saw, for a CR that recorded none at H3.
async fn fenced_delete(
    cr: &CocoonHibernation,
    vm: &str,
    debt: Debt,
    probed: Option<&str>,
    api: &Api<CocoonHibernation>,
    ctx: &Context,
) -> Result<Attempt> {
    let until = ctx.fence.valid_until().ok_or_else(|| fence_closed(vm))?;
    let Some(_slot) = ctx.registry_slot().await else {
        return Ok(Attempt::Deferred(
            ctx.defer("registry_busy", REGISTRY_BUSY_RETRY),
        ));
    };
    let fresh = match api.get_opt(&cr.name_any()).await? {
        // F2, D1: the end of a wake writes a status planned from `cr`; a newer CR (a flipped
        // desire, a timeout) needs a new plan before anything is deleted.
        Some(fresh)
            if debt == Debt::EndOfWake
                && fresh.metadata.resource_version != cr.metadata.resource_version =>
        {
            return Ok(Attempt::Deferred(ctx.defer("stale_view", CONFLICT_RETRY)));
        }
        Some(fresh) if plan::still_owes(&fresh, cr.metadata.uid.as_deref(), vm, debt) => fresh,
        _ => {
            tracing::info!(
                cr = %key(cr),
                vm,
                ?debt,
                "fresh read: the delete is no longer owed; tag kept"
            );
            return Ok(Attempt::NotOwed);
        }
    };
    // S7: the pod too, from the apiserver: a lagging pod cache may still show the VM
    // running from before its hibernate while vk restores it from this very tag.
    let pods: Api<PodSlice> =
        Api::namespaced(ctx.client.clone(), &fresh.namespace().unwrap_or_default());
    let pod = pods.get_opt(&fresh.spec.pod_ref.name).await?;
    let view = pod.as_ref().map(PodView::from_pod);
    if debt != Debt::OnDeletion && !plan::vm_running_again(view.as_ref(), vm) {
        tracing::info!(
            cr = %key(cr),
            vm,
            ?debt,
            "fresh read: the pod does not show the VM running again; tag kept"
        );
        return Ok(Attempt::Deferred(ctx.defer("stale_pod", STALE_POD_RETRY)));
    }
    let (confirmed, outcome) =
        delete_confirmed(&fresh, vm, debt, probed, view.as_ref(), until, ctx).await?;
    let result = match &outcome {
        Ok(DeleteOutcome::Deleted | DeleteOutcome::Absent) => DeleteResult::Gone,
        Ok(DeleteOutcome::KeptSharedDigest { other_tags }) => {
            DeleteResult::SharedDigest(other_tags.clone())
        }
        Ok(DeleteOutcome::Moved { found }) => DeleteResult::Moved {
            confirmed: confirmed.unwrap_or_default(),
            found: found.clone(),
        },
        Err(e) => DeleteResult::Failed {
            message: e.to_string(),
        },
    };
    tracing::info!(
        cr = %key(cr),
        vm,
        ?result,
        ?debt,
        "snapshot tag delete"
    );
    let then = match (&result, outcome) {
        (DeleteResult::SharedDigest(_), _) => Some(Ok(Action::requeue(SHARED_DIGEST_RETRY))),
        (_, Err(e)) if e.is_permanent() => {
            // S5: a refusal that will not heal by itself is retried in minutes, not seconds.
            let delay = ctx.permanent_backoff(cr);
            tracing::warn!(cr = %key(cr), vm, error = %e, retry_in = ?delay, "the registry refuses the tag delete; retrying later");
            Some(Ok(Action::requeue(delay)))
        }
        (_, Err(e)) => Some(Err(Error::Registry(e))),
        (_, Ok(_)) => {
            ctx.forget_refusals(cr);
            None
        }
    };
    Ok(Attempt::Done {
        fresh: Box::new(fresh),
        result,
        then,
    })
}

/// S1: the lease is not fresh, so the tag stays.
fn fence_closed(vm: &str) -> Error {
    Error::Fenced(format!("the lease is not fresh; kept {vm}:hibernate"))
}

/// S6, S7: asks the registry to delete the manifest `fresh` confirmed (H3's probe, or its
/// own probe just now when it recorded none), saying so first when it may be the VM's
/// only copy. Returns that digest (None when there was no tag) and the registry's answer.
/// A deletion always probes: S6 warns only about a tag that exists.
async fn delete_confirmed(
    fresh: &CocoonHibernation,
    vm: &str,
    debt: Debt,
    probed: Option<&str>,
    pod: Option<&PodView>,
    until: tokio::time::Instant,
    ctx: &Context,
) -> Result<(
    Option<String>,
    std::result::Result<DeleteOutcome, RegistryError>,
)> {
    let recorded = fresh
        .status
        .as_ref()
        .and_then(|s| s.snapshot.as_ref())
        .and_then(|s| s.digest.clone())
        .or_else(|| probed.map(str::to_owned));
    let seen = match (&recorded, debt) {
        (Some(d), Debt::EndOfWake | Debt::AfterWake) => Some(d.clone()),
        _ => match ctx.registry.snapshot_digest(vm).await {
            Ok(seen) => seen,
            Err(e) => return Ok((recorded, Err(e))),
        },
    };
    let Some(seen) = seen else {
        return Ok((None, Ok(DeleteOutcome::Absent)));
    };
    let digest = recorded.unwrap_or_else(|| seen.clone());
    if digest != seen {
        return Ok((Some(digest), Ok(DeleteOutcome::Moved { found: seen })));
    }
    if debt == Debt::OnDeletion
        && let Some(ev) = plan::discard_event(fresh, vm, pod, true)
    {
        // S6: if the warning cannot be written, nothing is deleted.
        if let Err(e) = ctx
            .recorder
            .publish(&event(&ev), &fresh.object_ref(&()))
            .await
        {
            tracing::warn!(cr = %key(fresh), vm, error = %e, "could not write SnapshotDiscarded; tag kept");
            return Err(e.into());
        }
    }
    // The fence may have moved while we read; the delete must end before it closes.
    let until = ctx
        .fence
        .valid_until()
        .map(|u| u.min(until))
        .ok_or_else(|| fence_closed(vm))?;
    // The registry may still carry out a DELETE it already received, so the last one
    // must leave before the fence closes, not at that instant.
    let outcome = ctx
        .registry
        .delete_snapshot_before(vm, &digest, until - FENCE_SLACK)
        .await;
    Ok((Some(digest), outcome))
}

/// W3 with S1 and S5: delete the settled CR's old tag, then record what happened.
/// Returns an action when the pass should end differently from its plan.
async fn pay_wake_debt(
    cr: &CocoonHibernation,
    vm: &str,
    api: &Api<CocoonHibernation>,
    ctx: &Context,
) -> Result<Option<Action>> {
    let (fresh, result, then) = match fenced_delete(cr, vm, Debt::AfterWake, None, api, ctx).await?
    {
        Attempt::Deferred(action) => return Ok(Some(action)),
        Attempt::NotOwed => return Ok(None),
        Attempt::Done {
            fresh,
            result,
            then,
        } => (fresh, result, then),
    };
    // Recorded on top of what the apiserver holds now, not the cache's copy.
    let written = fresh.status.clone().unwrap_or_default();
    let next = plan::after_delete(&written, vm, &result, Time(jiff::Timestamp::now()));
    if next != written {
        let written = write_status(&fresh, api, &next).await?;
        ctx.wrote(cr, &fresh, written);
    }
    then.transpose()
}

impl Context {
    /// A registry slot, if one frees up within `REGISTRY_SLOT_WAIT` (C2): a stalled
    /// registry holds no worker beyond the slots' own for longer than that.
    async fn registry_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let slot = self.registry_slots.clone().acquire_owned();
        tokio::time::timeout(REGISTRY_SLOT_WAIT, slot)
            .await
            .ok()?
            .ok()
    }

    /// Ends a pass early, to look again after `delay`; counted by `reason`.
    fn defer(&self, reason: &'static str, delay: Duration) -> Action {
        self.metrics.deferral(reason);
        tracing::debug!(reason, ?delay, "pass deferred");
        Action::requeue(delay)
    }

    /// Notes that `cached` (the cache's view) and `base` (the version the write was made
    /// against, a fresh read when there was one) were superseded by our write, which the
    /// apiserver answered with `written`.
    fn wrote(
        &self,
        cached: &CocoonHibernation,
        base: &CocoonHibernation,
        written: CocoonHibernation,
    ) {
        let Ok(mut map) = self.superseded.lock() else {
            return;
        };
        let key = ObjectRef::from_obj(base);
        if written.metadata.resource_version == base.metadata.resource_version {
            // A write that changed nothing leaves every view as new as it was.
            return;
        }
        let mut behind = map.remove(&key).map(|w| w.behind).unwrap_or_default();
        behind.extend(cached.metadata.resource_version.clone());
        behind.extend(base.metadata.resource_version.clone());
        let written = Arc::new(written);
        map.insert(key, OwnWrite { written, behind });
    }

    /// The CR to plan from: the cache's, unless it still holds a version our own last
    /// write replaced; then that write's answer.
    pub(super) fn own_write_view(&self, cached: Arc<CocoonHibernation>) -> Arc<CocoonHibernation> {
        let Ok(mut map) = self.superseded.lock() else {
            return cached;
        };
        let key = ObjectRef::from_obj(cached.as_ref());
        let Some(own) = map.get(&key) else {
            return cached;
        };
        match &cached.metadata.resource_version {
            Some(rv) if own.behind.contains(rv) => own.written.clone(),
            // Caught up, or moved on past our write: the cache is as new as we know.
            _ => {
                map.remove(&key);
                cached
            }
        }
    }

    /// Notes that `pod`, as the cache held it, was superseded by our patch. A patch that
    /// changed nothing keeps the resourceVersion, and no event would ever move past it.
    fn wrote_pod(&self, pod: &PodSlice, patched: &PodSlice) {
        let (Some(old), Ok(mut map)) =
            (&pod.metadata.resource_version, self.superseded_pods.lock())
        else {
            return;
        };
        if patched.metadata.resource_version.as_ref() != Some(old) {
            let key = (pod.namespace().unwrap_or_default(), pod.name_any());
            map.insert(key, old.clone());
        }
    }

    /// True while the pod cache still holds the version our last patch replaced.
    fn pod_behind_own_write(&self, pod: &PodSlice) -> bool {
        let Ok(mut map) = self.superseded_pods.lock() else {
            return false;
        };
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        match map.get(&key) {
            Some(rv) if pod.metadata.resource_version.as_ref() == Some(rv) => true,
            Some(_) => {
                map.remove(&key);
                false
            }
            None => false,
        }
    }

    /// S5: a delete that went through ends the slow backoff of earlier refusals.
    fn forget_refusals(&self, cr: &CocoonHibernation) {
        if let Ok(mut refusals) = self.refusals.lock() {
            refusals.remove(&ObjectRef::from_obj(cr));
        }
    }

    fn permanent_backoff(&self, cr: &CocoonHibernation) -> Duration {
        let attempts = match self.refusals.lock() {
            Ok(mut f) => {
                let n = f.entry(ObjectRef::from_obj(cr)).or_insert(0);
                *n = n.saturating_add(1);
                *n
            }
            Err(_) => 1,
        };
        refusal_backoff(attempts, self.settings.refused_delete_backoff)
    }
}

/// S5: with the default base of a minute, 1, 2, 4, 8 minutes, then every 10 minutes.
fn refusal_backoff(attempts: u32, base: Duration) -> Duration {
    let doublings = attempts.clamp(1, 5) - 1;
    base.saturating_mul(1 << doublings)
        .min(base.saturating_mul(10))
}

/// Status goes to the status subresource; the resourceVersion makes a write based on a
/// stale cache fail with a conflict instead of overwriting newer state.
async fn write_status(
    cr: &CocoonHibernation,
    api: &Api<CocoonHibernation>,
    status: &crate::api::CocoonHibernationStatus,
) -> Result<CocoonHibernation> {
    let mut body = json!({ "status": status });
    // A merge patch keeps what it omits: a cleared snapshot must be sent as null.
    if status.snapshot.is_none() {
        body["status"]["snapshot"] = Value::Null;
    }
    if let Some(rv) = &cr.metadata.resource_version {
        body["metadata"] = json!({ "resourceVersion": rv });
    }
    Ok(api
        .patch_status(&cr.name_any(), &patch_params(), &Patch::Merge(body))
        .await?)
}

/// Sends a finished pass's events without holding its worker: an event write took about
/// a third of a hibernate's last pass under load. Up to `EVENTS_IN_FLIGHT` go out in the
/// background, beyond that inline, so a slow apiserver slows passes down instead of
/// piling up tasks.
async fn publish_after_pass(ctx: &Context, cr: &CocoonHibernation, events: &[PlannedEvent]) {
    if events.is_empty() {
        return;
    }
    let (recorder, reference, cr_key) = (ctx.recorder.clone(), cr.object_ref(&()), key(cr));
    let events = events.to_vec();
    let send = async move {
        for ev in events {
            send_event(&recorder, &reference, &cr_key, &ev).await;
        }
    };
    match ctx.event_slots.clone().try_acquire_owned() {
        Ok(slot) => drop(tokio::spawn(async move {
            send.await;
            drop(slot);
        })),
        Err(_) => send.await,
    }
}

async fn send_event(
    recorder: &Recorder,
    reference: &ObjectReference,
    cr_key: &str,
    ev: &PlannedEvent,
) {
    // An event that cannot be written must not undo or repeat the pass.
    if let Err(e) = recorder.publish(&event(ev), reference).await {
        tracing::warn!(cr = %cr_key, reason = ev.reason, error = %e, "could not publish event");
    }
}

fn event(ev: &PlannedEvent) -> Event {
    Event {
        type_: match ev.kind {
            EventKind::Normal => EventType::Normal,
            EventKind::Warning => EventType::Warning,
        },
        reason: ev.reason.to_owned(),
        note: Some(ev.note.clone()),
        action: "Reconcile".to_owned(),
        secondary: None,
    }
}

/// G1, G2, S6: delete the tag unless another live CR holds the VM, saying so first when
/// it may be the VM's only copy; never block the finalizer on the registry.
async fn cleanup(
    cr: &CocoonHibernation,
    api: &Api<CocoonHibernation>,
    ctx: &Context,
) -> Result<Action> {
    let ns = cr.namespace().unwrap_or_default();
    let name = cr.name_any();
    let lock_key = cr
        .vm_name()
        .map(str::to_owned)
        .unwrap_or_else(|| format!("pod:{ns}/{}", cr.spec.pod_ref.name));
    let _guard = ctx.locks.lock(&lock_key).await;
    let cr = ctx
        .cache
        .cr(&ns, &name)
        .map(|c| (*c).clone())
        .unwrap_or_else(|| cr.clone());
    let mut others = ctx.cache.crs_for_pod(&ns, &cr.spec.pod_ref.name);
    let mut claimants = Vec::new();
    if let Some(vm) = cr.vm_name() {
        others.extend(ctx.cache.crs_holding_vm(vm));
        claimants = ctx.cache.crs_on_pods_naming(vm);
    }
    let Cleanup {
        delete_tag,
        remove_finalizer,
    } = plan::plan_cleanup(
        &cr,
        others.iter().map(Arc::as_ref),
        claimants.iter().map(Arc::as_ref),
    );
    if let Some(vm) = delete_tag {
        match fenced_delete(&cr, &vm, Debt::OnDeletion, None, api, ctx).await? {
            Attempt::Deferred(action) => return Ok(action),
            Attempt::NotOwed => {}
            Attempt::Done { result, .. } => match result {
                DeleteResult::Failed { message } => {
                    tracing::error!(cr = %key(&cr), vm, error = message, "snapshot tag cleanup failed; removing finalizer anyway")
                }
                DeleteResult::Gone => {
                    tracing::info!(cr = %key(&cr), vm, "snapshot tag cleaned up on deletion")
                }
                kept => tracing::warn!(cr = %key(&cr), vm, ?kept, "snapshot tag kept"),
            },
        }
    } else if let Some(vm) = cr.vm_name() {
        tracing::info!(
            cr = %key(&cr),
            vm,
            "snapshot tag kept: another CocoonHibernation holds the VM"
        );
    }
    if remove_finalizer {
        // The finalizer goes from the CR as the apiserver holds it now, and only from the
        // same object: a CR recreated under the name keeps its own.
        let Some(fresh) = api.get_opt(&name).await? else {
            return Ok(Action::await_change());
        };
        if fresh.metadata.uid != cr.metadata.uid || !fresh.has_finalizer() {
            return Ok(Action::await_change());
        }
        api.patch(
            &name,
            &patch_params(),
            &Patch::Json::<()>(remove_finalizer_patch(&fresh)),
        )
        .await?;
        if let Ok(mut map) = ctx.superseded.lock() {
            map.remove(&ObjectRef::from_obj(&cr));
        }
    }
    Ok(Action::await_change())
}

fn finalizers_pointer() -> PointerBuf {
    PointerBuf::from_tokens(["metadata", "finalizers"])
}

/// Adds our finalizer without clobbering a concurrent change to the list.
pub fn add_finalizer_patch(cr: &CocoonHibernation) -> json_patch::Patch {
    match &cr.metadata.finalizers {
        Some(list) => json_patch::Patch(vec![
            PatchOperation::Test(TestOperation {
                path: finalizers_pointer(),
                value: json!(list),
            }),
            PatchOperation::Add(AddOperation {
                path: PointerBuf::from_tokens(["metadata", "finalizers", "-"]),
                value: Value::String(FINALIZER.to_owned()),
            }),
        ]),
        None => {
            let mut ops = Vec::new();
            if let Some(rv) = &cr.metadata.resource_version {
                ops.push(PatchOperation::Test(TestOperation {
                    path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
                    value: Value::String(rv.clone()),
                }));
            }
            ops.push(PatchOperation::Add(AddOperation {
                path: finalizers_pointer(),
                value: json!([FINALIZER]),
            }));
            json_patch::Patch(ops)
        }
    }
}

/// Removes our finalizer, keeping any others, only if the object and its list are what
/// we saw.
pub fn remove_finalizer_patch(cr: &CocoonHibernation) -> json_patch::Patch {
    let current = cr.metadata.finalizers.clone().unwrap_or_default();
    let kept: Vec<&String> = current.iter().filter(|f| *f != FINALIZER).collect();
    let uid = cr.metadata.uid.iter().map(|uid| {
        PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "uid"]),
            value: Value::String(uid.clone()),
        })
    });
    json_patch::Patch(
        uid.chain([
            PatchOperation::Test(TestOperation {
                path: finalizers_pointer(),
                value: json!(current),
            }),
            PatchOperation::Replace(ReplaceOperation {
                path: finalizers_pointer(),
                value: json!(kept),
            }),
        ])
        .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CocoonHibernationSpec, Desire, PodRef};

    fn cr(finalizers: Option<Vec<&str>>) -> CocoonHibernation {
        let mut cr = CocoonHibernation::new(
            "p",
            CocoonHibernationSpec {
                pod_ref: PodRef { name: "p".into() },
                desire: Desire::Hibernate,
                hibernate_timeout: None,
                wake_timeout: None,
            },
        );
        cr.metadata.resource_version = Some("5".into());
        cr.metadata.finalizers = finalizers.map(|f| f.into_iter().map(str::to_owned).collect());
        cr
    }

    /// SPEC R1.
    #[test]
    fn r1_finalizer_patch_appends_and_keeps_others() {
        let c = cr(Some(vec!["other/finalizer"]));
        let mut doc = serde_json::to_value(&c).unwrap();
        json_patch::patch(&mut doc, &add_finalizer_patch(&c).0).unwrap();
        assert_eq!(
            doc["metadata"]["finalizers"],
            json!(["other/finalizer", FINALIZER])
        );
        // A concurrent change to the list makes the patch fail instead of clobbering it.
        let mut changed = serde_json::to_value(cr(Some(vec!["x", "y"]))).unwrap();
        assert!(json_patch::patch(&mut changed, &add_finalizer_patch(&c).0).is_err());
    }

    /// SPEC R1.
    #[test]
    fn r1_finalizer_patch_creates_the_list() {
        let c = cr(None);
        let mut doc = serde_json::to_value(&c).unwrap();
        json_patch::patch(&mut doc, &add_finalizer_patch(&c).0).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!([FINALIZER]));
    }

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

    /// SPEC G2.
    #[test]
    fn g2_finalizer_removal_keeps_other_finalizers() {
        let c = cr(Some(vec!["a", FINALIZER, "b"]));
        let mut doc = serde_json::to_value(&c).unwrap();
        json_patch::patch(&mut doc, &remove_finalizer_patch(&c).0).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
    }
}
