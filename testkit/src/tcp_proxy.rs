//! Test support: network faults between the product and what it talks to, on loopback.
//!
//! - [`TcpProxy`]: a TCP proxy whose [`TcpProxy::blackhole`] stops forwarding bytes on
//!   existing and new connections without closing them (a network partition: the peer
//!   sees silence, not an error), whose [`TcpProxy::reset`] drops every connection and
//!   refuses new ones (as after the peers' timeouts), and whose [`TcpProxy::heal`] resumes
//!   forwarding. TLS passes through untouched: point a kubeconfig at
//!   `https://127.0.0.1:<port>` (the test apiserver's certificate covers 127.0.0.1).
//! - [`RegistryProxy`]: a plain-HTTP proxy in front of a registry that logs every request
//!   (method, path, wall-clock time, status), can answer 503 to every DELETE, and can hold
//!   one chosen request before it reaches the registry ([`RegistryProxy::trap`]).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Forward,
    Blackhole,
    Reset,
}

/// A TCP proxy on 127.0.0.1 with a partition switch. Stops on drop.
pub struct TcpProxy {
    pub port: u16,
    mode: watch::Sender<Mode>,
    accepted: Arc<AtomicUsize>,
    task: JoinHandle<()>,
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        // Connection tasks see the mode channel close and end with the listener.
        self.mode.send_replace(Mode::Reset);
        self.task.abort();
    }
}

impl TcpProxy {
    /// Listens on a free loopback port and forwards each connection to `upstream`.
    pub async fn start(upstream: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let (mode, rx) = watch::channel(Mode::Forward);
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    continue;
                };
                count.fetch_add(1, Ordering::Relaxed);
                // Refused: closed at once, as a dead route would end in a connect error.
                if *rx.borrow() == Mode::Reset {
                    drop(client);
                    continue;
                }
                tokio::spawn(proxy_connection(client, upstream, rx.clone()));
            }
        });
        Self {
            port,
            mode,
            accepted,
            task,
        }
    }

    /// `127.0.0.1:<port>`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Connections accepted so far.
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::Relaxed)
    }

    /// Partition: no byte moves either way on any connection, old or new; none is closed.
    pub fn blackhole(&self) {
        self.mode.send_replace(Mode::Blackhole);
    }

    /// Drops every open connection and refuses new ones until [`Self::heal`].
    pub fn reset(&self) {
        self.mode.send_replace(Mode::Reset);
    }

    /// Forwards again; blackholed connections resume where they stopped.
    pub fn heal(&self) {
        self.mode.send_replace(Mode::Forward);
    }
}

async fn proxy_connection(client: TcpStream, upstream: SocketAddr, mode: watch::Receiver<Mode>) {
    let Ok(server) = TcpStream::connect(upstream).await else {
        return;
    };
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    // Each direction ends on EOF, an error or a reset; dropping the halves closes both.
    tokio::join!(pump(cr, sw, mode.clone()), pump(sr, cw, mode));
}

/// Waits until forwarding is allowed: false if the proxy was reset (or dropped).
async fn gate(mode: &mut watch::Receiver<Mode>) -> bool {
    match mode.wait_for(|m| *m != Mode::Blackhole).await {
        Ok(m) => *m == Mode::Forward,
        Err(_) => false,
    }
}

async fn until_reset(mut mode: watch::Receiver<Mode>) {
    let _ = mode.wait_for(|m| *m == Mode::Reset).await;
}

async fn pump(mut from: OwnedReadHalf, mut to: OwnedWriteHalf, mut mode: watch::Receiver<Mode>) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if !gate(&mut mode).await {
            return;
        }
        let n = tokio::select! {
            r = from.read(&mut buf) => match r {
                Ok(0) | Err(_) => {
                    let _ = to.shutdown().await;
                    return;
                }
                Ok(n) => n,
            },
            _ = until_reset(mode.clone()) => return,
        };
        // Bytes read just as the partition began wait for the heal, like a retransmit.
        if !gate(&mut mode).await {
            return;
        }
        tokio::select! {
            r = to.write_all(&buf[..n]) => if r.is_err() { return },
            _ = until_reset(mode.clone()) => return,
        }
    }
}

/// One request seen by a [`RegistryProxy`].
#[derive(Clone, Debug)]
pub struct Logged {
    pub method: String,
    pub path: String,
    /// When the request arrived (wall clock, comparable with Lease times).
    pub at: jiff::Timestamp,
    /// When it went on to the registry (later than `at` only for a trapped request).
    pub forwarded: jiff::Timestamp,
    pub status: u16,
}

/// One request to hold, armed by [`RegistryProxy::trap`].
struct Trap {
    method: http::Method,
    path: String,
    on_hit: Box<dyn FnOnce() + Send>,
    hit: watch::Sender<Option<jiff::Timestamp>>,
    release: watch::Receiver<bool>,
}

/// The test's side of a [`RegistryProxy::trap`].
pub struct TrapHandle {
    hit: watch::Receiver<Option<jiff::Timestamp>>,
    release: watch::Sender<bool>,
}

impl TrapHandle {
    /// Waits until the trapped request arrived; returns when (after `on_hit` ran).
    pub async fn hit(&mut self) -> jiff::Timestamp {
        let hit = self
            .hit
            .wait_for(Option::is_some)
            .await
            .expect("trap alive");
        hit.expect("set")
    }

    /// Sends the held request on to the registry.
    pub fn release(&self) {
        self.release.send_replace(true);
    }
}

