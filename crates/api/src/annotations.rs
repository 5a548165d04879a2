//! The pod annotation contract (SPEC A4): every key we read or write, with typed helpers.

use super::pod::PodSlice;
use json_patch::{AddOperation, Patch, PatchOperation, RemoveOperation, TestOperation};
use jsonptr::PointerBuf;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde_json::Value;

/// VM name; also the registry repository holding the snapshot.
pub const VM_NAME: &str = "vm.cocoonstack.io/name";
/// `"true"` asks vk-cocoon to hibernate the VM; absent means run. Written only by us.
pub const HIBERNATE: &str = "vm.cocoonstack.io/hibernate";
/// vk-cocoon's lifecycle state: creating, ready, hibernating, hibernated, failed.
pub const LIFECYCLE_STATE: &str = "vm.cocoonstack.io/lifecycle-state";
/// CocoonSet generation vk-cocoon acted on.
pub const LIFECYCLE_OBSERVED_GENERATION: &str = "vm.cocoonstack.io/lifecycle-observed-generation";
/// Generation stamp of the pod's CocoonSet round.
pub const COCOONSET_GENERATION: &str = "cocoonset.cocoonstack.io/generation";
/// VMID: cleared by vk on hibernate, rewritten after a wake's clone.
pub const VM_ID: &str = "vm.cocoonstack.io/id";

/// Every annotation of the contract: the only ones the cache keeps.
pub const CONTRACT: [&str; 6] = [
    VM_NAME,
    HIBERNATE,
    LIFECYCLE_STATE,
    LIFECYCLE_OBSERVED_GENERATION,
    COCOONSET_GENERATION,
    VM_ID,
];

/// Value of [`HIBERNATE`] that requests hibernation.
pub const HIBERNATE_REQUESTED: &str = "true";
/// Value of [`LIFECYCLE_STATE`] once vk has hibernated the VM.
pub const STATE_HIBERNATED: &str = "hibernated";
/// Value of [`LIFECYCLE_STATE`] while vk snapshots and removes the VM.
pub const STATE_HIBERNATING: &str = "hibernating";

/// Everything a reconcile pass reads from a pod, in typed form.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct PodView {
    pub uid: Option<String>,
    pub vm_name: Option<String>,
    pub hibernate_requested: bool,
    pub lifecycle_state: Option<String>,
    pub observed_generation: i64,
    pub cocoonset_generation: i64,
    pub vm_id: Option<String>,
    pub container_running: bool,
}

impl PodView {
    /// The view of a whole k8s-openapi Pod (what the simulator and tests hold).
    pub fn of(pod: &k8s_openapi::api::core::v1::Pod) -> Self {
        Self::read(&pod.metadata, super::pod::any_container_running(pod))
    }

    pub fn from_pod(pod: &PodSlice) -> Self {
        Self::read(pod, pod.container_running)
    }

    fn read(meta: &impl PodMeta, container_running: bool) -> Self {
        let get = |key: &str| meta.annotation(key);
        let non_empty = |key: &str| get(key).filter(|v| !v.is_empty()).map(str::to_owned);
        Self {
            uid: meta.pod_uid().map(str::to_owned),
            vm_name: non_empty(VM_NAME),
            hibernate_requested: get(HIBERNATE) == Some(HIBERNATE_REQUESTED),
            lifecycle_state: non_empty(LIFECYCLE_STATE),
            observed_generation: parse_generation(get(LIFECYCLE_OBSERVED_GENERATION)),
            cocoonset_generation: parse_generation(get(COCOONSET_GENERATION)),
            vm_id: non_empty(VM_ID),
            container_running,
        }
    }

    /// H3's first two conditions: vk reports hibernated for the pod's current round.
    pub fn lifecycle_hibernated_for_round(&self) -> bool {
        self.lifecycle_state.as_deref() == Some(STATE_HIBERNATED)
            && self.observed_generation >= self.cocoonset_generation
    }

    /// vk reports the VM running: a Running container and a VMID, while vk no longer
    /// reports a hibernate in progress or done (until then it may still remove the VM, and
    /// the tag would be its only copy). Not proof of a wake on its own: see
    /// [`Self::woken_since`].
    pub fn woken(&self) -> bool {
        let hibernate_reported = matches!(
            self.lifecycle_state.as_deref(),
            Some(STATE_HIBERNATING | STATE_HIBERNATED)
        );
        self.container_running && self.vm_id.is_some() && !hibernate_reported
    }

    /// W2: running on a freshly written VMID: not `pre_hibernate`, the one the pod showed
    /// when the hibernate was requested (a VM vk may still be pushing or removing).
    pub fn woken_since(&self, pre_hibernate: Option<&str>) -> bool {
        self.woken() && (pre_hibernate.is_none() || self.vm_id.as_deref() != pre_hibernate)
    }
}

/// What the view and the pod patches read of a pod's metadata: a whole pod's
/// [`ObjectMeta`] or the cache's [`PodSlice`] alike.
pub trait PodMeta {
    fn pod_uid(&self) -> Option<&str>;
    fn pod_version(&self) -> Option<&str>;
    /// The value of annotation `key`, if the pod carries it.
    fn annotation(&self, key: &str) -> Option<&str>;
    /// Whether the pod has an annotation map at all.
    fn has_annotations(&self) -> bool;
}

