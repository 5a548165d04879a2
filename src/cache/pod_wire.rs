//! The pod watch on protobuf (issue 23, start-up).
//!
//! kube-apiserver encodes one watch's events on one goroutine. As JSON, a realistic pod
//! (half of it `managedFields`) costs it so much that a start-up's streamed pod list is
//! bound by that one core; as protobuf it costs a fraction. kube-rs has no protobuf codec,
//! so this layer of the watch client asks for protobuf on pod watches only and gives kube's
//! watcher each event back as the JSON line it reads, holding only what [`PodSlice`] keeps.
//! Written here because no crate does this; the messages are the subset of k8s.io/api's
//! `generated.proto` it needs (prost skips the other fields unread). Any reply that is not
//! protobuf passes untouched, and the first event it cannot read turns it off for good: the
//! watch then fails once, and kube's watcher retries on JSON.
//!
//! [`PodSlice`]: crate::api::pod::PodSlice

use bytes::{Buf, Bytes, BytesMut};
use http::{HeaderValue, Request, Response, header};
use http_body::{Body, Frame, SizeHint};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time};
use prost::Message;
use serde_json::json;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const PROTOBUF: &str = "application/vnd.kubernetes.protobuf";
/// What prefixes every protobuf-encoded object (`runtime.Unknown` follows).
const MAGIC: &[u8] = b"k8s\0";
/// A length above this is a broken stream, not a pod.
const MAX_FRAME: usize = 64 << 20;

mod pb;

/// Why a protobuf reply could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("pod watch (protobuf): {0}")]
    Decode(#[from] prost::DecodeError),
    #[error("pod watch (protobuf): an object without the k8s\\0 prefix")]
    NoMagic,
    #[error("pod watch (protobuf): an event without an object")]
    NoObject,
    #[error("pod watch (protobuf): a frame of {0} bytes")]
    Oversized(usize),
    #[error("pod watch (protobuf): the stream ended inside a frame")]
    Truncated,
    #[error("pod watch (protobuf): a time out of range")]
    Time,
}

/// The encoded object inside `k8s\0` + `runtime.Unknown`.
fn unwrap_object(raw: &[u8]) -> Result<Vec<u8>, WireError> {
    let envelope = raw.strip_prefix(MAGIC).ok_or(WireError::NoMagic)?;
    Ok(pb::Unknown::decode(envelope)?.raw)
}

/// Go's zero `time.Time`, which JSON writes as null.
const GO_ZERO_TIME_SECONDS: i64 = -62_135_596_800;

fn time(t: Option<pb::Time>) -> Result<Option<Time>, WireError> {
    t.filter(|t| t.seconds != GO_ZERO_TIME_SECONDS)
        .map(|t| {
            k8s_openapi::jiff::Timestamp::new(t.seconds, t.nanos)
                .map(Time)
                .map_err(|_| WireError::Time)
        })
        .transpose()
}

/// A value Go wrote to protobuf even when empty (zero, "", no items), which JSON leaves
/// out (`omitempty`): kube's types expect `None` there.
fn present<T: Default + PartialEq>(v: T) -> Option<T> {
    (v != T::default()).then_some(v)
}

fn meta(m: pb::ObjectMeta) -> Result<ObjectMeta, WireError> {
    Ok(ObjectMeta {
        annotations: present(m.annotations),
        creation_timestamp: time(m.creation_timestamp)?,
        deletion_grace_period_seconds: m.deletion_grace_period_seconds,
        deletion_timestamp: time(m.deletion_timestamp)?,
        finalizers: present(m.finalizers),
        generate_name: m.generate_name.and_then(present),
        generation: m.generation.and_then(present),
        labels: present(m.labels),
        managed_fields: None,
        name: m.name.and_then(present),
        namespace: m.namespace.and_then(present),
        owner_references: present(
            m.owner_references
                .into_iter()
                .map(|o| OwnerReference {
                    api_version: o.api_version,
                    block_owner_deletion: o.block_owner_deletion,
                    controller: o.controller,
                    kind: o.kind,
                    name: o.name,
                    uid: o.uid,
                })
                .collect(),
        ),
        resource_version: m.resource_version.and_then(present),
        self_link: m.self_link.and_then(present),
        uid: m.uid.and_then(present),
    })
}

