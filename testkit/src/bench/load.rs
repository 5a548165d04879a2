//! Admission load: a keep-alive HTTP/1.1-over-TLS load generator (hyper + tokio-rustls),
//! and the ceiling: a no-op axum + rustls server with the product's TLS settings, run as
//! a child process of this benchmark (so it has its own runtime, as the product does).

use axum::body::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_rustls::TlsConnector;

pub const PATH: &str = cocoon_hibernation::webhook::PATH;

/// One load run's result.
#[derive(Clone, Debug, serde::Serialize)]
pub struct LoadResult {
    pub concurrency: usize,
    pub requests: usize,
    pub errors: usize,
    pub seconds: f64,
    pub rps: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

/// An AdmissionReview CREATE of `name` (podRef `name`) in `namespace`, as the apiserver
/// sends it (tests/data/admission/create_valid.json with the names replaced).
pub fn review_body(namespace: &str, name: &str) -> Vec<u8> {
    let path = crate::repo_root().join("tests/data/admission/create_valid.json");
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut v: serde_json::Value = serde_json::from_str(&text).expect("create_valid.json is JSON");
    let req = &mut v["request"];
    req["name"] = name.into();
    req["namespace"] = namespace.into();
    req["object"]["metadata"]["name"] = name.into();
    req["object"]["metadata"]["namespace"] = namespace.into();
    req["object"]["spec"]["podRef"]["name"] = name.into();
    serde_json::to_vec(&v).expect("serialize review")
}

fn connector(ca_pem: &str) -> TlsConnector {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("CA PEM")).expect("add CA");
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .expect("TLS versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    TlsConnector::from(Arc::new(cfg))
}

type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

async fn connect(port: u16, tls: &TlsConnector) -> Sender {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap_or_else(|e| panic!("connect 127.0.0.1:{port}: {e}"));
    tcp.set_nodelay(true).expect("nodelay");
    let name = ServerName::try_from("127.0.0.1").expect("server name");
    let stream = tls.connect(name, tcp).await.expect("TLS handshake");
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1.1 handshake");
    tokio::spawn(async move {
        let _ = conn.await;
    });
    sender
}

async fn one(sender: &mut Sender, body: &Bytes) -> Result<(u16, Bytes), String> {
    sender.ready().await.map_err(|e| e.to_string())?;
    let req = hyper::Request::post(PATH)
        .header("host", "127.0.0.1")
        .header("content-type", "application/json")
        .body(Full::new(body.clone()))
        .map_err(|e| e.to_string())?;
    let resp = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = resp.status().as_u16();
    let bytes = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    Ok((status, bytes))
}

/// Sends one review and returns the response body (a sanity check before load).
pub async fn probe(port: u16, ca_pem: &str, body: &[u8]) -> serde_json::Value {
    let mut sender = connect(port, &connector(ca_pem)).await;
    let (status, bytes) = one(&mut sender, &Bytes::copy_from_slice(body))
        .await
        .expect("probe request");
    assert_eq!(status, 200, "webhook answered {status}: {bytes:?}");
    serde_json::from_slice(&bytes).expect("AdmissionReview response")
}

/// `concurrency` keep-alive connections, each sending reviews back to back for `secs`
/// after a short warm-up.
pub async fn run(
    port: u16,
    ca_pem: &str,
    body: &[u8],
    concurrency: usize,
    secs: f64,
) -> LoadResult {
    let tls = connector(ca_pem);
    let body = Bytes::copy_from_slice(body);
    let mut senders = Vec::with_capacity(concurrency);
    for _ in 0..concurrency {
        senders.push(connect(port, &tls).await);
    }
    let warmup = Duration::from_millis(500);
    let start = Instant::now() + warmup;
    let end = start + Duration::from_secs_f64(secs);
    let mut tasks = tokio::task::JoinSet::new();
    for mut sender in senders {
        let body = body.clone();
        tasks.spawn(async move {
            let mut lat_us: Vec<u32> = Vec::new();
            let mut errors = 0usize;
            loop {
                let t = Instant::now();
                if t >= end {
                    break;
                }
                let res = one(&mut sender, &body).await;
                let measured = t >= start;
                match res {
                    Ok((200, _)) if measured => {
                        lat_us.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32)
                    }
                    Ok((200, _)) => {}
                    _ if measured => errors += 1,
                    _ => {}
                }
                if res.is_err() {
                    // A broken connection ends this worker.
                    break;
                }
            }
            (lat_us, errors)
        });
    }
    let mut all: Vec<u32> = Vec::new();
    let mut errors = 0;
    while let Some(r) = tasks.join_next().await {
        let (lat, e) = r.expect("load worker");
        all.extend(lat);
        errors += e;
    }
    all.sort_unstable();
    let pct = |p: f64| -> f64 {
        if all.is_empty() {
            return f64::NAN;
        }
        let i = ((all.len() as f64 * p).ceil() as usize).clamp(1, all.len()) - 1;
        all[i] as f64 / 1000.0
    };
    LoadResult {
        concurrency,
        requests: all.len(),
        errors,
        seconds: secs,
        rps: all.len() as f64 / secs,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        max_ms: all.last().map_or(f64::NAN, |v| *v as f64 / 1000.0),
    }
}

/// The median run (by rps) of `reps` runs.
pub async fn median_of(
    reps: usize,
    port: u16,
    ca_pem: &str,
    body: &[u8],
    concurrency: usize,
    secs: f64,
) -> (LoadResult, Vec<LoadResult>) {
    let mut runs = Vec::new();
    for _ in 0..reps.max(1) {
        runs.push(run(port, ca_pem, body, concurrency, secs).await);
    }
    let mut sorted = runs.clone();
    sorted.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    (sorted[sorted.len() / 2].clone(), runs)
}

// ---------------------------------------------------------------------------------------
// The ceiling server.

pub const CEILING_FLAG: &str = "--ceiling-server";

/// A child process serving a no-op handler on `port`: killed on drop.
pub struct Ceiling {
    child: std::process::Child,
    pub port: u16,
}

impl Drop for Ceiling {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Ceiling {
    pub async fn start(cert: &std::path::Path, key: &std::path::Path) -> Self {
        let port = crate::product::free_port();
        let exe = std::env::current_exe().expect("current exe");
        let child = std::process::Command::new(exe)
            .arg(CEILING_FLAG)
            .arg(port.to_string())
            .arg(cert)
            .arg(key)
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("spawn ceiling server");
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            assert!(Instant::now() < deadline, "ceiling server never listened");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, port }
    }
}

/// The child's main: the product's TLS config (`webhook::tls::server_config`) and server
/// (`axum_server::bind_rustls`) on the product's default runtime, with a handler that
/// reads the body and answers a fixed allowed review.
pub fn ceiling_main(args: &[String]) {
    let port: u16 = args[0].parse().expect("port");
    let cert = std::path::PathBuf::from(&args[1]);
    let key = std::path::PathBuf::from(&args[2]);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async move {
        use axum::routing::post;
        let cfg = cocoon_hibernation::webhook::tls::server_config(&cert, &key).expect("TLS");
        let tls = axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(cfg));
        const ALLOWED: &str = r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"705ab4f5-6393-11e8-b7cc-42010a800002","allowed":true}}"#;
        let app = axum::Router::new().route(
            PATH,
            post(|body: Bytes| async move {
                std::hint::black_box(body);
                ([("content-type", "application/json")], ALLOWED)
            }),
        );
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        axum_server::bind_rustls(addr, tls)
            .serve(app.into_make_service())
            .await
            .expect("ceiling server");
    });
}
