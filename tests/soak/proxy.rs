//! The soak's fault proxies, on loopback, each HTTP/1.1 connection mapped to one upstream
//! connection:
//! - [`ApiProxy`]: TLS-terminating, in front of kube-apiserver. It serves a certificate of
//!   the harness CA and reaches the apiserver with the product's own client certificate, so
//!   the product authenticates as before. While switched on it answers a share of the
//!   product's non-watch calls with 429, 500 or 409 (409 only on writes), or drops the
//!   connection before or after forwarding. Watches always pass.
//! - [`RegistryProxy`]: plain HTTP in front of the registry. While switched on it answers a
//!   share of calls 503, delays a share, refuses DELETEs (403 DENIED) or refuses
//!   connections (no listener, open connections closed). Every manifest PUT of
//!   `<vm>:hibernate` and every DELETE under `/v2/<vm>/manifests/` passes through the
//!   [`Tap`]: serialized per VM, bracketed by the etcd revision and by the observer's own
//!   HEAD of the tag, so each one is placed in the apiserver's history.
//!
//! The TLS ends and the upstream connections are testkit::tls_proxy's.

use http::{Method, Request, Response, StatusCode};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use testkit::tls_proxy::{self, BoxError, Connect, Io};
use tokio::net::{TcpSocket, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

type Body = BoxBody<Bytes, hyper::Error>;

/// What a proxied request ends with when it gets no answer: hyper then closes the
/// connection (the "dropped connection" fault, or an upstream that failed).
#[derive(Debug)]
pub struct Dropped(String);

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Dropped {}

impl From<BoxError> for Dropped {
    fn from(e: BoxError) -> Self {
        Self(e.to_string())
    }
}

fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

fn stream(body: Incoming) -> Body {
    body.boxed()
}

type Upstream = tls_proxy::Upstream<Body>;

/// What a handler does with one request.
type Handler = Arc<
    dyn Fn(
            Request<Incoming>,
            Arc<tokio::sync::Mutex<Upstream>>,
        ) -> Pin<Box<dyn Future<Output = Result<Response<Body>, Dropped>> + Send>>
        + Send
        + Sync,
>;

/// Serves one downstream connection until it ends or `kill` turns true.
async fn serve_connection(
    down: impl Io,
    connect: Connect,
    handler: Handler,
    mut kill: watch::Receiver<bool>,
) {
    let upstream = Arc::new(tokio::sync::Mutex::new(Upstream::new(connect)));
    let service = hyper::service::service_fn(move |req| handler(req, upstream.clone()));
    let conn =
        hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(down), service);
    tokio::select! {
        _ = conn => {}
        _ = kill.wait_for(|k| *k) => {}
    }
}

/// Forwards a request whose body streams through, and streams the answer back.
async fn forward(
    req: Request<Incoming>,
    up: &tokio::sync::Mutex<Upstream>,
) -> Result<Response<Body>, BoxError> {
    let req = req.map(stream);
    let res = up.lock().await.send(req).await?;
    Ok(res.map(stream))
}

/// Forwards and reads the whole answer (small answers only).
async fn forward_buffered(
    req: Request<Incoming>,
    up: &tokio::sync::Mutex<Upstream>,
) -> Result<(http::response::Parts, Bytes), BoxError> {
    let req = req.map(stream);
    let res = up.lock().await.send(req).await?;
    let (parts, body) = res.into_parts();
    let bytes = body.collect().await?.to_bytes();
    Ok((parts, bytes))
}

fn per_mille(rng: &Mutex<StdRng>, p: u32) -> bool {
    p > 0 && rng.lock().unwrap().random_range(0..1000u32) < p
}

// ---------------------------------------------------------------------------------------
// kube-apiserver.

/// Shares of the product's non-watch calls answered with a fault, per mille.
#[derive(Default)]
pub struct ApiFaults {
    pub p429: AtomicU32,
    pub p500: AtomicU32,
    pub p409: AtomicU32,
    pub pdrop: AtomicU32,
    /// Every call, watches too, answered 503: the product is held back after an apiserver
    /// restart until the observer has relisted, so no transition falls into its blind gap.
    pub held: AtomicBool,
}

