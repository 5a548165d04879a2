//! Test support: a TLS-terminating, HTTP-aware proxy in front of kube-apiserver that
//! logs every call of the product by kind and can cut precise parts of its traffic, each
//! a switch of its own:
//! - [`ApiTap::stall_lease_writes`]: Lease writes (POST, PUT, PATCH under
//!   `/apis/coordination.k8s.io/v1/namespaces/*/leases`) are held unanswered and never
//!   forwarded, while Lease reads, CR and pod reads and writes, events and watches pass
//!   (a partition that hits only the renewals, S1);
//! - [`ApiTap::hold_pod_watches`]: the replies of pod watches stop moving (events and
//!   bookmarks are held back in order, the connection stays open) while pod LISTs and
//!   everything else pass: a lagging pod informer (S7). [`ApiTap::release_pod_watches`]
//!   lets the held events through.
//! - [`ApiTap::freeze_informers`]: the informers' traffic (a GET on a collection of pods
//!   or cocoonhibernations, a list or a watch) stops: open replies send not one more
//!   byte, not even their end, and stay open; new informer requests are held unanswered.
//!   Lease, event and single-object calls pass (a frozen view, S8). [`ApiTap::thaw`] lets
//!   everything through again.
//!
//! The TLS ends and the forwarding are [`crate::tls_proxy`]'s.

use crate::tls_proxy::{self, BoxError};
use futures::StreamExt;
use http::{Method, Request, Response};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, BodyStream, Full, StreamBody};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::task::JoinHandle;

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

/// The class of one request, as the tap counts and cuts them.
pub fn kind(method: &Method, path: &str, query: &str) -> Kind {
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

/// A list or a watch of one of the product's informers.
pub fn is_informer(method: &Method, path: &str) -> bool {
    let last = path.trim_end_matches('/').rsplit('/').next();
    method == Method::GET && matches!(last, Some("pods" | "cocoonhibernations"))
}

/// One call seen by the tap.
#[derive(Clone, Debug)]
pub struct Call {
    pub kind: Kind,
    pub method: String,
    pub path: String,
    /// The query string (`watch=true&...` for a watch).
    pub query: String,
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

/// The switches, each a watch that requests and replies wait on.
#[derive(Clone)]
struct Switches {
    stall_leases: watch::Receiver<bool>,
    hold_pods: watch::Receiver<bool>,
    frozen: watch::Receiver<bool>,
    /// Informer requests that arrived while frozen.
    held: Arc<AtomicUsize>,
    log: Arc<Mutex<Log>>,
}

/// The proxy; stops on drop (open connections end with their tasks).
pub struct ApiTap {
    pub port: u16,
    stall_leases: watch::Sender<bool>,
    hold_pods: watch::Sender<bool>,
    frozen: watch::Sender<bool>,
    held: Arc<AtomicUsize>,
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
        let (acceptor, connector) = tls_proxy::tls_ends(&serving, &client, ca_pem);
        let connect = tls_proxy::tls_connect(connector, upstream);
        let (stall_leases, stall_rx) = watch::channel(false);
        let (hold_pods, hold_rx) = watch::channel(false);
        let (frozen, frozen_rx) = watch::channel(false);
        let held = Arc::new(AtomicUsize::new(0));
        let log = Arc::new(Mutex::new(Log::default()));
        let switches = Switches {
            stall_leases: stall_rx,
            hold_pods: hold_rx,
            frozen: frozen_rx,
            held: held.clone(),
            log: log.clone(),
        };
        let (port, task) = tls_proxy::serve_tls(acceptor, move |down| {
            // One upstream connection per downstream one, opened on first use.
            let up = Arc::new(tokio::sync::Mutex::new(tls_proxy::Upstream::new(
                connect.clone(),
            )));
            let switches = switches.clone();
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                handle(req, up.clone(), switches.clone())
            });
            async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(down), service)
                    .await;
            }
        })
        .await;
        Self {
            port,
            stall_leases,
            hold_pods,
            frozen,
            held,
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

    /// From now on no informer reply moves and no new informer request is answered.
    pub fn freeze_informers(&self) {
        self.frozen.send_replace(true);
    }

    /// Lets the frozen informer traffic through again.
    pub fn thaw(&self) {
        self.frozen.send_replace(false);
    }

    /// Informer requests that arrived while frozen.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
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

type Upstream = Arc<tokio::sync::Mutex<tls_proxy::Upstream<Body>>>;

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

/// Logs one request, holds it while a switch says so, forwards it on this connection's
/// upstream connection, and hands its reply on through the switches that apply to it.
async fn handle(
    req: Request<Incoming>,
    up: Upstream,
    switches: Switches,
) -> Result<Response<Body>, BoxError> {
    let path = req.uri().path().to_owned();
    let k = kind(req.method(), &path, req.uri().query().unwrap_or_default());
    let informer = is_informer(req.method(), &path);
    let index = {
        let mut log = switches.log.lock().unwrap();
        log.calls.push(Call {
            kind: k,
            method: req.method().to_string(),
            path: path.clone(),
            query: req.uri().query().unwrap_or_default().to_owned(),
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
    if informer && *switches.frozen.borrow() {
        switches.held.fetch_add(1, Ordering::SeqCst);
        until(switches.frozen.clone(), false).await;
    }
    let req = req.map(|b| b.map_err(BoxError::from).boxed_unsync());
    let res = up.lock().await.send(req).await?;
    {
        let mut log = switches.log.lock().unwrap();
        let call = &mut log.calls[index];
        call.answered = Some(jiff::Timestamp::now());
        call.status = res.status().as_u16();
    }
    // Each reply waits on the switches that apply to it; watch replies are logged.
    let mut gates = Vec::new();
    if k == Kind::PodWatch {
        gates.push(switches.hold_pods.clone());
    }
    if informer {
        gates.push(switches.frozen.clone());
    }
    let logged = matches!(k, Kind::PodWatch | Kind::CrWatch).then(|| switches.log.clone());
    Ok(if gates.is_empty() && logged.is_none() {
        res.map(|b| b.map_err(BoxError::from).boxed_unsync())
    } else {
        res.map(|b| gated(b, k, gates, logged))
    })
}

/// A reply body whose chunks each wait, and whose end waits, until every gate is open;
/// with `log`, each chunk is logged as it goes on.
fn gated(
    body: Incoming,
    kind: Kind,
    gates: Vec<watch::Receiver<bool>>,
    log: Option<Arc<Mutex<Log>>>,
) -> Body {
    let end = gates.clone();
    let open = |gates: Vec<watch::Receiver<bool>>| async move {
        for gate in gates {
            until(gate, false).await;
        }
    };
    let frames = BodyStream::new(body)
        .then(move |frame| {
            let (gates, log) = (gates.clone(), log.clone());
            async move {
                open(gates).await;
                if let Some(log) = log
                    && let Ok(f) = &frame
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
        .chain(futures::stream::once(open(end)).filter_map(|()| async { None }));
    StreamBody::new(frames).boxed_unsync()
}
