//! In-process tests of the admission router with JSON fixtures (V1–V5). No server, no TLS.

use axum::body::Body;
use axum::http::{Request, StatusCode};
use cocoon_hibernation::metrics::Metrics;
use cocoon_hibernation::webhook::validate::{Claim, ClaimView, VmHolder};
use cocoon_hibernation::webhook::{self, WebhookState};
use http_body_util::BodyExt;
use rstest::rstest;
use serde_json::Value;
use tower::ServiceExt;

const UID: &str = "705ab4f5-6393-11e8-b7cc-42010a800002";

/// A cache view: synced or not, and which CRs target which pod.
#[derive(Clone, Default)]
struct FakeView {
    synced: bool,
    claims: Vec<(&'static str, &'static str, bool)>, // (pod, cr name, terminating)
    held_vm: Option<(&'static str, VmHolder)>,       // (pod, who holds its VM)
}

impl ClaimView for FakeView {
    fn synced(&self) -> bool {
        self.synced
    }
    fn claims(&self, namespace: &str, pod: &str) -> Vec<Claim> {
        if namespace != "team-a" {
            return vec![];
        }
        self.claims
            .iter()
            .filter(|(p, _, _)| *p == pod)
            .map(|(_, n, t)| Claim {
                name: (*n).into(),
                terminating: *t,
            })
            .collect()
    }
    fn vm_holder(&self, namespace: &str, pod: &str) -> Option<VmHolder> {
        self.held_vm
            .as_ref()
            .filter(|(p, _)| namespace == "team-a" && *p == pod)
            .map(|(_, h)| h.clone())
    }
}

fn synced() -> FakeView {
    FakeView {
        synced: true,
        claims: vec![("web-1", "old-web-1", false)],
        held_vm: None,
    }
}

fn fixture(name: &str) -> Vec<u8> {
    let path = testkit::repo_root().join("tests/data/admission").join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

async fn post(view: FakeView, body: Vec<u8>) -> (StatusCode, Value) {
    let app = webhook::router(WebhookState {
        view,
        metrics: Metrics::new(),
    });
    let req = Request::post(webhook::PATH)
        .header("content-type", "application/json")
        .body(Body::from(body))
        .unwrap();
    let res = app.oneshot(req).await.unwrap();
    let status = res.status();
    let bytes = res.into_body().collect().await.unwrap().to_bytes();
    let json = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
    (status, json)
}

fn verdict(body: &Value) -> (bool, String) {
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    assert_eq!(body["response"]["uid"], UID, "V5: the uid is echoed");
    (
        body["response"]["allowed"].as_bool().unwrap(),
        body["response"]["status"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

/// SPEC V1 V2 V4 V5: each fixture is a real AdmissionReview body.
#[rstest]
#[case::v1_valid_create("create_valid.json", true, "")]
#[case::v1_name_must_equal_pod_ref(
    "create_name_mismatch.json",
    false,
    "metadata.name \"my-hib\" must equal spec.podRef.name \"web-0\""
)]
#[case::v2_live_duplicate(
    "create_duplicate.json",
    false,
    "team-a/old-web-1 already targets pod web-1; flip its spec.desire instead"
)]
#[case::v4_pod_ref_immutable("update_podref_changed.json", false, "spec.podRef is immutable")]
#[case::v4_desire_flip_allowed("update_desire_flip.json", true, "")]
#[case::delete_allowed("delete.json", true, "")]
#[case::v5_object_does_not_decode("undecodable_object.json", false, "object does not decode")]
#[case::v5_wrong_kind("wrong_kind.json", false, "not \"Pod\"")]
#[tokio::test]
async fn admission_fixtures(#[case] file: &str, #[case] allowed: bool, #[case] message: &str) {
    let (status, body) = post(synced(), fixture(file)).await;
    assert_eq!(status, StatusCode::OK);
    let (got_allowed, got_message) = verdict(&body);
    assert_eq!(got_allowed, allowed, "{got_message}");
    assert!(
        got_message.contains(message),
        "{got_message:?} lacks {message:?}"
    );
}

/// SPEC V2.
#[tokio::test]
async fn v2_terminating_duplicate_says_retry_after_cleanup() {
    let view = FakeView {
        synced: true,
        claims: vec![("web-1", "old-web-1", true)],
        held_vm: None,
    };
    let (_, body) = post(view, fixture("create_duplicate.json")).await;
    let (allowed, message) = verdict(&body);
    assert!(!allowed);
    assert!(
        message.contains("is terminating; retry after its cleanup finishes"),
        "{message}"
    );
}

/// SPEC V2.
#[tokio::test]
async fn v2_the_cr_itself_is_not_a_duplicate() {
    let view = FakeView {
        synced: true,
        claims: vec![("web-0", "web-0", false)],
        held_vm: None,
    };
    let (_, body) = post(view, fixture("create_valid.json")).await;
    assert!(verdict(&body).0);
}

/// SPEC V3.
#[tokio::test]
async fn v3_fails_closed_until_the_cache_has_synced() {
    let view = FakeView {
        synced: false,
        claims: vec![],
        held_vm: None,
    };
    let (status, body) = post(view, fixture("create_valid.json")).await;
    assert_eq!(status, StatusCode::OK);
    let (allowed, message) = verdict(&body);
    assert!(!allowed);
    assert!(message.contains("not synced"), "{message}");
}

/// SPEC V3.
#[tokio::test]
async fn v3_update_needs_no_cache() {
    let (_, body) = post(FakeView::default(), fixture("update_desire_flip.json")).await;
    assert!(verdict(&body).0);
}

/// SPEC V5.
#[rstest]
#[case::v5_not_json("not_json.txt", "not JSON")]
#[case::v5_wrong_api_version("wrong_api_version.json", "expected apiVersion admission.k8s.io/v1")]
#[case::v5_missing_request("missing_request.json", "has no request")]
#[case::v5_missing_uid("missing_uid.json", "missing field `uid`")]
#[case::v5_unknown_operation(
    "bad_operation.json",
    "unknown variant `PATCH`, expected one of `CREATE`"
)]
#[tokio::test]
async fn v5_malformed_reviews_get_a_clear_400(#[case] file: &str, #[case] message: &str) {
    let (status, body) = post(synced(), fixture(file)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert!(body["error"].as_str().unwrap().contains(message), "{body}");
}

/// SPEC V5.
#[tokio::test]
async fn v5_oversized_body_is_refused_with_413() {
    let mut big = b"{\"apiVersion\":\"admission.k8s.io/v1\",\"pad\":\"".to_vec();
    big.resize(webhook::MAX_BODY_BYTES + 10, b'a');
    let (status, _) = post(synced(), big).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
}

/// SPEC V5.
#[tokio::test]
async fn v5_arbitrary_bytes_never_panic() {
    // A cheap deterministic fuzz: truncations and byte flips of a valid review.
    let valid = fixture("create_valid.json");
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    for i in 0..300 {
        let mut body = valid.clone();
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        if i % 2 == 0 {
            body.truncate((seed as usize) % body.len());
        } else {
            let at = (seed as usize) % body.len();
            body[at] = (seed >> 8) as u8;
        }
        let (status, _) = post(synced(), body).await;
        assert!(
            status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
            "{status}"
        );
    }
}

/// SPEC O1.
#[tokio::test]
async fn o1_admission_decisions_are_counted_by_result() {
    let metrics = Metrics::new();
    let app = webhook::router(WebhookState {
        view: synced(),
        metrics: metrics.clone(),
    });
    for file in [
        "create_valid.json",
        "create_name_mismatch.json",
        "not_json.txt",
    ] {
        let req = Request::post(webhook::PATH)
            .body(Body::from(fixture(file)))
            .unwrap();
        app.clone().oneshot(req).await.unwrap();
    }
    let text = metrics.encode().unwrap();
    for result in ["allowed", "denied", "invalid"] {
        assert!(
            text.contains(&format!("result=\"{result}\"}} 1")),
            "{result} missing in\n{text}"
        );
    }
}

/// SPEC O1 V3: the operation label is the review's operation (`unknown` for a body that
/// is not a review), and the V3 denial of an unsynced cache is a result of its own.
#[tokio::test]
async fn o1_v3_admission_labels_name_the_operation_and_an_unsynced_cache() {
    let metrics = Metrics::new();
    let send = |view: FakeView, file: &str| {
        let app = webhook::router(WebhookState {
            view,
            metrics: metrics.clone(),
        });
        let req = Request::post(webhook::PATH)
            .body(Body::from(fixture(file)))
            .unwrap();
        async move { app.oneshot(req).await.unwrap() }
    };
    send(synced(), "create_valid.json").await;
    send(FakeView::default(), "create_valid.json").await;
    send(synced(), "update_podref_changed.json").await;
    send(synced(), "delete.json").await;
    send(synced(), "not_json.txt").await;
    let text = metrics.encode().unwrap();
    let family = "cocoon_hibernation_admission_decisions_total";
    for (operation, result) in [
        ("CREATE", "allowed"),
        ("CREATE", "unsynced"),
        ("UPDATE", "denied"),
        ("DELETE", "allowed"),
        ("unknown", "invalid"),
    ] {
        let line = format!("{family}{{operation=\"{operation}\",result=\"{result}\"}} 1");
        assert!(text.contains(&line), "{line} missing in\n{text}");
    }
    assert!(!text.contains("operation=\"review\""), "{text}");
}

#[tokio::test]
async fn wrong_method_and_path_are_not_served() {
    let app = webhook::router(WebhookState {
        view: synced(),
        metrics: Metrics::new(),
    });
    let get = app
        .clone()
        .oneshot(Request::get(webhook::PATH).body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(get.status(), StatusCode::METHOD_NOT_ALLOWED);
    let other = app
        .oneshot(Request::post("/other").body(Body::empty()).unwrap())
        .await
        .unwrap();
    assert_eq!(other.status(), StatusCode::NOT_FOUND);
}

/// SPEC S2 S12: a CREATE whose pod names a VM another live CR holds through another pod is
/// denied; the denial names a holder of the request's namespace, and one of another
/// namespace only as "a CR in another namespace" (never its namespace or name).
#[rstest]
#[case::s12_holder_in_another_namespace_unnamed("team-b", "db-0", false)]
#[case::s12_holder_named_like_the_namespace_unnamed("team-b", "team-a", false)]
#[case::s2_holder_in_the_same_namespace_named("team-a", "db-0", true)]
#[tokio::test]
async fn s2_create_on_a_pod_naming_a_held_vm_is_denied(
    #[case] holder_ns: &'static str,
    #[case] holder_name: &'static str,
    #[case] named: bool,
) {
    let view = FakeView {
        synced: true,
        claims: vec![],
        held_vm: Some((
            "web-0",
            VmHolder {
                vm: "vm-victim".into(),
                namespace: holder_ns.into(),
                name: holder_name.into(),
            },
        )),
    };
    let (_, body) = post(view.clone(), fixture("create_valid.json")).await;
    let (allowed, message) = verdict(&body);
    assert!(!allowed);
    assert!(message.contains("vm-victim"), "{message}");
    if named {
        assert!(
            message.contains(&format!("CocoonHibernation {holder_ns}/{holder_name}")),
            "{message}"
        );
    } else {
        assert!(message.contains("a CR in another namespace"), "{message}");
        assert!(!message.contains(holder_ns), "{message}");
        assert!(!message.contains(holder_name), "{message}");
    }
    let free = FakeView {
        held_vm: None,
        ..view
    };
    let (_, body) = post(free, fixture("create_valid.json")).await;
    assert!(
        verdict(&body).0,
        "the same CREATE passes once the VM is free"
    );
}
