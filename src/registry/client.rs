//! The registry client: probe and delete `<base>/<vm>:hibernate`.

use super::config::{RegistryAuth, RegistryConfig};
use super::deadline::Deadline;
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
use tokio::time::Instant;
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
    /// The whole probe, token exchange included, gets one `timeout` (C2).
    pub async fn snapshot_exists(&self, vm: &str) -> Result<bool, RegistryError> {
        Ok(self.snapshot_digest(vm).await?.is_some())
    }

    /// The manifest digest `<base>/<vm>:hibernate` resolves to (from the HEAD probe's
    /// `Docker-Content-Digest`); None when the tag does not exist. Same call, errors and
    /// budget as [`Self::snapshot_exists`].
    pub async fn snapshot_digest(&self, vm: &str) -> Result<Option<String>, RegistryError> {
        let reference = self.snapshot_reference(vm)?;
        let deadline = Deadline::new(self.inner.timeout, None);
        self.resolve_digest(&reference, "probe", &deadline).await
    }

    /// Delete the tag <base>/<vm>:hibernate, within one `timeout` for the whole operation
    /// (C2). Same as [`Self::delete_snapshot_before`] with no bound of the caller's.
    pub async fn delete_snapshot(&self, vm: &str) -> Result<DeleteOutcome, RegistryError> {
        self.delete_with(vm, Deadline::new(self.inner.timeout, None))
            .await
    }

    /// Delete the tag <base>/<vm>:hibernate, every request of it finished or abandoned by
    /// min(now + timeout, `not_after`) (C2, S1: the leader passes its fence's expiry).
    /// A `not_after` already past returns `Timeout` without sending anything; running out
    /// of time midway returns `Timeout` and no further request is started.
    ///
    /// An abandoned request may still be carried out by the registry: a caller that must
    /// not have a DELETE land after some instant passes that instant minus its margin.
    ///
    /// Registries that cannot delete a tag (CNCF Distribution 2.x) get the manifest deleted
    /// by digest instead, unless another tag of the repository points at the same digest:
    /// that delete would take the other tag with it, so it is left alone
    /// ([`DeleteOutcome::KeptSharedDigest`]). If `<vm>:hibernate` moves to another digest
    /// while the fallback checks (a fresh push), nothing is deleted and the answer is
    /// [`RegistryError::SnapshotMoved`].
    pub async fn delete_snapshot_before(
        &self,
        vm: &str,
        not_after: Instant,
    ) -> Result<DeleteOutcome, RegistryError> {
        self.delete_with(vm, Deadline::new(self.inner.timeout, Some(not_after)))
            .await
    }

    async fn delete_with(
        &self,
        vm: &str,
        deadline: Deadline,
    ) -> Result<DeleteOutcome, RegistryError> {
        let reference = self.snapshot_reference(vm)?;
        // Checked before any request, so a caller out of time sends nothing (S1).
        deadline.check("delete")?;
        // The host oci-client talks to (it maps docker.io to index.docker.io).
        let registry = reference.resolve_registry();
        let repository = reference.repository();
        let mut session = DeleteSession::default();
        match self
            .delete_manifest(
                registry,
                repository,
                SNAPSHOT_TAG,
                "delete",
                &mut session,
                &deadline,
            )
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

        let Some(digest) = self
            .resolve_digest(&reference, "resolve", &deadline)
            .await?
        else {
            return Ok(DeleteOutcome::Absent);
        };
        let other_tags = self
            .tags_sharing_digest(&reference, &digest, &deadline)
            .await?;
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
        // The listing took a while: if the tag was pushed again meanwhile, the digest we
        // checked is no longer the snapshot, and the new one was not checked at all.
        // What is left open: a push or a new tag on this digest between this HEAD and the
        // DELETE (one round trip). Distribution has no conditional DELETE to close it.
        match self
            .resolve_digest(&reference, "recheck", &deadline)
            .await?
        {
            None => return Ok(DeleteOutcome::Absent),
            Some(now) if now != digest => {
                warn!(
                    repository,
                    checked = %digest,
                    found = %now,
                    "not deleting: the snapshot tag moved to another manifest while it was checked"
                );
                return Err(RegistryError::SnapshotMoved {
                    reference: format!("{registry}/{repository}:{SNAPSHOT_TAG}"),
                    checked: digest,
                    found: now,
                });
            }
            Some(_) => {}
        }
        match self
            .delete_manifest(
                registry,
                repository,
                &digest,
                "delete_digest",
                &mut session,
                &deadline,
            )
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
        deadline: &Deadline,
    ) -> Result<Option<String>, RegistryError> {
        let inner = &self.inner;
        let result = self
            .retry_transport(operation, || async {
                match deadline
                    .run(
                        operation,
                        inner.oci.fetch_manifest_digest(reference, &inner.oci_auth),
                    )
                    .await?
                {
                    Ok(digest) => Ok(Some(digest)),
                    Err(e) => match classify(e, operation, deadline.budget()) {
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
        deadline: &Deadline,
    ) -> Result<Vec<String>, RegistryError> {
        let mut sharing = Vec::new();
        for tag in self.list_tags(reference, deadline).await? {
            if tag == SNAPSHOT_TAG {
                continue;
            }
            let other = Reference::with_tag(
                reference.registry().to_string(),
                reference.repository().to_string(),
                tag,
            );
            // A lookup error aborts: without a full answer we cannot prove the digest is unshared.
            if self
                .resolve_digest(&other, "resolve", deadline)
                .await?
                .as_deref()
                == Some(digest)
            {
                sharing.extend(other.tag().map(str::to_string));
            }
        }
        Ok(sharing)
    }

    /// Every tag of the repository. Pages until a page brings nothing new, so a registry
    /// that caps the page size below ours is still read to the end.
    async fn list_tags(
        &self,
        reference: &Reference,
        deadline: &Deadline,
    ) -> Result<Vec<String>, RegistryError> {
        let inner = &self.inner;
        let mut tags = Vec::new();
        let mut seen = HashSet::new();
        let mut last: Option<String> = None;
        for _ in 0..MAX_TAG_PAGES {
            let page = self
                .retry_transport("list_tags", || async {
                    let listed = deadline
                        .run(
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
                        Err(e) => match classify(e, "list_tags", deadline.budget()) {
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
