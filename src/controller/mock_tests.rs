//! The effects layer against a mocked apiserver (tower-test): which requests a pass makes,
//! in what shape, and that a settled pass makes none.

use super::Context;
use super::plan::Settings;
use super::reconcile::reconcile;
use crate::api::annotations::{
    COCOONSET_GENERATION, HIBERNATE, LIFECYCLE_OBSERVED_GENERATION, LIFECYCLE_STATE, VM_ID, VM_NAME,
};
use crate::api::conditions::{READY, REASON_DONE, Update, upsert};
use crate::api::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Desire, FINALIZER, Phase,
    PodRef,
};
use crate::cache::SharedCache;
use crate::leader::Fence;
use crate::metrics::Metrics;
use crate::registry::fake::FakeStore;
use http::{Request, Response};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::ObjectMeta;
use kube::client::Body;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;
use tower_test::mock::{self, Handle};

type ApiHandle = Handle<Request<Body>, Response<Body>>;

fn cr(finalizer: bool, phase: Option<Phase>) -> CocoonHibernation {
    let mut cr = CocoonHibernation::new(
        "web-0",
        CocoonHibernationSpec {
            pod_ref: PodRef {
                name: "web-0".into(),
            },
            desire: Desire::Hibernate,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.namespace = Some("ns".into());
    cr.metadata.generation = Some(1);
    cr.metadata.resource_version = Some("41".into());
    cr.metadata.uid = Some("cr-uid".into());
    if finalizer {
        cr.metadata.finalizers = Some(vec![FINALIZER.into()]);
    }
    if let Some(phase) = phase {
        let mut status = CocoonHibernationStatus {
            observed_generation: Some(1),
            phase: Some(phase),
            vm_name: Some("vm-a".into()),
            ..Default::default()
        };
        let update = Update {
            type_: READY,
            status: true,
            reason: REASON_DONE,
            message: "vm vm-a hibernated; snapshot vm-a:hibernate stored",
            observed_generation: Some(1),
        };
        upsert(
            &mut status.conditions,
            update,
            Time(jiff::Timestamp::now()),
            false,
        );
        cr.status = Some(status);
    }
    cr
}

fn pod(annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some("web-0".into()),
            namespace: Some("ns".into()),
            uid: Some("pod-uid".into()),
            resource_version: Some("7".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| ((*k).into(), (*v).into()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn running_pod() -> Pod {
    pod(&[
        (VM_NAME, "vm-a"),
        (VM_ID, "id-1"),
        (LIFECYCLE_STATE, "ready"),
    ])
}

fn context(cache: SharedCache) -> (Arc<Context>, ApiHandle) {
    context_with(cache, FakeStore::default())
}

fn context_with(
    cache: SharedCache,
    registry: impl crate::registry::SnapshotStore + 'static,
) -> (Arc<Context>, ApiHandle) {
    context_fenced(cache, registry, Fence::unfenced())
}

fn context_fenced(
    cache: SharedCache,
    registry: impl crate::registry::SnapshotStore + 'static,
    fence: crate::leader::Fence,
) -> (Arc<Context>, ApiHandle) {
    let (service, handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "default");
    let metrics = Metrics::new();
    let ctx = super::context(
        client,
        cache,
        registry,
        metrics,
        Settings::default(),
        None,
        fence,
    );
    (ctx, handle)
}

/// Takes the next request and answers it with `body`.
async fn expect_request(
    handle: &mut ApiHandle,
    body: Value,
) -> (http::Method, String, String, Value) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a request within 5s")
        .expect("the client is alive");
    let method = req.method().clone();
    let uri = req.uri().to_string();
    let content_type = req
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned();
    let bytes = http_body_util::BodyExt::collect(req.into_body())
        .await
        .unwrap()
        .to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    send.send_response(
        Response::builder()
            .body(Body::from(serde_json::to_vec(&body).unwrap()))
            .unwrap(),
    );
    (method, uri, content_type, json)
}

async fn no_more_requests(handle: &mut ApiHandle) {
    // Timing out, or the client being gone, both mean no request came.
    let next = tokio::time::timeout(Duration::from_millis(300), handle.next_request()).await;
    if let Ok(Some((req, _))) = next {
        panic!("unexpected request: {} {}", req.method(), req.uri());
    }
}

/// SPEC R1: the first pass adds the finalizer with a guarded JSON Patch and does nothing else.
#[tokio::test]
async fn r1_first_pass_adds_only_the_finalizer() {
    let obj = cr(false, None);
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![running_pod()]);
    let (ctx, mut handle) = context(cache);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx));
    let (method, uri, ct, body) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::PATCH);
    assert!(
        uri.starts_with(
            "/apis/cocoonset.cocoonstack.io/v1/namespaces/ns/cocoonhibernations/web-0?"
        ),
        "{uri}"
    );
    assert_eq!(ct, "application/json-patch+json");
    assert_eq!(
        body[0],
        json!({"op": "test", "path": "/metadata/resourceVersion", "value": "41"})
    );
    assert_eq!(
        body[1],
        json!({"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]})
    );
    pass.await.unwrap().unwrap();
    no_more_requests(&mut handle).await;
}

/// SPEC C3: a settled CR's pass makes no API request at all.
#[tokio::test]
async fn c3_settled_pass_makes_no_request() {
    let obj = cr(true, Some(Phase::Hibernated));
    let hibernated = pod(&[
        (VM_NAME, "vm-a"),
        ("vm.cocoonstack.io/hibernate", "true"),
        (LIFECYCLE_STATE, "hibernated"),
        (LIFECYCLE_OBSERVED_GENERATION, "1"),
        (COCOONSET_GENERATION, "1"),
    ]);
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![hibernated]);
    let (ctx, mut handle) = context(cache);
    let pass = tokio::spawn(reconcile(Arc::new(obj), ctx));
    no_more_requests(&mut handle).await;
    let action = tokio::time::timeout(Duration::from_secs(5), pass)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(action, kube::runtime::controller::Action::await_change());
}

/// SPEC H1 H2 W2 F2: entering Hibernating writes the status subresource first (guarded by
/// the resourceVersion the pass read), recording the VMID the request may take away, and
/// only then patches the pod (guarded by its uid and that VMID).
#[tokio::test]
async fn h1_h2_w2_entering_writes_the_status_then_patches_the_pod() {
    let obj = cr(true, None);
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![running_pod()]);
    let (ctx, mut handle) = context(cache);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx));

    let (method, uri, ct, body) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::PATCH);
    assert!(
        uri.starts_with(
            "/apis/cocoonset.cocoonstack.io/v1/namespaces/ns/cocoonhibernations/web-0/status?"
        ),
        "{uri}"
    );
    assert_eq!(ct, "application/merge-patch+json");
    assert_eq!(body["metadata"]["resourceVersion"], "41");
    assert_eq!(body["status"]["phase"], "Hibernating");
    assert_eq!(body["status"]["vmName"], "vm-a");
    assert_eq!(body["status"]["preHibernateVmId"], "id-1");

    let (method, uri, ct, body) =
        expect_request(&mut handle, serde_json::to_value(running_pod()).unwrap()).await;
    assert_eq!(method, http::Method::PATCH);
    assert!(
        uri.starts_with("/api/v1/namespaces/ns/pods/web-0?"),
        "{uri}"
    );
    assert_eq!(ct, "application/json-patch+json");
    assert_eq!(
        body[0],
        json!({"op": "test", "path": "/metadata/uid", "value": "pod-uid"})
    );
    assert_eq!(
        body[1],
        json!({"op": "test", "path": "/metadata/annotations/vm.cocoonstack.io~1id", "value": "id-1"}),
        "W2: the request lands on the VMID the CR records"
    );
    assert_eq!(
        body[2]["path"],
        "/metadata/annotations/vm.cocoonstack.io~1hibernate"
    );
    pass.await.unwrap().unwrap();
    no_more_requests(&mut handle).await;
}

