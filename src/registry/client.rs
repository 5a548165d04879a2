//! [`RegistryClient`]: the [`SnapshotStore`] on a real registry.

use super::config::{RegistryAuth, RegistryConfig};
use super::error::{RegistryError, describe_chain, from_oci};
use super::http::{Deleted, PAGE_SIZE, Session, valid_tag};
use super::names::{RegistryBase, SNAPSHOT_TAG};
use super::{DeleteOutcome, Fut, SnapshotStore};
use crate::metrics::Metrics;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

const USER_AGENT: &str = concat!("cocoon-hibernation/", env!("CARGO_PKG_VERSION"));

#[derive(Clone)]
pub struct RegistryClient {
    inner: Arc<Inner>,
}

struct Inner {
    base: RegistryBase,
    scheme: &'static str,
    auth: RegistryAuth,
    oci_auth: oci_client::secrets::RegistryAuth,
    oci: oci_client::Client,
    http: reqwest::Client,
    timeout: Duration,
    metrics: Metrics,
    /// The registry refused a DELETE by tag (Distribution): deletes go straight to the
    /// digest path, three calls when the snapshot tag is alone in its repository.
    tag_delete_refused: AtomicBool,
    /// Whether the registry deletes tags is known (it did, or it refused).
    tag_delete_known: AtomicBool,
    /// Until then one delete at a time asks, so concurrent first wakes do not each pay
    /// for a refused DELETE.
    tag_delete_asking: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let inner = &self.inner;
        f.debug_struct("RegistryClient")
            .field("base", &inner.base)
            .field("scheme", &inner.scheme)
            .field("auth", &inner.auth)
            .field("timeout", &inner.timeout)
            .finish()
    }
}

