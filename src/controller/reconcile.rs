//! One pass: read the CR and its pod from the cache, plan (probing the registry when the
//! plan asks), then carry the plan out in order: finalizer, pod patch, tag delete and
//! status write, events. Tag deletes live in `tag_delete.rs`, a CR's deletion in `finalizer.rs`.

use super::context::Context;
use super::effects::{
    key, patch_params, progress_reason, publish_after_pass, record_finished, write_status,
};
use super::error_policy::Deferral;
use super::finalizer::cleanup;
use super::plan::{self, Debt, Plan, PodPatch, PodRead, Probe};
use super::selection;
use super::tag_delete::{Attempt, fenced_delete, pay_wake_debt};
use crate::api::annotations::{self, PodView};
use crate::api::pod::PodSlice;
use crate::api::{CocoonHibernation, FINALIZER, Phase};
use crate::error::{Error, Result};
use crate::runtime::finalizers;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::Patch;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use std::sync::Arc;

pub async fn reconcile(cr: Arc<CocoonHibernation>, ctx: Arc<Context>) -> Result<Action> {
    ctx.metrics.reconcile_passes.inc();
    // Debug logs inside a pass name its CR, so one CR's passes can be followed.
    let span = tracing::debug_span!("pass", cr = %key(&cr));
    let action = tracing::Instrument::instrument(reconcile_inner(cr.clone(), &ctx), span).await?;
    ctx.failures
        .lock()
        .remove(&ObjectRef::from_obj(cr.as_ref()));
    Ok(action)
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
    let _guard = ctx.limits.vm(&lock_key).await;

    // Another pass on this VM may have finished while we waited: read again.
    let Some(cr) = ctx.cache.cr(&ns, &name) else {
        return Ok(Action::await_change());
    };
    let cr = ctx.own_write_view(cr);
    let pod = ctx.cache.pod(&ns, &pod_name);
    if pod.as_deref().is_some_and(|p| ctx.pod_behind_own_write(p)) {
        return Ok(ctx.defer(Deferral::OwnPodWrite));
    }
    let view = pod.as_deref().map(PodView::from_pod);
    // R2: a pod the cache lacks may exist outside --pod-selector; it is not missing.
    let read = match &view {
        Some(v) => PodRead::Found(v),
        None if selection::outside_selector(ctx, &ns, &pod_name).await? => PodRead::NotSelected,
        None => PodRead::Missing,
    };
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

    let mut probe = Probe::NotProbed;
    let mut digest = None;
    let mut now = now;
    let plan_on = |view: PodRead<'_>, probe: &Probe, now: &Time, digest: &Option<String>| {
        let mut plan = plan::plan_read(&cr, view, &owner, probe, now.clone(), &ctx.settings);
        plan::record_digest(&mut plan, digest.clone());
        plan
    };
    let mut plan = plan_on(read, &probe, &now, &digest);
    let pods: Api<PodSlice> = Api::namespaced(ctx.client.clone(), &ns);
    // S7's fresh pod read of an ending, when one was made beside the probe.
    let mut read_beside = None;
    if plan.needs_probe {
        let asked = std::time::Instant::now();
        let Some(_slot) = ctx.limits.registry_slot().await else {
            return Ok(ctx.defer(Deferral::RegistryBusy));
        };
        let slot_wait = asked.elapsed();
        // An ending's fresh pod read goes out beside the probe, not after it: neither
        // depends on the other, both come after the cache's view and before any write,
        // and an ending pass holds a worker that the next of vk's answers waits for.
        let may_end = [Probe::Present, Probe::Absent]
            .iter()
            .any(|p| ends_without_delete(&plan_on(read, p, &now, &digest)));
        // The timeouts are judged at the probe's time, after any wait for the slot.
        now = Time(jiff::Timestamp::now());
        let probing = async {
            let probed = ctx
                .registry
                .snapshot_digest(pod_vm.unwrap_or_default())
                .await;
            (probed, asked.elapsed() - slot_wait)
        };
        let reading = async {
            if may_end {
                Some(pods.get_opt(&pod_name).await)
            } else {
                None
            }
        };
        let ((probed, probe_time), fresh) = tokio::join!(probing, reading);
        read_beside = fresh;
        probe = match probed {
            Ok(Some(d)) => {
                digest = Some(d);
                Probe::Present
            }
            Ok(None) => Probe::Absent,
            Err(e) => Probe::Failed(e.to_string()),
        };
        tracing::debug!(
            slot_wait_ms = slot_wait.as_millis(),
            probe_ms = probe_time.as_millis(),
            "probed"
        );
        plan = plan_on(read, &probe, &now, &digest);
    }
    // Two plans are made only on the pod as the apiserver shows it now:
    // - W2: a hibernate request that would replace the VMID recorded for a request already
    //   made. A lagging pod cache shows no request and an older VMID; recorded first, then
    //   refused by the patch's `test`, that VMID would take the place of the one the
    //   earlier request may take away, and a later wake would end on it.
    // - S7, every ending: a transition that ends without a tag delete (whose own fresh read
    //   covers it) ends only if the fresh pod ends it too. A lagging pod cache (a failover,
    //   a relist) may show a round vk has not done.
    let planned_record = plan
        .status
        .as_ref()
        .and_then(|s| s.pre_hibernate_vm_id.as_deref());
    let replaces_record = matches!(plan.pod_patch, Some(PodPatch::SetHibernate))
        && cr.pre_hibernate_vm_id().is_some()
        && planned_record != cr.pre_hibernate_vm_id();
    if replaces_record || ends_without_delete(&plan) {
        let fresh = match read_beside {
            Some(read) => read?,
            None => pods.get_opt(&pod_name).await?,
        };
        let fresh_view = fresh.as_ref().map(PodView::from_pod);
        if fresh_view != view {
            let again = plan_on(fresh_view.as_ref().into(), &probe, &now, &digest);
            if replaces_record {
                tracing::info!(cr = %key(&cr), "fresh read: the pod cache lags a recorded hibernate request");
            } else if again.finished != plan.finished {
                tracing::info!(cr = %key(&cr), "fresh read: the pod does not end the transition yet");
                return Ok(ctx.defer(Deferral::StalePod));
            }
            return execute(&cr, fresh.as_ref(), again, &api, ctx).await;
        }
    }
    execute(&cr, pod.as_deref(), plan, &api, ctx).await
}