/// The pass's result; a pass still waiting on a request nobody answers fails the test
/// instead of hanging it.
async fn ended(pass: Pass) -> crate::error::Result<kube::runtime::controller::Action> {
    tokio::time::timeout(Duration::from_secs(10), pass)
        .await
        .expect("the pass ends without a request the test did not expect")
        .expect("the pass does not panic")
}

fn deleting_hibernated() -> CocoonHibernation {
    let mut obj = cr(true, Some(Phase::Hibernated));
    obj.metadata.finalizers = Some(vec!["other/keep".into(), FINALIZER.into()]);
    obj.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
    obj
}

type Calls = Arc<std::sync::Mutex<Vec<String>>>;
type Pass = tokio::task::JoinHandle<crate::error::Result<kube::runtime::controller::Action>>;

/// A pass over a Hibernated CR being deleted whose pod is gone, while the registry holds
/// its tag (digest `sha256:aaa`); the registry calls it makes land in `Calls`.
fn delete_with_tag(fence: Fence) -> (CocoonHibernation, Calls, ApiHandle, Pass) {
    let obj = deleting_hibernated();
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![]);
    let store = holding_the_snapshot();
    let calls = store.calls.clone();
    let (ctx, handle) = context_fenced(cache, store, fence);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx));
    (obj, calls, handle, pass)
}

