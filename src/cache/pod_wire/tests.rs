use super::*;
use std::collections::BTreeMap;

fn frame(event: &pb::WatchEvent) -> Vec<u8> {
    let body = event.encode_to_vec();
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend(body);
    out
}

fn wrapped(object: &impl Message) -> Vec<u8> {
    let mut raw = MAGIC.to_vec();
    raw.extend(
        pb::Unknown {
            raw: object.encode_to_vec(),
        }
        .encode_to_vec(),
    );
    raw
}

fn event(kind: &str, object: &impl Message) -> pb::WatchEvent {
    pb::WatchEvent {
        r#type: kind.into(),
        object: Some(pb::RawExtension {
            raw: wrapped(object),
        }),
    }
}

fn pod(running: bool) -> pb::Pod {
    let mut annotations = BTreeMap::new();
    annotations.insert("vm.cocoonstack.io/name".to_string(), "vm-a".to_string());
    pb::Pod {
        metadata: Some(pb::ObjectMeta {
            name: Some("p".into()),
            namespace: Some("ns".into()),
            uid: Some("u".into()),
            resource_version: Some("7".into()),
            creation_timestamp: Some(pb::Time {
                seconds: 1_767_225_600,
                nanos: 0,
            }),
            deletion_timestamp: Some(pb::Time {
                seconds: 1_767_225_600,
                nanos: 0,
            }),
            annotations,
            ..Default::default()
        }),
        status: Some(pb::PodStatus {
            container_statuses: vec![
                pb::ContainerStatus {
                    state: Some(pb::ContainerState { running: None }),
                },
                pb::ContainerStatus {
                    state: Some(pb::ContainerState {
                        running: running.then_some(pb::Empty {}),
                    }),
                },
            ],
        }),
    }
}

