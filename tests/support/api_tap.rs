//! Test support: a TLS-terminating, HTTP-aware proxy in front of kube-apiserver that
//! logs every call of the product by kind and can cut precise parts of its traffic:
//! - [`ApiTap::stall_lease_writes`]: Lease writes (POST, PUT, PATCH under
//!   `/apis/coordination.k8s.io/v1/namespaces/*/leases`) are held unanswered and never
//!   forwarded, while Lease reads, CR and pod reads and writes, events and watches pass
//!   (a partition that hits only the renewals, S1);
//! - [`ApiTap::hold_pod_watches`]: the replies of pod watches stop moving (events and
//!   bookmarks are held back in order, the connection stays open) while pod LISTs and
//!   everything else pass: a lagging pod informer (S7). [`ApiTap::release_pod_watches`]
//!   lets the held events through.
//!
//! It serves a certificate of the test cluster's CA (which the product's kubeconfig
//! trusts) and reaches the apiserver with a client certificate of the product's own
//! identity, so the product authenticates as before. Include with
//! `#[path = "support/api_tap.rs"] mod api_tap;`.
#![allow(dead_code)] // each test binary uses a different subset

use futures::StreamExt;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, BodyStream, Full, StreamBody};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tokio::task::JoinHandle;

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

/// What a call was, as far as these tests care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    LeaseRead,
    LeaseWrite,
    /// A GET of one CocoonHibernation (the controller's fresh read).
    CrGet,
    /// A watch of CocoonHibernations (the informer).
    CrWatch,
    /// A list of CocoonHibernations, a status write, or any other CR call.
    CrOther,
    /// A GET of one pod (the controller's fresh read, S7).
    PodGet,
    PodList,
    PodWatch,
    Other,
}

fn kind(method: &Method, path: &str, query: &str) -> Kind {
    let watch = query
        .split('&')
        .any(|kv| kv == "watch=true" || kv == "watch=1");
    let segments: Vec<&str> = path.trim_end_matches('/').split('/').collect();
    // ["", "api", v, ..] or ["", "apis", g, v, ..], then [namespaces, ns,] resource[, name, sub]
    let base = if path.starts_with("/apis/") { 4 } else { 3 };
    let resource_at = match segments.get(base) {
        Some(&"namespaces") if segments.len() > base + 2 => Some(base + 2),
        Some(_) => Some(base),
        None => None,
    };
    let resource = resource_at.and_then(|i| segments.get(i).copied());
    let named = resource_at.is_some_and(|i| segments.len() > i + 1);
    let sub = resource_at.is_some_and(|i| segments.len() > i + 2);
    let get = method == Method::GET;
    match resource {
        Some("leases") if path.starts_with("/apis/coordination.k8s.io/") => {
            if get {
                Kind::LeaseRead
            } else {
                Kind::LeaseWrite
            }
        }
        Some("cocoonhibernations") if get && named && !sub => Kind::CrGet,
        Some("cocoonhibernations") if get && !named && watch => Kind::CrWatch,
        Some("cocoonhibernations") => Kind::CrOther,
        Some("pods") if get && named && !sub => Kind::PodGet,
        Some("pods") if get && !named && watch => Kind::PodWatch,
        Some("pods") if get && !named => Kind::PodList,
        _ => Kind::Other,
    }
}

/// One call seen by the tap.
#[derive(Clone, Debug)]
pub struct Call {
    pub kind: Kind,
    pub method: String,
    pub path: String,
    /// When the request arrived (wall clock, comparable with Lease and registry times).
    pub at: jiff::Timestamp,
    /// When its answer headers came back from the apiserver.
    pub answered: Option<jiff::Timestamp>,
    /// 0: never forwarded (stalled) or no answer.
    pub status: u16,
}

/// One chunk of a watch reply handed on to the product.
#[derive(Clone, Debug)]
pub struct Frame {
    pub kind: Kind,
    pub at: jiff::Timestamp,
    pub bytes: usize,
}

#[derive(Default)]
struct Log {
    calls: Vec<Call>,
    frames: Vec<Frame>,
}

#[derive(Clone)]
struct Switches {
    stall_leases: watch::Receiver<bool>,
    hold_pods: watch::Receiver<bool>,
    log: Arc<Mutex<Log>>,
}

/// The proxy; stops on drop (open connections end with their tasks).
pub struct ApiTap {
    pub port: u16,
    stall_leases: watch::Sender<bool>,
    hold_pods: watch::Sender<bool>,
    log: Arc<Mutex<Log>>,
    task: JoinHandle<()>,
}