/// Answers the next request with an apiserver error `code`.
async fn fail_request(handle: &mut ApiHandle, code: u16) -> (http::Method, String) {
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .expect("a request within 5s")
        .expect("the client is alive");
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code,
        "reason": if code == 404 { "NotFound" } else { "InternalError" },
        "message": "injected by the test"
    });
    send.send_response(
        Response::builder()
            .status(code)
            .body(Body::from(serde_json::to_vec(&status).unwrap()))
            .unwrap(),
    );
    (req.method().clone(), req.uri().to_string())
}

/// Answers the fresh reads of a delete: the CR as `obj` and, asked beside it, the pod as
/// `pod` (None: 404); then, for a deletion, G1's pod list (none naming the VM).
async fn fresh_reads(handle: &mut ApiHandle, obj: &CocoonHibernation, pod: Option<Pod>) {
    let (method, uri, _, body) = expect_request(handle, serde_json::to_value(obj).unwrap()).await;
    assert_eq!(
        (method, uri.contains("/cocoonhibernations/web-0")),
        (http::Method::GET, true),
        "S1: the CR is read fresh: {uri} {body}"
    );
    match pod {
        Some(pod) => {
            let (method, uri, _, _) =
                expect_request(handle, serde_json::to_value(pod).unwrap()).await;
            assert_eq!(
                (method, uri.ends_with("/pods/web-0")),
                (http::Method::GET, true),
                "S7: the pod is read fresh"
            );
        }
        None => {
            let (method, uri) = fail_request(handle, 404).await;
            assert_eq!(
                (method, uri.ends_with("/pods/web-0")),
                (http::Method::GET, true),
                "S7: the pod is read fresh"
            );
        }
    }
    if obj.is_deleting() {
        fresh_pod_list(handle, &[]).await;
    }
}

/// Answers G1's fresh list of pods (metadata only) with `pods`, (name, vm name) in "ns".
async fn fresh_pod_list(handle: &mut ApiHandle, pods: &[(&str, &str)]) {
    let items: Vec<Value> = pods
        .iter()
        .map(|(name, vm)| {
            json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": name, "namespace": "ns", "annotations": {VM_NAME: vm}}})
        })
        .collect();
    let list = json!({"apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadataList",
        "metadata": {}, "items": items});
    let (method, uri, _, _) = expect_request(handle, list).await;
    assert_eq!(
        (method, uri.starts_with("/api/v1/pods?")),
        (http::Method::GET, true),
        "G1: the pods are listed fresh: {uri}"
    );
}

/// SPEC G1 (issue: a replacement pod): a pod the cache has not seen yet names the VM (the
/// replacement vk restores from the tag): the fresh list finds it, so nothing is asked of
/// the registry beyond the probe-free path, no warning is written, and the finalizer goes.
#[tokio::test]
async fn g1_a_replacement_pod_listed_fresh_keeps_the_tag() {
    let (obj, calls, mut handle, pass) = delete_with_tag(Fence::unfenced());
    let (method, uri, _, _) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::GET, "{uri}");
    // S7's read of its own pod goes beside the CR's: gone.
    let (method, uri) = fail_request(&mut handle, 404).await;
    assert_eq!(
        (method, uri.ends_with("/pods/web-0")),
        (http::Method::GET, true)
    );
    fresh_pod_list(&mut handle, &[("web-0-new", "vm-a")]).await;
    // Then only the finalizer: a fresh read and its removal; no event, no delete.
    let (method, uri, _, _) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::GET, "{uri}");
    let (method, uri, _, _) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::PATCH, "{uri}");
    ended(pass).await.unwrap();
    assert!(
        calls.lock().unwrap().is_empty(),
        "G1: the registry is not asked"
    );
}