#[derive(Default, Debug, Clone, Copy)]
pub struct ApiCounts {
    pub s429: u64,
    pub s500: u64,
    pub s409: u64,
    pub drops: u64,
    pub requests: u64,
}

#[derive(Default)]
struct ApiCounters {
    s429: AtomicU64,
    s500: AtomicU64,
    s409: AtomicU64,
    drops: AtomicU64,
    requests: AtomicU64,
}

pub struct ApiProxy {
    pub port: u16,
    pub faults: Arc<ApiFaults>,
    counters: Arc<ApiCounters>,
    task: JoinHandle<()>,
}

impl Drop for ApiProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn is_watch(req: &Request<Incoming>) -> bool {
    let q = req.uri().query().unwrap_or_default();
    q.split('&').any(|kv| kv == "watch=true" || kv == "watch=1")
        || req.uri().path().contains("/watch/")
}

fn status_json(code: u16, reason: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    let mut res = Response::new(full(body.to_string()));
    *res.status_mut() = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    res.headers_mut().insert(
        "content-type",
        http::HeaderValue::from_static("application/json"),
    );
    if code == 429 {
        res.headers_mut()
            .insert("retry-after", http::HeaderValue::from_static("1"));
    }
    res
}

impl ApiProxy {
    /// `serving` is the (cert, key) PEM it presents (signed by the harness CA); `client`
    /// the identity it uses upstream; `ca_pem` verifies the apiserver.
    pub async fn start(
        upstream: SocketAddr,
        serving: (String, String),
        client: (String, String),
        ca_pem: &str,
        seed: u64,
    ) -> Self {
        let (acceptor, connector) = tls_proxy::tls_ends(&serving, &client, ca_pem);
        let connect = tls_proxy::tls_connect(connector, upstream);
        let faults = Arc::new(ApiFaults::default());
        let counters = Arc::new(ApiCounters::default());
        let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
        let handler: Handler = {
            let (faults, counters) = (faults.clone(), counters.clone());
            Arc::new(move |req, up| {
                let (faults, counters, rng) = (faults.clone(), counters.clone(), rng.clone());
                Box::pin(async move {
                    if faults.held.load(Ordering::Relaxed) {
                        return Ok(status_json(
                            503,
                            "ServiceUnavailable",
                            "soak: held while the observer relists after an apiserver restart",
                        ));
                    }
                    if is_watch(&req) {
                        return Ok(forward(req, &up).await?);
                    }
                    counters.requests.fetch_add(1, Ordering::Relaxed);
                    let write = req.method() != Method::GET && req.method() != Method::HEAD;
                    let f = |p: &AtomicU32| per_mille(&rng, p.load(Ordering::Relaxed));
                    if f(&faults.p429) {
                        counters.s429.fetch_add(1, Ordering::Relaxed);
                        return Ok(status_json(
                            429,
                            "TooManyRequests",
                            "soak: too many requests, please try again later",
                        ));
                    }
                    if f(&faults.p500) {
                        counters.s500.fetch_add(1, Ordering::Relaxed);
                        return Ok(status_json(
                            500,
                            "InternalError",
                            "soak: injected internal error",
                        ));
                    }
                    if write && f(&faults.p409) {
                        counters.s409.fetch_add(1, Ordering::Relaxed);
                        return Ok(status_json(
                            409,
                            "Conflict",
                            "Operation cannot be fulfilled: the object has been modified; please apply your changes to the latest version and try again (soak)",
                        ));
                    }
                    if f(&faults.pdrop) {
                        counters.drops.fetch_add(1, Ordering::Relaxed);
                        // Half the drops happen after the apiserver acted on the request.
                        if rng.lock().unwrap().random_bool(0.5) {
                            let _ = forward_buffered(req, &up).await;
                        }
                        return Err(Dropped("soak: connection dropped".into()));
                    }
                    Ok(forward(req, &up).await?)
                })
            })
        };
        // Never switched: ApiProxy drops no connection wholesale; the sender lives as long
        // as the accept loop, which owns it through the closure.
        let (kill, _) = watch::channel(false);
        let (port, task) = tls_proxy::serve_tls(acceptor, move |tls| {
            serve_connection(tls, connect.clone(), handler.clone(), kill.subscribe())
        })
        .await;
        Self {
            port,
            faults,
            counters,
            task,
        }
    }