/// A transition ends in this plan without a tag delete, whose own fresh reads cover it.
fn ends_without_delete(plan: &Plan) -> bool {
    plan.finished
        .is_some_and(|f| f.ending == plan::Ending::Done)
        && !plan.delete_first
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
                &Patch::Json::<()>(finalizers::add(&cr.metadata, FINALIZER)),
            )
            .await?;
        ctx.wrote(cr, cr, written);
        return Ok(Action::await_change());
    }
    let mut status = plan.status.clone();
    // W2, F2: a hibernate request goes out only once the status that records it (the
    // phase, the VMID its patch tests) is written at the CR's current version; written
    // after it, a 409 would leave a request vk acts on with no record of that VMID.
    let mut recorded = false;
    if matches!(plan.pod_patch, Some(PodPatch::SetHibernate))
        && pod.is_some()
        && !plan.delete_first
        && let Some(first) = status.take()
    {
        let written = write_status(cr, api, &first).await?;
        ctx.wrote(cr, cr, written);
        log_status(cr, &first);
        recorded = true;
    }
    if let (Some(patch), Some(pod)) = (plan.pod_patch, pod) {
        // F2: a 409 on the status write cannot undo a pod patch, and vk acts on it at
        // once, so a transition starts or ends only from the CR's current version (the
        // status write just made proved it, when there was one).
        if !recorded {
            let current = api.get(&name).await?;
            if current.metadata.resource_version != cr.metadata.resource_version {
                return Ok(ctx.defer(Deferral::StaleView));
            }
        }
        let pods: Api<PodSlice> =
            Api::namespaced(ctx.client.clone(), &cr.namespace().unwrap_or_default());
        let json = match patch {
            PodPatch::SetHibernate => annotations::set_hibernate_patch(pod),
            PodPatch::ClearHibernate => annotations::clear_hibernate_patch(pod),
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
        log_status(cr, status);
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

fn log_status(cr: &CocoonHibernation, status: &crate::api::CocoonHibernationStatus) {
    tracing::info!(
        cr = %key(cr),
        phase = status.phase.map(Phase::as_str).unwrap_or("none"),
        reason = progress_reason(status),
        "status updated"
    );
}