/// SPEC G1 (issue: the finalizer's same-object guard): a pass for a deleted CR that finds
/// a CR recreated under the same name in the cache (another uid, not deleting) leaves it
/// alone: it neither deletes its tag nor takes its finalizer.
#[tokio::test]
async fn g1_a_pass_for_a_deleted_cr_never_strips_a_recreated_ones_finalizer() {
    let old = deleting_hibernated();
    let mut recreated = cr(true, Some(Phase::Hibernated));
    recreated.metadata.uid = Some("cr-uid-2".into());
    let cache = SharedCache::from_objects(vec![recreated], vec![]);
    let store = holding_the_snapshot();
    let calls = store.calls.clone();
    let (ctx, mut handle) = context_with(cache, store);
    let pass = tokio::spawn(reconcile(Arc::new(old), ctx));
    no_more_requests(&mut handle).await;
    ended(pass).await.unwrap();
    assert!(calls.lock().unwrap().is_empty());
}

/// SPEC G1 G2 S6 S7: with the registry unreachable nothing is known about the tag: no
/// warning, no delete, and the finalizer (only ours) is still removed from the CR as
/// the apiserver holds it.
#[tokio::test]
async fn g2_deletion_removes_the_finalizer_though_the_registry_is_down() {
    let obj = deleting_hibernated();
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![]);
    let store = FakeStore::unreachable();
    let calls = store.calls.clone();
    let (ctx, mut handle) = context_with(cache, store);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx.clone()));
    fresh_reads(&mut handle, &obj, None).await;
    // The finalizer goes from a fresh read of the same object.
    let (method, uri, _, _) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::GET);
    assert!(uri.ends_with("/cocoonhibernations/web-0"), "{uri}");
    let (method, uri, _, body) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::PATCH);
    assert!(uri.contains("/cocoonhibernations/web-0?"), "{uri}");
    assert_eq!(
        body[0],
        json!({"op": "test", "path": "/metadata/uid", "value": "cr-uid"})
    );
    assert_eq!(
        body[1],
        json!({"op": "test", "path": "/metadata/finalizers", "value": ["other/keep", FINALIZER]})
    );
    assert_eq!(
        body[2],
        json!({"op": "replace", "path": "/metadata/finalizers", "value": ["other/keep"]})
    );
    ended(pass).await.unwrap();
    assert_eq!(*calls.lock().unwrap(), ["probe vm-a"]);
}

/// SPEC G1 S6 S7: deleting a CR whose pod is gone, with the tag in the registry: the
/// Warning comes after the fresh reads and before the delete, which names the digest.
#[tokio::test]
async fn s6_s7_deletion_warns_then_deletes_the_confirmed_digest() {
    let (obj, calls, mut handle, pass) = delete_with_tag(Fence::unfenced());
    fresh_reads(&mut handle, &obj, None).await;
    let (method, uri, _, event) = expect_request(&mut handle, json!({})).await;
    assert_eq!(method, http::Method::POST);
    assert!(uri.contains("/events"), "{uri}");
    assert_eq!(
        (event["reason"].as_str(), event["type"].as_str()),
        (Some("SnapshotDiscarded"), Some("Warning"))
    );
    assert_eq!(
        *calls.lock().unwrap(),
        ["probe vm-a"],
        "S6: warned before the delete"
    );
    expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    ended(pass).await.unwrap();
    assert_eq!(
        *calls.lock().unwrap(),
        ["probe vm-a", "delete vm-a@sha256:aaa"]
    );
}

/// SPEC S6: a SnapshotDiscarded that cannot be written deletes nothing and keeps the
/// finalizer; the pass fails and is retried.
#[tokio::test]
async fn s6_an_unwritten_warning_deletes_nothing() {
    let (obj, calls, mut handle, pass) = delete_with_tag(Fence::unfenced());
    fresh_reads(&mut handle, &obj, None).await;
    let (method, uri) = fail_request(&mut handle, 500).await;
    assert_eq!(method, http::Method::POST);
    assert!(uri.contains("/events"), "{uri}");
    assert!(ended(pass).await.is_err(), "the pass is retried");
    no_more_requests(&mut handle).await;
    assert_eq!(
        *calls.lock().unwrap(),
        ["probe vm-a"],
        "S6: nothing deleted"
    );
}

