//! The slice of a Pod the product reads (A4): its identity, labels, the contract's
//! annotations and whether a container runs.

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::Resource;
use serde::{Deserialize, Deserializer};
use std::collections::BTreeMap;
use std::sync::Arc;

use crate::annotations::CONTRACT;
use crate::intern::intern;

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

/// A Pod as the cache keeps it and as pod patches answer (issues 8 and 38, memory): only
/// what a pass, the webhook, a schedule or an idle policy reads. It is decoded straight
/// from the apiserver's JSON, skipping the spec and reducing the container statuses to one
/// flag, so no k8s-openapi `Pod` is ever held for it; of the metadata it keeps the name,
/// namespace, uid, resourceVersion and deletion time (what the store and kube's watcher and
/// S4's version checks read), the labels (K1, I1 select by them) and the contract's
/// annotations (A4), their strings shared through [`crate::intern`].
#[derive(Resource, Clone, Debug, Default, Deserialize, PartialEq)]
#[resource(inherit = Pod)]
#[serde(from = "WirePod")]
pub struct PodSlice {
    /// Identity and version only: its `labels` and `annotations` are always `None`; read
    /// them through [`Self::labels`], [`Self::label`] and [`Self::annotation`].
    pub metadata: ObjectMeta,
    labels: Pairs<Arc<str>>,
    /// `None`: the pod has no annotation map at all (a patch adding one must create it).
    annotations: Option<Pairs<&'static str>>,
    /// Some container is in state `running`.
    pub container_running: bool,
}

/// Sorted key/value pairs in one allocation, the strings shared.
type Pairs<K> = Box<[(K, Arc<str>)]>;

/// One label, its key and value shared with every pod that has the same.
pub type LabelPair = (Arc<str>, Arc<str>);

impl PodSlice {
    /// The slice of `meta` and a running flag.
    pub fn new(meta: ObjectMeta, container_running: bool) -> Self {
        let labels = meta
            .labels
            .iter()
            .flatten()
            .map(|(k, v)| (intern(k), intern(v)))
            .collect();
        // Keys are the contract's own constants: nothing to intern; BTreeMap order is kept.
        let annotations = meta.annotations.as_ref().map(|a| {
            a.iter()
                .filter_map(|(k, v)| {
                    let key = CONTRACT.iter().find(|c| **c == k.as_str())?;
                    Some((*key, intern(v)))
                })
                .collect()
        });
        PodSlice {
            metadata: ObjectMeta {
                name: meta.name,
                namespace: meta.namespace,
                uid: meta.uid,
                resource_version: meta.resource_version,
                deletion_timestamp: meta.deletion_timestamp,
                ..ObjectMeta::default()
            },
            labels,
            annotations,
            container_running,
        }
    }

    /// The labels, sorted by key.
    pub fn label_pairs(&self) -> &[LabelPair] {
        &self.labels
    }

    /// The value of label `key`.
    pub fn label(&self, key: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| &**k == key)
            .map(|(_, v)| &**v)
    }

    /// The labels as the map kube's label selectors match (K1, I1): built on demand, since
    /// a schedule or policy pass reads them far less often than the cache holds them.
    /// Named as `ResourceExt::labels`, which it shadows: that one reads the metadata, where
    /// a slice keeps no labels.
    pub fn labels(&self) -> BTreeMap<String, String> {
        self.labels
            .iter()
            .map(|(k, v)| ((**k).to_owned(), (**v).to_owned()))
            .collect()
    }

    /// The value of the contract's annotation `key` (A4); others are not kept.
    pub fn annotation(&self, key: &str) -> Option<&str> {
        self.annotations
            .as_deref()?
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| &**v)
    }

    /// The contract's annotations the pod carries, as a map; shadows
    /// `ResourceExt::annotations` as [`Self::labels`] does.
    pub fn annotations(&self) -> BTreeMap<String, String> {
        self.annotations
            .iter()
            .flatten()
            .map(|(k, v)| ((*k).to_owned(), (**v).to_owned()))
            .collect()
    }

    /// Whether the pod has an annotation map (maybe empty, or none of the contract's keys).
    pub fn has_annotations(&self) -> bool {
        self.annotations.is_some()
    }
}