    pub fn set(&self, p429: u32, p500: u32, p409: u32, pdrop: u32) {
        self.faults.p429.store(p429, Ordering::Relaxed);
        self.faults.p500.store(p500, Ordering::Relaxed);
        self.faults.p409.store(p409, Ordering::Relaxed);
        self.faults.pdrop.store(pdrop, Ordering::Relaxed);
    }

    pub fn hold(&self, on: bool) {
        self.faults.held.store(on, Ordering::Relaxed);
    }

    pub fn counts(&self) -> ApiCounts {
        let c = &self.counters;
        ApiCounts {
            s429: c.s429.load(Ordering::Relaxed),
            s500: c.s500.load(Ordering::Relaxed),
            s409: c.s409.load(Ordering::Relaxed),
            drops: c.drops.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
        }
    }
}

// ---------------------------------------------------------------------------------------
// The registry.

/// Who sent a registry request: each has a proxy of its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    Product,
    Vk,
}

/// One PUT or DELETE of a VM's snapshot, as the registry saw it.
#[derive(Clone, Debug)]
pub struct TagOp {
    pub vm: String,
    /// Whose proxy it came through: [`Source::Product`] or [`Source::Vk`] (the simulator).
    pub source: Source,
    pub delete: bool,
    /// etcd revisions just before the request reached the registry and just after its
    /// answer (before the answer went on to the caller).
    pub rev_before: u64,
    pub rev_after: u64,
    pub status: u16,
    /// The tag's digest by our own HEAD before and after.
    pub before: Option<String>,
    pub after: Option<String>,
}

impl TagOp {
    /// A DELETE that took the `hibernate` tag away.
    pub fn removed_tag(&self) -> bool {
        self.delete && self.before.is_some() && self.after.is_none()
    }
}

/// Serializes the snapshot operations of each VM and records them (see the module doc).
pub struct Tap {
    registry: String,
    etcd: String,
    http: reqwest::Client,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub ops: Mutex<Vec<TagOp>>,
    pub errors: Mutex<Vec<String>>,
}

const MANIFEST_ACCEPT: &str = "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json";

impl Tap {
    pub fn new(registry: &str, etcd: &str) -> Arc<Self> {
        Arc::new(Self {
            registry: registry.to_owned(),
            etcd: etcd.to_owned(),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("http client"),
            locks: Mutex::new(HashMap::new()),
            ops: Mutex::new(Vec::new()),
            errors: Mutex::new(Vec::new()),
        })
    }

    fn lock_of(&self, vm: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks
            .lock()
            .unwrap()
            .entry(vm.to_owned())
            .or_default()
            .clone()
    }

    /// The current etcd revision (a linearizable read through etcd's JSON gateway).
    pub async fn revision(&self) -> Result<u64, BoxError> {
        let res: serde_json::Value = self
            .http
            .post(format!("{}/v3/kv/range", self.etcd))
            .json(&serde_json::json!({ "key": "AA==" }))
            .send()
            .await?
            .json()
            .await?;
        res["header"]["revision"]
            .as_str()
            .and_then(|r| r.parse().ok())
            .ok_or_else(|| format!("no revision in {res}").into())
    }

    /// The digest `<vm>:hibernate` points at, straight from the registry.
    pub async fn head(&self, vm: &str) -> Result<Option<String>, BoxError> {
        let res = self
            .http
            .head(format!(
                "http://{}/v2/{vm}/manifests/hibernate",
                self.registry
            ))
            .header("accept", MANIFEST_ACCEPT)
            .send()
            .await?;
        match res.status().as_u16() {
            200 => Ok(Some(
                res.headers()
                    .get("docker-content-digest")
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("present")
                    .to_owned(),
            )),
            404 => Ok(None),
            s => Err(format!("HEAD {vm}:hibernate answered {s}").into()),
        }
    }

