//! Serving certificate loading and hot reload (V6). Files are polled, not watched: a
//! Kubernetes Secret volume swaps a symlink, which a single-file watch would miss.

use crate::error::{Error, Result};
use axum_server::tls_rustls::RustlsConfig;
use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// TLS 1.2 and 1.3 only, HTTP/1.1, ring provider.
pub fn server_config(cert_file: &Path, key_file: &Path) -> Result<ServerConfig> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| Error::Tls(format!("reading {}: {e}", cert_file.display())))?
        .collect::<Result<_, _>>()
        .map_err(|e| Error::Tls(format!("parsing {}: {e}", cert_file.display())))?;
    if certs.is_empty() {
        return Err(Error::Tls(format!(
            "{} holds no certificate",
            cert_file.display()
        )));
    }
    let key = PrivateKeyDer::from_pem_file(key_file)
        .map_err(|e| Error::Tls(format!("reading key {}: {e}", key_file.display())))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| Error::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| Error::Tls(format!("certificate and key do not match: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(cfg)
}

/// What identifies one version of the files: resolved path, size and mtime.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Stamp(Vec<(PathBuf, u64, Option<SystemTime>)>);

fn stamp(paths: &[&Path]) -> Stamp {
    Stamp(
        paths
            .iter()
            .map(|p| {
                let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
                let meta = std::fs::metadata(&real).ok();
                (
                    real,
                    meta.as_ref().map(|m| m.len()).unwrap_or_default(),
                    meta.and_then(|m| m.modified().ok()),
                )
            })
            .collect(),
    )
}

/// What the reloader has done so far: it is alive while `checks` grows.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReloadStatus {
    /// Polls of the files.
    pub checks: u64,
    /// Changed pairs loaded and now served.
    pub reloaded: u64,
    /// Changed pairs that could not be loaded (the old pair kept serving).
    pub failed: u64,
}

/// Polls the files and swaps the live config on change; a bad new pair is logged and
/// the old one keeps serving.
pub async fn reload_on_change(
    config: RustlsConfig,
    cert_file: PathBuf,
    key_file: PathBuf,
    every: Duration,
    stop: CancellationToken,
) {
    let status = watch::Sender::new(ReloadStatus::default());
    reload_on_change_reporting(config, cert_file, key_file, every, stop, status).await
}

/// [`reload_on_change`], publishing what it does to `status` (for tests and health).
pub async fn reload_on_change_reporting(
    config: RustlsConfig,
    cert_file: PathBuf,
    key_file: PathBuf,
    every: Duration,
    stop: CancellationToken,
    status: watch::Sender<ReloadStatus>,
) {
    let mut last = stamp(&[&cert_file, &key_file]);
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        let now = stamp(&[&cert_file, &key_file]);
        if now == last {
            status.send_modify(|s| s.checks += 1);
            continue;
        }
        match server_config(&cert_file, &key_file) {
            Ok(cfg) => {
                config.reload_from_config(Arc::new(cfg));
                last = now;
                tracing::info!(cert = %cert_file.display(), "serving certificate reloaded");
                status.send_modify(|s| {
                    s.checks += 1;
                    s.reloaded += 1;
                });
            }
            // Likely caught mid-write: retry on the next tick without moving `last`.
            Err(e) => {
                tracing::warn!(error = %e, "serving certificate changed but could not be loaded");
                status.send_modify(|s| {
                    s.checks += 1;
                    s.failed += 1;
                });
            }
        }
    }
}