impl RegistryClient {
    pub fn new(config: RegistryConfig, metrics: Metrics) -> Result<Self, RegistryError> {
        let base = RegistryBase::parse(&config.base)?;
        let invalid = |what: &str, e: &(dyn std::error::Error + 'static)| {
            RegistryError::InvalidConfig(format!("{what}: {}", describe_chain(e)))
        };
        if config.timeout.is_zero() {
            let message = "the registry timeout must be above zero".into();
            return Err(RegistryError::InvalidConfig(message));
        }
        // reqwest, built without a provider, panics when none is installed.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let ders = parse_ca_pems(&config.extra_ca_pems)?;
        let oci = oci_client::Client::try_from(ClientConfig {
            protocol: if config.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: ders
                .iter()
                .map(|der| Certificate {
                    encoding: CertificateEncoding::Der,
                    data: der.to_vec(),
                })
                .collect(),
            read_timeout: Some(config.timeout),
            connect_timeout: Some(config.timeout),
            user_agent: USER_AGENT,
            ..ClientConfig::default()
        })
        .map_err(|e| invalid("cannot build the OCI client", &e))?;
        let roots = ders
            .iter()
            .map(|der| reqwest::Certificate::from_der(der))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("unusable CA certificate", &e))?;
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .tls_certs_merge(roots)
            // Never let a redirect or a token realm downgrade an https registry.
            .https_only(!config.plain_http)
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| invalid("cannot build the HTTP client", &e))?;
        Ok(Self {
            inner: Arc::new(Inner {
                base,
                scheme: if config.plain_http { "http" } else { "https" },
                oci_auth: config.auth.to_oci(),
                auth: config.auth,
                oci,
                http,
                timeout: config.timeout,
                metrics,
                tag_delete_refused: AtomicBool::new(false),
                tag_delete_known: AtomicBool::new(false),
                tag_delete_asking: tokio::sync::Mutex::new(()),
            }),
        })
    }

    /// Where a VM's snapshot lives, as users write it: `host[:port]/<prefix>/<vm>:hibernate`.
    pub fn snapshot_location(&self, vm: &str) -> Result<String, RegistryError> {
        let base = &self.inner.base;
        Ok(format!(
            "{}/{}:{SNAPSHOT_TAG}",
            base.registry,
            base.repository(vm)?
        ))
    }

    pub(super) fn timeout(&self) -> Duration {
        self.inner.timeout
    }

    pub(super) fn base(&self) -> &RegistryBase {
        &self.inner.base
    }

    /// `<scheme>://<registry>/v2/<path>`.
    pub(super) fn url(&self, path: &str) -> Result<reqwest::Url, RegistryError> {
        let inner = &self.inner;
        let raw = format!("{}://{}/v2/{path}", inner.scheme, inner.base.registry);
        reqwest::Url::parse(&raw)
            .map_err(|e| RegistryError::InvalidConfig(format!("bad URL {raw}: {e}")))
    }

    pub(super) fn session(&self, scope: String, budget: Duration) -> Session<'_> {
        let inner = &self.inner;
        Session {
            http: &inner.http,
            auth: &inner.auth,
            metrics: &inner.metrics,
            scope,
            budget,
            token: None,
        }
    }

    /// Runs one operation within min(now + timeout, `not_after`) (C2, S1): no request
    /// starts after it, and one still running is dropped. A deadline already past sends
    /// nothing.
    async fn within<T>(
        &self,
        op: &'static str,
        not_after: Option<Instant>,
        call: impl AsyncFnOnce(Duration) -> Result<T, RegistryError>,
    ) -> Result<T, RegistryError> {
        let now = Instant::now();
        // A timeout too large for an Instant means no bound of its own.
        let far = Duration::from_secs(365 * 24 * 3600);
        let own = now.checked_add(self.inner.timeout).unwrap_or(now + far);
        let at = not_after.map_or(own, |limit| own.min(limit));
        let after = at.saturating_duration_since(now);
        if after.is_zero() {
            return Err(RegistryError::Timeout {
                operation: op,
                after,
            });
        }
        tokio::time::timeout_at(at, call(after))
            .await
            .unwrap_or_else(|_| {
                self.inner.metrics.registry_call(op, "timeout");
                Err(RegistryError::Timeout {
                    operation: op,
                    after,
                })
            })
    }

    /// HEAD `<vm>:hibernate` through oci-client, once more after a transport error.
    async fn probe(&self, vm: &str, after: Duration) -> Result<Option<String>, RegistryError> {
        let inner = &self.inner;
        let reference = oci_client::Reference::with_tag(
            inner.base.registry.clone(),
            inner.base.repository(vm)?,
            SNAPSHOT_TAG.to_string(),
        );
        let head = async || match inner
            .oci
            .fetch_manifest_digest(&reference, &inner.oci_auth)
            .await
        {
            Ok(digest) => Ok(Some(digest)),
            Err(e) => from_oci(e, "probe", after).map_or(Ok(None), Err),
        };
        let result = match head().await {
            Err(RegistryError::Transport { .. }) => head().await,
            other => other,
        };
        let outcome = match &result {
            Ok(Some(_)) => "present",
            Ok(None) => "absent",
            Err(RegistryError::Timeout { .. }) => "timeout",
            Err(_) => "error",
        };
        inner.metrics.registry_call("probe", outcome);
        debug!(%reference, outcome, "registry probe");
        result
    }

    async fn delete(&self, vm: &str, after: Duration) -> Result<DeleteOutcome, RegistryError> {
        let inner = &self.inner;
        let repository = inner.base.repository(vm)?;
        let manifest = |reference: &str| self.url(&format!("{repository}/manifests/{reference}"));
        let snapshot = manifest(SNAPSHOT_TAG)?;
        let mut s = self.session(format!("repository:{repository}:pull,delete"), after);
        let (refused, known) = (&inner.tag_delete_refused, &inner.tag_delete_known);
        let asking = match known.load(Ordering::Acquire) {
            true => None,
            false => Some(inner.tag_delete_asking.lock().await),
        };
        if !refused.load(Ordering::Acquire) {
            match s.delete(&snapshot, "delete").await? {
                Deleted::Yes => {
                    known.store(true, Ordering::Release);
                    info!(repository, tag = SNAPSHOT_TAG, "deleted snapshot tag");
                    return Ok(DeleteOutcome::Deleted);
                }
                Deleted::NotFound => return Ok(DeleteOutcome::Absent),
                Deleted::Unsupported { status, .. } => {
                    debug!(
                        repository,
                        status, "tag delete refused; by digest from now on"
                    );
                    refused.store(true, Ordering::Release);
                    known.store(true, Ordering::Release);
                }
            }
        }
        drop(asking);
        // The digest path (S5, G1). The HEAD comes first: the digest deleted is the
        // snapshot the caller decided about, and a push during the listing is another
        // manifest, which a DELETE by this digest leaves alone. Left open, as
        // Distribution has no conditional DELETE: a tag put on the digest after the
        // listing goes with it, and a byte-identical re-push cannot be told apart.
        let Some(digest) = s.head_digest(&snapshot, "resolve").await? else {
            return Ok(DeleteOutcome::Absent);
        };
        let list = self.url(&format!("{repository}/tags/list?n={PAGE_SIZE}"))?;
        let tags = s.list(list, "tags", "list_tags").await?.unwrap_or_default();
        if !tags.iter().any(|t| t == SNAPSHOT_TAG) {
            info!(repository, %digest, "snapshot tag gone from the tag list; nothing deleted");
            return Ok(DeleteOutcome::Absent);
        }
        let others: Vec<String> = tags.into_iter().filter(|t| t != SNAPSHOT_TAG).collect();
        if let Some(bad) = others.iter().find(|t| !valid_tag(t)) {
            let message = format!("the tag list holds a malformed tag {bad:?}");
            return Err(RegistryError::Protocol {
                operation: "list_tags",
                message,
            });
        }
        if !others.is_empty() {
            let mut sharing = Vec::new();
            // Any lookup error aborts: the digest is not proven unshared without all.
            for tag in others {
                if s.head_digest(&manifest(&tag)?, "resolve").await?.as_ref() == Some(&digest) {
                    sharing.push(tag);
                }
            }
            if !sharing.is_empty() {
                warn!(repository, %digest, other_tags = ?sharing,
                    "not deleting the snapshot: other tags share its manifest");
                self.inner.metrics.snapshot_tags_kept.inc();
                return Ok(DeleteOutcome::KeptSharedDigest {
                    other_tags: sharing,
                });
            }
            match s.head_digest(&snapshot, "recheck").await? {
                None => return Ok(DeleteOutcome::Absent),
                Some(found) if found != digest => {
                    warn!(repository, checked = %digest, %found, "snapshot moved; not deleting");
                    let reference = format!("{}/{repository}:{SNAPSHOT_TAG}", self.base().registry);
                    return Err(RegistryError::SnapshotMoved {
                        reference,
                        checked: digest,
                        found,
                    });
                }
                Some(_) => {}
            }
        }
        match s.delete(&manifest(&digest)?, "delete_digest").await? {
            Deleted::Yes => {
                info!(repository, %digest, "deleted snapshot manifest by digest");
                Ok(DeleteOutcome::DeletedByDigest)
            }
            Deleted::NotFound => Ok(DeleteOutcome::Absent),
            Deleted::Unsupported { status, message } => {
                // Deletes are off altogether, which says nothing about tags: once
                // allowed again, a tag delete is tried first.
                refused.store(false, Ordering::Release);
                known.store(false, Ordering::Release);
                let reference = format!("{}/{repository}@{digest}", self.base().registry);
                Err(RegistryError::DeleteRefused {
                    reference,
                    status,
                    message,
                })
            }
        }
    }
}