impl Drop for ApiTap {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl ApiTap {
    /// `serving`: (cert, key) PEM it presents; `client`: (cert, key) PEM of the identity
    /// it uses upstream; `ca_pem` verifies the apiserver.
    pub async fn start(
        upstream: SocketAddr,
        serving: (String, String),
        client: (String, String),
        ca_pem: &str,
    ) -> Self {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let _ = rustls::crypto::ring::default_provider().install_default();
        let certs = |pem: &str| -> Vec<CertificateDer<'static>> {
            CertificateDer::pem_slice_iter(pem.as_bytes())
                .collect::<Result<_, _>>()
                .expect("certificate PEM")
        };
        let key = |pem: &str| PrivateKeyDer::from_pem_slice(pem.as_bytes()).expect("key PEM");
        let mut server = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(certs(&serving.0), key(&serving.1))
            .expect("tap serving config");
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server));
        let mut roots = rustls::RootCertStore::empty();
        for c in certs(ca_pem) {
            roots.add(c).expect("CA certificate");
        }
        let mut client_cfg = rustls::ClientConfig::builder()
            .with_root_certificates(roots)
            .with_client_auth_cert(certs(&client.0), key(&client.1))
            .expect("tap client config");
        client_cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
        let connector = tokio_rustls::TlsConnector::from(Arc::new(client_cfg));

        let (stall_leases, stall_rx) = watch::channel(false);
        let (hold_pods, hold_rx) = watch::channel(false);
        let log = Arc::new(Mutex::new(Log::default()));
        let switches = Switches {
            stall_leases: stall_rx,
            hold_pods: hold_rx,
            log: log.clone(),
        };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the api tap");
        let port = listener.local_addr().expect("tap address").port();
        let task = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    continue;
                };
                let (acceptor, connector, switches) =
                    (acceptor.clone(), connector.clone(), switches.clone());
                tokio::spawn(async move {
                    let Ok(down) = acceptor.accept(tcp).await else {
                        return;
                    };
                    // One upstream connection per downstream one, opened on first use.
                    let up: Upstream = Arc::new(tokio::sync::Mutex::new(None));
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        handle(
                            req,
                            connector.clone(),
                            up.clone(),
                            switches.clone(),
                            upstream,
                        )
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(down), service)
                        .await;
                });
            }
        });
        Self {
            port,
            stall_leases,
            hold_pods,
            log,
            task,
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// While on, Lease writes are held unanswered and never reach the apiserver; turned
    /// off, the held ones are answered 503 (still not forwarded) and new ones pass.
    pub fn stall_lease_writes(&self, on: bool) {
        self.stall_leases.send_replace(on);
    }

    /// From now on pod watch replies stop moving (held back in order, not dropped).
    pub fn hold_pod_watches(&self) {
        self.hold_pods.send_replace(true);
    }

    /// Lets the held pod watch events through, and every later one.
    pub fn release_pod_watches(&self) {
        self.hold_pods.send_replace(false);
    }

    pub fn calls(&self) -> Vec<Call> {
        self.log.lock().unwrap().calls.clone()
    }

    pub fn frames(&self) -> Vec<Frame> {
        self.log.lock().unwrap().frames.clone()
    }

    /// Calls of `kind` that the apiserver answered with a 2xx at or after `since`.
    pub fn answered_ok_since(&self, kind: Kind, since: jiff::Timestamp) -> usize {
        self.calls()
            .iter()
            .filter(|c| c.kind == kind && (200..300).contains(&c.status))
            .filter(|c| c.answered.is_some_and(|t| t >= since))
            .count()
    }
}

type Upstream = Arc<tokio::sync::Mutex<Option<hyper::client::conn::http1::SendRequest<Body>>>>;

fn empty(status: u16) -> Response<Body> {
    let mut res = Response::new(
        Full::new(Bytes::new())
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    *res.status_mut() =
        http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::SERVICE_UNAVAILABLE);
    res
}

async fn until(mut flag: watch::Receiver<bool>, want: bool) {
    // A dropped tap never changes again: wait forever.
    if flag.wait_for(|f| *f == want).await.is_err() {
        std::future::pending::<()>().await;
    }
}