/// SPEC S1 (issue: a fence closing mid-pass): the fence is open when the deletion's pass
/// starts and closes while it reads the CR, the pods and the pod fresh. The re-check right
/// before the DELETE keeps the tag, though the Warning was already written.
#[tokio::test]
async fn s1_a_fence_closing_during_the_fresh_reads_sends_no_delete() {
    let fence = Fence::unfenced();
    let (obj, calls, mut handle, pass) = delete_with_tag(fence.clone());
    let (method, _, _, _) = expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::GET);
    fence.close();
    let (method, uri) = fail_request(&mut handle, 404).await;
    assert_eq!(
        (method, uri.ends_with("/pods/web-0")),
        (http::Method::GET, true)
    );
    fresh_pod_list(&mut handle, &[]).await;
    let (method, uri, _, _) = expect_request(&mut handle, json!({})).await;
    assert_eq!(method, http::Method::POST, "the S6 warning: {uri}");
    let err = ended(pass).await.unwrap_err();
    assert_eq!(err.metric_label(), "fenced");
    assert_eq!(*calls.lock().unwrap(), ["probe vm-a"], "S1: no DELETE");
}

/// SPEC S1 S7 (issue: FENCE_SLACK): a fence that still holds, but for less than the slack
/// the last registry request must leave before it closes, sends no DELETE: the registry
/// may carry out a DELETE it received until after the fence closed.
#[tokio::test]
async fn s1_a_fence_about_to_close_sends_no_delete() {
    let fence = Fence::unfenced();
    let (obj, calls, mut handle, pass) = delete_with_tag(fence.clone());
    fresh_reads(&mut handle, &obj, None).await;
    // Open for another 300 ms, less than the slack (500 ms).
    fence.extend_to(tokio::time::Instant::now() + Duration::from_millis(300));
    let (method, _, _, _) = expect_request(&mut handle, json!({})).await;
    assert_eq!(method, http::Method::POST, "the S6 warning");
    // G2: the finalizer still goes (the tag is kept, a leak the audit can find).
    expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    let _ = ended(pass).await;
    assert!(
        !calls
            .lock()
            .unwrap()
            .iter()
            .any(|c| c.starts_with("delete")),
        "S1: no DELETE inside the slack: {:?}",
        calls.lock().unwrap()
    );
}

/// SPEC S1: with the fence closed, a deletion sends nothing to the registry and keeps the
/// finalizer, although the apiserver answers.
#[tokio::test]
async fn s1_a_closed_fence_sends_no_delete() {
    let (_, calls, mut handle, pass) = delete_with_tag(Fence::closed());
    let err = ended(pass).await.unwrap_err();
    assert_eq!(err.metric_label(), "fenced");
    no_more_requests(&mut handle).await;
    assert!(
        calls.lock().unwrap().is_empty(),
        "S1: {:?}",
        calls.lock().unwrap()
    );
}

/// A CR waking its pod, with the snapshot's digest recorded at H3.
fn waking_with_digest() -> CocoonHibernation {
    let mut obj = cr(true, Some(Phase::Waking));
    obj.spec.desire = Desire::Wake;
    if let Some(status) = obj.status.as_mut() {
        status.snapshot = Some(crate::api::SnapshotStatus {
            digest: Some("sha256:aaa".into()),
        });
    }
    obj
}

/// `pod` with its VM container running.
fn with_running_container(mut pod: Pod) -> Pod {
    pod.status = Some(
        serde_json::from_value(json!({
            "containerStatuses": [{"name": "vm", "image": "i", "imageID": "", "ready": true,
                "restartCount": 0, "state": {"running": {}}}]
        }))
        .unwrap(),
    );
    pod
}

/// The registry holding the snapshot `sha256:aaa`.
fn holding_the_snapshot() -> FakeStore {
    FakeStore {
        digest: Some("sha256:aaa".into()),
        ..FakeStore::default()
    }
}

/// A pass over `obj`, with `cached` as the cache's pod and the registry holding the
/// snapshot `sha256:aaa`.
fn pass_over(obj: &CocoonHibernation, cached: Pod) -> (Calls, Arc<Context>, ApiHandle, Pass) {
    pass_over_with(obj, cached, holding_the_snapshot())
}

fn pass_over_with(
    obj: &CocoonHibernation,
    cached: Pod,
    store: FakeStore,
) -> (Calls, Arc<Context>, ApiHandle, Pass) {
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![cached]);
    let calls = store.calls.clone();
    let (ctx, handle) = context_with(cache, store);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx.clone()));
    (calls, ctx, handle, pass)
}

