//! Benchmarks of the hot paths, reported as medians and ratios (machines here are noisy).
//! Run: `cargo bench --bench hot_paths`. No timing is asserted anywhere.

use cocoon_hibernation::api::annotations::PodView;
use cocoon_hibernation::api::{
    CocoonHibernation, CocoonHibernationSpec, Desire, FINALIZER, PodRef,
};
use cocoon_hibernation::cache::index::{Key, PodRefIndex};
use cocoon_hibernation::controller::plan::{self, Probe, Settings};
use cocoon_hibernation::metrics::Metrics;
use cocoon_hibernation::webhook::handler;
use cocoon_hibernation::webhook::validate::{Claim, ClaimView};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::hint::black_box;
use std::time::Instant;

/// Median nanoseconds per call over `rounds` rounds of `iters` calls.
fn median_ns(rounds: usize, iters: usize, mut f: impl FnMut()) -> f64 {
    let mut samples: Vec<f64> = (0..rounds)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..iters {
                f();
            }
            start.elapsed().as_nanos() as f64 / iters as f64
        })
        .collect();
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

fn cr(name: &str, pod: &str) -> CocoonHibernation {
    let mut cr = CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire: Desire::Hibernate,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.namespace = Some("ns".into());
    cr.metadata.generation = Some(1);
    cr.metadata.finalizers = Some(vec![FINALIZER.into()]);
    cr
}

#[derive(Clone)]
struct View;
impl ClaimView for View {
    fn synced(&self) -> bool {
        true
    }
    fn claims(&self, _: &str, _: &str) -> Vec<Claim> {
        vec![]
    }
}

fn main() {
    let now = Time(jiff::Timestamp::now());
    let settings = Settings::default();
    let pod = PodView {
        vm_name: Some("vm-a".into()),
        vm_id: Some("id".into()),
        container_running: true,
        ..PodView::default()
    };

    // The pure decision for a settled CR and for a CR entering Hibernating.
    let mut settled = cr("a", "a");
    let first = plan::plan(
        &settled,
        Some(&pod),
        &plan::Ownership::Sole,
        &Probe::NotProbed,
        now.clone(),
        &settings,
    );
    settled.status = first.status;
    let fresh = cr("b", "b");
    let entering = median_ns(31, 20_000, || {
        black_box(plan::plan(
            black_box(&fresh),
            Some(&pod),
            &plan::Ownership::Sole,
            &Probe::NotProbed,
            now.clone(),
            &settings,
        ));
    });
    let waiting = median_ns(31, 20_000, || {
        black_box(plan::plan(
            black_box(&settled),
            Some(&pod),
            &plan::Ownership::Sole,
            &Probe::NotProbed,
            now.clone(),
            &settings,
        ));
    });
    println!("plan: entering Hibernating      median {entering:>9.0} ns/pass");
    println!("plan: waiting in Hibernating    median {waiting:>9.0} ns/pass");

    // One admission review, body bytes to response, as the handler does it.
    let body = std::fs::read(testkit::repo_root().join("tests/data/admission/create_valid.json"))
        .unwrap_or_default();
    let metrics = Metrics::new();
    let review = median_ns(31, 5_000, || {
        black_box(handler::review(black_box(&body), &View, &metrics));
    });
    println!("webhook: CREATE review          median {review:>9.0} ns/review");

    // Pod event -> CRs: the index against a scan of every CR, at 10k CRs.
    let crs: Vec<CocoonHibernation> = (0..10_000)
        .map(|i| cr(&format!("p{i}"), &format!("p{i}")))
        .collect();
    let mut index = PodRefIndex::default();
    for c in &crs {
        let key = Key::new("ns", c.metadata.name.as_deref().unwrap_or_default());
        index.upsert(&key, &c.spec.pod_ref.name, None);
    }
    let lookup = median_ns(31, 20_000, || {
        black_box(index.crs_for_pod("ns", black_box("p7777")));
    });
    let scan = median_ns(11, 200, || {
        black_box(
            crs.iter()
                .filter(|c| {
                    c.metadata.namespace.as_deref() == Some("ns")
                        && c.spec.pod_ref.name == black_box("p7777")
                })
                .count(),
        );
    });
    println!(
        "pod event -> CRs, 10k CRs: index median {lookup:>9.0} ns, scan median {scan:>9.0} ns, scan/index = {:.0}x",
        scan / lookup
    );

    // Memory kept per cached pod: a typical pod as listed, and after stripping.
    let listed: Pod = serde_json::from_str(TYPICAL_POD).unwrap_or_default();
    let before = serde_json::to_vec(&listed)
        .map(|v| v.len())
        .unwrap_or_default();
    let kept: cocoon_hibernation::api::pod::PodSlice =
        serde_json::from_str(TYPICAL_POD).unwrap_or_default();
    // The labels and annotations the slice keeps outside its metadata count too.
    let after = serde_json::to_vec(&kept.metadata)
        .map(|v| v.len())
        .unwrap_or_default()
        + serde_json::to_vec(&kept.labels())
            .map(|v| v.len())
            .unwrap_or_default()
        + cocoon_hibernation::api::annotations::CONTRACT
            .iter()
            .filter_map(|k| kept.annotation(k).map(|v| k.len() + v.len() + 6))
            .sum::<usize>();
    println!(
        "cached pod size (JSON bytes, proxy for memory): as listed {before}, kept {after}, kept/listed = {:.2}",
        after as f64 / before.max(1) as f64
    );
}

