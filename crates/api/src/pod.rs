//! The slice of a Pod the product reads (A4): its metadata and whether a container runs.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::Resource;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;

/// A pod's place and the VM it names (`vm.cocoonstack.io/name`, empty read as none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedVm {
    pub namespace: String,
    pub name: String,
    pub vm: Option<String>,
    pub deleting: bool,
}

/// Pods per page of [`list_vm_names`]; only their metadata is read.
#[cfg(feature = "client")]
const VM_NAME_PAGE: u32 = 500;

#[cfg(feature = "client")]
/// Every pod `api` lists, read from the apiserver (metadata only, in pages), with the VM it
/// names: G1's fresh read before a deletion's delete, and the orphan audit's claims.
pub async fn list_vm_names(api: &kube::Api<Pod>) -> kube::Result<Vec<NamedVm>> {
    let mut params = kube::api::ListParams::default().limit(VM_NAME_PAGE);
    let mut pods = Vec::new();
    loop {
        let page = api.list_metadata(&params).await?;
        pods.extend(page.items.iter().map(|pod| {
            let m = &pod.metadata;
            NamedVm {
                namespace: m.namespace.clone().unwrap_or_default(),
                name: m.name.clone().unwrap_or_default(),
                vm: m
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(super::annotations::VM_NAME))
                    .filter(|v| !v.is_empty())
                    .cloned(),
                deleting: m.deletion_timestamp.is_some(),
            }
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(pods),
        }
    }
}

/// A Pod as the cache keeps it and as pod patches answer (issue 8, memory). It is decoded
/// straight from the apiserver's JSON, skipping the spec and reducing the container
/// statuses to one flag, so no k8s-openapi `Pod` (about 2 KB of struct before any string,
/// plus 3 full container statuses) is ever held for it.
#[derive(Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = Pod)]
pub struct PodSlice {
    /// Without `managedFields`: never read, and about half of a typical pod's JSON.
    #[serde(deserialize_with = "decode_meta_without_managed_fields")]
    pub metadata: ObjectMeta,
    /// Some container is in state `running`.
    #[serde(
        rename = "status",
        default,
        deserialize_with = "decode_any_container_running"
    )]
    pub container_running: bool,
}

/// ObjectMeta's fields but `managedFields`, which serde then skips without building its
/// `fieldsV1` trees: most of the allocations of a pod list (issue 23, start-up).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaWithoutManagedFields {
    annotations: Option<BTreeMap<String, String>>,
    creation_timestamp: Option<Time>,
    deletion_grace_period_seconds: Option<i64>,
    deletion_timestamp: Option<Time>,
    finalizers: Option<Vec<String>>,
    generate_name: Option<String>,
    generation: Option<i64>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    owner_references: Option<Vec<OwnerReference>>,
    resource_version: Option<String>,
    self_link: Option<String>,
    uid: Option<String>,
}

fn decode_meta_without_managed_fields<'de, D: Deserializer<'de>>(
    meta: D,
) -> Result<ObjectMeta, D::Error> {
    let m = MetaWithoutManagedFields::deserialize(meta)?;
    Ok(ObjectMeta {
        annotations: m.annotations,
        creation_timestamp: m.creation_timestamp,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: m.deletion_timestamp,
        finalizers: m.finalizers,
        generate_name: m.generate_name,
        generation: m.generation,
        labels: m.labels,
        managed_fields: None,
        name: m.name,
        namespace: m.namespace,
        owner_references: m.owner_references,
        resource_version: m.resource_version,
        self_link: m.self_link,
        uid: m.uid,
    })
}

fn decode_any_container_running<'de, D: Deserializer<'de>>(status: D) -> Result<bool, D::Error> {
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct Status {
        container_statuses: Option<Vec<Container>>,
    }
    #[derive(Deserialize)]
    struct Container {
        state: Option<State>,
    }
    #[derive(Deserialize)]
    struct State {
        running: Option<serde::de::IgnoredAny>,
    }
    let status = Option::<Status>::deserialize(status)?;
    Ok(status.and_then(|s| s.container_statuses).is_some_and(|cs| {
        cs.iter()
            .any(|c| c.state.as_ref().is_some_and(|s| s.running.is_some()))
    }))
}

/// Whether some container of a whole Pod is in state `running`.
pub fn any_container_running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| {
            cs.iter()
                .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
        })
}

impl From<&Pod> for PodSlice {
    fn from(pod: &Pod) -> Self {
        PodSlice {
            metadata: pod.metadata.clone(),
            container_running: any_container_running(pod),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC A4 (issue 8, memory): decoding the apiserver's JSON reads the same as the
    /// whole Pod would, whatever the status holds.
    #[test]
    fn a4_the_slice_decodes_like_the_whole_pod() {
        let statuses = [
            serde_json::json!(null),
            serde_json::json!({}),
            serde_json::json!({ "phase": "Pending", "containerStatuses": null }),
            serde_json::json!({ "containerStatuses": [
                { "name": "a", "image": "i", "imageID": "", "ready": false, "restartCount": 0,
                  "state": { "waiting": { "reason": "ContainerCreating" } } },
            ] }),
            serde_json::json!({ "containerStatuses": [
                { "name": "a", "image": "i", "imageID": "", "ready": false, "restartCount": 0 },
                { "name": "b", "image": "i", "imageID": "", "ready": true, "restartCount": 0,
                  "state": { "running": { "startedAt": "2026-01-01T00:00:00Z" } } },
            ] }),
        ];
        let mut running = Vec::new();
        for status in statuses {
            let json = serde_json::json!({
                "apiVersion": "v1", "kind": "Pod",
                "metadata": { "name": "p", "namespace": "ns", "uid": "u" },
                "spec": { "containers": [{ "name": "a", "image": "i" }] },
                "status": status,
            });
            let pod: Pod = serde_json::from_value(json.clone()).unwrap();
            let slice: PodSlice = serde_json::from_value(json).unwrap();
            assert_eq!(slice, PodSlice::from(&pod), "{status}");
            running.push(slice.container_running);
        }
        assert_eq!(running, [false, false, false, false, true]);
    }

    /// Issue 23: every metadata field survives the decode but `managedFields`.
    #[test]
    fn a4_the_slice_keeps_all_metadata_but_managed_fields() {
        let meta = serde_json::json!({
            "name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
            "generateName": "p-", "generation": 2, "selfLink": "/x",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 30,
            "labels": { "a": "1" }, "annotations": { "vm.cocoonstack.io/name": "vm" },
            "finalizers": ["f"],
            "ownerReferences": [{ "apiVersion": "v1", "kind": "Node", "name": "n", "uid": "o" }],
            "managedFields": [{ "manager": "m", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": { "f:metadata": { "f:labels": {} } } }],
        });
        let json = serde_json::json!({ "apiVersion": "v1", "kind": "Pod", "metadata": meta });
        let mut whole: Pod = serde_json::from_value(json.clone()).unwrap();
        assert!(whole.metadata.managed_fields.is_some());
        whole.metadata.managed_fields = None;
        let slice: PodSlice = serde_json::from_value(json).unwrap();
        assert_eq!(slice.metadata, whole.metadata);
    }
}