/// The pass ends deferred for `reason`, to look again later; nothing more is asked of
/// the apiserver, and nothing of the registry.
async fn deferred_without_a_delete(
    pass: Pass,
    handle: ApiHandle,
    calls: &Calls,
    ctx: &Context,
    reason: &str,
) {
    deferred_after(pass, handle, calls, &[], ctx, reason).await;
}

/// The pass ends deferred for `reason`, to look again later, having asked nothing more
/// of the apiserver and only `registry_calls` of the registry.
async fn deferred_after(
    pass: Pass,
    mut handle: ApiHandle,
    calls: &Calls,
    registry_calls: &[&str],
    ctx: &Context,
    reason: &str,
) {
    let action = ended(pass).await.unwrap();
    assert_ne!(action, kube::runtime::controller::Action::await_change());
    no_more_requests(&mut handle).await;
    assert_eq!(*calls.lock().unwrap(), registry_calls, "S7");
    let metric = format!(r#"pass_deferrals_total{{reason="{reason}"}} 1"#);
    assert!(ctx.metrics.encode().unwrap().contains(&metric), "{metric}");
}

/// SPEC S7 W2: the cache shows the VM running again but the apiserver shows vk still
/// restoring it: the wake does not end and the tag is not deleted.
#[tokio::test]
async fn s7_w2_a_stale_pod_cache_deletes_nothing() {
    let obj = waking_with_digest();
    // The pre-hibernate view: running, the old VMID, no annotation.
    let before = with_running_container(running_pod());
    let (calls, ctx, mut handle, pass) = pass_over(&obj, before);
    let restoring = pod(&[(VM_NAME, "vm-a"), (LIFECYCLE_STATE, "hibernated")]);
    fresh_reads(&mut handle, &obj, Some(restoring)).await;
    deferred_without_a_delete(pass, handle, &calls, &ctx, "stale_pod").await;
}

/// SPEC S7 (issue 38: the pod is read beside the CR): the pod read is the one the planned
/// CR names; a fresh CR naming another (podRef edited past the webhook and CEL) deletes
/// nothing, though the pod just read shows the VM running again.
#[tokio::test]
async fn s7_a_fresh_cr_naming_another_pod_than_the_one_read_deletes_nothing() {
    let obj = waking_with_digest();
    let woken = with_running_container(running_pod());
    let (calls, ctx, mut handle, pass) = pass_over(&obj, woken.clone());
    let mut moved = obj.clone();
    moved.spec.pod_ref.name = "web-1".into();
    let (method, uri, _, _) =
        expect_request(&mut handle, serde_json::to_value(&moved).unwrap()).await;
    assert_eq!(method, http::Method::GET, "{uri}");
    let (method, uri, _, _) =
        expect_request(&mut handle, serde_json::to_value(&woken).unwrap()).await;
    assert_eq!(
        (method, uri.ends_with("/pods/web-0")),
        (http::Method::GET, true),
        "S7: the planned CR's pod is read beside it"
    );
    deferred_without_a_delete(pass, handle, &calls, &ctx, "stale_view").await;
}

/// SPEC F2 W2: a status write computed from a stale cache meets a 409 and is retried,
/// never forced; the hibernate request it would have recorded never reaches the pod.
#[tokio::test]
async fn f2_w2_stale_cache_status_write_conflicts_and_the_pod_is_untouched() {
    let obj = cr(true, None);
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![running_pod()]);
    let (ctx, mut handle) = context(cache);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx.clone()));
    let (req, send) = tokio::time::timeout(Duration::from_secs(5), handle.next_request())
        .await
        .unwrap()
        .unwrap();
    assert!(req.uri().path().ends_with("/web-0/status"));
    let conflict = json!({
        "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Conflict", "code": 409,
        "message": "the object has been modified; please apply your changes to the latest version and try again"
    });
    send.send_response(
        Response::builder()
            .status(409)
            .body(Body::from(serde_json::to_vec(&conflict).unwrap()))
            .unwrap(),
    );
    let err = ended(pass).await.unwrap_err();
    assert_eq!(err.metric_label(), "conflict");
    no_more_requests(&mut handle).await;
    let action = super::error_policy(Arc::new(obj), &err, ctx.clone());
    assert_ne!(
        action,
        kube::runtime::controller::Action::await_change(),
        "retried"
    );
    assert!(
        ctx.metrics
            .encode()
            .unwrap()
            .contains(r#"reconcile_errors_total{error="conflict"} 1"#)
    );
}

