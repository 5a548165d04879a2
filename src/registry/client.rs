//! [`RegistryClient`]: the [`SnapshotStore`] on a real registry.

use super::config::RegistryConfig;
use super::error::{Op, RegistryError, Result, describe_chain, from_oci};
use super::http::{Http, valid_tag};
use super::names::{RegistryBase, SNAPSHOT_TAG};
use super::{DeleteOutcome, FAR, Fut, SnapshotStore};
use crate::metrics::Metrics;
use oci_client::client::{Certificate, CertificateEncoding, ClientConfig, ClientProtocol};
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject as _;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tracing::{debug, info, warn};

const USER_AGENT: &str = concat!("cocoon-hibernation/", env!("CARGO_PKG_VERSION"));

#[derive(Clone)]
pub struct RegistryClient {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub base: RegistryBase,
    oci: oci_client::Client,
    pub http: Http,
    pub timeout: Duration,
    /// Whether the registry deletes tags, once an answer showed it. Distribution refuses:
    /// deletes then go straight to the digest path, three calls when the snapshot tag is
    /// alone in its repository. Until it is known, one delete at a time asks, holding the
    /// lock, so concurrent first wakes do not each pay for a refused DELETE.
    tag_deletes: tokio::sync::Mutex<Option<bool>>,
}

impl std::fmt::Debug for RegistryClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Inner { base, http, .. } = &*self.inner;
        f.debug_struct("RegistryClient")
            .field("base", base)
            .field("root", &http.root)
            .field("auth", &http.auth)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

