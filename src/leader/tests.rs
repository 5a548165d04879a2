//! The election loop against a mocked apiserver (tower-test), on tokio's paused clock:
//! exact instants, no waiting.

use super::decide::{Readiness, Timing};
use super::elector::{Elector, Leadership};
use super::*;
use http::{Method, Request, Response, StatusCode};
use kube::client::Body;
use serde_json::{Value, json};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use tower_test::mock;

const ME: &str = "replica-a";

/// What the mock apiserver does with one request: answer, or never answer (a dead
/// connection).
enum Reply {
    Answer(StatusCode, Value),
    Hang,
}

fn lease(rv: u64, holder: &str, duration: i32) -> Value {
    json!({
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": { "name": "lease", "namespace": "ns", "resourceVersion": rv.to_string() },
        "spec": { "holderIdentity": holder, "leaseDurationSeconds": duration },
    })
}

fn not_found() -> Reply {
    Reply::Answer(
        StatusCode::NOT_FOUND,
        json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
               "reason": "NotFound", "code": 404, "message": "leases \"lease\" not found"}),
    )
}

struct Harness {
    election: Election,
    patches: Arc<Mutex<Vec<Value>>>,
    requests: Arc<AtomicUsize>,
    _hung: Arc<Mutex<Vec<mock::SendResponse<Response<Body>>>>>,
}

/// Starts an election (lease duration 6 s: margin 1.2 s, fence span 4.8 s, retry 1.2 s,
/// request timeout 1 s)
/// against a mock that answers with `serve(method, n-th request of that method, body)`.
fn start(serve: impl FnMut(&Method, usize, &Value) -> Reply + Send + 'static) -> (Harness, Timing) {
    start_with(serve, Arc::new(|| Readiness::Ready))
}