/// One protobuf watch event as the JSON line kube's watcher reads.
pub fn event_to_json(frame: &[u8]) -> Result<Vec<u8>, WireError> {
    let event = pb::WatchEvent::decode(frame)?;
    let raw = event.object.ok_or(WireError::NoObject)?.raw;
    let object = unwrap_object(&raw)?;
    let object = if event.r#type == "ERROR" {
        status_json(&object)?
    } else {
        pod_json(&object)?
    };
    let mut line =
        serde_json::to_vec(&json!({ "type": event.r#type, "object": object })).unwrap_or_default();
    line.push(b'\n');
    Ok(line)
}

fn pod_json(object: &[u8]) -> Result<serde_json::Value, WireError> {
    let pod = pb::Pod::decode(object)?;
    let running = pod.status.is_some_and(|s| {
        s.container_statuses
            .iter()
            .any(|c| c.state.as_ref().is_some_and(|st| st.running.is_some()))
    });
    let metadata = meta(pod.metadata.unwrap_or_default())?;
    // The one container status PodSlice reads: whether any runs.
    let statuses = if running {
        json!([{ "state": { "running": {} } }])
    } else {
        json!([])
    };
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "status": { "containerStatuses": statuses },
    }))
}

fn status_json(object: &[u8]) -> Result<serde_json::Value, WireError> {
    let s = pb::Status::decode(object)?;
    Ok(json!({
        "apiVersion": "v1",
        "kind": "Status",
        "status": s.status.unwrap_or_default(),
        "message": s.message.unwrap_or_default(),
        "reason": s.reason.unwrap_or_default(),
        "code": s.code.unwrap_or_default(),
    }))
}

/// A whole non-watch reply (an error status) as JSON.
pub fn status_to_json(body: &[u8]) -> Result<Vec<u8>, WireError> {
    let object = unwrap_object(body)?;
    Ok(serde_json::to_vec(&status_json(&object)?).unwrap_or_default())
}

/// Splits a protobuf watch stream into its frames: a 4-byte big-endian length, then
/// that many bytes of `WatchEvent`.
#[derive(Default)]
pub struct Frames {
    buf: BytesMut,
}

impl Frames {
    pub fn push(&mut self, data: &[u8]) {
        self.buf.extend_from_slice(data);
    }