    /// Forwards a snapshot PUT or DELETE of `vm` and records it.
    async fn tapped(
        &self,
        source: Source,
        vm: &str,
        req: Request<Incoming>,
        up: &tokio::sync::Mutex<Upstream>,
    ) -> Result<Response<Body>, BoxError> {
        let delete = req.method() == Method::DELETE;
        let lock = self.lock_of(vm);
        let _held = lock.lock().await;
        let rev_before = self.revision().await?;
        let before = self.head(vm).await?;
        // Recorded even when the answer is lost: the registry may have acted anyway.
        let forwarded = forward_buffered(req, up).await;
        let after = self.head(vm).await;
        let rev_after = self.revision().await;
        let status = forwarded
            .as_ref()
            .map_or(0, |(parts, _)| parts.status.as_u16());
        match (after, rev_after) {
            (Ok(after), Ok(rev_after)) => self.ops.lock().unwrap().push(TagOp {
                vm: vm.to_owned(),
                source,
                delete,
                rev_before,
                rev_after,
                status,
                before,
                after,
            }),
            (a, r) => self.errors.lock().unwrap().push(format!(
                "could not observe after {} of {vm}: {:?} {:?}",
                if delete { "DELETE" } else { "PUT" },
                a.err(),
                r.err()
            )),
        }
        let (parts, bytes) = forwarded?;
        Ok(Response::from_parts(parts, full(bytes)))
    }
}

/// `Some((vm, is_delete))` for a snapshot PUT of `<vm>:hibernate` or a DELETE of a manifest.
fn snapshot_op(method: &Method, path: &str) -> Option<String> {
    let rest = path.strip_prefix("/v2/")?;
    let (vm, reference) = rest.split_once("/manifests/")?;
    let reference = reference.split('?').next().unwrap_or(reference);
    match *method {
        Method::PUT if reference == "hibernate" => Some(vm.to_owned()),
        Method::DELETE => Some(vm.to_owned()),
        _ => None,
    }
}

#[derive(Default)]
pub struct RegistryFaults {
    /// Per mille of calls answered 503.
    pub p503: AtomicU32,
    /// Per mille of calls delayed, and by how long (ms).
    pub pslow: AtomicU32,
    pub slow_ms: AtomicU64,
    /// DELETEs answered 403 DENIED.
    pub refuse_deletes: AtomicBool,
}

#[derive(Default, Debug, Clone, Copy)]
pub struct RegistryCounts {
    pub s503: u64,
    pub slow: u64,
    pub refused_deletes: u64,
    pub refused_connections: u64,
    pub requests: u64,
}

#[derive(Default)]
struct RegistryCounters {
    s503: AtomicU64,
    slow: AtomicU64,
    refused_deletes: AtomicU64,
    refused_connections: AtomicU64,
    requests: AtomicU64,
}

pub struct RegistryProxy {
    pub addr: String,
    pub faults: Arc<RegistryFaults>,
    refuse: watch::Sender<bool>,
    counters: Arc<RegistryCounters>,
    task: JoinHandle<()>,
}

