//! The effects layer against a mocked apiserver (tower-test): which requests a pass makes,
//! in what shape, and that a settled pass makes none.

use super::plan::Settings;
use super::reconcile::{Context, reconcile};
use crate::api::annotations::{
    COCOONSET_GENERATION, LIFECYCLE_OBSERVED_GENERATION, LIFECYCLE_STATE, VM_ID, VM_NAME,
};
use crate::api::conditions::{READY, REASON_DONE, Update, upsert};
use crate::api::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Desire, FINALIZER, Phase,
    PodRef,
};
use crate::cache::SharedCache;
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
        crate::leader::Fence::unfenced(),
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

/// SPEC H1 H2 O1 F2: entering Hibernating reads the CR fresh, patches the pod (guarded by its uid), then the
/// status subresource (guarded by the resourceVersion the pass read).
#[tokio::test]
async fn h1_h2_entering_patches_pod_then_status_subresource() {
    let obj = cr(true, None);
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![running_pod()]);
    let (ctx, mut handle) = context(cache);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx));

    // F2: a fresh read shows the planned version before the pod is touched.
    let (method, uri, _, _) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::GET);
    assert!(uri.ends_with("/cocoonhibernations/web-0"), "{uri}");
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
        body[1]["path"],
        "/metadata/annotations/vm.cocoonstack.io~1hibernate"
    );

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
    pass.await.unwrap().unwrap();
    no_more_requests(&mut handle).await;
}

/// SPEC G1 G2 S6 S1: deleting a Hibernated CR first warns that its snapshot is
/// discarded, then reads the CR fresh from the apiserver before the delete; with the
/// registry unreachable the finalizer is still removed, and only ours.
#[tokio::test]
async fn g2_deletion_removes_the_finalizer_though_the_registry_is_down() {
    let mut obj = cr(true, Some(Phase::Hibernated));
    obj.metadata.finalizers = Some(vec!["other/keep".into(), FINALIZER.into()]);
    obj.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::now()));
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![]);
    let store = FakeStore::unreachable();
    let calls = store.calls.clone();
    let (ctx, mut handle) = context_with(cache, store);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx.clone()));
    // S6: the Warning event comes before anything touches the registry.
    let (method, uri, _, event) = expect_request(&mut handle, json!({})).await;
    assert_eq!(method, http::Method::POST);
    assert!(uri.contains("/events"), "{uri}");
    assert_eq!(event["reason"], "SnapshotDiscarded");
    assert_eq!(event["type"], "Warning");
    assert!(
        event["note"].as_str().unwrap_or_default().contains("vm-a"),
        "{event}"
    );
    // S1: a fresh GET (not the cache) confirms the same CR still owes the delete.
    let (method, uri, _, _) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::GET);
    assert!(uri.contains("/cocoonhibernations/web-0"), "{uri}");
    let (method, uri, _, body) =
        expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    assert_eq!(method, http::Method::PATCH);
    assert!(uri.contains("/cocoonhibernations/web-0?"), "{uri}");
    assert_eq!(
        body[0],
        json!({"op": "test", "path": "/metadata/finalizers", "value": ["other/keep", FINALIZER]})
    );
    assert_eq!(
        body[1],
        json!({"op": "replace", "path": "/metadata/finalizers", "value": ["other/keep"]})
    );
    pass.await.unwrap().unwrap();
    // The delete was asked for once, after the fresh read, and failed.
    assert_eq!(*calls.lock().unwrap(), ["delete vm-a"]);
}

/// A status write computed from a stale cache meets a 409 and is retried, never forced.
#[tokio::test]
async fn stale_cache_status_write_conflicts_and_is_retried() {
    let obj = cr(true, None);
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![running_pod()]);
    let (ctx, mut handle) = context(cache);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx.clone()));
    expect_request(&mut handle, serde_json::to_value(&obj).unwrap()).await;
    expect_request(&mut handle, serde_json::to_value(running_pod()).unwrap()).await;
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
    let err = pass.await.unwrap().unwrap_err();
    assert_eq!(err.metric_label(), "conflict");
    let action = super::reconcile::error_policy(Arc::new(obj), &err, ctx.clone());
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

/// SPEC F2 W3: when the fresh read shows a newer CR than the cache (the user flipped the
/// desire since), the pass touches neither the pod nor the status, and looks again soon.
#[tokio::test]
async fn f2_a_stale_view_defers_before_the_pod_patch() {
    let obj = cr(true, None);
    let cache = SharedCache::from_objects(vec![obj.clone()], vec![running_pod()]);
    let (ctx, mut handle) = context(cache);
    let pass = tokio::spawn(reconcile(Arc::new(obj.clone()), ctx.clone()));
    let mut newer = obj.clone();
    newer.metadata.resource_version = Some("42".into());
    newer.spec.desire = crate::api::Desire::Wake;
    let (method, _, _, _) =
        expect_request(&mut handle, serde_json::to_value(&newer).unwrap()).await;
    assert_eq!(method, http::Method::GET);
    let action = pass.await.unwrap().unwrap();
    assert_ne!(action, kube::runtime::controller::Action::await_change());
    no_more_requests(&mut handle).await;
    assert!(
        ctx.metrics
            .encode()
            .unwrap()
            .contains(r#"pass_deferrals_total{reason="stale_view"} 1"#)
    );
}
