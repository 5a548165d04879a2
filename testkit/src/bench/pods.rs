//! Realistic pods for the cache-memory run: what a real VM-backed workload looks like.

use super::world::retry;
use cocoon_hibernation::api::annotations::{COCOONSET_GENERATION, LIFECYCLE_STATE, VM_ID, VM_NAME};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};

/// A VM-backed pod as a real workload looks: three containers with env, resources,
/// probes and mounts, labels, annotations and the CocoonSet that owns it (as its
/// controller makes them: a generated name's prefix, an owner reference, the set's name
/// label); about 8 KB of JSON. Running (VMID, ready).
pub fn realistic_pod(name: &str, vm: &str) -> Pod {
    let container = |cname: &str, image: &str| {
        let env: Vec<serde_json::Value> = (0..10)
            .map(|i| {
                serde_json::json!({
                    "name": format!("{}_SETTING_{i:02}", cname.to_uppercase()),
                    "value": format!("value-{i:02}-for-{cname}-in-{name}-abcdefgh")
                })
            })
            .collect();
        serde_json::json!({
            "name": cname,
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "args": ["--config=/etc/app/config.yaml", "--log-level=info", "--port=8080"],
            "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"},
                      {"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
            "env": env,
            "resources": {"requests": {"cpu": "250m", "memory": "256Mi"},
                          "limits": {"cpu": "1", "memory": "1Gi"}},
            "volumeMounts": [{"name": "config", "mountPath": "/etc/app", "readOnly": true},
                             {"name": "data", "mountPath": "/var/lib/app"}],
            "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8080},
                               "periodSeconds": 10, "timeoutSeconds": 2},
            "livenessProbe": {"httpGet": {"path": "/healthz", "port": 8080},
                              "periodSeconds": 20, "failureThreshold": 3},
            "securityContext": {"runAsNonRoot": true, "allowPrivilegeEscalation": false,
                                "readOnlyRootFilesystem": true,
                                "capabilities": {"drop": ["ALL"]}}
        })
    };
    let vm_id = format!("vmid-{:016x}", crate::cluster::random_u64());
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": "sandbox-",
            "ownerReferences": [{
                "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonSet",
                "name": "bench", "uid": "5b0e7a52-3f7c-4d8e-9a51-0c6f2b7d1e44",
                "controller": true, "blockOwnerDeletion": true
            }],
            "labels": {
                "cocoonset.cocoonstack.io/name": "bench",
                "app.kubernetes.io/name": "sandbox",
                "app.kubernetes.io/instance": name,
                "app.kubernetes.io/part-of": "cocoonset-bench",
                "cocoonset.cocoonstack.io/set": "bench",
                "pod-template-hash": "5d8f7c9b6d"
            },
            "annotations": {
                VM_NAME: vm,
                COCOONSET_GENERATION: "1",
                VM_ID: vm_id,
                LIFECYCLE_STATE: "ready",
                "cocoonset.cocoonstack.io/template": "sandbox-python-3.12-large",
                "prometheus.io/scrape": "true"
            }
        },
        "spec": {
            "containers": [
                container("vm", "registry.example.com/cocoon/vm:1.4.2"),
                container("agent", "registry.example.com/cocoon/agent:0.9.1"),
                container("proxy", "registry.example.com/cocoon/proxy:2.1.0")
            ],
            "volumes": [{"name": "config", "configMap": {"name": "sandbox-config"}},
                        {"name": "data", "emptyDir": {"sizeLimit": "10Gi"}}],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "serviceAccountName": "default",
            "tolerations": [{"key": "cocoonstack.io/vm", "operator": "Exists", "effect": "NoSchedule"}]
        }
    }))
    .expect("realistic pod")
}

/// Every container Running, as vk reports a live VM.
pub fn running_status(pod: &Pod) -> serde_json::Value {
    let vm_id = pod
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(VM_ID))
        .cloned()
        .unwrap_or_default();
    let now = jiff::Timestamp::now()
        .strftime("%Y-%m-%dT%H:%M:%SZ")
        .to_string();
    let statuses: Vec<serde_json::Value> = pod
        .spec
        .as_ref()
        .map(|s| s.containers.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|c| {
            serde_json::json!({
                "name": c.name, "image": c.image, "imageID": "",
                "containerID": format!("cocoon://{vm_id}/{}", c.name),
                "ready": true, "started": true, "restartCount": 0,
                "state": { "running": { "startedAt": now } },
            })
        })
        .collect();
    serde_json::json!({ "status": {
        "phase": "Running",
        "podIP": "10.0.0.17",
        "conditions": [
            { "type": "Ready", "status": "True", "lastTransitionTime": now },
            { "type": "ContainersReady", "status": "True", "lastTransitionTime": now },
        ],
        "containerStatuses": statuses,
    }})
}

/// Creates a realistic running pod (create, then the status write vk would make); returns
/// its JSON size without managedFields.
pub async fn create_realistic_pod(api: &Api<Pod>, name: &str, vm: &str) -> usize {
    let pod = realistic_pod(name, vm);
    let pp = PostParams::default();
    let created = retry(&format!("create pod {name}"), || api.create(&pp, &pod)).await;
    let status = running_status(&created);
    let (params, patch) = (PatchParams::default(), Patch::Merge(&status));
    let mut done = retry(&format!("pod {name} status"), || {
        api.patch_status(name, &params, &patch)
    })
    .await;
    // The size a cache holds: the product drops managedFields.
    done.metadata.managed_fields = None;
    serde_json::to_vec(&done).map_or(0, |v| v.len())
}

/// Deletes every pod of a namespace at once (unscheduled pods go immediately).
pub async fn delete_pods(client: &kube::Client, ns: &str) {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let dp = kube::api::DeleteParams::default().grace_period(0);
    let _ = api.delete_collection(&dp, &Default::default()).await;
}