/// Issue 23: a protobuf event reads as the same PodSlice its JSON would.
#[test]
fn a4_a_protobuf_pod_event_reads_like_its_json() {
    for running in [true, false] {
        let line = event_to_json(&frame(&event("ADDED", &pod(running)))[4..]).unwrap();
        assert_eq!(line.last(), Some(&b'\n'));
        let ev: kube::core::WatchEvent<crate::api::pod::PodSlice> =
            serde_json::from_slice(&line).unwrap();
        let kube::core::WatchEvent::Added(slice) = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(slice.container_running, running);
        assert_eq!(slice.metadata.name.as_deref(), Some("p"));
        assert_eq!(slice.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(slice.annotation("vm.cocoonstack.io/name"), Some("vm-a"));
        assert_eq!(
            slice.metadata.deletion_timestamp.unwrap().0.to_string(),
            "2026-01-01T00:00:00Z"
        );
    }
}

/// The bookmark that ends a streamed list keeps its annotation (P1: the list ends).
#[test]
fn p1_the_initial_events_end_bookmark_survives() {
    let mut annotations = BTreeMap::new();
    annotations.insert("k8s.io/initial-events-end".to_string(), "true".to_string());
    let bookmark = pb::Pod {
        metadata: Some(pb::ObjectMeta {
            resource_version: Some("42".into()),
            annotations,
            ..Default::default()
        }),
        status: None,
    };
    let line = event_to_json(&frame(&event("BOOKMARK", &bookmark))[4..]).unwrap();
    let ev: kube::core::WatchEvent<crate::api::pod::PodSlice> =
        serde_json::from_slice(&line).unwrap();
    let kube::core::WatchEvent::Bookmark(b) = ev else {
        panic!("{ev:?}")
    };
    assert_eq!(b.metadata.resource_version, "42");
    assert_eq!(b.metadata.annotations["k8s.io/initial-events-end"], "true");
}

/// An ERROR event (410 Gone) reaches kube's watcher as the Status it relists on.
#[test]
fn s4_an_error_event_keeps_its_status() {
    let gone = pb::Status {
        status: Some("Failure".into()),
        message: Some("too old resource version".into()),
        reason: Some("Expired".into()),
        code: Some(410),
    };
    let line = event_to_json(&frame(&event("ERROR", &gone))[4..]).unwrap();
    let ev: kube::core::WatchEvent<crate::api::pod::PodSlice> =
        serde_json::from_slice(&line).unwrap();
    let kube::core::WatchEvent::Error(status) = ev else {
        panic!("{ev:?}")
    };
    assert_eq!(status.code, 410);
    assert_eq!(status.reason, "Expired");
    let whole: kube::core::Status =
        serde_json::from_slice(&status_to_json(&wrapped(&gone)).unwrap()).unwrap();
    assert_eq!(whole.code, 410);
}

/// Frames split anywhere come out whole, in order; a length past the limit is an error.
#[test]
fn frames_are_whole_however_the_bytes_arrive() {
    let mut stream = frame(&event("ADDED", &pod(true)));
    stream.extend(frame(&event("DELETED", &pod(false))));
    for cut in [1, 3, 4, 5, 17, stream.len() - 1] {
        let mut frames = Frames::default();
        let mut got = Vec::new();
        for part in [&stream[..cut], &stream[cut..]] {
            frames.push(part);
            while let Some(f) = frames.next_frame().unwrap() {
                got.push(pb::WatchEvent::decode(f).unwrap().r#type);
            }
        }
        assert_eq!(got, ["ADDED", "DELETED"], "cut at {cut}");
        assert!(frames.is_empty());
    }
    let mut frames = Frames::default();
    frames.push(&u32::MAX.to_be_bytes());
    assert!(matches!(frames.next_frame(), Err(WireError::Oversized(_))));
}

#[test]
fn an_object_without_the_magic_is_an_error() {
    let bad = pb::WatchEvent {
        r#type: "ADDED".into(),
        object: Some(pb::RawExtension {
            raw: pod(true).encode_to_vec(),
        }),
    };
    assert!(matches!(
        event_to_json(&bad.encode_to_vec()),
        Err(WireError::NoMagic)
    ));
}

#[test]
fn only_pod_watches_are_asked_for_protobuf() {
    let req = |uri: &str| Request::get(uri).body(()).unwrap();
    assert!(is_pod_watch(&req(
        "/api/v1/namespaces/ns/pods?&watch=true&timeoutSeconds=290"
    )));
    assert!(is_pod_watch(&req("/api/v1/pods?watch=true")));
    assert!(!is_pod_watch(&req("/api/v1/namespaces/ns/pods?limit=50")));
    assert!(!is_pod_watch(&req(
        "/apis/cocoonset.cocoonstack.io/v1/cocoonhibernations?watch=true"
    )));
    assert!(!is_pod_watch(&req(
        "/api/v1/namespaces/ns/pods/p?watch=true"
    )));
}

/// What a watch event says, comparable: its type, its pod, or its bookmark's version and
/// annotations.
type Said = (
    &'static str,
    Option<crate::api::pod::PodSlice>,
    Option<(String, BTreeMap<String, String>)>,
);

fn said(ev: kube::core::WatchEvent<crate::api::pod::PodSlice>) -> Said {
    use kube::core::WatchEvent as E;
    match ev {
        E::Added(p) => ("ADDED", Some(p), None),
        E::Modified(p) => ("MODIFIED", Some(p), None),
        E::Deleted(p) => ("DELETED", Some(p), None),
        E::Bookmark(b) => (
            "BOOKMARK",
            None,
            Some((b.metadata.resource_version, b.metadata.annotations)),
        ),
        E::Error(e) => panic!("{e:?}"),
    }
}

/// Issue 23, A4: one watch of a real kube-apiserver (v1.34.4), taken as protobuf and as
/// JSON (`tests/data/pod_watch/capture.sh`): every protobuf event reads as the same
/// PodSlice, with the same metadata, as its JSON twin. This is what proves the field
/// numbers in `pb` against the apiserver's own encoding.
#[test]
fn a4_a_real_apiserver_watch_reads_the_same_on_protobuf_and_json() {
    let json = include_str!("../../../tests/data/pod_watch/pod-watch.json");
    let protobuf = include_bytes!("../../../tests/data/pod_watch/pod-watch.protobuf");
    let from_json: Vec<_> = json
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| said(serde_json::from_str(l).unwrap()))
        .collect();
    let mut frames = Frames::default();
    frames.push(protobuf);
    let mut from_protobuf = Vec::new();
    while let Some(frame) = frames.next_frame().unwrap() {
        let line = event_to_json(&frame).unwrap();
        from_protobuf.push(said(serde_json::from_slice(&line).unwrap()));
    }
    assert!(frames.is_empty(), "a frame cut short");
    assert_eq!(from_protobuf, from_json);
    let pods: Vec<_> = from_json.iter().filter_map(|(_, p, _)| p.clone()).collect();
    let running: Vec<_> = pods.iter().map(|p| p.container_running).collect();
    assert_eq!(running, [false, true], "hibernated, running");
    assert!(pods[0].metadata.deletion_timestamp.is_some());
    assert_eq!(pods[1].label("cocoonset.cocoonstack.io/set"), Some("bench"));
    assert!(pods[1].annotation("vm.cocoonstack.io/id").is_some());
    assert!(
        from_json.iter().any(|(_, _, b)| b
            .as_ref()
            .is_some_and(
                |(_, a)| a.get("k8s.io/initial-events-end").map(String::as_str) == Some("true")
            ))
    );
}

/// One call through the layer: the Accept header the apiserver got, and the body read
/// back (or its error), for a reply of `content_type` carrying `body`.
type MockService =
    PodWireService<tower_test::mock::Mock<Request<()>, Response<http_body_util::Full<Bytes>>>>;
type MockHandle = tower_test::mock::Handle<Request<()>, Response<http_body_util::Full<Bytes>>>;

async fn through(
    service: &mut MockService,
    handle: &mut MockHandle,
    content_type: &str,
    body: Vec<u8>,
) -> (Option<String>, Result<Bytes, BoxError>) {
    through_with(service, handle, http::StatusCode::OK, content_type, body).await
}

/// [`through`] with the reply's status.
async fn through_with(
    service: &mut MockService,
    handle: &mut MockHandle,
    status: http::StatusCode,
    content_type: &str,
    body: Vec<u8>,
) -> (Option<String>, Result<Bytes, BoxError>) {
    use http_body_util::BodyExt;
    use tower::{Service, ServiceExt};
    let req = Request::get("/api/v1/namespaces/ns/pods?&watch=true")
        .body(())
        .unwrap();
    let call = service.ready().await.unwrap().call(req);
    let (sent, reply) = handle.next_request().await.unwrap();
    let accept = sent
        .headers()
        .get(header::ACCEPT)
        .map(|v| v.to_str().unwrap().to_owned());
    reply.send_response(
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, content_type)
            .body(http_body_util::Full::new(Bytes::from(body)))
            .unwrap(),
    );
    let resp = call.await.unwrap();
    let read = resp.into_body().collect().await.map(|b| b.to_bytes());
    (accept, read)
}