impl PodMeta for ObjectMeta {
    fn pod_uid(&self) -> Option<&str> {
        self.uid.as_deref()
    }
    fn pod_version(&self) -> Option<&str> {
        self.resource_version.as_deref()
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations.as_ref()?.get(key).map(String::as_str)
    }
    fn has_annotations(&self) -> bool {
        self.annotations.is_some()
    }
}

impl PodMeta for PodSlice {
    fn pod_uid(&self) -> Option<&str> {
        self.metadata.uid.as_deref()
    }
    fn pod_version(&self) -> Option<&str> {
        self.metadata.resource_version.as_deref()
    }
    fn annotation(&self, key: &str) -> Option<&str> {
        PodSlice::annotation(self, key)
    }
    fn has_annotations(&self) -> bool {
        PodSlice::has_annotations(self)
    }
}

/// A4: a missing or unparsable integer reads as 0.
pub fn parse_generation(raw: Option<&str>) -> i64 {
    raw.and_then(|v| v.trim().parse::<i64>().ok()).unwrap_or(0)
}

fn annotation_pointer(key: &str) -> PointerBuf {
    PointerBuf::from_tokens(["metadata", "annotations", key])
}

/// JSON Patch that sets [`HIBERNATE`] and touches no other key, so a concurrent vk write
/// survives. `test` on the uid keeps it from landing on a recreated pod, and on the VMID
/// from landing on another VM than the one the CR records as this round's (W2). Without a
/// VMID to test (JSON Patch cannot test for an absent key), the pod's resourceVersion is
/// tested instead: a view that shows none may be stale, and the pod may run a VM again.
pub fn set_hibernate_patch(pod: &impl PodMeta) -> Patch {
    let mut ops = Vec::new();
    if let Some(uid) = pod.pod_uid() {
        ops.push(PatchOperation::Test(TestOperation {
            path: PointerBuf::from_tokens(["metadata", "uid"]),
            value: Value::String(uid.to_owned()),
        }));
    }
    match pod.annotation(VM_ID) {
        Some(vm_id) => ops.push(PatchOperation::Test(TestOperation {
            path: annotation_pointer(VM_ID),
            value: Value::String(vm_id.to_owned()),
        })),
        // Also keeps a new annotation map from racing a writer that adds one meanwhile.
        None => {
            if let Some(rv) = pod.pod_version() {
                ops.push(PatchOperation::Test(TestOperation {
                    path: PointerBuf::from_tokens(["metadata", "resourceVersion"]),
                    value: Value::String(rv.to_owned()),
                }));
            }
        }
    }
    if pod.has_annotations() {
        ops.push(PatchOperation::Add(AddOperation {
            path: annotation_pointer(HIBERNATE),
            value: Value::String(HIBERNATE_REQUESTED.to_owned()),
        }));
    } else {
        ops.push(PatchOperation::Add(AddOperation {
            path: PointerBuf::from_tokens(["metadata", "annotations"]),
            value: serde_json::json!({ HIBERNATE: HIBERNATE_REQUESTED }),
        }));
    }
    Patch(ops)
}

