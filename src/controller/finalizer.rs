//! G1, G2, S6: a CR being deleted gives up its tag (when it is the VM's last holder) and
//! then its finalizer; and the JSON patches that add and remove the finalizer (R1, G2).
//!
//! Hand-written rather than `kube::runtime::finalizer`, though that would keep S6's order
//! (the warning and the delete live in `deletes.rs` either way): the helper removes the
//! finalizer whenever cleanup returns Ok, so a deferred delete (registry busy, a stale
//! pod) would have to become an error to keep it; and it removes it by its index in the
//! cached object, where ours goes from a fresh read, tested against the uid, so a CR
//! recreated under the same name keeps its own.

use super::context::Context;
use super::deletes::{Attempt, fenced_delete};
use super::effects::{key, patch_params};
use super::plan::{self, Cleanup, Debt, DeleteResult};
use crate::api::{CocoonHibernation, FINALIZER};
use crate::error::Result;
use json_patch::{AddOperation, PatchOperation, ReplaceOperation, TestOperation};
use jsonptr::PointerBuf;
use kube::api::Patch;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
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
    let _guard = ctx.locks.lock(&lock_key).await;
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
            &Patch::Json::<()>(remove_finalizer_patch(&fresh)),
        )
        .await?;
        ctx.superseded.lock().remove(&ObjectRef::from_obj(&cr));
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

    /// SPEC G2.
    #[test]
    fn g2_finalizer_removal_keeps_other_finalizers() {
        let c = cr(Some(vec!["a", FINALIZER, "b"]));
        let mut doc = serde_json::to_value(&c).unwrap();
        json_patch::patch(&mut doc, &remove_finalizer_patch(&c).0).unwrap();
        assert_eq!(doc["metadata"]["finalizers"], json!(["a", "b"]));
    }
}
