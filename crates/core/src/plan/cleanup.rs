//! G1, G2, S6: what a CR being deleted does with its tag and its finalizer.

use super::delete_rules::vm_running_again;
use super::{EventKind, PlannedEvent, PodRead};
use cocoon_api::annotations::PodView;
use cocoon_api::{CocoonHibernation, Phase};

/// What to do for a CR being deleted (G1, G2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cleanup {
    pub delete_tag: Option<String>,
    pub remove_finalizer: bool,
}
/// G1, S6. `others` are the CRs that may still hold the VM: those on the same pod and
/// those whose status.vmName is the VM, in any namespace (S2). `claimants` are CRs whose
/// pod names the VM: one blocked by this CR (S2) wants the snapshot as soon as this CR is
/// gone, so the tag is kept for it. `cr` itself is skipped.
pub fn plan_cleanup<'a>(
    cr: &CocoonHibernation,
    others: impl IntoIterator<Item = &'a CocoonHibernation>,
    claimants: impl IntoIterator<Item = &'a CocoonHibernation>,
) -> Cleanup {
    if !cr.has_finalizer() {
        return Cleanup {
            delete_tag: None,
            remove_finalizer: false,
        };
    }
    let other_live = |o: &CocoonHibernation| {
        let same_cr =
            o.metadata.namespace == cr.metadata.namespace && o.metadata.name == cr.metadata.name;
        !same_cr && !o.is_deleting()
    };
    let held_elsewhere = |vm: &str| {
        others.into_iter().any(|o| {
            let same_pod = o.metadata.namespace == cr.metadata.namespace
                && o.spec.pod_ref.name == cr.spec.pod_ref.name;
            other_live(o) && (o.vm_name() == Some(vm) || same_pod)
        }) || claimants.into_iter().any(other_live)
    };
    // G1: the last holder of a VM deletes its tag.
    let delete_tag = cr
        .vm_name()
        .filter(|vm| !held_elsewhere(vm))
        .map(str::to_owned);
    Cleanup {
        delete_tag,
        remove_finalizer: true,
    }
}

/// G1: a pod other than the CR's own that names the VM holds its tag, as the orphan audit
/// counts it: vk restores a newly created pod (a replacement the CocoonSet operator made
/// for a hibernated VM) from that tag. `pods` are (namespace, name, vm name) of live pods;
/// returns the first such holder.
pub fn pod_holding<'a>(
    cr: &CocoonHibernation,
    vm: &str,
    pods: impl IntoIterator<Item = (&'a str, &'a str, Option<&'a str>)>,
) -> Option<(String, String)> {
    let own_ns = cr.metadata.namespace.as_deref().unwrap_or_default();
    pods.into_iter()
        .find(|(ns, name, named)| {
            *named == Some(vm) && !(*ns == own_ns && *name == cr.spec.pod_ref.name)
        })
        .map(|(ns, name, _)| (ns.to_owned(), name.to_owned()))
}

/// G1, S6 with `--pod-selector`: the CR's own pod, read fresh right before a deletion's
/// delete, holds the tag when it exists outside the selector. This install does not watch
/// that pod, so it cannot tell whether vk still needs the snapshot (a restore under way, a
/// hibernate it acted on): the tag is kept and nothing is discarded; the orphan audit,
/// which reads every pod, lists it once no CR holds it. The phase decides nothing.
pub fn own_pod_holds_tag(own: PodRead<'_>) -> bool {
    matches!(own, PodRead::NotSelected)
}

/// S6: the Warning a G1 delete sends first when the tag exists and may be the VM's only
/// copy. That is decided from the pod as the apiserver shows it right before the delete,
/// not from the phase: only a pod running the VM again after a wake holds another copy.
pub fn discard_event(
    cr: &CocoonHibernation,
    vm: &str,
    pod: Option<&PodView>,
    tag_present: bool,
) -> Option<PlannedEvent> {
    if !tag_present || vm_running_again(pod, vm, cr.pre_hibernate_vm_id()) {
        return None;
    }
    let phase = cr.phase().map_or("new", Phase::as_str);
    Some(PlannedEvent {
        kind: EventKind::Warning,
        reason: "SnapshotDiscarded",
        note: format!(
            "deleting this {phase} CocoonHibernation discards snapshot {vm}:hibernate, which may be the only copy of vm {vm}: its pod does not show the VM running"
        ),
    })
}
