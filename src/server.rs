//! Wiring of the one process (P1): cache, webhook, admin endpoints, election, controller.

use crate::cache::{self, CacheScope};
use crate::config::{RegistryArgs, ServerArgs};
use crate::controller::{self, plan::Settings};
use crate::error::{Error, Result};
use crate::leader::Election;
use crate::metrics::Metrics;
use crate::registry::{RegistryAuth, RegistryClient, RegistryConfig, auth_from_docker_config};
use crate::webhook::{self, tls};
use axum_server::tls_rustls::RustlsConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

pub async fn run(args: ServerArgs) -> Result<()> {
    args.validate()?;
    let metrics = Metrics::new();
    let registry = RegistryClient::new(registry_config(&args.registry)?, metrics.clone())?;
    let (watch_client, client) = kube_clients(args.apiserver_timeout).await?;
    let shutdown = CancellationToken::new();

    let (trigger_tx, trigger_rx) = mpsc::unbounded_channel();
    let scope = CacheScope {
        namespace: args.controller.watch_namespace.clone(),
        pod_selector: args.controller.pod_selector.clone(),
    };
    let (cache, cache_driver) = cache::start(watch_client, &scope, trigger_tx);
    let cache_task = tokio::spawn(cache_driver);

    // Webhook: fail fast on a bad certificate, then reload on change (V6).
    let tls_config = RustlsConfig::from_config(Arc::new(tls::server_config(
        &args.webhook.tls_cert_file,
        &args.webhook.tls_key_file,
    )?));
    tokio::spawn(tls::reload_on_change(
        tls_config.clone(),
        args.webhook.tls_cert_file.clone(),
        args.webhook.tls_key_file.clone(),
        args.webhook.tls_reload_interval,
        shutdown.clone(),
    ));
    let webhook_handle = axum_server::Handle::new();
    let webhook_app = webhook::cache_router(cache.clone(), metrics.clone());
    let webhook_server = tokio::spawn(
        axum_server::bind_rustls(args.webhook.webhook_addr, tls_config)
            .handle(webhook_handle.clone())
            .serve(webhook_app.into_make_service()),
    );

    let admin_listener = tokio::net::TcpListener::bind(args.admin_addr).await?;
    let admin_app = crate::admin::router(cache.clone(), metrics.clone());
    let admin_stop = shutdown.clone();
    let admin_server = tokio::spawn(async move {
        axum::serve(admin_listener, admin_app)
            .with_graceful_shutdown(async move { admin_stop.cancelled().await })
            .await
    });
    tracing::info!(webhook = %args.webhook.webhook_addr, admin = %args.admin_addr, "serving");

    let identity = args
        .election
        .identity
        .clone()
        .unwrap_or_else(|| format!("cocoon-hibernation-{}", std::process::id()));
    let election = if args.election.leader_election {
        Election::start(
            client.clone(),
            &args.election,
            identity.clone(),
            args.apiserver_timeout,
        )
        .await?
    } else {
        Election::always()
    };
    let settings = Settings {
        hibernate_timeout: args.controller.hibernate_timeout,
        wake_timeout: args.controller.wake_timeout,
        refused_delete_backoff: args.controller.refused_delete_backoff,
        registry_slots: usize::try_from(args.controller.concurrency - 1)
            .unwrap_or(1)
            .max(1),
        ..Settings::default()
    };
    let ctx = controller::context(
        client,
        cache,
        registry,
        metrics,
        settings,
        Some(identity),
        election.fence.clone(),
    );
    let census_task = tokio::spawn(controller::report_census(ctx.clone(), shutdown.clone()));
    let concurrency = u16::try_from(args.controller.concurrency).unwrap_or(u16::MAX);
    let controller_task = tokio::spawn(controller::run(
        ctx,
        trigger_rx,
        election.leading.clone(),
        concurrency,
        shutdown.clone(),
    ));

    let mut webhook_server = webhook_server;
    let outcome = tokio::select! {
        _ = wait_for_signal() => Ok(()),
        res = &mut webhook_server => Err(Error::Tls(format!("webhook server stopped: {}", flatten(res)))),
    };

    // P4: stop accepting, finish in-flight reviews, stop reconciling, release the lease
    // (only after the controller stopped, so no leader-only effect follows the release).
    tracing::info!("shutting down");
    webhook_handle.graceful_shutdown(Some(args.shutdown_grace));
    shutdown.cancel();
    let _ = controller_task.await;
    census_task.abort();
    election.stop.cancel();
    if let Some(task) = election.task {
        let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    }
    if !webhook_server.is_finished() {
        let _ = tokio::time::timeout(
            args.shutdown_grace + Duration::from_secs(1),
            &mut webhook_server,
        )
        .await;
    }
    let _ = admin_server.await;
    cache_task.abort();
    tracing::info!("stopped");
    outcome
}

/// Two clients on the same kubeconfig (S1): one without a read timeout for the cache's
/// watches, which kube-runtime guards with its own idle timeout, and one whose every
/// request (reads, writes, events, the Lease) fails after `timeout` of silence, so a dead
/// connection cannot hold a reconcile pass or a lease renewal forever.
async fn kube_clients(timeout: Duration) -> Result<(kube::Client, kube::Client)> {
    let config = kube::Config::infer()
        .await
        .map_err(|e| Error::Kube(kube::Error::InferConfig(e)))?;
    let (watch, timed) = client_configs(config, timeout);
    Ok((
        kube::Client::try_from(watch)?,
        kube::Client::try_from(timed)?,
    ))
}

