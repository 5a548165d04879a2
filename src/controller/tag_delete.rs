//! Tag deletes (S1, S5, S6, S7): the fence, the fresh reads, the S6 warning, and the
//! delete of the confirmed digest, in that order; and W3's retry on a settled CR.

use super::context::Context;
use super::effects::{event, key, write_status};
use super::error_policy::Deferral;
use super::plan::{self, Debt, DeleteResult, PodRead};
use super::selection;
use crate::api::CocoonHibernation;
use crate::api::annotations::PodView;
use crate::api::pod::{PodSlice, list_vm_names};
use crate::error::{Error, Result};
use crate::registry::{DeleteOutcome, RegistryError};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::controller::Action;
use kube::{Api, Resource, ResourceExt};
use std::time::Duration;

/// S1: the last registry request leaves this long before the fence closes.
const FENCE_SLACK: Duration = Duration::from_millis(500);
/// S5: a kept (shared-digest) tag is looked at again this rarely.
const SHARED_DIGEST_RETRY: Duration = Duration::from_secs(600);

/// How a delete attempt ended (S1, S5, S7); every caller matches this one enum.
pub(super) enum Attempt {
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
pub(super) async fn fenced_delete(
    cr: &CocoonHibernation,
    vm: &str,
    debt: Debt,
    probed: Option<&str>,
    api: &Api<CocoonHibernation>,
    ctx: &Context,
) -> Result<Attempt> {
    let until = ctx.fence.valid_until().ok_or_else(|| fence_closed(vm))?;
    let Some(_slot) = ctx.limits.registry_slot().await else {
        return Ok(Attempt::Deferred(ctx.defer(Deferral::RegistryBusy)));
    };
    // S7: the pod is read beside the CR, not after it: the two reads are independent (the
    // CR's podRef is immutable, and a pass holds its VM's lock), and one round trip instead
    // of two frees the worker sooner for the next wake (issue 38).
    let pods: Api<PodSlice> =
        Api::namespaced(ctx.client.clone(), &cr.namespace().unwrap_or_default());
    let name = cr.name_any();
    let (fresh, pod) = tokio::try_join!(api.get_opt(&name), pods.get_opt(&cr.spec.pod_ref.name))?;
    let fresh = match fresh {
        // F2, D1: the end of a wake writes a status planned from `cr`; a newer CR (a flipped
        // desire, a timeout) needs a new plan before anything is deleted.
        Some(fresh)
            if debt == Debt::EndOfWake
                && fresh.metadata.resource_version != cr.metadata.resource_version =>
        {
            return Ok(Attempt::Deferred(ctx.defer(Deferral::StaleView)));
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
    // The same uid names the same pod (podRef is immutable); checked, as the pod was read
    // by the planned CR's name, in case that ever changes.
    if fresh.spec.pod_ref.name != cr.spec.pod_ref.name {
        return Ok(Attempt::Deferred(ctx.defer(Deferral::StaleView)));
    }
    // G1: a pod other than the CR's own that names the VM (a replacement vk restores from
    // this tag) holds it; read fresh, since the replacement may be seconds old.
    if debt == Debt::OnDeletion
        && let Some((pod_ns, pod)) = fresh_pod_holding(&fresh, vm, ctx).await?
    {
        tracing::info!(
            cr = %key(cr),
            vm,
            pod = %format!("{pod_ns}/{pod}"),
            "fresh read: another pod names the VM; tag kept"
        );
        return Ok(Attempt::NotOwed);
    }
    // S7: the pod too, from the apiserver (read above): a lagging pod cache may still show
    // the VM running from before its hibernate while vk restores it from this very tag.
    let view = pod.as_ref().map(PodView::from_pod);
    // G1, S6: an own pod outside --pod-selector holds the tag; nothing is discarded.
    if debt == Debt::OnDeletion && pod.is_some() {
        let (ns, name) = (
            fresh.namespace().unwrap_or_default(),
            &fresh.spec.pod_ref.name,
        );
        let own = match selection::selected(ctx, &ns, name).await? {
            true => PodRead::from(view.as_ref()),
            false => PodRead::NotSelected,
        };
        if plan::own_pod_holds_tag(own) {
            tracing::info!(
                cr = %key(cr),
                vm,
                selector = %ctx.settings.pod_selector,
                "fresh read: the pod is outside --pod-selector; tag kept"
            );
            return Ok(Attempt::NotOwed);
        }
    }
    if debt != Debt::OnDeletion
        && !plan::vm_running_again(view.as_ref(), vm, fresh.pre_hibernate_vm_id())
    {
        tracing::info!(
            cr = %key(cr),
            vm,
            ?debt,
            "fresh read: the pod does not show the VM running again; tag kept"
        );
        return Ok(Attempt::Deferred(ctx.defer(Deferral::StalePod)));
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

/// G1: a live pod other than `cr`'s own that names `vm`, listed from the apiserver in the
/// namespace the product watches, as the orphan audit counts it.
async fn fresh_pod_holding(
    cr: &CocoonHibernation,
    vm: &str,
    ctx: &Context,
) -> Result<Option<(String, String)>> {
    let namespace = &ctx.settings.watch_namespace;
    let api: Api<Pod> = if namespace.is_empty() {
        Api::all(ctx.client.clone())
    } else {
        Api::namespaced(ctx.client.clone(), namespace)
    };
    let pods = list_vm_names(&api).await?;
    let live = pods.iter().filter(|p| !p.deleting);
    let named = live.map(|p| (p.namespace.as_str(), p.name.as_str(), p.vm.as_deref()));
    Ok(plan::pod_holding(cr, vm, named))
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
pub(super) async fn pay_wake_debt(
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
