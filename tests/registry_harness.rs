//! The real-registry harness itself, as other test files use it: included alone, only a
//! few of its helpers used (so it must stay warning-free when mostly unused).

#[path = "support/registry_server.rs"]
mod registry_server;

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