/// [`start`] with the cache's readiness given by `readiness` (S8).
fn start_with(
    mut serve: impl FnMut(&Method, usize, &Value) -> Reply + Send + 'static,
    readiness: Arc<dyn Fn() -> Readiness + Send + Sync>,
) -> (Harness, Timing) {
    let (service, mut handle) = mock::pair::<Request<Body>, Response<Body>>();
    let client = kube::Client::new(service, "ns");
    let patches = Arc::new(Mutex::new(Vec::new()));
    let requests = Arc::new(AtomicUsize::new(0));
    let hung = Arc::new(Mutex::new(Vec::new()));
    let (p, r, h) = (patches.clone(), requests.clone(), hung.clone());
    tokio::spawn(async move {
        let mut counts = std::collections::HashMap::<Method, usize>::new();
        while let Some((req, send)) = handle.next_request().await {
            r.fetch_add(1, Ordering::SeqCst);
            let method = req.method().clone();
            let bytes = http_body_util::BodyExt::collect(req.into_body())
                .await
                .unwrap()
                .to_bytes();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            if method == Method::PATCH {
                p.lock().unwrap().push(body.clone());
            }
            let n = counts.entry(method.clone()).or_default();
            *n += 1;
            match serve(&method, *n, &body) {
                Reply::Answer(code, value) => send.send_response(
                    Response::builder()
                        .status(code)
                        .body(Body::from(serde_json::to_vec(&value).unwrap()))
                        .unwrap(),
                ),
                Reply::Hang => h.lock().unwrap().push(send),
            }
        }
    });
    // A 1 s request timeout, so a hung request does not end on a retry-period boundary.
    let timing = Timing::new(Duration::from_secs(6), Duration::from_secs(1));
    let fence = Fence::closed();
    let (leading_tx, leading) = watch::channel(false);
    let elector = Elector {
        api: kube::Api::namespaced(client, "ns"),
        name: "lease".into(),
        identity: ME.into(),
        timing,
        leadership: Arc::new(Leadership {
            fence: fence.clone(),
            leading: leading_tx,
            span: timing.fence_span(),
        }),
        readiness,
        safety_epoch: super::decide::SAFETY_EPOCH,
        outranked_by: std::sync::atomic::AtomicU64::new(0),
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(elector.run(stop.clone()));
    let election = Election {
        leading,
        task: Some(task),
        fence,
        stop,
        _always: None,
    };
    (
        Harness {
            election,
            patches,
            requests,
            _hung: hung,
        },
        timing,
    )
}

/// Creates the lease on the first pass; every later request gets `after`.
fn leader_then(after: fn() -> Reply) -> impl FnMut(&Method, usize, &Value) -> Reply {
    move |method, n, _| match (method.as_str(), n) {
        ("GET", 1) => not_found(),
        ("POST", _) => Reply::Answer(StatusCode::CREATED, lease(1, ME, 6)),
        _ => after(),
    }
}

/// SPEC S1: when every renewal fails, the fence closes and `leading` goes false exactly at
/// (send time of the last successful renewal) + duration - margin, on our own clock:
/// before any other replica may take the lease (duration after it saw that renewal).
#[rstest::rstest]
#[case::s1_renewals_answered_with_errors(|| Reply::Answer(
    StatusCode::INTERNAL_SERVER_ERROR,
    json!({"kind": "Status", "status": "Failure", "code": 500, "message": "boom"}),
))]
#[case::s1_renewals_never_answered(|| Reply::Hang)]
#[tokio::test(start_paused = true)]
async fn s1_fence_closes_at_last_renewal_plus_span_when_renewals_fail(
    #[case] renewal: fn() -> Reply,
) {
    let t0 = Instant::now();
    let (mut h, timing) = start(leader_then(renewal));
    let leading = &mut h.election.leading;
    leading.wait_for(|l| *l).await.unwrap();
    let deadline = h
        .election
        .fence
        .deadline()
        .expect("fence open while leading");
    // The create was sent at t0: the paused clock does not move while the mock answers.
    assert_eq!(deadline - t0, timing.fence_span());
    assert_eq!(timing.fence_span(), Duration::from_millis(4_800));
    assert!(h.election.fence.valid_until().is_some());

    // Virtual time: a minute passes instantly unless something steps down before.
    tokio::time::timeout(Duration::from_secs(60), leading.wait_for(|l| !*l))
        .await
        .expect("stepped down within a minute")
        .unwrap();
    assert_eq!(
        Instant::now(),
        deadline,
        "stepped down at the fence deadline"
    );
    assert!(h.election.fence.valid_until().is_none());
    assert!(h.election.fence.deadline().is_none(), "fence closed");
    assert!(
        Instant::now() < t0 + timing.lease_duration,
        "before the lease could expire for a follower"
    );
    assert!(
        h.requests.load(Ordering::SeqCst) >= 3,
        "renewals were attempted meanwhile"
    );
}

/// SPEC S1 P2: successful renewals keep the fence moving forward and `leading` true.
#[tokio::test(start_paused = true)]
async fn s1_successful_renewals_keep_the_fence_open() {
    let (h, timing) = start(|method, n, _| match (method.as_str(), n) {
        ("GET", 1) => not_found(),
        ("POST", _) => Reply::Answer(StatusCode::CREATED, lease(1, ME, 6)),
        ("GET", n) => Reply::Answer(StatusCode::OK, lease(n as u64, ME, 6)),
        (_, n) => Reply::Answer(StatusCode::OK, lease(n as u64 + 1, ME, 6)),
    });
    let mut leading = h.election.leading.clone();
    leading.wait_for(|l| *l).await.unwrap();
    tokio::time::sleep(timing.lease_duration * 5).await;
    assert!(*leading.borrow());
    let until = h.election.fence.valid_until().expect("fence open");
    assert!(until > Instant::now() + timing.fence_span() - timing.retry_period * 2);
    assert!(!leading.has_changed().unwrap(), "never stepped down");
    // Every renewal was guarded by the resourceVersion it read.
    for patch in h.patches.lock().unwrap().iter() {
        assert!(patch["metadata"]["resourceVersion"].is_string(), "{patch}");
        assert_eq!(patch["spec"]["holderIdentity"], ME);
    }
}