async fn handle(
    req: Request<Incoming>,
    connector: tokio_rustls::TlsConnector,
    up: Upstream,
    switches: Switches,
    upstream: SocketAddr,
) -> Result<Response<Body>, BoxError> {
    let path = req.uri().path().to_owned();
    let k = kind(req.method(), &path, req.uri().query().unwrap_or_default());
    let index = {
        let mut log = switches.log.lock().unwrap();
        log.calls.push(Call {
            kind: k,
            method: req.method().to_string(),
            path: path.clone(),
            at: jiff::Timestamp::now(),
            answered: None,
            status: 0,
        });
        log.calls.len() - 1
    };
    if k == Kind::LeaseWrite && *switches.stall_leases.borrow() {
        // Never forwarded: a renewal that could land later would reopen the fence.
        until(switches.stall_leases.clone(), false).await;
        return Ok(empty(503));
    }
    let mut guard = up.lock().await;
    let usable = match guard.as_mut() {
        Some(s) => !s.is_closed() && s.ready().await.is_ok(),
        None => false,
    };
    if !usable {
        let tcp = TcpStream::connect(upstream).await?;
        let tls = connector
            .connect(ServerName::from(upstream.ip()), tcp)
            .await?;
        let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls)).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        *guard = Some(sender);
    }
    let Some(sender) = guard.as_mut() else {
        return Err("no upstream connection".into());
    };
    let req = req.map(|b| b.map_err(BoxError::from).boxed_unsync());
    let res = sender.send_request(req).await?;
    drop(guard);
    {
        let mut log = switches.log.lock().unwrap();
        let call = &mut log.calls[index];
        call.answered = Some(jiff::Timestamp::now());
        call.status = res.status().as_u16();
    }
    let watch_kind = matches!(k, Kind::PodWatch | Kind::CrWatch);
    Ok(if watch_kind {
        let held = if k == Kind::PodWatch {
            Some(switches.hold_pods.clone())
        } else {
            None
        };
        res.map(|b| counted(b, k, held, switches.log.clone()))
    } else {
        res.map(|b| b.map_err(BoxError::from).boxed_unsync())
    })
}

/// A reply body whose chunks are logged as they go on; with `held`, each chunk and the
/// end wait while it is set.
fn counted(
    body: Incoming,
    kind: Kind,
    held: Option<watch::Receiver<bool>>,
    log: Arc<Mutex<Log>>,
) -> Body {
    let end = held.clone();
    let frames = BodyStream::new(body)
        .then(move |frame| {
            let (held, log) = (held.clone(), log.clone());
            async move {
                if let Some(held) = held {
                    until(held, false).await;
                }
                if let Ok(f) = &frame
                    && let Some(data) = f.data_ref()
                {
                    log.lock().unwrap().frames.push(Frame {
                        kind,
                        at: jiff::Timestamp::now(),
                        bytes: data.len(),
                    });
                }
                frame.map_err(BoxError::from)
            }
        })
        .chain(
            futures::stream::once(async move {
                if let Some(end) = end {
                    until(end, false).await;
                }
            })
            .filter_map(|()| async { None }),
        );
    StreamBody::new(frames).boxed_unsync()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds() {
        let k = |m: Method, p: &str, q: &str| kind(&m, p, q);
        let lease = "/apis/coordination.k8s.io/v1/namespaces/ns/leases/l";
        assert_eq!(k(Method::GET, lease, ""), Kind::LeaseRead);
        assert_eq!(k(Method::PATCH, lease, ""), Kind::LeaseWrite);
        assert_eq!(
            k(
                Method::POST,
                "/apis/coordination.k8s.io/v1/namespaces/ns/leases",
                ""
            ),
            Kind::LeaseWrite
        );
        let crs = "/apis/cocoonset.cocoonstack.io/v1/namespaces/ns/cocoonhibernations";
        assert_eq!(k(Method::GET, &format!("{crs}/a"), ""), Kind::CrGet);
        assert_eq!(k(Method::GET, crs, "watch=true"), Kind::CrWatch);
        assert_eq!(k(Method::GET, crs, ""), Kind::CrOther);
        let all = "/apis/cocoonset.cocoonstack.io/v1/cocoonhibernations";
        assert_eq!(k(Method::GET, all, "watch=1"), Kind::CrWatch);
        assert_eq!(k(Method::GET, "/api/v1/pods", "watch=true"), Kind::PodWatch);
        assert_eq!(k(Method::GET, "/api/v1/namespaces/ns", ""), Kind::Other);
        assert_eq!(
            k(Method::PATCH, &format!("{crs}/a/status"), ""),
            Kind::CrOther
        );
        let pods = "/api/v1/namespaces/ns/pods";
        assert_eq!(k(Method::GET, &format!("{pods}/p"), ""), Kind::PodGet);
        assert_eq!(
            k(Method::GET, pods, "allowWatchBookmarks=true&watch=true"),
            Kind::PodWatch
        );
        assert_eq!(k(Method::GET, pods, "limit=500"), Kind::PodList);
    }
}