/// A reply it cannot read fails that watch once and turns pod watches to JSON for good;
/// a JSON reply passes as it came.
#[tokio::test]
async fn an_unreadable_reply_turns_pod_watches_to_json() {
    let (mock, mut handle) = tower_test::mock::pair();
    let mut service = tower::Layer::layer(&PodWireLayer::new(PodWatchEncoding::Protobuf), mock);

    let good = frame(&event("ADDED", &pod(true)));
    let (accept, read) = through(&mut service, &mut handle, PROTOBUF, good).await;
    assert_eq!(accept.as_deref(), Some(PROTOBUF));
    let read = read.unwrap();
    assert!(read.starts_with(b"{\"object\""), "{read:?}");

    let mut garbage = 3u32.to_be_bytes().to_vec();
    garbage.extend([0xff, 0xff, 0xff]);
    let (accept, read) = through(&mut service, &mut handle, PROTOBUF, garbage).await;
    assert_eq!(accept.as_deref(), Some(PROTOBUF));
    assert!(read.is_err(), "{read:?}");

    let json = b"{\"type\":\"ADDED\"}\n".to_vec();
    let (accept, read) = through(&mut service, &mut handle, "application/json", json.clone()).await;
    assert_eq!(accept, None, "JSON from then on");
    assert_eq!(read.unwrap(), json);
}

/// An error reply in protobuf reaches kube as its JSON Status; one it cannot read also
/// turns pod watches to JSON, so a watch cannot fail on it forever.
#[tokio::test]
async fn an_error_reply_reads_as_json_and_an_unreadable_one_turns_to_json() {
    let (mock, mut handle) = tower_test::mock::pair();
    let mut service = tower::Layer::layer(&PodWireLayer::new(PodWatchEncoding::Protobuf), mock);
    let forbidden = pb::Status {
        status: Some("Failure".into()),
        message: Some("pods is forbidden".into()),
        reason: Some("Forbidden".into()),
        code: Some(403),
    };
    let (mock_status, body) = (http::StatusCode::FORBIDDEN, wrapped(&forbidden));
    let (accept, read) = through_with(&mut service, &mut handle, mock_status, PROTOBUF, body).await;
    assert_eq!(accept.as_deref(), Some(PROTOBUF));
    let status: kube::core::Status = serde_json::from_slice(&read.unwrap()).unwrap();
    assert_eq!((status.code, status.reason.as_str()), (403, "Forbidden"));

    let (accept, read) = through_with(
        &mut service,
        &mut handle,
        mock_status,
        PROTOBUF,
        b"nonsense".to_vec(),
    )
    .await;
    assert_eq!(accept.as_deref(), Some(PROTOBUF));
    assert!(read.is_err(), "{read:?}");
    let (accept, _) = through(&mut service, &mut handle, "application/json", Vec::new()).await;
    assert_eq!(accept, None, "JSON from then on");
}