/// SPEC P4: stopping closes the fence first, then releases the lease the way client-go's
/// ReleaseOnCancel does (holder cleared, leaseDurationSeconds 1), guarded by the
/// resourceVersion.
#[tokio::test(start_paused = true)]
async fn p4_stop_releases_the_lease_and_closes_the_fence() {
    let (mut h, _) = start(|method, n, _| match (method.as_str(), n) {
        ("GET", 1) => not_found(),
        ("POST", _) => Reply::Answer(StatusCode::CREATED, lease(1, ME, 6)),
        ("GET", _) => Reply::Answer(StatusCode::OK, lease(1, ME, 6)),
        _ => Reply::Answer(StatusCode::OK, lease(2, "", 1)),
    });
    h.election.leading.wait_for(|l| *l).await.unwrap();
    h.election.stop.cancel();
    h.election.task.take().unwrap().await.unwrap();
    assert!(!*h.election.leading.borrow());
    assert!(h.election.fence.valid_until().is_none());
    let patches = h.patches.lock().unwrap();
    let release = patches.last().expect("a release patch");
    assert_eq!(release["spec"]["holderIdentity"], "");
    assert_eq!(release["spec"]["leaseDurationSeconds"], 1);
    assert_eq!(release["metadata"]["resourceVersion"], "1");
}

/// SPEC P4 P2: a follower polls every retry period, so a released lease (holder cleared)
/// is taken at the first poll that sees it, not at the old record's expiry.
#[tokio::test(start_paused = true)]
async fn p4_released_lease_is_taken_within_one_retry_period() {
    let t0 = Instant::now();
    let released_at = Duration::from_secs(3);
    let (mut h, timing) = start(move |method, _, _| {
        let released = Instant::now() >= t0 + released_at;
        match (method.as_str(), released) {
            ("GET", false) => Reply::Answer(StatusCode::OK, lease(7, "replica-b", 60)),
            ("GET", true) => Reply::Answer(StatusCode::OK, lease(8, "", 1)),
            _ => Reply::Answer(StatusCode::OK, lease(9, ME, 6)),
        }
    });
    h.election.leading.wait_for(|l| *l).await.unwrap();
    let took = Instant::now() - t0;
    assert!(
        took >= released_at && took <= released_at + timing.retry_period,
        "taken {took:?} after start; released at {released_at:?}"
    );
    let patches = h.patches.lock().unwrap();
    assert_eq!(patches.len(), 1, "one acquisition: {patches:?}");
    assert_eq!(patches[0]["metadata"]["resourceVersion"], "8");
}

/// SPEC P2: a lease held by another replica is taken only after its full duration has
/// passed on our clock since we first saw that version, and the write is guarded by it.
#[tokio::test(start_paused = true)]
async fn p2_held_lease_is_taken_only_after_its_duration_unchanged() {
    let t0 = Instant::now();
    let (mut h, _) = start(|method, _, _| match method.as_str() {
        "GET" => Reply::Answer(StatusCode::OK, lease(7, "replica-b", 10)),
        _ => Reply::Answer(StatusCode::OK, lease(8, ME, 6)),
    });
    h.election.leading.wait_for(|l| *l).await.unwrap();
    assert!(Instant::now() - t0 >= Duration::from_secs(10));
    let patches = h.patches.lock().unwrap();
    assert_eq!(patches[0]["metadata"]["resourceVersion"], "7");
    assert_eq!(patches[0]["spec"]["holderIdentity"], ME);
}

/// SPEC S8: a leader whose read of the Lease names another holder stops leading at that
/// read, with most of its fence still open, and writes nothing more.
#[tokio::test(start_paused = true)]
async fn s8_another_holder_closes_an_open_fence_at_once() {
    let t0 = Instant::now();
    let (mut h, timing) = start(|method, n, _| match (method.as_str(), n) {
        ("GET", 1) => not_found(),
        ("POST", _) => Reply::Answer(StatusCode::CREATED, lease(1, ME, 6)),
        // replica-b keeps renewing.
        (_, n) => Reply::Answer(StatusCode::OK, lease(n as u64 + 1, "replica-b", 6)),
    });
    let leading = &mut h.election.leading;
    leading.wait_for(|l| *l).await.unwrap();
    let deadline = h.election.fence.deadline().expect("fence open");
    tokio::time::timeout(Duration::from_secs(60), leading.wait_for(|l| !*l))
        .await
        .expect("stepped down")
        .unwrap();
    // At the first read after the acquisition: one retry period, not the fence span.
    assert_eq!(Instant::now() - t0, timing.retry_period);
    assert!(Instant::now() < deadline, "the fence was still open");
    assert!(
        h.election.fence.deadline().is_none(),
        "fence closed at once"
    );
    tokio::time::sleep(timing.lease_duration * 3).await;
    assert!(!*h.election.leading.borrow(), "never leads again meanwhile");
    assert!(
        h.patches.lock().unwrap().is_empty(),
        "no write over the other holder"
    );
}

