//! HTTP (1.1 and 2) through the proxy (Q1–Q3): route by host and path, hold while the pod
//! wakes, forward to the pod's current address over HTTP/1.1 with `X-Forwarded-*` and
//! `Forwarded` added. An HTTP/1.1 `Upgrade` (WebSocket and the like) is held like any
//! request, then both upgraded connections are joined byte for byte.
//!
//! hyper and hyper-util rather than a proxy framework (pingora, a tower reverse proxy):
//! the proxy's one special part is holding before the connect, which is a plain future
//! here; the forwarding itself is a pooled client call.

use super::Proxy;
use super::activity::OpenGuard;
use super::decide::Refusal;
use super::hold::{Answer, Ready, VmKey, resolve};
use super::routes::{HttpMatch, Target};
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full, combinators::BoxBody};
use hyper::body::Incoming;
use hyper::body::{Frame, SizeHint};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
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
        let (stream, peer) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(error = %e, "accept");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let proxy = proxy.clone();
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |req| handle(proxy.clone(), peer, req));
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
            if let Err(e) = conn.await {
                tracing::debug!(error = %e, "connection ended");
            }
        });
    }
}

async fn handle(
    proxy: Arc<Proxy>,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Result<Response<Body>, Infallible> {
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
    let key: VmKey = (target.namespace().to_owned(), target.pod.clone());
    // Held or forwarded, until its response ends, the request keeps the pod awake (I3).
    let open = proxy.reporter.opened(&key);
    // The request, its body unread, waits here while the pod wakes (Q2).
    match resolve(&*proxy.cluster, &proxy.holds, &proxy.metrics, &target).await {
        Ok(ready) => {
            let from = Origin {
                peer: peer.ip(),
                host: &host,
            };
            Ok(forward(&proxy, req, key, &target, &ready, from, open).await)
        }
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

/// Who asked, for the forwarding headers.
struct Origin<'a> {
    peer: IpAddr,
    host: &'a str,
}

async fn forward(
    proxy: &Proxy,
    mut req: Request<Incoming>,
    key: VmKey,
    target: &Target,
    ready: &Ready,
    from: Origin<'_>,
    open: OpenGuard,
) -> Response<Body> {
    let addr = SocketAddr::new(ready.ip, target.port);
    let client = proxy.upstream(&key, &ready.uid, addr);
    let upgrade = upgrade_asked(&req);
    let client_side = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
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
    if let Some(protocol) = &upgrade {
        keep_upgrade(&mut parts.headers, protocol.clone());
    }
    add_forwarded(&mut parts.headers, from.peer, from.host);
    match client.request(Request::from_parts(parts, body)).await {
        Ok(mut resp) => {
            proxy.metrics.forwarded("http");
            proxy.reporter.note(&key);
            let switched = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
            let protocol = resp.headers().get(header::UPGRADE).cloned();
            if let (true, Some(client_side), Some(protocol)) = (switched, client_side, protocol) {
                let upstream_side = hyper::upgrade::on(&mut resp);
                let reporter = proxy.reporter.clone();
                tokio::spawn(async move {
                    join_upgraded(client_side, upstream_side, &key).await;
                    reporter.note(&key);
                    drop(open);
                });
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                keep_upgrade(&mut parts.headers, protocol);
                return Response::from_parts(parts, body.boxed());
            }
            let (mut parts, body) = resp.into_parts();
            strip_hop_by_hop(&mut parts.headers);
            let body = Guarded {
                inner: body,
                _open: open,
            };
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

/// The protocol an HTTP/1.1 request asks to switch to (`Connection: upgrade` with
/// `Upgrade`). HTTP/2's extended CONNECT is not carried: the pod is spoken to in HTTP/1.1.
fn upgrade_asked<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let connection_upgrade = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade
        .then(|| req.headers().get(header::UPGRADE).cloned())
        .flatten()
}

/// The two headers of an upgrade, which hop-by-hop stripping removed.
fn keep_upgrade(headers: &mut HeaderMap, protocol: HeaderValue) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, protocol);
}

/// Joins the client's and the pod's upgraded connections until either side ends.
async fn join_upgraded(
    client: hyper::upgrade::OnUpgrade,
    upstream: hyper::upgrade::OnUpgrade,
    (ns, pod): &VmKey,
) {
    match tokio::try_join!(client, upstream) {
        Ok((c, u)) => {
            let (mut c, mut u) = (TokioIo::new(c), TokioIo::new(u));
            if let Err(e) = tokio::io::copy_bidirectional(&mut c, &mut u).await {
                tracing::debug!(%ns, %pod, error = %e, "upgraded connection ended");
            }
        }
        Err(e) => tracing::info!(%ns, %pod, error = %e, "upgrade not completed"),
    }
}

/// RFC 7239 and the de facto `X-Forwarded-For`/`-Proto`/`-Host`: the client's address
/// appended to what earlier proxies wrote (the pod sees the whole chain), the scheme and
/// host set when no earlier proxy set them.
fn add_forwarded(headers: &mut HeaderMap, peer: IpAddr, host: &str) {
    const XFF: &str = "x-forwarded-for";
    const XFP: &str = "x-forwarded-proto";
    const XFH: &str = "x-forwarded-host";
    let peer_text = peer.to_string();
    append(headers, HeaderName::from_static(XFF), &peer_text);
    if !headers.contains_key(XFP) {
        headers.insert(XFP, HeaderValue::from_static("http"));
    }
    if !headers.contains_key(XFH)
        && let Ok(v) = HeaderValue::from_str(host)
        && !host.is_empty()
    {
        headers.insert(XFH, v);
    }
    // RFC 7239 4: an IPv6 node is quoted and bracketed; a host is quoted when it holds
    // a character a token may not (a port's `:`).
    let node = match peer {
        IpAddr::V4(_) => peer_text,
        IpAddr::V6(_) => format!("\"[{peer}]\""),
    };
    let mut element = format!("for={node};proto=http");
    if !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_graphic() && c != '"' && c != '\\')
    {
        element.push_str(&format!(";host=\"{host}\""));
    }
    append(headers, header::FORWARDED, &element);
}

/// Appends `value` to the header's last list, as one more element.
fn append(headers: &mut HeaderMap, name: HeaderName, value: &str) {
    let joined = match headers
        .get_all(&name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect::<Vec<_>>()
    {
        earlier if earlier.is_empty() => value.to_owned(),
        earlier => format!("{}, {value}", earlier.join(", ")),
    };
    if let Ok(v) = HeaderValue::from_str(&joined) {
        headers.insert(name, v);
    }
}

/// A response body that holds its connection's place in the pod's open count until it
/// is sent or dropped.
struct Guarded {
    inner: Incoming,
    _open: OpenGuard,
}

impl hyper::body::Body for Guarded {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, hyper::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
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

    fn forwarded(earlier: &[(&str, &str)], peer: &str, host: &str) -> Vec<(String, String)> {
        let mut h = HeaderMap::new();
        for (k, v) in earlier {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        add_forwarded(&mut h, peer.parse().unwrap(), host);
        let mut out: Vec<(String, String)> = h
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        out.sort();
        out
    }

    fn pairs(want: &[(&str, &str)]) -> Vec<(String, String)> {
        let mut out: Vec<(String, String)> = want
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        out.sort();
        out
    }

    /// RFC 7239 and X-Forwarded-*: the client is appended to an earlier proxy's chain (a
    /// repeated header folded into one list), scheme and host kept when set, an IPv6
    /// client bracketed and quoted.
    #[rstest]
    #[case::first_hop(&[], "192.0.2.7", "web-0.example", &[
        ("x-forwarded-for", "192.0.2.7"),
        ("x-forwarded-proto", "http"),
        ("x-forwarded-host", "web-0.example"),
        ("forwarded", "for=192.0.2.7;proto=http;host=\"web-0.example\""),
    ])]
    #[case::behind_another_proxy(
        &[("x-forwarded-for", "203.0.113.1"), ("x-forwarded-for", "10.0.0.2"),
          ("x-forwarded-proto", "https"), ("x-forwarded-host", "vm.example"),
          ("forwarded", "for=203.0.113.1;proto=https")],
        "10.0.0.3", "web-0.example:8000",
        &[
            ("x-forwarded-for", "203.0.113.1, 10.0.0.2, 10.0.0.3"),
            ("x-forwarded-proto", "https"),
            ("x-forwarded-host", "vm.example"),
            ("forwarded", "for=203.0.113.1;proto=https, for=10.0.0.3;proto=http;host=\"web-0.example:8000\""),
        ],
    )]
    #[case::ipv6_no_host(&[], "2001:db8::1", "", &[
        ("x-forwarded-for", "2001:db8::1"),
        ("x-forwarded-proto", "http"),
        ("forwarded", "for=\"[2001:db8::1]\";proto=http"),
    ])]
    fn forwarding_headers_are_appended(
        #[case] earlier: &[(&str, &str)],
        #[case] peer: &str,
        #[case] host: &str,
        #[case] want: &[(&str, &str)],
    ) {
        assert_eq!(forwarded(earlier, peer, host), pairs(want));
    }

    /// An upgrade is an HTTP/1.1 request with `Connection: upgrade` (any case, in a list)
    /// and `Upgrade`; HTTP/2 or either header alone is an ordinary request.
    #[rstest]
    #[case::websocket(
        Version::HTTP_11,
        Some("keep-alive, Upgrade"),
        Some("websocket"),
        Some("websocket")
    )]
    #[case::no_connection_token(Version::HTTP_11, Some("keep-alive"), Some("websocket"), None)]
    #[case::no_upgrade_header(Version::HTTP_11, Some("upgrade"), None, None)]
    #[case::http2(Version::HTTP_2, Some("upgrade"), Some("websocket"), None)]
    fn upgrades_are_told_apart(
        #[case] version: Version,
        #[case] connection: Option<&str>,
        #[case] upgrade: Option<&str>,
        #[case] want: Option<&str>,
    ) {
        let mut req = Request::builder().version(version).uri("/ws");
        if let Some(c) = connection {
            req = req.header(header::CONNECTION, c);
        }
        if let Some(u) = upgrade {
            req = req.header(header::UPGRADE, u);
        }
        let req = req.body(()).unwrap();
        let got = upgrade_asked(&req);
        assert_eq!(got.as_ref().map(|v| v.to_str().unwrap()), want);
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
