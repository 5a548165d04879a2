//! The webhook over real TLS (V6): handshake, TLS 1.2+, and certificate reload on change,
//! including the symlink swap a Kubernetes Secret volume does.

use axum_server::tls_rustls::RustlsConfig;
use cocoon_hibernation::metrics::Metrics;
use cocoon_hibernation::webhook::tls::ReloadStatus;
use cocoon_hibernation::webhook::validate::{Claim, ClaimView};
use cocoon_hibernation::webhook::{self, WebhookState, tls};
use rustls::pki_types::{CertificateDer, ServerName};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

#[derive(Clone)]
struct Synced;
impl ClaimView for Synced {
    fn synced(&self) -> bool {
        true
    }
    fn claims(&self, _: &str, _: &str) -> Vec<Claim> {
        vec![]
    }
}

struct Pair {
    cert_pem: String,
    key_pem: String,
    der: CertificateDer<'static>,
}

fn new_pair() -> Pair {
    let ck =
        rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap();
    Pair {
        cert_pem: ck.cert.pem(),
        key_pem: ck.signing_key.serialize_pem(),
        der: ck.cert.der().clone(),
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

struct Server {
    addr: SocketAddr,
    stop: CancellationToken,
    handle: axum_server::Handle<SocketAddr>,
    /// What the reloader has done: tests wait on it instead of sleeping.
    reloads: watch::Receiver<ReloadStatus>,
}

impl Server {
    /// Waits until the reloader's status satisfies `pred`. Bounded, so a dead reloader
    /// fails the test instead of hanging it.
    async fn reloader_reaches(&mut self, what: &str, pred: impl Fn(&ReloadStatus) -> bool) {
        let wait = tokio::time::timeout(Duration::from_secs(20), self.reloads.wait_for(pred));
        let reached = matches!(wait.await, Ok(Ok(_)));
        assert!(
            reached,
            "the reloader never reached {what}; status {:?}",
            *self.reloads.borrow()
        );
    }
}

async fn start(cert: &Path, key: &Path) -> Server {
    let config = RustlsConfig::from_config(Arc::new(tls::server_config(cert, key).unwrap()));
    let stop = CancellationToken::new();
    let (status, reloads) = watch::channel(ReloadStatus::default());
    tokio::spawn(tls::reload_on_change_reporting(
        config.clone(),
        cert.to_path_buf(),
        key.to_path_buf(),
        Duration::from_millis(50),
        stop.clone(),
        status,
    ));
    let handle = axum_server::Handle::new();
    let app = webhook::router(WebhookState {
        view: Synced,
        metrics: Metrics::new(),
    });
    let server = axum_server::bind_rustls("127.0.0.1:0".parse::<SocketAddr>().unwrap(), config)
        .handle(handle.clone());
    tokio::spawn(server.serve(app.into_make_service()));
    let addr = handle.listening().await.expect("server listens");
    Server {
        addr,
        stop,
        handle,
        reloads,
    }
}

/// Handshakes trusting `trusted`, posts a review, returns the served cert and HTTP status line.
async fn call(
    addr: SocketAddr,
    trusted: &CertificateDer<'static>,
    versions: &[&'static rustls::SupportedProtocolVersion],
) -> Result<(CertificateDer<'static>, String), String> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(trusted.clone()).map_err(|e| e.to_string())?;
    let cfg = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(versions)
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(Arc::new(cfg));
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").map_err(|e| e.to_string())?;
    let mut stream = connector
        .connect(name, tcp)
        .await
        .map_err(|e| e.to_string())?;
    let served = stream
        .get_ref()
        .1
        .peer_certificates()
        .and_then(|c| c.first().cloned())
        .ok_or("no cert")?;
    let body = std::fs::read(testkit::repo_root().join("tests/data/admission/create_valid.json"))
        .map_err(|e| e.to_string())?;
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: 127.0.0.1\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
        webhook::PATH,
        body.len()
    );
    stream
        .write_all(head.as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    stream.write_all(&body).await.map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out).await;
    let text = String::from_utf8_lossy(&out).to_string();
    let status = text.lines().next().unwrap_or_default().to_owned();
    Ok((served.into_owned(), status))
}

fn write(dir: &Path, name: &str, content: &str) {
    std::fs::write(dir.join(name), content).unwrap();
}

/// A server over a fresh pair written as `tls.crt`/`tls.key` in a temp dir.
async fn start_with(pair: &Pair) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "tls.crt", &pair.cert_pem);
    write(dir.path(), "tls.key", &pair.key_pem);
    let server = start(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).await;
    (dir, server)
}

/// SPEC V6.
#[tokio::test]
async fn v6_https_handshake_serves_reviews_over_tls12_and_tls13() {
    let pair = new_pair();
    let (_dir, server) = start_with(&pair).await;
    for versions in [
        &[&rustls::version::TLS13][..],
        &[&rustls::version::TLS12][..],
    ] {
        let (served, status) = call(server.addr, &pair.der, versions).await.unwrap();
        assert_eq!(served, pair.der);
        assert!(status.contains("200"), "{status}");
    }
    server.stop.cancel();
    server.handle.shutdown();
}

