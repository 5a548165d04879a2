//! The registry client against a real CNCF Distribution 2.8 (`docker-registry`); nothing
//! is mocked at the HTTP level. Each test names the SPEC rule it proves.

#[path = "support/registry_server.rs"]
mod registry_server;

use cocoon_hibernation::metrics::{Metrics, RegistryLabels};
use cocoon_hibernation::registry::{
    DeleteOutcome, RegistryAuth, RegistryClient, RegistryConfig, RegistryError,
};
use registry_server::{RegistryOptions, RegistryServer, install_crypto_provider};
use std::time::{Duration, Instant};

const VM: &str = "vm-0a1b2c";

fn client_for(server: &RegistryServer) -> (RegistryClient, Metrics) {
    client_with(server.registry_config())
}

fn client_with(config: RegistryConfig) -> (RegistryClient, Metrics) {
    install_crypto_provider();
    let metrics = Metrics::new();
    let client = RegistryClient::new(config, metrics.clone()).expect("registry client");
    (client, metrics)
}

fn calls(metrics: &Metrics, operation: &'static str, outcome: &'static str) -> u64 {
    metrics
        .registry_calls
        .get_or_create(&RegistryLabels { operation, outcome })
        .get()
}

// H3: a repository that was never pushed is an answer (absent), not an error.
#[tokio::test]
async fn h3_probe_of_never_pushed_repo_is_absent() {
    let server = RegistryServer::launch_default();
    let (client, metrics) = client_for(&server);
    assert!(!client.snapshot_exists(VM).await.unwrap());
    assert_eq!(calls(&metrics, "probe", "absent"), 1);
}

// H3: the completion check sees the pushed `<vm>:hibernate`, and only that tag.
#[tokio::test]
async fn h3_probe_sees_pushed_tag() {
    let server = RegistryServer::launch_default();
    let (client, metrics) = client_for(&server);
    server.push_artifact(VM, "stale-cycle").await;
    assert!(
        !client.snapshot_exists(VM).await.unwrap(),
        "another tag of the repo is not the snapshot"
    );
    server.push_artifact(VM, "hibernate").await;
    assert!(client.snapshot_exists(VM).await.unwrap());
    assert_eq!(calls(&metrics, "probe", "present"), 1);
    assert_eq!(calls(&metrics, "probe", "absent"), 1);
}

// H3 with a path prefix in the base: the repository is "<prefix>/<vm>".
#[tokio::test]
async fn h3_probe_uses_base_path_prefix() {
    let server = RegistryServer::launch_default();
    server
        .push_artifact("snapshots/team-a/vm-x", "hibernate")
        .await;
    let mut config = server.registry_config();
    config.base = format!("{}/snapshots/team-a", server.host());
    let (client, _) = client_with(config);
    assert!(client.snapshot_exists("vm-x").await.unwrap());
    assert!(!client.snapshot_exists("vm-y").await.unwrap());
}

// H4: a registry that is down is an error (retried with backoff), and it fails fast; once
// the registry is back with the same storage, the probe answers again.
#[tokio::test]
async fn h4_probe_of_stopped_registry_is_error_quickly() {
    let mut server = RegistryServer::launch_default();
    server.push_artifact(VM, "hibernate").await;
    let (client, metrics) = client_for(&server);
    server.stop();

    let started = Instant::now();
    let err = client.snapshot_exists(VM).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, RegistryError::Transport { .. }), "{err:?}");
    assert_eq!(err.metric_label(), "registry_transport");
    assert_eq!(calls(&metrics, "probe", "error"), 1);
    // W3: a delete during the outage is an error too (the tag is not forgotten).
    assert!(client.delete_snapshot(VM).await.is_err());

    server.start();
    assert!(client.snapshot_exists(VM).await.unwrap());
    // Right after a restart the pool still holds a connection to the dead process; the
    // probe must not turn that into a spurious error.
    server.restart();
    assert!(client.snapshot_exists(VM).await.unwrap());
}

