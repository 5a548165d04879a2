//! The registry client: probe and delete `<base>/<vm>:hibernate`.

use super::config::{RegistryAuth, RegistryConfig};
use super::delete::{DeleteSession, RawDelete};
use super::error::{RegistryError, describe_chain};
use super::names::{RegistryBase, SNAPSHOT_TAG};
use super::oci_errors::{Failure, classify};
use crate::metrics::Metrics;
use oci_client::Reference;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::{debug, info, warn};

const USER_AGENT: &str = concat!("cocoon-hibernation/", env!("CARGO_PKG_VERSION"));
/// Tags asked for per `tags/list` page.
const TAG_PAGE_SIZE: usize = 100;
/// Upper bound on pages, so a registry that ignores `last` cannot loop us forever.
const MAX_TAG_PAGES: usize = 100;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteOutcome {
    /// The registry deleted the tag itself.
    Deleted,
    /// There was nothing to delete.
    Absent,
    /// Tag deletion is unsupported (Distribution 2.x); the manifest was deleted by digest.
    DeletedByDigest,
    /// Other tags point at the same manifest: deleting by digest would remove them too,
    /// so nothing was deleted.
    KeptSharedDigest { other_tags: Vec<String> },
}

#[derive(Clone)]
pub struct RegistryClient {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub base: RegistryBase,
    pub scheme: &'static str,
    pub auth: RegistryAuth,
    pub oci_auth: oci_client::secrets::RegistryAuth,
    pub oci: oci_client::Client,
    /// For the calls oci-client lacks (DELETE, delete-scoped tokens).
    pub http: reqwest::Client,
    pub timeout: Duration,
    pub metrics: Metrics,
}

impl fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RegistryClient")
            .field("registry", &self.inner.base.registry)
            .field("prefix", &self.inner.base.prefix)
            .field("scheme", &self.inner.scheme)
            .field("auth", &self.inner.auth)
            .field("timeout", &self.inner.timeout)
            .finish()
    }
}

