//! Test support: the Node a virtual kubelet registers. VM pods are bound to it by
//! `spec.nodeName`, so on a cluster with a real kubelet and scheduler the real node never
//! tries to run them. It is tainted so that nothing else is scheduled onto it, and its
//! Lease is renewed so that kube-controller-manager neither marks it unreachable nor
//! evicts or garbage-collects its pods.

use std::time::Duration;

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;
use tokio::task::JoinHandle;

/// The taint that keeps ordinary pods off the virtual node (virtual-kubelet's own key).
pub const VIRTUAL_NODE_TAINT: &str = "virtual-kubelet.io/provider";
/// Well inside kube-controller-manager's 40 s node-monitor grace period.
const HEARTBEAT: Duration = Duration::from_secs(10);
const LEASE_SECONDS: i32 = 40;
const FIELD_MANAGER: &str = "vk-cocoon-simulator";

/// Registers (or takes over) node `name`, reports it Ready, and keeps its Lease renewed
/// until the returned task is aborted.
pub async fn register(client: kube::Client, name: &str) -> Result<JoinHandle<()>, kube::Error> {
    let nodes: Api<Node> = Api::all(client.clone());
    let node = json!({
        "apiVersion": "v1", "kind": "Node",
        "metadata": { "name": name, "labels": {
            "type": "virtual-kubelet",
            "kubernetes.io/role": "agent",
            "kubernetes.io/hostname": name,
        }},
        "spec": { "taints": [{ "key": VIRTUAL_NODE_TAINT, "value": "cocoon", "effect": "NoSchedule" }] },
    });
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    nodes.patch(name, &apply, &Patch::Apply(&node)).await?;
    heartbeat(&client, name).await?;
    let client = client.clone();
    let name = name.to_owned();
    Ok(tokio::spawn(async move {
        loop {
            tokio::time::sleep(HEARTBEAT).await;
            if let Err(e) = heartbeat(&client, &name).await {
                tracing::warn!(node = %name, error = %e, "virtual node heartbeat failed; retrying");
            }
        }
    }))
}

async fn heartbeat(client: &kube::Client, name: &str) -> Result<(), kube::Error> {
    let now = Timestamp::now();
    let stamp = now.strftime("%Y-%m-%dT%H:%M:%SZ").to_string();
    let node = json!({
        "apiVersion": "v1", "kind": "Node", "metadata": { "name": name },
        "status": {
            "conditions": [{
                "type": "Ready", "status": "True", "reason": "VirtualKubeletReady",
                "message": "vk-cocoon simulator is running",
                "lastHeartbeatTime": stamp, "lastTransitionTime": stamp,
            }],
            "capacity": { "cpu": "1000", "memory": "4Ti", "pods": "100000" },
            "allocatable": { "cpu": "1000", "memory": "4Ti", "pods": "100000" },
        },
    });
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    Api::<Node>::all(client.clone())
        .patch_status(name, &apply, &Patch::Apply(&node))
        .await?;
    // A Lease's renewTime is a MicroTime: exactly six fractional digits.
    let renew = format!(
        "{}.{:06}Z",
        now.strftime("%Y-%m-%dT%H:%M:%S"),
        now.subsec_microsecond()
    );
    let lease = json!({
        "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": { "name": name, "namespace": "kube-node-lease" },
        "spec": { "holderIdentity": name, "leaseDurationSeconds": LEASE_SECONDS, "renewTime": renew },
    });
    Api::<Lease>::namespaced(client.clone(), "kube-node-lease")
        .patch(name, &apply, &Patch::Apply(&lease))
        .await?;
    Ok(())
}