/// (watch config, timed config) from one inferred config.
fn client_configs(mut config: kube::Config, timeout: Duration) -> (kube::Config, kube::Config) {
    // The apiserver's audit log then tells our calls from everyone else's.
    config.headers.push((
        http::header::USER_AGENT,
        http::HeaderValue::from_static(crate::USER_AGENT),
    ));
    let mut watch = config.clone();
    watch.read_timeout = None;
    let mut timed = config;
    timed.connect_timeout = Some(timeout);
    timed.read_timeout = Some(timeout);
    timed.write_timeout = Some(timeout);
    // Count the read timeout from when a request is sent, not from when its pooled
    // connection went idle.
    timed.reset_reader_on_write = true;
    (watch, timed)
}

fn flatten(res: std::result::Result<std::io::Result<()>, tokio::task::JoinError>) -> String {
    match res {
        Ok(Ok(())) => "closed".into(),
        Ok(Err(e)) => e.to_string(),
        Err(e) => e.to_string(),
    }
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Turns the registry flags into a client config; reads credential files (P3).
pub fn registry_config(args: &RegistryArgs) -> Result<RegistryConfig> {
    let base = args
        .registry_base
        .clone()
        .unwrap_or_default()
        .trim()
        .trim_end_matches('/')
        .to_owned();
    let host = base.split('/').next().unwrap_or_default().to_owned();
    let auth = if let Some(user) = &args.registry_username {
        RegistryAuth::Basic(
            user.clone(),
            args.registry_password.clone().unwrap_or_default(),
        )
    } else if let Some(path) = &args.registry_docker_config {
        let raw = std::fs::read(path).map_err(|e| {
            Error::Config(crate::config::ConfigError(format!(
                "reading --registry-docker-config {}: {e}",
                path.display()
            )))
        })?;
        auth_from_docker_config(&raw, &host)?
    } else if let Some(path) = &args.registry_token_file {
        let token = std::fs::read_to_string(path).map_err(|e| {
            Error::Config(crate::config::ConfigError(format!(
                "reading --registry-token-file {}: {e}",
                path.display()
            )))
        })?;
        RegistryAuth::Bearer(token.trim().to_owned())
    } else {
        RegistryAuth::Anonymous
    };
    let mut extra_ca_pems = Vec::new();
    for path in &args.registry_ca_file {
        let pem = std::fs::read(path).map_err(|e| {
            Error::Config(crate::config::ConfigError(format!(
                "reading --registry-ca-file {}: {e}",
                path.display()
            )))
        })?;
        extra_ca_pems.push(pem);
    }
    Ok(RegistryConfig {
        base,
        plain_http: args.registry_plain_http,
        auth,
        extra_ca_pems,
        timeout: args.registry_timeout,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// O4: both kube clients name us to the apiserver, whose audit log records it.
    #[test]
    fn o4_kube_clients_send_our_user_agent() {
        let config = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let (watch, timed) = client_configs(config, Duration::from_secs(3));
        for c in [watch, timed] {
            let ua = c
                .headers
                .iter()
                .find(|(k, _)| k == http::header::USER_AGENT);
            assert_eq!(
                ua.map(|(_, v)| v.to_str().unwrap().to_owned()),
                Some(format!("cocoon-hibernation/{}", env!("CARGO_PKG_VERSION")))
            );
        }
    }

    fn args(extra: &[&str]) -> RegistryArgs {
        let mut all = vec!["x", "--registry-base", "reg.example:5000/snapshots/"];
        all.extend_from_slice(extra);
        crate::config::Cli::try_parse_from(all)
            .unwrap()
            .server_args()
            .registry
    }

    /// SPEC P3: credentials come from the docker config for the base's host.
    #[test]
    fn p3_docker_config_file_gives_the_registry_host_credentials() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.json");
        // "alice:pw" in base64
        std::fs::write(
            &path,
            r#"{"auths":{"reg.example:5000":{"auth":"YWxpY2U6cHc="}}}"#,
        )
        .unwrap();
        let cfg =
            registry_config(&args(&["--registry-docker-config", path.to_str().unwrap()])).unwrap();
        assert_eq!(cfg.base, "reg.example:5000/snapshots");
        assert!(matches!(cfg.auth, RegistryAuth::Basic(ref username, _) if username == "alice"));
    }

    /// SPEC S1: every non-watch call has connect, read and write timeouts; watches keep
    /// no read timeout (kube-runtime's watcher has its own idle timeout).
    #[test]
    fn s1_only_the_watch_client_lacks_a_read_timeout() {
        let base = kube::Config::new("https://127.0.0.1:6443".parse().unwrap());
        let t = Duration::from_secs(7);
        let (watch, timed) = client_configs(base, t);
        assert_eq!(watch.read_timeout, None);
        assert_eq!(timed.read_timeout, Some(t));
        assert_eq!(timed.write_timeout, Some(t));
        assert_eq!(timed.connect_timeout, Some(t));
        assert!(timed.reset_reader_on_write);
    }

    /// SPEC P3: an unreadable file is a clear error naming the flag, not a panic.
    #[test]
    fn p3_unreadable_credential_files_name_their_flag() {
        for flag in [
            "--registry-docker-config",
            "--registry-token-file",
            "--registry-ca-file",
        ] {
            let err = registry_config(&args(&[flag, "/nonexistent/file"])).unwrap_err();
            assert!(err.to_string().contains(flag), "{err}");
        }
    }
}
