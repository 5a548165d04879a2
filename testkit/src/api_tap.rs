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
//! - [`ApiTap::cut_cr_relist`]: the open CR watches end, the next resumed one is told
//!   410 Gone (so the informer relists), and the next streamed CR list is cut after its
//!   first object, before its end bookmark (so kube starts that list over, S4).
//!
//! - [`ApiTap::hold_activity_takes`]: PATCHes of activity Leases (`cocoon-activity-*`,
//!   the idle policy's fence, I3) are held, then forwarded once the switch is off, so a
//!   test can write a heartbeat between the decision's read and its take.
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
    hold_takes: watch::Receiver<bool>,
    takes_held: Arc<AtomicUsize>,
    hold_pods: watch::Receiver<bool>,
    frozen: watch::Receiver<bool>,
    /// Informer requests that arrived while frozen.
    held: Arc<AtomicUsize>,
    log: Arc<Mutex<Log>>,
    relist: Arc<CrRelist>,
}

/// [`ApiTap::cut_cr_relist`]'s state.
struct CrRelist {
    /// Bumped to end every open CR watch reply.
    end: watch::Sender<u64>,
    /// Resumed CR watches still to answer 410 Gone, and how many were.
    gone: AtomicUsize,
    gone_sent: AtomicUsize,
    /// Streamed CR lists still to cut after their first object, and how many were.
    cut: AtomicUsize,
    cut_done: AtomicUsize,
    /// Streamed CR lists passed whole.
    whole: AtomicUsize,
}

/// The proxy; stops on drop (open connections end with their tasks).
pub struct ApiTap {
    pub port: u16,
    stall_leases: watch::Sender<bool>,
    hold_takes: watch::Sender<bool>,
    takes_held: Arc<AtomicUsize>,
    hold_pods: watch::Sender<bool>,
    frozen: watch::Sender<bool>,
    held: Arc<AtomicUsize>,
    log: Arc<Mutex<Log>>,
    relist: Arc<CrRelist>,
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
        let (hold_takes, takes_rx) = watch::channel(false);
        let takes_held = Arc::new(AtomicUsize::new(0));
        let (hold_pods, hold_rx) = watch::channel(false);
        let (frozen, frozen_rx) = watch::channel(false);
        let held = Arc::new(AtomicUsize::new(0));
        let log = Arc::new(Mutex::new(Log::default()));
        let relist = Arc::new(CrRelist {
            end: watch::channel(0).0,
            gone: AtomicUsize::new(0),
            gone_sent: AtomicUsize::new(0),
            cut: AtomicUsize::new(0),
            cut_done: AtomicUsize::new(0),
            whole: AtomicUsize::new(0),
        });
        let switches = Switches {
            stall_leases: stall_rx,
            hold_takes: takes_rx,
            takes_held: takes_held.clone(),
            hold_pods: hold_rx,
            frozen: frozen_rx,
            held: held.clone(),
            log: log.clone(),
            relist: relist.clone(),
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
            hold_takes,
            takes_held,
            hold_pods,
            frozen,
            held,
            log,
            relist,
            task,
        }
    }

    /// `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// While on, PATCHes of activity Leases wait here; turned off, they are forwarded.
    pub fn hold_activity_takes(&self, on: bool) {
        self.hold_takes.send_replace(on);
    }

    /// Activity Lease PATCHes held so far.
    pub fn takes_held(&self) -> usize {
        self.takes_held.load(Ordering::SeqCst)
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

    /// Ends every open CR watch now; the next resumed CR watch is answered with a 410 Gone
    /// event (never forwarded), and the next streamed CR list (`sendInitialEvents`) is
    /// cut after its first object.
    pub fn cut_cr_relist(&self) {
        self.relist.gone.store(1, Ordering::SeqCst);
        self.relist.cut.store(1, Ordering::SeqCst);
        self.relist.end.send_modify(|n| *n += 1);
    }

    /// (resumed CR watches told 410 Gone, streamed CR lists cut, streamed CR lists passed
    /// whole).
    pub fn cr_relists(&self) -> (usize, usize, usize) {
        let r = &self.relist;
        (
            r.gone_sent.load(Ordering::SeqCst),
            r.cut_done.load(Ordering::SeqCst),
            r.whole.load(Ordering::SeqCst),
        )
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
    if req.method() == Method::PATCH
        && path.contains("/leases/cocoon-activity-")
        && *switches.hold_takes.borrow()
    {
        switches.takes_held.fetch_add(1, Ordering::SeqCst);
        until(switches.hold_takes.clone(), false).await;
    }
    if informer && *switches.frozen.borrow() {
        switches.held.fetch_add(1, Ordering::SeqCst);
        until(switches.frozen.clone(), false).await;
    }
    let streamed = req
        .uri()
        .query()
        .unwrap_or_default()
        .split('&')
        .any(|kv| kv == "sendInitialEvents=true");
    if k == Kind::CrWatch && !streamed && take_one(&switches.relist.gone) {
        switches.relist.gone_sent.fetch_add(1, Ordering::SeqCst);
        return Ok(gone());
    }
    let cut_list = k == Kind::CrWatch && streamed && take_one(&switches.relist.cut);
    if k == Kind::CrWatch && streamed && !cut_list {
        switches.relist.whole.fetch_add(1, Ordering::SeqCst);
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
    let res = if gates.is_empty() && logged.is_none() {
        res.map(|b| b.map_err(BoxError::from).boxed_unsync())
    } else {
        res.map(|b| gated(b, k, gates, logged))
    };
    if cut_list {
        switches.relist.cut_done.fetch_add(1, Ordering::SeqCst);
        return Ok(res.map(first_line));
    }
    Ok(if k == Kind::CrWatch {
        let mut end = switches.relist.end.subscribe();
        res.map(|b| {
            let frames = BodyStream::new(b).take_until(async move {
                let _ = end.changed().await;
            });
            StreamBody::new(frames).boxed_unsync()
        })
    } else {
        res
    })
}

/// Takes one from `n` unless it is 0.
fn take_one(n: &AtomicUsize) -> bool {
    n.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |v| v.checked_sub(1))
        .is_ok()
}

/// A watch reply of one event: 410 Gone, as an apiserver says a resumed watch's
/// resourceVersion is too old.
fn gone() -> Response<Body> {
    let event = serde_json::json!({
        "type": "ERROR",
        "object": {
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "too old resource version (api_tap)", "reason": "Expired", "code": 410,
        },
    });
    let mut res = Response::new(
        Full::new(Bytes::from(format!("{event}\n")))
            .map_err(|never| match never {})
            .boxed_unsync(),
    );
    res.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json"),
    );
    res
}

/// The body up to and including its first newline (the first watch event), then its end.
fn first_line(body: Body) -> Body {
    let frames = BodyStream::new(body).scan(false, |done, frame| {
        if *done {
            return futures::future::ready(None);
        }
        let frame = match frame {
            Ok(f) => match f.into_data() {
                Ok(data) => match data.iter().position(|b| *b == b'\n') {
                    Some(i) => {
                        *done = true;
                        Ok(hyper::body::Frame::data(data.slice(..=i)))
                    }
                    None => Ok(hyper::body::Frame::data(data)),
                },
                Err(other) => Ok(other),
            },
            Err(e) => Err(e),
        };
        futures::future::ready(Some(frame))
    });
    StreamBody::new(frames).boxed_unsync()
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