/// What the apiserver's JSON decodes into before it is slimmed.
#[derive(Deserialize)]
struct WirePod {
    /// Without `managedFields`: never read, and about half of a typical pod's JSON.
    #[serde(deserialize_with = "decode_meta_without_managed_fields")]
    metadata: ObjectMeta,
    #[serde(
        rename = "status",
        default,
        deserialize_with = "decode_any_container_running"
    )]
    container_running: bool,
}

impl From<WirePod> for PodSlice {
    fn from(w: WirePod) -> Self {
        PodSlice::new(w.metadata, w.container_running)
    }
}

/// ObjectMeta's fields but `managedFields`, which serde then skips without building its
/// `fieldsV1` trees: most of the allocations of a pod list (issue 23, start-up). The
/// fields no slice keeps are skipped unread too.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MetaWithoutManagedFields {
    annotations: Option<BTreeMap<String, String>>,
    deletion_timestamp: Option<Time>,
    labels: Option<BTreeMap<String, String>>,
    name: Option<String>,
    namespace: Option<String>,
    resource_version: Option<String>,
    uid: Option<String>,
}

fn decode_meta_without_managed_fields<'de, D: Deserializer<'de>>(
    meta: D,
) -> Result<ObjectMeta, D::Error> {
    let m = MetaWithoutManagedFields::deserialize(meta)?;
    Ok(ObjectMeta {
        annotations: m.annotations,
        deletion_timestamp: m.deletion_timestamp,
        labels: m.labels,
        name: m.name,
        namespace: m.namespace,
        resource_version: m.resource_version,
        uid: m.uid,
        ..ObjectMeta::default()
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
        PodSlice::new(pod.metadata.clone(), any_container_running(pod))
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

    /// Issue 38: the slice keeps identity, version, deletion, labels and the contract's
    /// annotations, and drops everything else a pod's metadata carries.
    #[test]
    fn a4_the_slice_keeps_what_is_read_and_drops_the_rest() {
        let meta = serde_json::json!({
            "name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7",
            "generateName": "p-", "generation": 2, "selfLink": "/x",
            "creationTimestamp": "2026-01-01T00:00:00Z",
            "deletionTimestamp": "2026-01-02T00:00:00Z", "deletionGracePeriodSeconds": 30,
            "labels": { "a": "1", "b": "2" },
            "annotations": { "vm.cocoonstack.io/name": "vm", "vm.cocoonstack.io/id": "",
                "kubectl.kubernetes.io/last-applied-configuration": "{}" },
            "finalizers": ["f"],
            "ownerReferences": [{ "apiVersion": "v1", "kind": "Node", "name": "n", "uid": "o" }],
            "managedFields": [{ "manager": "m", "operation": "Update", "apiVersion": "v1",
                "fieldsType": "FieldsV1", "fieldsV1": { "f:metadata": { "f:labels": {} } } }],
        });
        let json = serde_json::json!({ "apiVersion": "v1", "kind": "Pod", "metadata": meta });
        let slice: PodSlice = serde_json::from_value(json.clone()).unwrap();
        let whole: Pod = serde_json::from_value(json).unwrap();
        assert_eq!(
            slice.metadata,
            ObjectMeta {
                name: Some("p".into()),
                namespace: Some("ns".into()),
                uid: Some("u".into()),
                resource_version: Some("7".into()),
                deletion_timestamp: whole.metadata.deletion_timestamp.clone(),
                ..ObjectMeta::default()
            }
        );
        assert_eq!(Some(slice.labels()), whole.metadata.labels);
        assert_eq!(slice.label("b"), Some("2"));
        assert_eq!(slice.annotation(crate::annotations::VM_NAME), Some("vm"));
        // An empty value is kept as such: A4 reads it as none, a patch tests it as "".
        assert_eq!(slice.annotation(crate::annotations::VM_ID), Some(""));
        assert_eq!(
            slice.annotation("kubectl.kubernetes.io/last-applied-configuration"),
            None
        );
        assert!(slice.has_annotations());
        // The whole pod's own conversion keeps the same.
        assert_eq!(PodSlice::from(&whole), slice);
    }

    /// Issue 38, A4: a pod with no annotation map keeps none, so a hibernate patch still
    /// creates the map; one with only foreign annotations keeps an empty one.
    #[test]
    fn a4_the_slice_knows_whether_the_pod_has_an_annotation_map() {
        let bare = PodSlice::new(ObjectMeta::default(), false);
        assert!(!bare.has_annotations());
        let foreign = PodSlice::new(
            ObjectMeta {
                annotations: Some(BTreeMap::from([("x".into(), "y".into())])),
                ..ObjectMeta::default()
            },
            false,
        );
        assert!(foreign.has_annotations());
        assert_eq!(foreign.annotation("x"), None);
    }

    /// Issue 38, W2: the patches built from the slice are the ones the whole pod's
    /// metadata gives (the uid, VMID and version they test, the map they create).
    #[test]
    fn w2_patches_from_the_slice_match_the_whole_pod() {
        use crate::annotations::{HIBERNATE, VM_ID, clear_hibernate_patch, set_hibernate_patch};
        let metas = [
            ObjectMeta::default(),
            ObjectMeta {
                uid: Some("u".into()),
                resource_version: Some("9".into()),
                annotations: Some(BTreeMap::from([("other".into(), "x".into())])),
                ..ObjectMeta::default()
            },
            ObjectMeta {
                uid: Some("u".into()),
                resource_version: Some("9".into()),
                annotations: Some(BTreeMap::from([
                    (VM_ID.into(), "id-1".into()),
                    (HIBERNATE.into(), "true".into()),
                ])),
                ..ObjectMeta::default()
            },
        ];
        for meta in metas {
            let slice = PodSlice::new(meta.clone(), true);
            assert_eq!(set_hibernate_patch(&slice), set_hibernate_patch(&meta));
            assert_eq!(clear_hibernate_patch(&slice), clear_hibernate_patch(&meta));
        }
    }

    /// Issue 38: equal label keys and values of different pods share one copy.
    #[test]
    fn a4_pods_share_their_repeated_strings() {
        let pod = |name: &str| {
            PodSlice::new(
                ObjectMeta {
                    name: Some(name.into()),
                    labels: Some(BTreeMap::from([
                        ("app.kubernetes.io/name".into(), "sandbox".into()),
                        ("app.kubernetes.io/instance".into(), name.into()),
                    ])),
                    annotations: Some(BTreeMap::from([(
                        crate::annotations::LIFECYCLE_STATE.into(),
                        "ready".into(),
                    )])),
                    ..ObjectMeta::default()
                },
                true,
            )
        };
        let (a, b) = (pod("a"), pod("b"));
        let shared = |x: &PodSlice, y: &PodSlice, i: usize| {
            let (kx, vx) = &x.label_pairs()[i];
            let (ky, vy) = &y.label_pairs()[i];
            (Arc::ptr_eq(kx, ky), Arc::ptr_eq(vx, vy))
        };
        // Sorted: `instance` first (unique value), then `name` (shared value).
        assert_eq!(shared(&a, &b, 0), (true, false));
        assert_eq!(shared(&a, &b, 1), (true, true));
        let state = |p: &PodSlice| p.annotations.as_deref().unwrap()[0].1.clone();
        assert!(Arc::ptr_eq(&state(&a), &state(&b)));
    }
}
