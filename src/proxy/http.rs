//! HTTP (1.1 and 2) through the proxy (Q1–Q3): route by host and path, hold while the pod
//! wakes, forward to the pod's current address over HTTP/1.1.
//!
//! hyper and hyper-util rather than a proxy framework (pingora, a tower reverse proxy):
//! the proxy's one special part is holding before the connect, which is a plain future
//! here; the forwarding itself is a pooled client call.

use super::Proxy;
use super::decide::Refusal;
use super::hold::{Answer, Ready, VmKey, resolve};
use super::routes::{HttpMatch, Target};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

pub type Body = BoxBody<Bytes, hyper::Error>;

/// Upstream connections kept idle this long.
const POOL_IDLE: Duration = Duration::from_secs(30);
/// Header naming why the proxy answered itself (a cause label of Q7), for clients and
/// tests; never on a forwarded response.
pub const ANSWER_HEADER: &str = "x-cocoon-wake-proxy";

/// A pooled client for one pod instance: its uid and address fence it (Q3), so a
/// recreated pod's or a re-addressed pod's traffic never reuses the old connections.
pub(super) struct Upstream {
    uid: String,
    addr: SocketAddr,
    client: Client<HttpConnector, Incoming>,
}

/// Accepts connections for ever; each is served as HTTP/1.1 or HTTP/2 as the client
/// speaks.
pub async fn serve(listener: TcpListener, proxy: Arc<Proxy>) {
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(proxy.clone(), req));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder.serve_connection(TokioIo::new(stream), svc).await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}

async fn handle(proxy: Arc<Proxy>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let host = request_host(&req);
    let table = proxy.cluster.routes();
    let target = match table.http(&host, req.uri().path()) {
        HttpMatch::Probe => return Ok(text(StatusCode::OK, "ok\n", "probe")),
        HttpMatch::NoRoute => {
            proxy.metrics.refused("no_route");
            return Ok(answer(&Answer::Refused(Refusal::NoPod), None));
        }
        HttpMatch::Route(t) => t,
    };
    // The request, its body unread, waits here while the pod wakes (Q2).
    match resolve(&*proxy.cluster, &proxy.holds, &proxy.metrics, &target).await {
        Ok(ready) => Ok(forward(&proxy, req, &target, &ready).await),
        Err(a) => {
            proxy.metrics.refused(a.cause());
            Ok(answer(&a, Some(&target)))
        }
    }
}

/// The host the client asked for: the URI's (HTTP/2, absolute form), else `Host`.
fn request_host<B>(req: &Request<B>) -> String {
    req.uri()
        .host()
        .map(str::to_owned)
        .or_else(|| {
            req.headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        })
        .unwrap_or_default()
}

async fn forward(
    proxy: &Proxy,
    req: Request<Incoming>,
    target: &Target,
    ready: &Ready,
) -> Response<Body> {
    let key: VmKey = (target.namespace().to_owned(), target.pod.clone());
    let addr = SocketAddr::new(ready.ip, target.port);
    let client = proxy.upstream(&key, &ready.uid, addr);
    let (mut parts, body) = req.into_parts();
    let authority = parts.uri.authority().map(|a| a.as_str().to_owned());
    let pq = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_owned();
    parts.uri = match format!("http://{addr}{pq}").parse() {
        Ok(u) => u,
        Err(_) => {
            return text(
                StatusCode::BAD_REQUEST,
                "bad request target\n",
                "bad_request",
            );
        }
    };
    // HTTP/2 carries the host as :authority; the pod is spoken to in HTTP/1.1.
    if !parts.headers.contains_key(header::HOST)
        && let Some(v) = authority.and_then(|a| HeaderValue::from_str(&a).ok())
    {
        parts.headers.insert(header::HOST, v);
    }
    parts.version = Version::HTTP_11;
    strip_hop_by_hop(&mut parts.headers);
    match client.request(Request::from_parts(parts, body)).await {
        Ok(resp) => {
            proxy.metrics.forwarded("http");
            proxy.reporter.note(&key);
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            Response::from_parts(parts, body.boxed())
        }
        Err(e) => {
            tracing::info!(ns = %key.0, pod = %key.1, error = %e, "upstream request failed");
            proxy.metrics.refused("upstream");
            text(
                StatusCode::BAD_GATEWAY,
                "the VM did not answer\n",
                "upstream",
            )
        }
    }
}

