use super::*;
use crate::api::annotations::{self, HIBERNATE, LIFECYCLE_STATE, VM_ID, VM_NAME};
use k8s_openapi::api::core::v1::Pod;

fn realistic_pod() -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "name": "web-0", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
            "labels": { "app": "web", "pod-template-hash": "abc" },
            "annotations": {
                VM_NAME: "vm-a", VM_ID: "id-1", LIFECYCLE_STATE: "ready",
                HIBERNATE: "true",
                "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(4000),
            },
            "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet",
                                  "name": "web", "uid": "o-1" }],
        },
        "spec": { "containers": [{ "name": "vm", "image": "vm:1" }] },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                { "name": "vm", "image": "vm:1", "imageID": "sha256:1", "ready": true,
                  "restartCount": 0, "state": { "running": { "startedAt": "2026-01-01T00:00:00Z" } } },
                { "name": "side", "image": "s:1", "imageID": "sha256:2", "ready": false,
                  "restartCount": 3, "state": { "waiting": { "reason": "CrashLoopBackOff" } } },
            ],
        },
    })
}

/// SPEC C3 (issue: memory): the stripped pod reads the same to every pass and to the
/// webhook, and the patches built from it still apply to the real pod.
#[test]
fn c3_stripped_pod_keeps_everything_a_pass_reads() {
    let json = realistic_pod();
    let full: Pod = serde_json::from_value(json.clone()).unwrap();
    let mut stripped: PodSlice = serde_json::from_value(json.clone()).unwrap();
    strip_pod(&mut stripped);
    assert_eq!(
        PodView::from_pod(&stripped),
        PodView::from_pod(&PodSlice::from(&full))
    );
    assert!(stripped.container_running);
    // K1: schedules select pods by label.
    assert_eq!(
        stripped.metadata.labels.as_ref().and_then(|l| l.get("app")),
        Some(&"web".to_owned())
    );
    assert!(stripped.metadata.owner_references.is_none());
    let kept = stripped.metadata.annotations.clone().unwrap_or_default();
    assert!(!kept.contains_key("kubectl.kubernetes.io/last-applied-configuration"));
    let full_len = serde_json::to_vec(&full).unwrap().len();
    let stripped_len = serde_json::to_vec(&stripped.metadata).unwrap().len();
    assert!(
        stripped_len * 5 < full_len,
        "{stripped_len} of {full_len} bytes"
    );
    for patch in [
        annotations::clear_hibernate_patch(&stripped.metadata),
        annotations::set_hibernate_patch(&stripped.metadata),
    ] {
        let mut doc = json.clone();
        json_patch::patch(&mut doc, &patch.0).unwrap();
    }
}