impl RegistryClient {
    pub fn new(config: RegistryConfig, metrics: Metrics) -> Result<Self> {
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
        let (protocol, scheme) = match config.plain_http {
            true => (ClientProtocol::Http, "http"),
            false => (ClientProtocol::Https, "https"),
        };
        let certificate = |der: &CertificateDer| Certificate {
            encoding: CertificateEncoding::Der,
            data: der.to_vec(),
        };
        let oci = oci_client::Client::try_from(ClientConfig {
            protocol,
            extra_root_certificates: ders.iter().map(certificate).collect(),
            read_timeout: Some(config.timeout),
            connect_timeout: Some(config.timeout),
            user_agent: USER_AGENT,
            ..ClientConfig::default()
        })
        .map_err(|e| invalid("cannot build the OCI client", &e))?;
        let roots = ders.iter().map(|der| reqwest::Certificate::from_der(der));
        let roots: Vec<_> = roots
            .collect::<reqwest::Result<_>>()
            .map_err(|e| invalid("unusable CA certificate", &e))?;
        let client = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.timeout)
            .tls_certs_merge(roots)
            // Never let a redirect or a token realm downgrade an https registry.
            .https_only(!config.plain_http)
            .user_agent(USER_AGENT)
            .build()
            .map_err(|e| invalid("cannot build the HTTP client", &e))?;
        let http = Http {
            client,
            auth: config.auth,
            metrics,
            root: format!("{scheme}://{}/v2/", base.registry),
        };
        let inner = Inner {
            base,
            oci,
            http,
            timeout: config.timeout,
            tag_deletes: Default::default(),
        };
        Ok(Self {
            inner: Arc::new(inner),
        })
    }

    /// Where a VM's snapshot lives, as users write it: `host[:port]/<prefix>/<vm>:hibernate`.
    pub fn snapshot_location(&self, vm: &str) -> Result<String> {
        Ok(self.inner.base.snapshot(vm)?.to_string())
    }

    /// Runs one operation within min(now + timeout, `not_after`) (C2, S1): no request
    /// starts after it, and one still running is dropped. A deadline already past sends
    /// nothing.
    async fn within<T>(
        &self,
        op: Op,
        not_after: Option<Instant>,
        call: impl AsyncFnOnce(Duration) -> Result<T>,
    ) -> Result<T> {
        let now = Instant::now();
        // A timeout too large for an Instant means no bound of its own.
        let own = now.checked_add(self.inner.timeout).unwrap_or(now + FAR);
        let at = not_after.map_or(own, |limit| own.min(limit));
        let after = at.saturating_duration_since(now);
        let timeout = || {
            Err(RegistryError::Timeout {
                operation: op,
                after,
            })
        };
        if after.is_zero() {
            return timeout();
        }
        let result = tokio::time::timeout_at(at, call(after)).await;
        result.unwrap_or_else(|_| {
            self.inner.http.metrics.registry_call(op, "timeout");
            timeout()
        })
    }

    /// HEAD `<vm>:hibernate` through oci-client, once more after a transport error.
    async fn probe(&self, vm: &str, after: Duration) -> Result<Option<String>> {
        let Inner {
            base, oci, http, ..
        } = &*self.inner;
        let reference = base.snapshot(vm)?;
        let head = async || match oci.fetch_manifest_digest(&reference, &http.auth).await {
            Ok(digest) => Ok(Some(digest)),
            Err(e) => from_oci(e, "probe", after).map_or(Ok(None), Err),
        };
        let result = match head().await {
            Err(RegistryError::Transport { .. }) => head().await,
            other => other,
        };
        let result = http.counted("probe", result, |d| {
            d.as_ref().map_or("absent", |_| "present")
        });
        debug!(%reference, ?result, "registry probe");
        result
    }

    async fn delete(&self, vm: &str, after: Duration) -> Result<DeleteOutcome> {
        let inner = &self.inner;
        let snapshot = inner.base.snapshot(vm)?;
        let repository = snapshot.repository();
        let manifest = |reference: &str| format!("{repository}/manifests/{reference}");
        let tagged = manifest(SNAPSHOT_TAG);
        let mut s = inner
            .http
            .session(format!("repository:{repository}:pull,delete"), after);
        let state = inner.tag_deletes.lock().await;
        let known = *state;
        // Only a delete that asks keeps the lock.
        let mut asking = known.is_none().then_some(state);
        if known != Some(false) {
            match s.delete(&tagged, &snapshot.to_string(), "delete").await {
                Ok(true) => {
                    asking.iter_mut().for_each(|state| **state = Some(true));
                    info!(repository, tag = SNAPSHOT_TAG, "deleted snapshot tag");
                    return Ok(DeleteOutcome::Deleted);
                }
                Ok(false) => return Ok(DeleteOutcome::Absent),
                Err(RegistryError::DeleteRefused { status, .. }) => {
                    debug!(
                        repository,
                        status, "tag delete refused; by digest from now on"
                    );
                    match asking.as_mut() {
                        Some(state) => **state = Some(false),
                        None => *inner.tag_deletes.lock().await = Some(false),
                    }
                }
                Err(e) => return Err(e),
            }
        }
        drop(asking);
        // The digest path (S5, G1). The HEAD comes first: the digest deleted is the
        // snapshot the caller decided about, and a push during the listing is another
        // manifest, which a DELETE by this digest leaves alone. Left open, as
        // Distribution has no conditional DELETE: a tag put on the digest after the
        // listing goes with it, and a byte-identical re-push cannot be told apart.
        let Some(digest) = s.head_digest(&tagged, "resolve").await? else {
            return Ok(DeleteOutcome::Absent);
        };
        let tags = s
            .list(&format!("{repository}/tags/list"), "tags", "list_tags")
            .await?;
        let tags = tags.unwrap_or_default();
        if !tags.iter().any(|t| t == SNAPSHOT_TAG) {
            info!(repository, %digest, "snapshot tag gone from the tag list; nothing deleted");
            return Ok(DeleteOutcome::Absent);
        }
        let others: Vec<String> = tags.into_iter().filter(|t| t != SNAPSHOT_TAG).collect();
        if let Some(bad) = others.iter().find(|t| !valid_tag(t)) {
            let message = format!("the tag list holds a malformed tag {bad:?}");
            return Err(RegistryError::protocol("list_tags", message));
        }
        if !others.is_empty() {
            let mut other_tags = Vec::new();
            // Any lookup error aborts: the digest is not proven unshared without all.
            for tag in others {
                if s.head_digest(&manifest(&tag), "resolve").await?.as_ref() == Some(&digest) {
                    other_tags.push(tag);
                }
            }
            if !other_tags.is_empty() {
                warn!(repository, %digest, ?other_tags,
                    "not deleting the snapshot: other tags share its manifest");
                inner.http.metrics.snapshot_tags_kept.inc();
                return Ok(DeleteOutcome::KeptSharedDigest { other_tags });
            }
            match s.head_digest(&tagged, "recheck").await? {
                None => return Ok(DeleteOutcome::Absent),
                Some(found) if found != digest => {
                    warn!(repository, checked = %digest, %found, "snapshot moved; not deleting");
                    return Err(RegistryError::SnapshotMoved {
                        reference: snapshot.to_string(),
                        checked: digest,
                        found,
                    });
                }
                Some(_) => {}
            }
        }
        let reference = format!("{}/{repository}@{digest}", snapshot.registry());
        match s
            .delete(&manifest(&digest), &reference, "delete_digest")
            .await
        {
            Ok(true) => {
                info!(repository, %digest, "deleted snapshot manifest by digest");
                Ok(DeleteOutcome::DeletedByDigest)
            }
            Ok(false) => Ok(DeleteOutcome::Absent),
            Err(e) => {
                // Deletes are off altogether, which says nothing about tags: once
                // allowed again, a tag delete is tried first.
                if matches!(e, RegistryError::DeleteRefused { .. }) {
                    *inner.tag_deletes.lock().await = None;
                }
                Err(e)
            }
        }
    }
}

impl SnapshotStore for RegistryClient {
    fn snapshot_digest<'a>(&'a self, vm: &'a str) -> Fut<'a, Option<String>> {
        Box::pin(self.within("probe", None, async |after| self.probe(vm, after).await))
    }

    fn delete_snapshot_before<'a>(&'a self, vm: &'a str, at: Instant) -> Fut<'a, DeleteOutcome> {
        let delete = async |after| self.delete(vm, after).await;
        Box::pin(self.within("delete", Some(at), delete))
    }
}

/// The certificates of each PEM; one without any is refused.
fn parse_ca_pems(pems: &[Vec<u8>]) -> Result<Vec<CertificateDer<'static>>> {
    let mut ders = Vec::new();
    for (index, pem) in pems.iter().enumerate() {
        let invalid =
            |why| RegistryError::InvalidConfig(format!("extra CA certificate #{index} {why}"));
        let certs: Vec<_> = CertificateDer::pem_slice_iter(pem)
            .collect::<Result<_, _>>()
            .map_err(|e| invalid(format!("is not valid PEM: {e}")))?;
        if certs.is_empty() {
            return Err(invalid("holds no PEM CERTIFICATE block".into()));
        }
        ders.extend(certs);
    }
    Ok(ders)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::RegistryAuth;

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
                auth: RegistryAuth::Basic("alice".into(), "hunter2".into()),
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