impl Proxy {
    /// The pooled client of the pod instance `uid` at `addr`, replacing the one of an
    /// older instance or address.
    fn upstream(
        &self,
        key: &VmKey,
        uid: &str,
        addr: SocketAddr,
    ) -> Client<HttpConnector, Incoming> {
        let mut ups = self.upstreams.lock();
        if let Some(u) = ups.get(key)
            && u.uid == uid
            && u.addr == addr
        {
            return u.client.clone();
        }
        let mut connector = HttpConnector::new();
        connector.set_nodelay(true);
        let client = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .build(connector);
        ups.insert(
            key.clone(),
            Upstream {
                uid: uid.to_owned(),
                addr,
                client: client.clone(),
            },
        );
        client
    }
}

/// RFC 9110 7.6.1: connection-specific headers are not forwarded.
fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|n| HeaderName::from_bytes(n.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for n in [
        header::CONNECTION,
        header::PROXY_AUTHENTICATE,
        header::PROXY_AUTHORIZATION,
        header::TE,
        header::TRAILER,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
    ] {
        headers.remove(n);
    }
    headers.remove("keep-alive");
    headers.remove("proxy-connection");
}

fn text(status: StatusCode, body: &str, cause: &'static str) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(body.to_owned()))
            .map_err(|never: Infallible| match never {})
            .boxed(),
    );
    *resp.status_mut() = status;
    let headers = resp.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    headers.insert(ANSWER_HEADER, HeaderValue::from_static(cause));
    resp
}

/// The proxy's own answer (Q2, Q5, Q6). It names only the requested VM's own state.
pub fn answer(a: &Answer, target: Option<&Target>) -> Response<Body> {
    let (status, body, retry) = match a {
        Answer::Refused(Refusal::NoPod) => {
            (StatusCode::NOT_FOUND, "no such route\n".to_owned(), None)
        }
        Answer::Refused(Refusal::NotManaged) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "this VM is not set up for wake on request yet\n".to_owned(),
            Some(10),
        ),
        Answer::Refused(Refusal::Conflict(reason)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("this VM is not woken on request: its hibernation is Failed ({reason})\n"),
            None,
        ),
        Answer::Refused(Refusal::WakeFailed(reason, _)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the VM's wake failed: {reason}\n"),
            Some(30),
        ),
        Answer::Full => (
            StatusCode::SERVICE_UNAVAILABLE,
            "too many requests wait for this VM\n".to_owned(),
            Some(5),
        ),
        Answer::TimedOut => {
            let secs = target.map_or(0, |t| t.policy.max_wait.as_secs());
            (
                StatusCode::SERVICE_UNAVAILABLE,
                format!("the VM did not wake within {secs}s\n"),
                Some(10),
            )
        }
    };
    let mut resp = text(status, &body, a.cause());
    if let Some(secs) = retry {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from(secs as u32));
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    /// SPEC Q2, Q5, Q6: each cause's status, Retry-After and reason; a refusal names only
    /// the VM's own state.
    #[rstest]
    #[case::q5_no_route(Answer::Refused(Refusal::NoPod), 404, None, "no such route")]
    #[case::q5_conflict(Answer::Refused(Refusal::Conflict("Conflict".into())), 503, None, "Failed (Conflict)")]
    #[case::q6_wake_failed(Answer::Refused(Refusal::WakeFailed("WakeTimedOut".into(), "other-tenant-x".into())), 503, Some("30"), "WakeTimedOut")]
    #[case::q2_full(Answer::Full, 503, Some("5"), "too many")]
    #[case::q2_timed_out(Answer::TimedOut, 503, Some("10"), "did not wake")]
    #[tokio::test]
    async fn q2_q5_q6_answers(
        #[case] a: Answer,
        #[case] status: u16,
        #[case] retry: Option<&str>,
        #[case] says: &str,
    ) {
        let resp = answer(&a, None);
        assert_eq!(resp.status().as_u16(), status);
        let got = resp
            .headers()
            .get(header::RETRY_AFTER)
            .map(|v| v.to_str().unwrap().to_owned());
        assert_eq!(got.as_deref(), retry);
        assert_eq!(resp.headers()[ANSWER_HEADER], a.cause());
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        let body = String::from_utf8_lossy(&body);
        assert!(body.contains(says), "{body}");
        assert!(!body.contains("other-tenant-x"), "{body}");
    }

    /// RFC 9110: connection-specific headers, and those `Connection` names, are dropped.
    #[test]
    fn hop_by_hop_headers_are_not_forwarded() {
        let mut h = HeaderMap::new();
        h.insert(
            header::CONNECTION,
            HeaderValue::from_static("close, x-private"),
        );
        h.insert("x-private", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert(header::ACCEPT, HeaderValue::from_static("*/*"));
        strip_hop_by_hop(&mut h);
        assert_eq!(h.len(), 1);
        assert!(h.contains_key(header::ACCEPT));
    }
}
