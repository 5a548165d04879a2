//! The registry client: probe and delete `<base>/<vm>:hibernate`.

use super::config::{RegistryAuth, RegistryConfig};
use super::deadline::Deadline;
use super::delete::RawDelete;
use super::error::{RegistryError, describe_chain};
use super::names::{RegistryBase, SNAPSHOT_TAG};
use super::oci_errors::{Failure, classify};
use super::request::Session;
use crate::metrics::Metrics;
use oci_client::Reference;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use std::collections::HashSet;
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

const USER_AGENT: &str = concat!("cocoon-hibernation/", env!("CARGO_PKG_VERSION"));

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
    /// For every request of a delete (see `request.rs`).
    pub http: reqwest::Client,
    pub timeout: Duration,
    pub metrics: Metrics,
    /// Registry hosts that refused a DELETE by tag (400 DIGEST_INVALID/UNSUPPORTED, 405).
    pub tag_delete_refused: Mutex<HashSet<String>>,
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
                tag_delete_refused: Mutex::new(HashSet::new()),
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
    /// ([`DeleteOutcome::KeptSharedDigest`]). The digest deleted is the one
    /// `<vm>:hibernate` resolves to at the first request of that path; a snapshot pushed
    /// later is a new manifest and is not deleted. If the tag moves to another digest
    /// while other tags are checked, nothing is deleted and the answer is
    /// [`RegistryError::SnapshotMoved`]. The refusal of a tag delete is remembered for the
    /// life of the client, so later deletes on that registry skip it: HEAD, `tags/list`
    /// and DELETE by digest when the snapshot is the repository's only tag.
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
        let mut session = Session::new(repository);
        if !self.tag_delete_refused(registry) {
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
                        status, "tag delete refused; deleting by digest, now and on later deletes"
                    );
                    self.remember_tag_delete_refused(registry, true);
                }
            }
        }
        self.delete_by_digest(registry, repository, &mut session, &deadline)
            .await
    }

    /// The digest path, for registries that cannot delete a tag (S5, G1). Its requests:
    ///
    /// 1. HEAD `<vm>:hibernate`: its `Docker-Content-Digest` is the manifest to delete.
    ///    404: [`DeleteOutcome::Absent`], nothing else is sent.
    /// 2. `tags/list`, every page once. `hibernate` not in it: Absent, no DELETE.
    /// 3. Only when the repository holds other tags: HEAD each one, and any on the digest
    ///    keeps the snapshot ([`DeleteOutcome::KeptSharedDigest`], no DELETE); then HEAD
    ///    `<vm>:hibernate` again, and if it moved meanwhile nothing is deleted
    ///    ([`RegistryError::SnapshotMoved`], transient).
    /// 4. DELETE by the digest of step 1.
    ///
    /// The normal case (no other tag) is three requests. The HEAD comes before the
    /// listing on purpose: read after it, the digest would be that of a snapshot pushed
    /// during the listing, which would then be deleted. Read first, it is the snapshot the
    /// caller decided about, and a later push is another manifest that a DELETE by this
    /// digest leaves alone (Distribution removes only the tags whose current link is the
    /// deleted digest).
    ///
    /// Left open, as Distribution has no conditional DELETE:
    /// - a tag put on the digest after the listing (or after its own HEAD in step 3) is
    ///   deleted with it;
    /// - a push of `<vm>:hibernate` after its last HEAD (in the normal case: during the
    ///   listing or the DELETE's round trip) survives, but the answer is
    ///   [`DeleteOutcome::DeletedByDigest`] for the old manifest while the tag exists;
    /// - a byte-identical re-push (the same digest) cannot be told apart and is deleted.
    async fn delete_by_digest(
        &self,
        registry: &str,
        repository: &str,
        session: &mut Session,
        deadline: &Deadline,
    ) -> Result<DeleteOutcome, RegistryError> {
        let Some(digest) = self
            .head_digest(
                registry,
                repository,
                SNAPSHOT_TAG,
                "resolve",
                session,
                deadline,
            )
            .await?
        else {
            return Ok(DeleteOutcome::Absent);
        };
        let tags = self
            .list_tags(registry, repository, session, deadline)
            .await?;
        if !tags.iter().any(|t| t == SNAPSHOT_TAG) {
            info!(
                repository,
                %digest,
                "snapshot tag not in the tag list (deleted meanwhile); nothing deleted"
            );
            return Ok(DeleteOutcome::Absent);
        }
        let others: Vec<String> = tags.into_iter().filter(|t| t != SNAPSHOT_TAG).collect();
        if !others.is_empty() {
            let mut sharing = Vec::new();
            for tag in others {
                // A lookup error aborts: without a full answer the digest is not proven
                // unshared.
                if self
                    .head_digest(registry, repository, &tag, "resolve", session, deadline)
                    .await?
                    .as_deref()
                    == Some(digest.as_str())
                {
                    sharing.push(tag);
                }
            }
            if !sharing.is_empty() {
                warn!(
                    repository,
                    %digest,
                    other_tags = ?sharing,
                    "not deleting snapshot tag: other tags share its manifest digest and a delete by digest would remove them"
                );
                self.inner.metrics.snapshot_tags_kept.inc();
                return Ok(DeleteOutcome::KeptSharedDigest {
                    other_tags: sharing,
                });
            }
            match self
                .head_digest(
                    registry,
                    repository,
                    SNAPSHOT_TAG,
                    "recheck",
                    session,
                    deadline,
                )
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
        }
        match self
            .delete_manifest(
                registry,
                repository,
                &digest,
                "delete_digest",
                session,
                deadline,
            )
            .await?
        {
            RawDelete::Deleted => {
                info!(repository, %digest, "deleted snapshot manifest by digest");
                Ok(DeleteOutcome::DeletedByDigest)
            }
            RawDelete::NotFound => Ok(DeleteOutcome::Absent),
            RawDelete::Unsupported { status, message } => {
                // Digests refused too: deletes are off altogether, which says nothing
                // about tags. Once the registry allows deletes, a tag delete is tried again.
                self.remember_tag_delete_refused(registry, false);
                Err(RegistryError::DeleteRefused {
                    reference: format!("{registry}/{repository}@{digest}"),
                    status,
                    message,
                })
            }
        }
    }

    /// Whether `registry` refused a DELETE by tag before (remembered for the life of the
    /// client): its deletes then go straight to the digest path.
    fn tag_delete_refused(&self, registry: &str) -> bool {
        self.inner
            .tag_delete_refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .contains(registry)
    }

    fn remember_tag_delete_refused(&self, registry: &str, refused: bool) {
        let mut hosts = self
            .inner
            .tag_delete_refused
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if refused {
            hosts.insert(registry.to_string());
        } else {
            hosts.remove(registry);
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