/// A logging HTTP proxy in front of a plain-http registry. Stops on drop.
pub struct RegistryProxy {
    /// `127.0.0.1:<port>`: give it as the product's `--registry-base`.
    pub addr: String,
    log: Arc<Mutex<Vec<Logged>>>,
    refuse_deletes: Arc<AtomicBool>,
    trap: Arc<Mutex<Option<Trap>>>,
    task: JoinHandle<()>,
}

impl Drop for RegistryProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[derive(Clone)]
struct ProxyState {
    upstream: String,
    http: reqwest::Client,
    log: Arc<Mutex<Vec<Logged>>>,
    refuse_deletes: Arc<AtomicBool>,
    trap: Arc<Mutex<Option<Trap>>>,
}

impl RegistryProxy {
    /// Proxies to `upstream` (`host:port`).
    pub async fn start(upstream: &str) -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the registry proxy");
        let addr = listener.local_addr().expect("proxy address").to_string();
        let log = Arc::new(Mutex::new(Vec::new()));
        let refuse_deletes = Arc::new(AtomicBool::new(false));
        let trap = Arc::new(Mutex::new(None));
        let state = ProxyState {
            upstream: upstream.to_owned(),
            http: reqwest::Client::builder()
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .expect("http client"),
            log: log.clone(),
            refuse_deletes: refuse_deletes.clone(),
            trap: trap.clone(),
        };
        let app = axum::Router::new().fallback(forward).with_state(state);
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Self {
            addr,
            log,
            refuse_deletes,
            trap,
            task,
        }
    }

    /// Holds the next `method` request of `path` (query ignored) before it reaches the
    /// registry: runs `on_hit` the moment it arrives (e.g. SIGSTOP its sender), then
    /// forwards it only once the handle's [`TrapHandle::release`] is called.
    pub fn trap(
        &self,
        method: http::Method,
        path: &str,
        on_hit: impl FnOnce() + Send + 'static,
    ) -> TrapHandle {
        let (hit_tx, hit) = watch::channel(None);
        let (release, release_rx) = watch::channel(false);
        *self.trap.lock().unwrap() = Some(Trap {
            method,
            path: path.to_owned(),
            on_hit: Box::new(on_hit),
            hit: hit_tx,
            release: release_rx,
        });
        TrapHandle { hit, release }
    }

    /// While set, every DELETE is answered 503 without reaching the registry.
    pub fn refuse_deletes(&self, on: bool) {
        self.refuse_deletes.store(on, Ordering::SeqCst);
    }

    pub fn requests(&self) -> Vec<Logged> {
        self.log.lock().unwrap().clone()
    }

    /// Every DELETE seen, refused or forwarded.
    pub fn deletes(&self) -> Vec<Logged> {
        self.requests()
            .into_iter()
            .filter(|r| r.method == "DELETE")
            .collect()
    }
}

async fn forward(
    axum::extract::State(state): axum::extract::State<ProxyState>,
    req: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    let at = jiff::Timestamp::now();
    let method = req.method().clone();
    let path = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_default();
    let trapped = {
        let mut trap = state.trap.lock().unwrap();
        let hit = trap
            .as_ref()
            .is_some_and(|t| t.method == method && path.split('?').next() == Some(t.path.as_str()));
        if hit { trap.take() } else { None }
    };
    if let Some(trap) = trapped {
        (trap.on_hit)();
        trap.hit.send_replace(Some(jiff::Timestamp::now()));
        let mut release = trap.release;
        let _ = release.wait_for(|r| *r).await;
        // Keep the sender alive until here: the handle waits on it.
        drop(trap.hit);
    }
    let forwarded = jiff::Timestamp::now();
    let record = |status: u16| {
        state.log.lock().unwrap().push(Logged {
            method: method.to_string(),
            path: path.clone(),
            at,
            forwarded,
            status,
        });
    };
    if method == http::Method::DELETE && state.refuse_deletes.load(Ordering::SeqCst) {
        record(503);
        return (
            http::StatusCode::SERVICE_UNAVAILABLE,
            "deletes refused by the test",
        )
            .into_response();
    }
    let headers = req.headers().clone();
    let body = match axum::body::to_bytes(req.into_body(), 256 << 20).await {
        Ok(b) => b,
        Err(_) => {
            record(400);
            return http::StatusCode::BAD_REQUEST.into_response();
        }
    };
    let mut out = state
        .http
        .request(method.clone(), format!("http://{}{path}", state.upstream))
        .body(body);
    for (name, value) in headers.iter() {
        if !matches!(
            name.as_str(),
            "host" | "content-length" | "connection" | "transfer-encoding"
        ) {
            out = out.header(name, value);
        }
    }
    let res = match out.send().await {
        Ok(res) => res,
        Err(_) => {
            record(502);
            return http::StatusCode::BAD_GATEWAY.into_response();
        }
    };
    let status = res.status();
    record(status.as_u16());
    let mut builder = http::Response::builder().status(status);
    // The body is buffered whole, so content-length stays true (and HEAD keeps it).
    for (name, value) in res.headers().iter() {
        if !matches!(name.as_str(), "connection" | "transfer-encoding") {
            builder = builder.header(name, value);
        }
    }
    let bytes = res.bytes().await.unwrap_or_default();
    builder
        .body(axum::body::Body::from(bytes))
        .unwrap_or_else(|_| http::StatusCode::BAD_GATEWAY.into_response())
}
