//! G1, G2, S6: a CR being deleted gives up its tag (when it is the VM's last holder) and
//! then its finalizer, by the patch every controller uses (`runtime::finalizers`).
//!
//! Hand-written rather than `kube::runtime::finalizer`, though that would keep S6's order
//! (the warning and the delete live in `tag_delete.rs` either way): the helper removes the
//! finalizer whenever cleanup returns Ok, so a deferred delete (registry busy, a stale
//! pod) would have to become an error to keep it; and it removes it by its index in the
//! cached object, where ours goes from a fresh read, tested against the uid, so a CR
//! recreated under the same name keeps its own.

use super::context::Context;
use super::effects::{key, patch_params};
use super::plan::{self, Cleanup, Debt, DeleteResult};
use super::tag_delete::{Attempt, fenced_delete};
use crate::api::{CocoonHibernation, FINALIZER};
use crate::error::Result;
use crate::runtime::finalizers;
use kube::api::Patch;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use std::sync::Arc;

/// it may be the VM's only copy; never block the finalizer on the registry.
/// G1, G2, S6: delete the tag unless another live CR holds the VM, saying so first when
/// it may be the VM's only copy; never block the finalizer on the registry.
pub(super) async fn cleanup(
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
    let _guard = ctx.limits.vm(&lock_key).await;
    // The pass is for this object (uid) being deleted: a cache that by now holds a CR
    // recreated under the name is another object, whose finalizer is not ours to take.
    let deleted_uid = cr.metadata.uid.clone();
    let cr = match ctx.cache.cr(&ns, &name) {
        Some(c) if c.metadata.uid == deleted_uid && c.is_deleting() => (*c).clone(),
        Some(_) => return Ok(Action::await_change()),
        None => cr.clone(),
    };
    let mut others = ctx.cache.crs_for_pod(&ns, &cr.spec.pod_ref.name);
    let mut claimants = Vec::new();
    if let Some(vm) = cr.vm_name() {
        others.extend(ctx.cache.crs_holding_vm(vm));
        claimants = ctx.cache.crs_on_pods_naming(vm);
    }
    let Cleanup {
        mut delete_tag,
        remove_finalizer,
    } = plan::plan_cleanup(
        &cr,
        others.iter().map(Arc::as_ref),
        claimants.iter().map(Arc::as_ref),
    );
    // G1: a replacement pod naming the VM holds its tag (a fresh read follows before any
    // delete, in `fenced_delete`).
    if let Some(vm) = delete_tag.clone() {
        let pods = ctx.cache.pods_naming(&vm);
        let named = pods
            .iter()
            .map(|(ns, n)| (ns.as_str(), n.as_str(), Some(vm.as_str())));
        if let Some((pod_ns, pod)) = plan::pod_holding(&cr, &vm, named) {
            tracing::info!(cr = %key(&cr), vm, pod = %format!("{pod_ns}/{pod}"), "snapshot tag kept: another pod names the VM");
            delete_tag = None;
        }
    }
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
        if fresh.metadata.uid != deleted_uid || !fresh.is_deleting() || !fresh.has_finalizer() {
            return Ok(Action::await_change());
        }
        api.patch(
            &name,
            &patch_params(),
            &Patch::Json::<()>(finalizers::remove(&fresh.metadata, FINALIZER)),
        )
        .await?;
        ctx.superseded.lock().remove(&ObjectRef::from_obj(&cr));
    }
    Ok(Action::await_change())
}