/// SPEC F2 W3: when the fresh read before a wake's pod patch shows a newer CR than the
/// cache (the user flipped the desire since), the pass touches neither the pod nor the
/// status, and looks again soon. (A hibernate's status write goes first and meets the 409.)
#[tokio::test]
async fn f2_a_stale_view_defers_before_the_pod_patch() {
    let mut obj = cr(true, Some(Phase::Hibernated));
    obj.spec.desire = crate::api::Desire::Wake;
    let hibernated = pod(&[
        (VM_NAME, "vm-a"),
        ("vm.cocoonstack.io/hibernate", "true"),
        (LIFECYCLE_STATE, "hibernated"),
    ]);
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![hibernated]);
    let (ctx, mut handle) = context(cache);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx.clone()));
    let mut newer = obj.clone();
    newer.metadata.resource_version = Some("42".into());
    newer.spec.desire = crate::api::Desire::Hibernate;
    let (method, _, _, _) =
        expect_request(&mut handle, serde_json::to_value(&newer).unwrap()).await;
    assert_eq!(method, http::Method::GET);
    let action = ended(pass).await.unwrap();
    assert_ne!(action, kube::runtime::controller::Action::await_change());
    no_more_requests(&mut handle).await;
    assert!(
        ctx.metrics
            .encode()
            .unwrap()
            .contains(r#"pass_deferrals_total{reason="stale_view"} 1"#)
    );
}

/// A CR whose hibernate request vk has answered, and the pod as vk left it: hibernated
/// this round, the VMID gone.
fn hibernating_answered() -> (CocoonHibernation, Pod) {
    let mut obj = cr(true, Some(Phase::Hibernating));
    if let Some(status) = obj.status.as_mut() {
        status.pre_hibernate_vm_id = Some("id-1".into());
    }
    let done = pod(&[
        (VM_NAME, "vm-a"),
        (HIBERNATE, "true"),
        (LIFECYCLE_STATE, "hibernated"),
    ]);
    (obj, done)
}

/// SPEC S7 H3: a hibernate ends only if the pod read fresh ends it too; a cache that shows
/// vk's answer before the apiserver does writes nothing.
#[tokio::test]
async fn h3_s7_a_hibernate_ending_on_a_stale_pod_cache_writes_nothing() {
    let (obj, done) = hibernating_answered();
    let (calls, ctx, mut handle, pass) = pass_over(&obj, done);
    let still_hibernating = pod(&[
        (VM_NAME, "vm-a"),
        (HIBERNATE, "true"),
        (LIFECYCLE_STATE, "hibernating"),
    ]);
    let (method, uri, _, _) = expect_request(
        &mut handle,
        serde_json::to_value(&still_hibernating).unwrap(),
    )
    .await;
    assert_eq!(
        (method, uri.as_str()),
        (http::Method::GET, "/api/v1/namespaces/ns/pods/web-0")
    );
    deferred_after(pass, handle, &calls, &["probe vm-a"], &ctx, "stale_pod").await;
}

/// SPEC S7 H3 (issue 38): an ending's fresh pod read goes out beside the probe, not after
/// it: here the registry answers only once the apiserver has the read.
#[tokio::test]
async fn h3_s7_an_endings_fresh_pod_read_goes_out_beside_the_probe() {
    let (obj, done) = hibernating_answered();
    let gate = Arc::new(tokio::sync::Notify::new());
    let store = FakeStore {
        probe_gate: Some(gate.clone()),
        ..holding_the_snapshot()
    };
    let (calls, _ctx, mut handle, pass) = pass_over_with(&obj, done.clone(), store);
    let (method, uri, _, _) =
        expect_request(&mut handle, serde_json::to_value(&done).unwrap()).await;
    assert_eq!(
        (method, uri.as_str()),
        (http::Method::GET, "/api/v1/namespaces/ns/pods/web-0")
    );
    gate.notify_one();
    let (method, uri, _, body) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::PATCH, "{uri}");
    assert_eq!(body["status"]["phase"], "Hibernated", "{uri}");
    ended(pass).await.unwrap();
    assert_eq!(*calls.lock().unwrap(), ["probe vm-a"]);
}