/// JSON Patch that removes [`HIBERNATE`] only if it still holds the value we saw.
pub fn clear_hibernate_patch(pod: &impl PodMeta) -> Patch {
    let current = pod.annotation(HIBERNATE).unwrap_or_default().to_owned();
    Patch(vec![
        PatchOperation::Test(TestOperation {
            path: annotation_pointer(HIBERNATE),
            value: Value::String(current),
        }),
        PatchOperation::Remove(RemoveOperation {
            path: annotation_pointer(HIBERNATE),
        }),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ContainerState, ContainerStateRunning, ContainerStatus, Pod, PodStatus,
    };
    use std::collections::BTreeMap;

    fn pod(annotations: &[(&str, &str)], running: bool) -> Pod {
        let ann: BTreeMap<String, String> = annotations
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        Pod {
            metadata: ObjectMeta {
                name: Some("p".into()),
                uid: Some("uid-1".into()),
                resource_version: Some("7".into()),
                annotations: (!ann.is_empty()).then_some(ann),
                ..Default::default()
            },
            status: Some(PodStatus {
                container_statuses: Some(vec![ContainerStatus {
                    name: "vm".into(),
                    state: Some(ContainerState {
                        running: running.then(ContainerStateRunning::default),
                        ..Default::default()
                    }),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// SPEC A4.
    #[test]
    fn a4_generations_missing_or_junk_read_as_zero() {
        assert_eq!(parse_generation(None), 0);
        assert_eq!(parse_generation(Some("junk")), 0);
        assert_eq!(parse_generation(Some("")), 0);
        assert_eq!(parse_generation(Some(" 12 ")), 12);
        let view = PodView::of(&pod(&[(LIFECYCLE_OBSERVED_GENERATION, "x1")], false));
        assert_eq!(view.observed_generation, 0);
        assert_eq!(view.cocoonset_generation, 0);
    }

    /// SPEC A4.
    #[test]
    fn a4_view_reads_every_key() {
        let view = PodView::of(&pod(
            &[
                (VM_NAME, "vm-a"),
                (HIBERNATE, "true"),
                (LIFECYCLE_STATE, "hibernated"),
                (LIFECYCLE_OBSERVED_GENERATION, "3"),
                (COCOONSET_GENERATION, "2"),
                (VM_ID, ""),
            ],
            true,
        ));
        assert_eq!(view.vm_name.as_deref(), Some("vm-a"));
        assert!(view.hibernate_requested);
        assert!(view.lifecycle_hibernated_for_round());
        assert_eq!(view.vm_id, None, "an empty VMID counts as cleared");
        assert!(view.container_running);
        assert!(!view.woken());
    }

    /// SPEC W2: the VMID recorded when the hibernate was requested proves no wake; a
    /// different one does.
    #[test]
    fn w2_the_pre_hibernate_vmid_is_not_a_fresh_one() {
        let view = PodView::of(&pod(&[(VM_NAME, "vm-a"), (VM_ID, "id-1")], true));
        assert!(view.woken());
        assert!(!view.woken_since(Some("id-1")), "the old VMID");
        assert!(view.woken_since(Some("id-0")), "another VMID");
        assert!(
            view.woken_since(None),
            "nothing recorded, or vk seen clearing it"
        );
    }

    /// SPEC A4.
    #[test]
    fn a4_hibernate_value_other_than_true_is_not_a_request() {
        let view = PodView::of(&pod(&[(HIBERNATE, "false")], false));
        assert!(!view.hibernate_requested);
    }

    /// SPEC H1.
    #[test]
    fn h1_set_patch_touches_only_the_hibernate_key_and_guards_uid() {
        let mut target = serde_json::to_value(pod(&[(VM_ID, "id-1")], true)).unwrap();
        let p = set_hibernate_patch(&pod(&[(VM_ID, "id-1")], true).metadata);
        json_patch::patch(&mut target, &p.0).unwrap();
        assert_eq!(target["metadata"]["annotations"][HIBERNATE], "true");
        assert_eq!(target["metadata"]["annotations"][VM_ID], "id-1");

        let mut recreated = target.clone();
        recreated["metadata"]["uid"] = "uid-2".into();
        assert!(json_patch::patch(&mut recreated, &p.0).is_err());
    }

    /// SPEC W2: the hibernate request lands only on the VMID the CR records for the round.
    #[test]
    fn w2_set_patch_guards_the_vmid_it_records() {
        let p = set_hibernate_patch(&pod(&[(VM_ID, "id-1")], true).metadata);
        let mut moved = serde_json::to_value(pod(&[(VM_ID, "id-2")], true)).unwrap();
        assert!(json_patch::patch(&mut moved, &p.0).is_err());
    }

    /// SPEC W2: seen without a VMID (vk removed the VM, or a stale view), the request lands
    /// only on that very version of the pod, never on one vk has since given a VM again.
    #[test]
    fn w2_set_patch_without_a_vmid_guards_the_seen_resource_version() {
        let removed = pod(&[(VM_NAME, "vm-a")], false);
        let p = set_hibernate_patch(&removed.metadata);
        let mut target = serde_json::to_value(&removed).unwrap();
        json_patch::patch(&mut target, &p.0).unwrap();
        assert_eq!(target["metadata"]["annotations"][HIBERNATE], "true");
        let mut restored =
            serde_json::to_value(pod(&[(VM_NAME, "vm-a"), (VM_ID, "id-2")], false)).unwrap();
        restored["metadata"]["resourceVersion"] = "8".into();
        assert!(json_patch::patch(&mut restored, &p.0).is_err());
    }

    /// SPEC H1.
    #[test]
    fn h1_set_patch_creates_the_map_only_at_the_seen_resource_version() {
        let bare = pod(&[], false);
        let p = set_hibernate_patch(&bare.metadata);
        let mut target = serde_json::to_value(&bare).unwrap();
        json_patch::patch(&mut target, &p.0).unwrap();
        assert_eq!(target["metadata"]["annotations"][HIBERNATE], "true");
        let mut moved = serde_json::to_value(&bare).unwrap();
        moved["metadata"]["resourceVersion"] = "8".into();
        assert!(json_patch::patch(&mut moved, &p.0).is_err());
    }

    /// SPEC W1.
    #[test]
    fn w1_clear_patch_removes_only_the_hibernate_key() {
        let p = pod(&[(HIBERNATE, "true"), (VM_NAME, "vm-a")], false);
        let mut target = serde_json::to_value(&p).unwrap();
        json_patch::patch(&mut target, &clear_hibernate_patch(&p.metadata).0).unwrap();
        assert!(target["metadata"]["annotations"].get(HIBERNATE).is_none());
        assert_eq!(target["metadata"]["annotations"][VM_NAME], "vm-a");
        // Already gone: the test op fails rather than removing something else.
        assert!(json_patch::patch(&mut target, &clear_hibernate_patch(&p.metadata).0).is_err());
    }
}