/// SPEC V6.
#[tokio::test]
async fn v6_plain_http_is_not_served() {
    let pair = new_pair();
    let (_dir, server) = start_with(&pair).await;
    let mut tcp = tokio::net::TcpStream::connect(server.addr).await.unwrap();
    tcp.write_all(
        b"POST /validate-cocoonhibernation HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\n\r\n{}",
    )
    .await
    .unwrap();
    let mut out = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut out)).await;
    assert!(read.is_ok(), "the server must not hang on a non-TLS client");
    assert!(!String::from_utf8_lossy(&out).contains("HTTP/1.1 200"));
    server.handle.shutdown();
}

/// The certificate a TLS 1.3 handshake trusting `trusted` is served.
async fn served_cert(
    addr: SocketAddr,
    trusted: &CertificateDer<'static>,
) -> CertificateDer<'static> {
    call(addr, trusted, &[&rustls::version::TLS13])
        .await
        .unwrap()
        .0
}

/// Waits for the reloader to load a changed pair, then checks `want` is what is served.
async fn wait_for_cert(server: &mut Server, want: &CertificateDer<'static>) {
    let before = server.reloads.borrow().reloaded;
    server
        .reloader_reaches("a reload", |s| s.reloaded > before)
        .await;
    assert_eq!(&served_cert(server.addr, want).await, want);
}

/// SPEC V6.
#[tokio::test]
async fn v6_certificate_rewritten_in_place_is_reloaded_without_restart() {
    let (first, second) = (new_pair(), new_pair());
    let (dir, mut server) = start_with(&first).await;
    assert_eq!(served_cert(server.addr, &first.der).await, first.der);
    write(dir.path(), "tls.crt", &second.cert_pem);
    write(dir.path(), "tls.key", &second.key_pem);
    wait_for_cert(&mut server, &second.der).await;
    server.handle.shutdown();
}

/// SPEC V6.
#[cfg(unix)]
#[tokio::test]
async fn v6_secret_volume_symlink_swap_is_reloaded() {
    use std::os::unix::fs::symlink;
    // Layout of a Secret volume: tls.crt -> ..data/tls.crt, ..data -> ..<timestamp>/
    let dir = tempfile::tempdir().unwrap();
    let (first, second) = (new_pair(), new_pair());
    let v1 = dir.path().join("..v1");
    let v2 = dir.path().join("..v2");
    std::fs::create_dir(&v1).unwrap();
    std::fs::create_dir(&v2).unwrap();
    write(&v1, "tls.crt", &first.cert_pem);
    write(&v1, "tls.key", &first.key_pem);
    write(&v2, "tls.crt", &second.cert_pem);
    write(&v2, "tls.key", &second.key_pem);
    symlink("..v1", dir.path().join("..data")).unwrap();
    symlink("..data/tls.crt", dir.path().join("tls.crt")).unwrap();
    symlink("..data/tls.key", dir.path().join("tls.key")).unwrap();
    let mut server = start(&dir.path().join("tls.crt"), &dir.path().join("tls.key")).await;
    assert_eq!(served_cert(server.addr, &first.der).await, first.der);
    // Atomic swap, as the kubelet does: new link, then rename over ..data.
    symlink("..v2", dir.path().join("..data_tmp")).unwrap();
    std::fs::rename(dir.path().join("..data_tmp"), dir.path().join("..data")).unwrap();
    wait_for_cert(&mut server, &second.der).await;
    server.handle.shutdown();
}

/// SPEC V6.
#[tokio::test]
async fn v6_a_broken_new_pair_keeps_the_old_certificate_serving() {
    let (first, third) = (new_pair(), new_pair());
    let (dir, mut server) = start_with(&first).await;
    write(dir.path(), "tls.crt", "not a certificate");
    // The reloader has seen the broken pair and refused it: only now is the old
    // certificate being served a result rather than a reloader that has not looked yet.
    server
        .reloader_reaches("a refused reload", |s| s.failed >= 1)
        .await;
    let (served, status) = call(server.addr, &first.der, &[&rustls::version::TLS13])
        .await
        .unwrap();
    assert_eq!(served, first.der);
    assert!(status.contains("200"));
    assert_eq!(server.reloads.borrow().reloaded, 0);
    // And it is still alive: a good pair written after the broken one is served.
    write(dir.path(), "tls.crt", &third.cert_pem);
    write(dir.path(), "tls.key", &third.key_pem);
    wait_for_cert(&mut server, &third.der).await;
    server.handle.shutdown();
}

/// SPEC V6.
#[test]
fn v6_start_refuses_a_missing_or_mismatched_pair_with_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let missing =
        tls::server_config(&dir.path().join("nope.crt"), &dir.path().join("nope.key")).unwrap_err();
    assert!(missing.to_string().contains("nope.crt"), "{missing}");
    let (a, b) = (new_pair(), new_pair());
    write(dir.path(), "a.crt", &a.cert_pem);
    write(dir.path(), "b.key", &b.key_pem);
    let mismatch =
        tls::server_config(&dir.path().join("a.crt"), &dir.path().join("b.key")).unwrap_err();
    assert!(mismatch.to_string().contains("do not match"), "{mismatch}");
}
