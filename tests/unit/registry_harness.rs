//! The real-registry harness itself, as other test files use it: included alone, only a
//! few of its helpers used (so it must stay warning-free when mostly unused).

use testkit::registry_server;

use registry_server::RegistryServer;
use std::net::TcpStream;

// W3 end-to-end tests rely on this: an outage keeps the port and the storage.
#[tokio::test]
async fn harness_stop_start_keeps_port_and_storage() {
    let mut server = RegistryServer::launch_default();
    let port = server.port();
    let digest = server.push_artifact("vm-h", "hibernate").await;

    server.stop();
    assert!(!server.is_running());
    assert!(
        TcpStream::connect(("127.0.0.1", port)).is_err(),
        "port still open"
    );

    server.start();
    assert_eq!(server.port(), port);
    assert_eq!(
        server.digest_of("vm-h", "hibernate").await,
        Some(digest.clone())
    );

    server.restart_with_delete(false);
    assert!(!server.options().delete_enabled);
    assert_eq!(server.digest_of("vm-h", "hibernate").await, Some(digest));
}

use testkit::slow_proxy;

/// HEAD of `<repo>:hibernate` through `host`; the digest, or the status when not 200.
async fn head(host: &str, repo: &str) -> Result<String, u16> {
    let response = reqwest::Client::new()
        .head(format!("http://{host}/v2/{repo}/manifests/hibernate"))
        .header("Accept", "application/vnd.oci.image.manifest.v1+json")
        .send()
        .await
        .map_err(|_| 0u16)?;
    match response.headers().get("Docker-Content-Digest") {
        Some(d) if response.status() == 200 => Ok(d.to_str().unwrap_or_default().to_owned()),
        _ => Err(response.status().as_u16()),
    }
}

// C2 tests rely on this: a stalled proxy holds requests (observably) until resumed, and
// counts a client that gives up; matching holds only some requests.
#[tokio::test]
async fn harness_slow_proxy_holds_releases_and_sees_abandoned_requests() {
    registry_server::install_crypto_provider();
    let server = RegistryServer::launch_default();
    let digest = server.push_artifact("vm-p", "hibernate").await;
    let proxy = slow_proxy::SlowProxy::start(&server.host()).await;
    let host = proxy.host();
    assert_eq!(head(&host, "vm-p").await, Ok(digest.clone()));

    proxy.stall();
    let held = tokio::spawn({
        let host = host.clone();
        async move { head(&host, "vm-p").await }
    });
    let stats = proxy.until(|s| s.held == 1).await;
    assert_eq!(stats.held_ended, 0);
    assert!(!held.is_finished(), "a held request gets no answer");
    proxy.resume();
    assert_eq!(held.await.unwrap(), Ok(digest.clone()));
    let stats = proxy.until(|s| s.held_ended == 1).await;
    assert_eq!((stats.held, stats.abandoned), (0, 0));

    // A client that gives up while held is seen as abandoned.
    proxy.stall();
    let gives_up = tokio::spawn({
        let host = host.clone();
        async move { head(&host, "vm-p").await }
    });
    proxy.until(|s| s.held == 1).await;
    gives_up.abort();
    let stats = proxy.until(|s| s.abandoned == 1).await;
    assert_eq!((stats.held, stats.held_ended), (0, 2));

    // Only matching requests are held.
    proxy.hold_matching("/v2/vm-q/");
    assert_eq!(head(&host, "vm-p").await, Ok(digest));
    let other = tokio::spawn(async move { head(&host, "vm-q").await });
    proxy.until(|s| s.held == 1).await;
    proxy.resume();
    assert_eq!(other.await.unwrap(), Err(404));
    assert_eq!(proxy.stats().count("HEAD /v2/vm-p/"), 4);
}