/// SPEC S8: a stalled cache ends the term at once (fence closed, `leading` false),
/// gives the Lease up (holder cleared) and never takes it back while stalled; once
/// ready again it leads again.
#[tokio::test(start_paused = true)]
async fn s8_a_stalled_cache_steps_down_releases_and_does_not_lead() {
    let stalled = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stalled.clone();
    let readiness = Arc::new(move || {
        if s.load(Ordering::SeqCst) {
            Readiness::Stalled
        } else {
            Readiness::Ready
        }
    });
    let holder = Arc::new(Mutex::new(ME.to_owned()));
    let hold = holder.clone();
    let (mut h, timing) = start_with(
        move |method, n, body| match (method.as_str(), n) {
            ("GET", 1) => not_found(),
            ("POST", _) => Reply::Answer(StatusCode::CREATED, lease(1, ME, 6)),
            ("GET", n) => Reply::Answer(
                StatusCode::OK,
                lease(n as u64 + 10, &hold.lock().unwrap(), 6),
            ),
            (_, n) => {
                let who = body["spec"]["holderIdentity"].as_str().unwrap_or_default();
                *hold.lock().unwrap() = who.to_owned();
                Reply::Answer(StatusCode::OK, lease(n as u64 + 100, who, 6))
            }
        },
        readiness,
    );
    h.election.leading.wait_for(|l| *l).await.unwrap();
    tokio::time::sleep(timing.retry_period * 3).await;
    let deadline = h.election.fence.deadline().expect("fence open");
    stalled.store(true, Ordering::SeqCst);
    let stalled_at = Instant::now();
    tokio::time::timeout(timing.lease_duration, h.election.leading.wait_for(|l| !*l))
        .await
        .expect("stepped down on the stall")
        .unwrap();
    assert!(Instant::now() <= stalled_at + timing.retry_period);
    assert!(
        Instant::now() < deadline,
        "before the fence would have closed"
    );
    assert!(h.election.fence.deadline().is_none());
    tokio::time::sleep(timing.lease_duration * 3).await;
    assert_eq!(*holder.lock().unwrap(), "", "the lease was released");
    assert!(
        !*h.election.leading.borrow(),
        "not taken back while stalled"
    );
    let writes = h.patches.lock().unwrap().len();
    tokio::time::sleep(timing.lease_duration * 3).await;
    assert_eq!(
        h.patches.lock().unwrap().len(),
        writes,
        "no write while stalled and released"
    );

    stalled.store(false, Ordering::SeqCst);
    tokio::time::timeout(timing.lease_duration, h.election.leading.wait_for(|l| *l))
        .await
        .expect("leads again once ready")
        .unwrap();
}

/// SPEC S8: with a cache still syncing (first list or relist) nothing begins leading: no
/// Lease is created or taken until the cache is ready.
#[tokio::test(start_paused = true)]
async fn s8_a_syncing_cache_never_begins_leading() {
    let ready = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let r = ready.clone();
    let readiness = Arc::new(move || {
        if r.load(Ordering::SeqCst) {
            Readiness::Ready
        } else {
            Readiness::Syncing
        }
    });
    let (mut h, timing) = start_with(
        |method, _, _| match method.as_str() {
            "GET" => Reply::Answer(StatusCode::OK, lease(7, "", 1)),
            _ => Reply::Answer(StatusCode::OK, lease(8, ME, 6)),
        },
        readiness,
    );
    tokio::time::sleep(timing.lease_duration * 5).await;
    assert!(!*h.election.leading.borrow());
    assert!(
        h.patches.lock().unwrap().is_empty(),
        "a free lease was not taken"
    );
    ready.store(true, Ordering::SeqCst);
    tokio::time::timeout(timing.lease_duration, h.election.leading.wait_for(|l| *l))
        .await
        .expect("takes the lease once ready")
        .unwrap();
}