impl SnapshotStore for RegistryClient {
    fn snapshot_digest<'a>(&'a self, vm: &'a str) -> Fut<'a, Option<String>> {
        Box::pin(self.within("probe", None, async |after| self.probe(vm, after).await))
    }

    fn delete_snapshot_before<'a>(
        &'a self,
        vm: &'a str,
        not_after: Instant,
    ) -> Fut<'a, DeleteOutcome> {
        let delete = async |after| self.delete(vm, after).await;
        Box::pin(self.within("delete", Some(not_after), delete))
    }
}

fn parse_ca_pems(pems: &[Vec<u8>]) -> Result<Vec<CertificateDer<'static>>, RegistryError> {
    let mut ders = Vec::new();
    for (index, pem) in pems.iter().enumerate() {
        let before = ders.len();
        for cert in CertificateDer::pem_slice_iter(pem) {
            ders.push(cert.map_err(|e| {
                RegistryError::InvalidConfig(format!(
                    "extra CA certificate #{index} is not valid PEM: {e}"
                ))
            })?);
        }
        if ders.len() == before {
            return Err(RegistryError::InvalidConfig(format!(
                "extra CA certificate #{index} holds no PEM CERTIFICATE block"
            )));
        }
    }
    Ok(ders)
}
#[cfg(test)]
mod tests {
    use super::*;

    /// The controller spawns these calls on a multi-threaded runtime (C2).
    #[allow(dead_code)]
    fn calls_are_send_and_client_is_shareable(client: RegistryClient) {
        fn send<T: Send>(_: &T) {}
        fn shareable<T: Send + Sync + Clone + 'static>() {}
        shareable::<RegistryClient>();
        send(&client.snapshot_exists("vm"));
        send(&client.delete_snapshot("vm"));
        send(&client.delete_snapshot_before("vm", Instant::now()));
        send(&client.snapshot_digest("vm"));
        fn error<T: std::error::Error + Send + Sync + 'static>() {}
        error::<RegistryError>();
    }

    #[test]
    fn client_debug_redacts_secrets() {
        let client = RegistryClient::new(
            RegistryConfig {
                base: "reg.example:5000/snap".into(),
                plain_http: false,
                auth: RegistryAuth::Basic {
                    username: "alice".into(),
                    password: "hunter2".into(),
                },
                extra_ca_pems: vec![],
                timeout: Duration::from_secs(3),
            },
            Metrics::new(),
        )
        .unwrap();
        let printed = format!("{client:?}");
        assert!(printed.contains("reg.example:5000"), "{printed}");
        assert!(!printed.contains("hunter2"), "{printed}");
    }
}