const TYPICAL_POD: &str = r#"{
 "apiVersion": "v1", "kind": "Pod",
 "metadata": {"name": "web-0", "namespace": "team-a", "uid": "6f1c1d9e-1f7e-4d4b-9d1e-2a7c3c0a9b11",
  "resourceVersion": "123456", "creationTimestamp": "2026-12-01T10:00:00Z",
  "labels": {"app": "web", "cocoonset.cocoonstack.io/name": "web", "pod-template-hash": "7d9f8c6b5"},
  "annotations": {"vm.cocoonstack.io/name": "web-0-vm", "cocoonset.cocoonstack.io/generation": "3",
   "vm.cocoonstack.io/id": "vm-8c1e", "vm.cocoonstack.io/lifecycle-state": "ready",
   "vm.cocoonstack.io/lifecycle-observed-generation": "3"},
  "managedFields": [
   {"manager": "cocoonset-operator", "operation": "Update", "apiVersion": "v1", "time": "2026-12-01T10:00:00Z",
    "fieldsType": "FieldsV1", "fieldsV1": {"f:metadata": {"f:annotations": {".": {}, "f:cocoonset.cocoonstack.io/generation": {}, "f:vm.cocoonstack.io/name": {}}, "f:labels": {".": {}, "f:app": {}}}, "f:spec": {"f:containers": {"k:{\"name\":\"vm\"}": {".": {}, "f:image": {}, "f:name": {}, "f:resources": {}}}}}},
   {"manager": "vk-cocoon", "operation": "Update", "apiVersion": "v1", "time": "2026-12-01T10:00:05Z", "subresource": "status",
    "fieldsType": "FieldsV1", "fieldsV1": {"f:status": {"f:conditions": {}, "f:containerStatuses": {}, "f:phase": {}, "f:podIP": {}, "f:startTime": {}}}}
  ]},
 "spec": {"nodeName": "vk-cocoon-0", "serviceAccountName": "default", "restartPolicy": "Always",
  "containers": [{"name": "vm", "image": "registry.example/cocoon/web:1.4.2",
   "resources": {"limits": {"cpu": "2", "memory": "4Gi"}, "requests": {"cpu": "1", "memory": "2Gi"}},
   "env": [{"name": "MODE", "value": "prod"}, {"name": "REGION", "value": "eu-1"}],
   "volumeMounts": [{"name": "kube-api-access", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": true}]}],
  "volumes": [{"name": "kube-api-access", "projected": {"sources": [{"serviceAccountToken": {"path": "token", "expirationSeconds": 3607}}]}}],
  "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Exists", "effect": "NoSchedule"}]},
 "status": {"phase": "Running", "podIP": "10.1.2.3", "hostIP": "10.0.0.4", "startTime": "2026-12-01T10:00:01Z",
  "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": "2026-12-01T10:00:05Z"},
   {"type": "ContainersReady", "status": "True", "lastTransitionTime": "2026-12-01T10:00:05Z"},
   {"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-12-01T10:00:00Z"}],
  "containerStatuses": [{"name": "vm", "ready": true, "restartCount": 0, "image": "registry.example/cocoon/web:1.4.2",
   "imageID": "registry.example/cocoon/web@sha256:0123", "containerID": "cocoon://vm-8c1e",
   "state": {"running": {"startedAt": "2026-12-01T10:00:04Z"}}}]}
}"#;