/// SPEC S8: without election the controller still stops on a stalled cache and begins
/// only on a ready one.
#[tokio::test(start_paused = true)]
async fn s8_without_election_a_stalled_cache_stops_the_controller() {
    let state = Arc::new(Mutex::new(Readiness::Syncing));
    let s = state.clone();
    let mut e = Election::always_while(move || *s.lock().unwrap(), Duration::from_secs(1));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(!*e.leading.borrow(), "does not begin while syncing");
    *state.lock().unwrap() = Readiness::Ready;
    e.leading.wait_for(|l| *l).await.unwrap();
    *state.lock().unwrap() = Readiness::Syncing;
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(*e.leading.borrow(), "a relist does not stop it");
    *state.lock().unwrap() = Readiness::Stalled;
    e.leading.wait_for(|l| !*l).await.unwrap();
    e.stop.cancel();
}

/// A free Lease (holder cleared) stamped with safety epoch `epoch`.
fn stamped(rv: u64, holder: &str, epoch: &str) -> Value {
    let mut l = lease(rv, holder, 6);
    l["metadata"]["annotations"] = json!({ super::decide::SAFETY_EPOCH_ANNOTATION: epoch });
    l
}

/// SPEC S11: a Lease stamped by a newer build is never taken, however long it stays
/// free, and nothing is written to it; one stamped by an older build is taken and
/// raised to this build's epoch.
#[tokio::test(start_paused = true)]
async fn s11_a_newer_stamp_is_never_taken_an_older_one_is_raised() {
    let newer = (super::decide::SAFETY_EPOCH + 1).to_string();
    let (h, timing) = start(move |method, n, _| match method.as_str() {
        "GET" => Reply::Answer(StatusCode::OK, stamped(n as u64, "", &newer)),
        _ => Reply::Answer(StatusCode::OK, lease(1_000, ME, 6)),
    });
    tokio::time::sleep(timing.lease_duration * 10).await;
    assert!(!*h.election.leading.borrow(), "an older build never leads");
    assert!(h.requests.load(Ordering::SeqCst) >= 10, "it kept reading");
    assert!(
        h.patches.lock().unwrap().is_empty(),
        "nothing written: {:?}",
        h.patches.lock().unwrap()
    );

    let older = (super::decide::SAFETY_EPOCH - 1).to_string();
    let (mut h, _) = start(move |method, _, _| match method.as_str() {
        "GET" => Reply::Answer(StatusCode::OK, stamped(7, "", &older)),
        _ => Reply::Answer(StatusCode::OK, lease(8, ME, 6)),
    });
    h.election.leading.wait_for(|l| *l).await.unwrap();
    let patches = h.patches.lock().unwrap();
    assert_eq!(
        patches[0]["metadata"]["annotations"][super::decide::SAFETY_EPOCH_ANNOTATION],
        super::decide::SAFETY_EPOCH.to_string(),
        "{patches:?}"
    );
}

/// SPEC S11: the Lease this build creates carries its epoch.
#[tokio::test(start_paused = true)]
async fn s11_a_created_lease_carries_the_epoch() {
    let created = Arc::new(Mutex::new(Value::Null));
    let c = created.clone();
    let (mut h, _) = start(move |method, _, body| match method.as_str() {
        "GET" => not_found(),
        "POST" => {
            *c.lock().unwrap() = body.clone();
            Reply::Answer(StatusCode::CREATED, lease(1, ME, 6))
        }
        _ => Reply::Answer(StatusCode::OK, lease(2, ME, 6)),
    });
    h.election.leading.wait_for(|l| *l).await.unwrap();
    let body = created.lock().unwrap().clone();
    assert_eq!(
        body["metadata"]["annotations"][super::decide::SAFETY_EPOCH_ANNOTATION],
        super::decide::SAFETY_EPOCH.to_string(),
        "{body}"
    );
}