// H4: wrong or missing credentials are errors, never "absent".
#[tokio::test]
async fn h4_probe_with_bad_credentials_is_auth_error() {
    let server =
        RegistryServer::launch(RegistryOptions::default().with_basic_auth("alice", "right"));
    server.push_artifact(VM, "hibernate").await;

    let mut config = server.registry_config();
    config.auth = RegistryAuth::Basic {
        username: "alice".into(),
        password: "wrong".into(),
    };
    let (client, _) = client_with(config);
    let err = client.snapshot_exists(VM).await.unwrap_err();
    assert!(
        matches!(err, RegistryError::Unauthorized { status: 401, .. }),
        "{err:?}"
    );
    assert!(!err.to_string().contains("wrong"), "password leaked: {err}");
    let err = client.delete_snapshot(VM).await.unwrap_err();
    assert!(matches!(err, RegistryError::Unauthorized { .. }), "{err:?}");

    let mut config = server.registry_config();
    config.auth = RegistryAuth::Anonymous;
    let (anonymous, _) = client_with(config);
    let err = anonymous.snapshot_exists(VM).await.unwrap_err();
    assert!(matches!(err, RegistryError::Unauthorized { .. }), "{err:?}");
    assert!(server.digest_of(VM, "hibernate").await.is_some());
}

// H3 + W2 with htpasswd basic auth; credentials come from a docker config.json.
#[tokio::test]
async fn w2_basic_auth_from_docker_config_probes_and_deletes() {
    let server = RegistryServer::launch(RegistryOptions::default().with_basic_auth("bob", "pa:ss"));
    let auth =
        RegistryAuth::from_docker_config(&server.docker_config_json(), &server.host()).unwrap();
    assert_eq!(
        auth,
        RegistryAuth::Basic {
            username: "bob".into(),
            password: "pa:ss".into()
        }
    );
    let mut config = server.registry_config();
    config.auth = auth;
    let (client, _) = client_with(config);

    assert!(!client.snapshot_exists(VM).await.unwrap());
    server.push_artifact(VM, "hibernate").await;
    assert!(client.snapshot_exists(VM).await.unwrap());
    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::DeletedByDigest
    );
    assert!(!client.snapshot_exists(VM).await.unwrap());
}

// H3/W2 with Docker token auth: the probe goes through oci-client's pull token, the delete
// asks the token server for a `repository:<repo>:delete` token and reuses it for the digest.
#[tokio::test]
async fn w2_token_auth_probe_and_delete_with_delete_scope() {
    let server =
        RegistryServer::launch(RegistryOptions::default().with_token_auth("carol", "s3cret"));
    let (client, metrics) = client_for(&server);
    assert!(!client.snapshot_exists(VM).await.unwrap());
    server.push_artifact(VM, "hibernate").await;
    assert!(client.snapshot_exists(VM).await.unwrap());
    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::DeletedByDigest
    );
    assert!(!client.snapshot_exists(VM).await.unwrap());
    assert_eq!(server.digest_of(VM, "hibernate").await, None);
    assert_eq!(
        calls(&metrics, "token", "ok"),
        1,
        "one delete token per delete"
    );

    // H4: refused credentials are auth errors on both paths.
    server.push_artifact(VM, "hibernate").await;
    let mut config = server.registry_config();
    config.auth = RegistryAuth::Basic {
        username: "carol".into(),
        password: "wrong".into(),
    };
    let (refused, _) = client_with(config);
    let err = refused.snapshot_exists(VM).await.unwrap_err();
    assert!(matches!(err, RegistryError::Unauthorized { .. }), "{err:?}");
    let err = refused.delete_snapshot(VM).await.unwrap_err();
    assert!(matches!(err, RegistryError::Unauthorized { .. }), "{err:?}");
    assert!(!err.to_string().contains("wrong"), "password leaked: {err}");
    assert!(server.digest_of(VM, "hibernate").await.is_some());
}

// W2/W3: Distribution 2.8 refuses delete-by-tag (400 DIGEST_INVALID); the client falls back
// to deleting the digest, leaving unrelated tags alone.
#[tokio::test]
async fn w2_delete_falls_back_to_digest_when_tag_delete_unsupported() {
    let server = RegistryServer::launch_default();
    let (client, metrics) = client_for(&server);
    let snapshot = server.push_artifact(VM, "hibernate").await;
    let unrelated = server.push_artifact(VM, "older-cycle").await;
    assert_ne!(snapshot, unrelated);

    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::DeletedByDigest
    );
    assert!(!client.snapshot_exists(VM).await.unwrap());
    assert_eq!(server.digest_of(VM, "hibernate").await, None);
    assert_eq!(
        server.digest_of(VM, "older-cycle").await,
        Some(unrelated),
        "an unrelated tag survives"
    );
    assert_eq!(calls(&metrics, "delete", "unsupported"), 1);
    assert_eq!(calls(&metrics, "resolve", "present"), 2);
    assert_eq!(calls(&metrics, "delete_digest", "deleted"), 1);
    assert_eq!(metrics.snapshot_tags_kept.get(), 0);

    // Deleting again is done, not an error.
    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::Absent
    );
}