    /// The next whole frame, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Bytes>, WireError> {
        let Some(head) = self.buf.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_be_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len > MAX_FRAME {
            return Err(WireError::Oversized(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        self.buf.advance(4);
        Ok(Some(self.buf.split_to(len).freeze()))
    }

    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// `--pod-watch-encoding`: how pod watches are encoded on the wire.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PodWatchEncoding {
    /// Protobuf, read back into the JSON kube's watcher decodes; JSON for good once a
    /// reply cannot be read.
    #[default]
    Protobuf,
    Json,
}

/// The watch client's layer: protobuf for pod watches while it works.
#[derive(Clone, Debug)]
pub struct PodWireLayer {
    /// Set when a protobuf reply could not be read: JSON from then on.
    broken: Arc<AtomicBool>,
}

impl PodWireLayer {
    pub fn new(encoding: PodWatchEncoding) -> Self {
        Self {
            broken: Arc::new(AtomicBool::new(encoding == PodWatchEncoding::Json)),
        }
    }
}

impl<S> tower::Layer<S> for PodWireLayer {
    type Service = PodWireService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        PodWireService {
            inner,
            broken: self.broken.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct PodWireService<S> {
    inner: S,
    broken: Arc<AtomicBool>,
}

/// A watch of pods (`…/pods?…watch=true…`), the one request this layer changes.
fn is_pod_watch<B>(req: &Request<B>) -> bool {
    let uri = req.uri();
    req.method() == http::Method::GET
        && uri.path().ends_with("/pods")
        && uri
            .query()
            .is_some_and(|q| q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1"))
}

impl<S, Req, B> tower::Service<Request<Req>> for PodWireService<S>
where
    S: tower::Service<Request<Req>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    type Response = Response<WireBody<B>>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<Req>) -> Self::Future {
        let asked = is_pod_watch(&req) && !self.broken.load(Ordering::Relaxed);
        if asked {
            req.headers_mut()
                .insert(header::ACCEPT, HeaderValue::from_static(PROTOBUF));
        }
        let broken = self.broken.clone();
        let reply = self.inner.call(req);
        Box::pin(async move {
            let mut resp = reply.await?;
            let protobuf = asked
                && resp
                    .headers()
                    .get(header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .is_some_and(|v| v.starts_with(PROTOBUF));
            if !protobuf {
                return Ok(resp.map(WireBody::plain));
            }
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp.headers_mut().remove(header::CONTENT_LENGTH);
            let mode = if resp.status().is_success() {
                Mode::Events
            } else {
                Mode::Status
            };
            Ok(resp.map(|inner| WireBody {
                inner,
                wire: Some(Wire {
                    mode,
                    frames: Frames::default(),
                    broken,
                }),
            }))
        })
    }
}

enum Mode {
    /// A watch stream: frame by frame.
    Events,
    /// An error reply: one `Status`, read whole.
    Status,
}

struct Wire {
    mode: Mode,
    frames: Frames,
    broken: Arc<AtomicBool>,
}

impl Wire {
    /// The JSON for every whole frame received so far.
    fn drain(&mut self) -> Result<Vec<u8>, WireError> {
        let mut out = Vec::new();
        while let Some(frame) = self.frames.next_frame()? {
            out.extend(event_to_json(&frame)?);
        }
        Ok(out)
    }

    fn fail(&self, e: WireError) -> BoxError {
        self.broken.store(true, Ordering::Relaxed);
        tracing::warn!(error = %e, "pod watches fall back to JSON");
        Box::new(e)
    }
}

/// A reply body: as it came, or transcoded from protobuf to JSON.
pub struct WireBody<B> {
    inner: B,
    wire: Option<Wire>,
}

impl<B> WireBody<B> {
    fn plain(inner: B) -> Self {
        Self { inner, wire: None }
    }
}

impl<B> Body for WireBody<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            let polled = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(polled) => polled,
            };
            let Some(wire) = this.wire.as_mut() else {
                return Poll::Ready(polled.map(|r| r.map_err(Into::into)));
            };
            match polled {
                Some(Ok(frame)) => {
                    let Ok(data) = frame.into_data() else {
                        continue;
                    };
                    wire.frames.push(&data);
                    if let Mode::Status = wire.mode {
                        continue;
                    }
                    match wire.drain() {
                        Ok(json) if json.is_empty() => continue,
                        Ok(json) => return Poll::Ready(Some(Ok(Frame::data(Bytes::from(json))))),
                        Err(e) => return Poll::Ready(Some(Err(wire.fail(e)))),
                    }
                }
                Some(Err(e)) => return Poll::Ready(Some(Err(e.into()))),
                None => {
                    let wire = this.wire.take();
                    return Poll::Ready(match wire {
                        Some(w) if matches!(w.mode, Mode::Status) => Some(
                            status_to_json(&w.frames.buf)
                                .map(|json| Frame::data(Bytes::from(json)))
                                .map_err(|e| w.fail(e)),
                        ),
                        Some(w) if !w.frames.is_empty() => Some(Err(w.fail(WireError::Truncated))),
                        _ => None,
                    });
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.wire.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.wire {
            None => self.inner.size_hint(),
            Some(_) => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests;