impl Drop for RegistryProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn bind_reusable(addr: SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

impl RegistryProxy {
    /// A proxy to `upstream` (host:port) through `tap` for `source`'s requests; `faulty`
    /// lets faults be switched on.
    pub async fn start(
        upstream: &str,
        tap: Arc<Tap>,
        source: Source,
        faulty: bool,
        seed: u64,
    ) -> Self {
        let upstream: SocketAddr = upstream.parse().expect("registry address");
        let connect: Connect = Arc::new(move || {
            Box::pin(async move {
                let tcp = TcpStream::connect(upstream).await?;
                Ok(Box::new(tcp) as Box<dyn Io>)
            })
        });
        let faults = Arc::new(RegistryFaults::default());
        let counters = Arc::new(RegistryCounters::default());
        let rng = Arc::new(Mutex::new(StdRng::seed_from_u64(seed)));
        let handler: Handler = {
            let (faults, counters) = (faults.clone(), counters.clone());
            Arc::new(move |req, up| {
                let (faults, counters, rng, tap) =
                    (faults.clone(), counters.clone(), rng.clone(), tap.clone());
                Box::pin(async move {
                    counters.requests.fetch_add(1, Ordering::Relaxed);
                    if faulty {
                        if req.method() == Method::DELETE
                            && faults.refuse_deletes.load(Ordering::Relaxed)
                        {
                            counters.refused_deletes.fetch_add(1, Ordering::Relaxed);
                            let mut res = Response::new(full(
                                r#"{"errors":[{"code":"DENIED","message":"requested access to the resource is denied (soak)"}]}"#,
                            ));
                            *res.status_mut() = StatusCode::FORBIDDEN;
                            return Ok(res);
                        }
                        if per_mille(&rng, faults.p503.load(Ordering::Relaxed)) {
                            counters.s503.fetch_add(1, Ordering::Relaxed);
                            let mut res = Response::new(full(
                                r#"{"errors":[{"code":"UNAVAILABLE","message":"service unavailable (soak)"}]}"#,
                            ));
                            *res.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                            return Ok(res);
                        }
                        if per_mille(&rng, faults.pslow.load(Ordering::Relaxed)) {
                            counters.slow.fetch_add(1, Ordering::Relaxed);
                            let ms = faults.slow_ms.load(Ordering::Relaxed);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                        }
                    }
                    let path = req.uri().path().to_owned();
                    Ok(match snapshot_op(req.method(), &path) {
                        // Spawned: a caller killed mid-request (kill -9) drops this handler,
                        // but its DELETE may already have reached the registry, and an
                        // unrecorded delete would make the observer misjudge the tag.
                        Some(vm) => {
                            let tapped =
                                tokio::spawn(
                                    async move { tap.tapped(source, &vm, req, &up).await },
                                );
                            tapped.await.map_err(|e| -> BoxError { Box::new(e) })??
                        }
                        None => forward(req, &up).await?,
                    })
                })
            })
        };
        let listener = bind_reusable("127.0.0.1:0".parse().expect("address")).expect("bind");
        let local = listener.local_addr().expect("proxy address");
        let (refuse, refuse_rx) = watch::channel(false);
        let task = {
            let counters = counters.clone();
            tokio::spawn(async move {
                let mut listener = Some(listener);
                let mut rx = refuse_rx.clone();
                loop {
                    let Some(l) = listener.as_ref() else {
                        // Refusing: no listener at all, so connects are refused.
                        let _ = rx.wait_for(|r| !*r).await;
                        match bind_reusable(local) {
                            Ok(l) => listener = Some(l),
                            Err(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                        }
                        continue;
                    };
                    tokio::select! {
                        accepted = l.accept() => {
                            let Ok((tcp, _)) = accepted else { continue };
                            let (connect, handler, kill) =
                                (connect.clone(), handler.clone(), refuse_rx.clone());
                            tokio::spawn(serve_connection(tcp, connect, handler, kill));
                        }
                        _ = rx.wait_for(|r| *r) => {
                            counters.refused_connections.fetch_add(1, Ordering::Relaxed);
                            listener = None;
                        }
                    }
                }
            })
        };
        Self {
            addr: local.to_string(),
            faults,
            refuse,
            counters,
            task,
        }
    }

    /// Refuses connections (and closes open ones) while `on`.
    pub fn refuse_connections(&self, on: bool) {
        self.refuse.send_replace(on);
    }

    pub fn set(&self, p503: u32, pslow: u32, slow: Duration, refuse_deletes: bool) {
        self.faults.p503.store(p503, Ordering::Relaxed);
        self.faults.pslow.store(pslow, Ordering::Relaxed);
        self.faults
            .slow_ms
            .store(slow.as_millis() as u64, Ordering::Relaxed);
        self.faults
            .refuse_deletes
            .store(refuse_deletes, Ordering::Relaxed);
    }

    pub fn counts(&self) -> RegistryCounts {
        let c = &self.counters;
        RegistryCounts {
            s503: c.s503.load(Ordering::Relaxed),
            slow: c.slow.load(Ordering::Relaxed),
            refused_deletes: c.refused_deletes.load(Ordering::Relaxed),
            refused_connections: c.refused_connections.load(Ordering::Relaxed),
            requests: c.requests.load(Ordering::Relaxed),
        }
    }
}