// G1/W2: a delete by digest would also remove every other tag on that manifest, so the
// client keeps the snapshot tag, reports the sharing tags and counts it.
#[tokio::test]
async fn g1_delete_keeps_tag_when_another_tag_shares_digest() {
    let server = RegistryServer::launch_default();
    let (client, metrics) = client_for(&server);
    let digest = server.push_artifact(VM, "hibernate").await;
    assert_eq!(server.add_tag(VM, "hibernate", "golden").await, digest);

    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::KeptSharedDigest {
            other_tags: vec!["golden".to_string()]
        }
    );
    assert_eq!(
        server.digest_of(VM, "hibernate").await.as_ref(),
        Some(&digest)
    );
    assert_eq!(server.digest_of(VM, "golden").await.as_ref(), Some(&digest));
    assert_eq!(metrics.snapshot_tags_kept.get(), 1);
    assert_eq!(calls(&metrics, "delete_digest", "deleted"), 0);
    let text = metrics.encode().unwrap();
    assert!(
        text.contains("cocoon_hibernation_snapshot_tags_kept_total 1"),
        "{text}"
    );
}

// G1: the sharing check reads every page of the tag list (Distribution pages by `n`/`last`).
#[tokio::test]
async fn g1_shared_digest_found_beyond_first_tag_page() {
    let server = RegistryServer::launch_default();
    let (client, metrics) = client_for(&server);
    let snapshot = server.push_artifact(VM, "hibernate").await;
    server.push_artifact(VM, "t000").await;
    for i in 1..130 {
        server.add_tag(VM, "t000", &format!("t{i:03}")).await;
    }
    // Sorts after every "t…" tag, so it is on the last page.
    assert_eq!(server.add_tag(VM, "hibernate", "zz-shared").await, snapshot);
    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::KeptSharedDigest {
            other_tags: vec!["zz-shared".to_string()]
        }
    );
    assert!(
        calls(&metrics, "list_tags", "ok") >= 2,
        "the tag list was read in pages"
    );
    assert_eq!(server.digest_of(VM, "hibernate").await, Some(snapshot));
}

// W3/G1: deleting a tag that is not there is done (404 is an answer).
#[tokio::test]
async fn w3_delete_of_absent_tag_is_absent() {
    let server = RegistryServer::launch_default();
    let (client, _) = client_for(&server);
    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::Absent
    );
    server.push_artifact(VM, "other").await;
    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::Absent
    );
    assert!(server.digest_of(VM, "other").await.is_some());
}

// W3: a registry that refuses deletes makes the delete fail (so the controller retries and
// the tag is not leaked); once it accepts deletes again, the retry succeeds.
#[tokio::test]
async fn w3_delete_refused_is_error_then_succeeds_after_registry_allows_deletes() {
    let mut server = RegistryServer::launch(RegistryOptions::default().with_delete(false));
    let (client, metrics) = client_for(&server);
    server.push_artifact(VM, "hibernate").await;

    let err = client.delete_snapshot(VM).await.unwrap_err();
    assert!(
        matches!(err, RegistryError::DeleteRefused { status: 405, .. }),
        "{err:?}"
    );
    assert_eq!(err.metric_label(), "registry_delete_refused");
    assert!(server.digest_of(VM, "hibernate").await.is_some());
    assert_eq!(calls(&metrics, "delete_digest", "unsupported"), 1);

    server.restart_with_delete(true);
    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::DeletedByDigest
    );
    assert!(!client.snapshot_exists(VM).await.unwrap());
}

// H4/C2: a registry that accepts connections but never answers costs at most the timeout.
#[tokio::test]
async fn h4_unresponsive_registry_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    // Accept and hold every connection without ever writing a byte.
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((socket, _)) = listener.accept().await {
            held.push(socket);
        }
    });
    let timeout = Duration::from_millis(500);
    let (client, metrics) = client_with(RegistryConfig {
        base: addr.to_string(),
        plain_http: true,
        auth: RegistryAuth::Anonymous,
        extra_ca_pems: vec![],
        timeout,
    });

    let started = Instant::now();
    let err = client.snapshot_exists(VM).await.unwrap_err();
    assert!(
        started.elapsed() < timeout * 4,
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, RegistryError::Timeout { .. }), "{err:?}");
    assert_eq!(calls(&metrics, "probe", "timeout"), 1);

    let started = Instant::now();
    let err = client.delete_snapshot(VM).await.unwrap_err();
    assert!(
        started.elapsed() < timeout * 4,
        "took {:?}",
        started.elapsed()
    );
    assert!(matches!(err, RegistryError::Timeout { .. }), "{err:?}");
    holder.abort();
}

