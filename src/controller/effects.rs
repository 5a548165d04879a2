//! The writes a pass makes besides pod patches and deletes: status, events, metrics of a
//! finished transition, and the field manager they all carry.

use super::context::Context;
use super::plan::{self, EventKind, PlannedEvent};
use crate::api::CocoonHibernation;
use crate::error::Result;
use crate::runtime::events::{Event, EventType, Recorder};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};
use serde_json::{Value, json};

const FIELD_MANAGER: &str = "cocoon-hibernation";

pub(super) fn patch_params() -> PatchParams {
    PatchParams {
        field_manager: Some(FIELD_MANAGER.to_owned()),
        ..PatchParams::default()
    }
}

/// `namespace/name`, as every log line names a CR.
pub(super) fn key(cr: &CocoonHibernation) -> String {
    format!("{}/{}", cr.namespace().unwrap_or_default(), cr.name_any())
}

pub(super) fn progress_reason(status: &crate::api::CocoonHibernationStatus) -> &str {
    crate::api::conditions::find(&status.conditions, crate::api::conditions::PROGRESSING)
        .map(|c| c.reason.as_str())
        .unwrap_or("")
}

/// Phase duration, and the reaction time from the pod change that completed it.
pub(super) fn record_finished(ctx: &Context, cr: &CocoonHibernation, done: plan::Finished) {
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

/// Status goes to the status subresource; the resourceVersion makes a write based on a
/// stale cache fail with a conflict instead of overwriting newer state.
pub(super) async fn write_status(
    cr: &CocoonHibernation,
    api: &Api<CocoonHibernation>,
    status: &crate::api::CocoonHibernationStatus,
) -> Result<CocoonHibernation> {
    let mut body = json!({ "status": status });
    // A merge patch keeps what it omits: a cleared snapshot must be sent as null.
    if status.snapshot.is_none() {
        body["status"]["snapshot"] = Value::Null;
    }
    // W2: likewise a VMID record dropped once vk was seen clearing it.
    if status.pre_hibernate_vm_id.is_none() {
        body["status"]["preHibernateVmId"] = Value::Null;
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
pub(super) async fn publish_after_pass(
    ctx: &Context,
    cr: &CocoonHibernation,
    events: &[PlannedEvent],
) {
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
    match ctx.limits.event_slot() {
        Some(slot) => drop(tokio::spawn(async move {
            send.await;
            drop(slot);
        })),
        None => send.await,
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

pub(super) fn event(ev: &PlannedEvent) -> Event {
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
