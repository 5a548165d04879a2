//! The simulated VM pods: their status as a kubelet reports it, and pods made by hand.

use super::{STATE_READY, SimError};
use cocoon_hibernation::api::annotations::{
    COCOONSET_GENERATION, LIFECYCLE_OBSERVED_GENERATION, LIFECYCLE_STATE, PodView,
    STATE_HIBERNATED, VM_ID, VM_NAME,
};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::hash::{BuildHasher, RandomState};

pub(super) fn new_vm_id() -> String {
    let r = RandomState::new().hash_one(std::time::SystemTime::now());
    format!("vmid-{r:016x}")
}

fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string()
}

fn container_names(pod: &Pod) -> Vec<String> {
    pod.spec
        .as_ref()
        .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
        .unwrap_or_default()
}

fn container_image(pod: &Pod, name: &str) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.containers.iter().find(|c| c.name == name))
        .and_then(|c| c.image.clone())
        .unwrap_or_default()
}

/// Pod status with every container Running and Ready.
pub(super) fn running_status(pod: &Pod, vm_id: &str) -> Value {
    let now = now_rfc3339();
    let statuses: Vec<Value> = container_names(pod)
        .iter()
        .map(|c| {
            json!({
                "name": c, "image": container_image(pod, c), "imageID": "",
                "containerID": format!("cocoon://{vm_id}"),
                "ready": true, "started": true, "restartCount": 0,
                "state": { "running": { "startedAt": now } },
            })
        })
        .collect();
    json!({ "status": {
        "phase": "Running",
        "conditions": [
            { "type": "Ready", "status": "True", "lastTransitionTime": now },
            { "type": "ContainersReady", "status": "True", "lastTransitionTime": now },
        ],
        "containerStatuses": statuses,
    }})
}

/// Pod status with every container waiting (the VM is gone). Waiting rather than
/// terminated: a terminated container may not go back to running under some restart
/// policies, and a woken VM must.
pub(super) fn stopped_status(pod: &Pod) -> Value {
    let now = now_rfc3339();
    let statuses: Vec<Value> = container_names(pod)
        .iter()
        .map(|c| {
            json!({
                "name": c, "image": container_image(pod, c), "imageID": "",
                "ready": false, "started": false, "restartCount": 0,
                "state": { "waiting": { "reason": "Hibernated", "message": "VM snapshot pushed; VM removed" } },
            })
        })
        .collect();
    json!({ "status": {
        "conditions": [
            { "type": "Ready", "status": "False", "reason": "Hibernated", "lastTransitionTime": now },
            { "type": "ContainersReady", "status": "False", "reason": "Hibernated", "lastTransitionTime": now },
        ],
        "containerStatuses": statuses,
    }})
}

/// See [`SimHandle::stage_stale_lifecycle`].
pub async fn stage_stale_lifecycle(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
) -> Result<(), SimError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let current = api.get(pod).await?;
    let generation = PodView::of(&current).cocoonset_generation;
    let patch = json!({ "metadata": { "annotations": {
        LIFECYCLE_STATE: STATE_HIBERNATED,
        LIFECYCLE_OBSERVED_GENERATION: (generation - 1).to_string(),
    }}});
    api.patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

/// Creates a VM-backed pod as the CocoonSet operator and vk would leave it: one container
/// `vm`, the VM name, generation stamp 1, a VMID, `lifecycle-state=ready`, and (through
/// `pods/status`, as there is no kubelet) a Running container. Returns the pod after the
/// status write.
pub async fn create_vm_pod(
    client: &kube::Client,
    namespace: &str,
    pod_name: &str,
    vm_name: &str,
) -> Result<Pod, SimError> {
    create_vm_pod_on(client, namespace, pod_name, vm_name, None).await
}

/// [`create_vm_pod`], bound to `node` (the simulator's virtual node) when given.
pub async fn create_vm_pod_on(
    client: &kube::Client,
    namespace: &str,
    pod_name: &str,
    vm_name: &str,
    node: Option<&str>,
) -> Result<Pod, SimError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let vm_id = new_vm_id();
    let annotations = [
        (VM_NAME, vm_name),
        (COCOONSET_GENERATION, "1"),
        (VM_ID, vm_id.as_str()),
        (LIFECYCLE_STATE, STATE_READY),
    ];
    let pod = vm_pod(pod_name, &annotations, node);
    let created = api.create(&PostParams::default(), &pod).await?;
    let running = api
        .patch_status(
            pod_name,
            &PatchParams::default(),
            &Patch::Merge(&running_status(&created, &vm_id)),
        )
        .await?;
    Ok(running)
}

/// Creates a replacement pod for `vm_name` as the CocoonSet operator does when it brings a
/// hibernated VM back on a new pod: the VM name and generation stamp only (no VMID, no
/// lifecycle state, no status). vk restores it from `<vm>:hibernate`
/// ([`super::SimKnobs::set_restore_replacements`]).
pub async fn create_replacement_pod(
    client: &kube::Client,
    namespace: &str,
    pod_name: &str,
    vm_name: &str,
) -> Result<Pod, SimError> {
    let api: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let pod = vm_pod(
        pod_name,
        &[(VM_NAME, vm_name), (COCOONSET_GENERATION, "1")],
        None,
    );
    Ok(api.create(&PostParams::default(), &pod).await?)
}

/// A pod with one container `vm` and these annotations, bound to `node` when given.
fn vm_pod(name: &str, annotations: &[(&str, &str)], node: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "vm".into(),
                image: Some("cocoon/vm:test".into()),
                ..Default::default()
            }],
            node_name: node.map(str::to_owned),
            ..Default::default()
        }),
        ..Default::default()
    }
}