// H4: a 5xx (here a proxy in front of a failing registry) is an error, not "absent".
#[tokio::test]
async fn h4_registry_5xx_is_error() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let responder = tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = socket.read(&mut buf).await;
                let body = "upstream down";
                let answer = format!(
                    "HTTP/1.1 503 Service Unavailable\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = socket.write_all(answer.as_bytes()).await;
            });
        }
    });
    let (client, metrics) = client_with(RegistryConfig {
        base: addr.to_string(),
        plain_http: true,
        auth: RegistryAuth::Anonymous,
        extra_ca_pems: vec![],
        timeout: Duration::from_secs(5),
    });
    let err = client.snapshot_exists(VM).await.unwrap_err();
    assert!(
        matches!(err, RegistryError::Server { status: 503, .. }),
        "{err:?}"
    );
    assert_eq!(calls(&metrics, "probe", "error"), 1);
    let err = client.delete_snapshot(VM).await.unwrap_err();
    assert!(
        matches!(err, RegistryError::Server { status: 503, .. }),
        "{err:?}"
    );
    responder.abort();
}

// R3-style: a name that cannot be an OCI repository is a clear error, never a panic.
#[tokio::test]
async fn h4_invalid_vm_name_is_error_not_panic() {
    let (client, metrics) = client_with(RegistryConfig {
        base: "127.0.0.1:9".into(),
        plain_http: true,
        auth: RegistryAuth::Anonymous,
        extra_ca_pems: vec![],
        timeout: Duration::from_secs(1),
    });
    for bad in ["", "VM-Upper", "a/b", "-x", "x..y", "vm:tag", "../etc"] {
        let err = client.snapshot_exists(bad).await.unwrap_err();
        assert!(
            matches!(err, RegistryError::InvalidVmName { .. }),
            "{bad}: {err:?}"
        );
        let err = client.delete_snapshot(bad).await.unwrap_err();
        assert!(
            matches!(err, RegistryError::InvalidVmName { .. }),
            "{bad}: {err:?}"
        );
    }
    assert!(!metrics.encode().unwrap().contains("operation=\"probe\""));
}

// A bad configuration is refused at construction with a clear message.
#[test]
fn h4_bad_config_is_refused_at_construction() {
    install_crypto_provider();
    let config = |base: &str, pems: Vec<Vec<u8>>, timeout| RegistryConfig {
        base: base.into(),
        plain_http: false,
        auth: RegistryAuth::Anonymous,
        extra_ca_pems: pems,
        timeout,
    };
    let cases = [
        config("https://reg", vec![], Duration::from_secs(1)),
        config("reg", vec![b"not a pem".to_vec()], Duration::from_secs(1)),
        config("reg", vec![], Duration::ZERO),
    ];
    for case in cases {
        let err = RegistryClient::new(case, Metrics::new()).unwrap_err();
        assert!(matches!(err, RegistryError::InvalidConfig(_)), "{err:?}");
    }
}

// H3/W2 over https: the extra CA is trusted; without it the certificate is refused.
#[tokio::test]
async fn h3_probe_and_delete_over_https_with_extra_ca() {
    let server = RegistryServer::launch(RegistryOptions::default().with_tls());
    server.push_artifact(VM, "hibernate").await;
    let (client, _) = client_for(&server);
    assert!(client.snapshot_exists(VM).await.unwrap());
    assert_eq!(
        client.delete_snapshot(VM).await.unwrap(),
        DeleteOutcome::DeletedByDigest
    );
    assert!(!client.snapshot_exists(VM).await.unwrap());

    let mut config = server.registry_config();
    config.extra_ca_pems.clear();
    let (untrusting, _) = client_with(config);
    let err = untrusting.snapshot_exists(VM).await.unwrap_err();
    assert!(matches!(err, RegistryError::Transport { .. }), "{err:?}");
}