impl RegistryClient {
    pub fn new(config: RegistryConfig, metrics: Metrics) -> Result<Self, RegistryError> {
        let base = RegistryBase::parse(&config.base)?;
        if config.timeout.is_zero() {
            return Err(RegistryError::InvalidConfig(
                "the registry timeout must be above zero".into(),
            ));
        }
        // reqwest (built without a provider) panics when none is installed; main installs
        // ring, and this keeps a forgotten install from turning into a panic.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let ca_ders = parse_ca_pems(&config.extra_ca_pems)?;

        let oci_config = ClientConfig {
            protocol: if config.plain_http {
                ClientProtocol::Http
            } else {
                ClientProtocol::Https
            },
            extra_root_certificates: ca_ders
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
        };
        let oci = oci_client::Client::try_from(oci_config).map_err(|e| {
            RegistryError::InvalidConfig(format!(
                "cannot build the OCI client: {}",
                describe_chain(&e)
            ))
        })?;

        let mut roots = Vec::with_capacity(ca_ders.len());
        for der in &ca_ders {
            roots.push(reqwest::Certificate::from_der(der).map_err(|e| {
                RegistryError::InvalidConfig(format!(
                    "unusable CA certificate: {}",
                    describe_chain(&e)
                ))
            })?);
        }
        let http = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .tls_certs_merge(roots)
            // Never let a redirect or a token realm downgrade an https registry to http.
            .https_only(!config.plain_http)
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| {
                RegistryError::InvalidConfig(format!(
                    "cannot build the HTTP client: {}",
                    describe_chain(&e)
                ))
            })?;

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
            }),
        })
    }

    /// HEAD <base>/<vm>:hibernate. Ok(true)=present, Ok(false)=absent (404 / MANIFEST_UNKNOWN / NAME_UNKNOWN is an answer, not an error).
    /// Transport errors, timeouts, 5xx and auth failures (401/403) are Err.
    pub async fn snapshot_exists(&self, vm: &str) -> Result<bool, RegistryError> {
        let reference = self.snapshot_reference(vm)?;
        Ok(self.resolve_digest(&reference, "probe").await?.is_some())
    }

    /// Delete the tag <base>/<vm>:hibernate.
    ///
    /// Registries that cannot delete a tag (CNCF Distribution 2.x) get the manifest deleted
    /// by digest instead, unless another tag of the repository points at the same digest:
    /// that delete would take the other tag with it, so it is left alone.
    pub async fn delete_snapshot(&self, vm: &str) -> Result<DeleteOutcome, RegistryError> {
        let reference = self.snapshot_reference(vm)?;
        // The host oci-client talks to (it maps docker.io to index.docker.io).
        let registry = reference.resolve_registry();
        let repository = reference.repository();
        let mut session = DeleteSession::default();
        match self
            .delete_manifest(registry, repository, SNAPSHOT_TAG, "delete", &mut session)
            .await?
        {
            RawDelete::Deleted => {
                info!(repository, tag = SNAPSHOT_TAG, "deleted snapshot tag");
                return Ok(DeleteOutcome::Deleted);
            }
            RawDelete::NotFound => return Ok(DeleteOutcome::Absent),
            RawDelete::Unsupported { status, .. } => {
                debug!(
                    repository,
                    status, "tag delete unsupported; falling back to delete by digest"
                );
            }
        }

        let Some(digest) = self.resolve_digest(&reference, "resolve").await? else {
            return Ok(DeleteOutcome::Absent);
        };
        let other_tags = self.tags_sharing_digest(&reference, &digest).await?;
        if !other_tags.is_empty() {
            warn!(
                repository,
                %digest,
                ?other_tags,
                "not deleting snapshot tag: other tags share its manifest digest and a delete by digest would remove them"
            );
            self.inner.metrics.snapshot_tags_kept.inc();
            return Ok(DeleteOutcome::KeptSharedDigest { other_tags });
        }
        match self
            .delete_manifest(registry, repository, &digest, "delete_digest", &mut session)
            .await?
        {
            RawDelete::Deleted => {
                info!(repository, %digest, "deleted snapshot manifest by digest");
                Ok(DeleteOutcome::DeletedByDigest)
            }
            RawDelete::NotFound => Ok(DeleteOutcome::Absent),
            RawDelete::Unsupported { status, message } => Err(RegistryError::DeleteRefused {
                reference: format!("{registry}/{repository}@{digest}"),
                status,
                message,
            }),
        }
    }

    fn snapshot_reference(&self, vm: &str) -> Result<Reference, RegistryError> {
        let repository = self.inner.base.repository(vm)?;
        Ok(Reference::with_tag(
            self.inner.base.registry.clone(),
            repository,
            SNAPSHOT_TAG.to_string(),
        ))
    }

    /// The manifest digest a reference resolves to; None when it does not exist.
    async fn resolve_digest(
        &self,
        reference: &Reference,
        operation: &'static str,
    ) -> Result<Option<String>, RegistryError> {
        let inner = &self.inner;
        let result = self
            .retry_transport(operation, || async {
                match self
                    .timed(
                        operation,
                        inner.oci.fetch_manifest_digest(reference, &inner.oci_auth),
                    )
                    .await?
                {
                    Ok(digest) => Ok(Some(digest)),
                    Err(e) => match classify(e, operation, inner.timeout) {
                        Failure::NotFound => Ok(None),
                        Failure::Error(e) => Err(e),
                    },
                }
            })
            .await;
        let outcome = match &result {
            Ok(Some(_)) => "present",
            Ok(None) => "absent",
            Err(e) => error_outcome(e),
        };
        inner.metrics.registry_call(operation, outcome);
        debug!(reference = %reference, operation, outcome, "registry manifest lookup");
        result
    }

    /// Other tags of the repository whose manifest digest equals `digest`.
    async fn tags_sharing_digest(
        &self,
        reference: &Reference,
        digest: &str,
    ) -> Result<Vec<String>, RegistryError> {
        let mut sharing = Vec::new();
        for tag in self.list_tags(reference).await? {
            if tag == SNAPSHOT_TAG {
                continue;
            }
            let other = Reference::with_tag(
                reference.registry().to_string(),
                reference.repository().to_string(),
                tag,
            );
            // A lookup error aborts: without a full answer we cannot prove the digest is unshared.
            if self.resolve_digest(&other, "resolve").await?.as_deref() == Some(digest) {
                sharing.extend(other.tag().map(str::to_string));
            }
        }
        Ok(sharing)
    }

    /// Every tag of the repository. Pages until a page brings nothing new, so a registry
    /// that caps the page size below ours is still read to the end.
    async fn list_tags(&self, reference: &Reference) -> Result<Vec<String>, RegistryError> {
        let inner = &self.inner;
        let mut tags = Vec::new();
        let mut seen = HashSet::new();
        let mut last: Option<String> = None;
        for _ in 0..MAX_TAG_PAGES {
            let page = self
                .retry_transport("list_tags", || async {
                    let listed = self
                        .timed(
                            "list_tags",
                            inner.oci.list_tags(
                                reference,
                                &inner.oci_auth,
                                Some(TAG_PAGE_SIZE),
                                last.as_deref(),
                            ),
                        )
                        .await?;
                    match listed {
                        Ok(page) => Ok(Some(page.tags)),
                        Err(e) => match classify(e, "list_tags", inner.timeout) {
                            Failure::NotFound => Ok(None),
                            Failure::Error(e) => Err(e),
                        },
                    }
                })
                .await;
            let page = match page {
                Ok(Some(page)) => page,
                // The repository vanished meanwhile: no tags.
                Ok(None) => {
                    inner.metrics.registry_call("list_tags", "absent");
                    return Ok(tags);
                }
                Err(e) => return Err(self.failed("list_tags", e)),
            };
            inner.metrics.registry_call("list_tags", "ok");
            let page_last = page.last().cloned();
            let before = tags.len();
            for tag in page {
                if seen.insert(tag.clone()) {
                    tags.push(tag);
                }
            }
            if tags.len() == before {
                return Ok(tags);
            }
            last = page_last;
        }
        Err(self.failed(
            "list_tags",
            RegistryError::Protocol {
                operation: "list_tags",
                message: format!(
                    "more than {} tags, or the registry ignores pagination",
                    TAG_PAGE_SIZE * MAX_TAG_PAGES
                ),
            },
        ))
    }

    /// Runs one registry call under the configured timeout.
    pub(super) async fn timed<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = T>,
    ) -> Result<T, RegistryError> {
        let after = self.inner.timeout;
        tokio::time::timeout(after, call)
            .await
            .map_err(|_| RegistryError::Timeout { operation, after })
    }

    /// Runs `call` once more after a transport failure. A registry restart leaves dead
    /// connections in the pool, and the first request on one fails without reaching the
    /// new process; every call here is idempotent (HEAD, GET, DELETE).
    pub(super) async fn retry_transport<T, F, Fut>(
        &self,
        operation: &'static str,
        mut call: F,
    ) -> Result<T, RegistryError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, RegistryError>>,
    {
        match call().await {
            Err(RegistryError::Transport { message, .. }) => {
                debug!(operation, %message, "retrying once after a transport error");
                call().await
            }
            other => other,
        }
    }

    /// Records a failed call and hands the error back.
    pub(super) fn failed(&self, operation: &'static str, error: RegistryError) -> RegistryError {
        self.inner
            .metrics
            .registry_call(operation, error_outcome(&error));
        error
    }
}

pub(super) fn error_outcome(error: &RegistryError) -> &'static str {
    match error {
        RegistryError::Timeout { .. } => "timeout",
        _ => "error",
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
