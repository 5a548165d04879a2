//! [`RegistryClient`]: the [`SnapshotStore`] on a real registry, and the catalog that
//! only the orphan audit (`kubectl cocoon orphans`) reads.

use super::config::RegistryConfig;
use super::error::{Op, RegistryError, Result, describe_chain};
use super::http::{Deadline, Http, valid_tag};
use super::names::{RegistryBase, SNAPSHOT_TAG};
use super::observer::{Observer, RegistryObserver};
use super::{DeleteOutcome, FAR, Fut, SnapshotStore};
use crate::USER_AGENT;
use std::sync::Arc;
use std::task::Poll;
use std::time::Duration;
use tokio::time::Instant;
use tracing::debug;

#[derive(Clone, Debug)]
pub struct RegistryClient {
    pub(super) base: RegistryBase,
    pub(super) http: Http,
    timeout: Duration,
}

impl RegistryClient {
    /// A client that reports to no one (the plugin's).
    pub fn new(config: RegistryConfig) -> Result<Self> {
        Self::build(config, Observer::default())
    }

    /// A client that reports every call to `observer` (the operator's metrics).
    pub fn observed(config: RegistryConfig, observer: Arc<dyn RegistryObserver>) -> Result<Self> {
        Self::build(config, Observer::new(observer))
    }

    fn build(config: RegistryConfig, observer: Observer) -> Result<Self> {
        let base = RegistryBase::parse(&config.base)?;
        let invalid = |message: String| RegistryError::InvalidConfig(message);
        if config.timeout.is_zero() {
            return Err(invalid("the registry timeout must be above zero".into()));
        }
        // reqwest, built without a provider, panics when none is installed.
        if rustls::crypto::CryptoProvider::get_default().is_none() {
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let mut roots = Vec::new();
        for (index, pem) in config.extra_ca_pems.iter().enumerate() {
            let invalid = |why| invalid(format!("extra CA certificate #{index} {why}"));
            let certs = reqwest::Certificate::from_pem_bundle(pem);
            let certs =
                certs.map_err(|e| invalid(format!("is not PEM: {}", describe_chain(&e))))?;
            if certs.is_empty() {
                return Err(invalid("holds no PEM CERTIFICATE block".into()));
            }
            roots.extend(certs);
        }
        let scheme = if config.plain_http { "http" } else { "https" };
        // No timeouts of reqwest's own: every operation runs under one deadline (`within`).
        let client = reqwest::Client::builder()
            .tls_certs_merge(roots)
            // Never let a redirect or a token realm downgrade an https registry.
            .https_only(!config.plain_http)
            .user_agent(USER_AGENT)
            .build();
        let client = client.map_err(|e| invalid(format!("HTTP client: {}", describe_chain(&e))))?;
        let http = Http {
            client,
            auth: config.auth,
            observer,
            root: format!("{scheme}://{}/v2/", base.registry),
        };
        Ok(Self {
            base,
            http,
            timeout: config.timeout,
        })
    }

    /// Where a VM's snapshot lives, as users write it: `host[:port]/<prefix>/<vm>:hibernate`.
    pub fn snapshot_location(&self, vm: &str) -> Result<String> {
        Ok(self.base.snapshot(vm)?.to_string())
    }

    /// The VMs whose repository `<base>/<vm>` the catalog lists, sorted, each once (the
    /// tag is not checked). Every page is read once, all within the timeout, on one token.
    pub async fn catalog_vms(&self) -> Result<Vec<String>> {
        let listing = self.within("catalog", Instant::now() + FAR, |deadline| async move {
            let mut session = self.http.session("registry:catalog:*".into(), deadline);
            session.list("_catalog", "catalog").await
        });
        let message = "this registry does not offer its catalog (GET /v2/_catalog); \
                       the orphan audit needs it";
        let repositories = listing
            .await?
            .ok_or_else(|| RegistryError::from_status("catalog", 404, message))?;
        let vms = repositories.iter().filter_map(|r| self.base.vm_of(r));
        Ok(vms.map(str::to_string).collect())
    }

    /// Runs one operation within min(now + timeout, `not_after`) (C2, S1, S7): a deadline
    /// already past sends nothing, every request checks it before it is sent (`Session`),
    /// and the deadline is looked at before each poll of `call`, so a process resumed past
    /// it drops the operation instead of carrying on.
    pub(super) async fn within<T, F>(
        &self,
        operation: Op,
        not_after: Instant,
        call: impl FnOnce(Deadline) -> F,
    ) -> Result<T>
    where
        F: Future<Output = Result<T>>,
    {
        let now = Instant::now();
        // A timeout too large for an Instant means no bound of its own.
        let at = now
            .checked_add(self.timeout)
            .unwrap_or(now + FAR)
            .min(not_after);
        let budget = at.saturating_duration_since(now);
        let deadline = Deadline {
            operation,
            at,
            budget,
        };
        if budget.is_zero() {
            return Err(deadline.expired());
        }
        let mut call = std::pin::pin!(call(deadline));
        let mut timer = std::pin::pin!(tokio::time::sleep_until(at));
        // The deadline first: tokio's `timeout_at` polls the inner future first.
        let result = std::future::poll_fn(|cx| {
            if deadline.check().is_err() || timer.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(deadline.expired()));
            }
            call.as_mut().poll(cx)
        })
        .await;
        if let Err(RegistryError::Timeout { .. }) = result {
            self.http.observer.call(operation, "timeout");
        }
        result
    }

    /// HEAD `<vm>:hibernate` (H3, H4).
    async fn probe(&self, vm: &str, deadline: Deadline) -> Result<Option<String>> {
        let snapshot = self.base.snapshot(vm)?;
        let repository = snapshot.repository();
        let scope = format!("repository:{repository}:pull");
        let path = format!("{repository}/manifests/{SNAPSHOT_TAG}");
        let mut session = self.http.session(scope, deadline);
        let result = session.head_digest(&path, "probe").await;
        debug!(%snapshot, ?result, "registry probe");
        result
    }

    /// S7: deletes manifest `digest` if `<vm>:hibernate` still names it and no other tag
    /// shares it (S5, G1). Never a DELETE by tag: one that lands late would remove whatever
    /// the tag names by then. Left open (Distribution has no conditional DELETE): a tag
    /// put on the digest after the listing goes with it.
    async fn delete(&self, vm: &str, digest: &str, deadline: Deadline) -> Result<DeleteOutcome> {
        let snapshot = self.base.snapshot(vm)?;
        let repository = snapshot.repository();
        let manifest = |reference: &str| format!("{repository}/manifests/{reference}");
        let tagged = manifest(SNAPSHOT_TAG);
        let scope = format!("repository:{repository}:pull,delete");
        let mut s = self.http.session(scope, deadline);
        // The tag must still name the manifest the caller confirmed: another one is a
        // newer snapshot.
        match s.head_digest(&tagged, "resolve").await? {
            None => return Ok(DeleteOutcome::Absent),
            Some(found) if found != digest => return Ok(DeleteOutcome::Moved { found }),
            Some(_) => {}
        }
        let tags = format!("{repository}/tags/list");
        let mut others = s.list(&tags, "list_tags").await?.unwrap_or_default();
        if !others.remove(SNAPSHOT_TAG) {
            return Ok(DeleteOutcome::Absent);
        }
        if let Some(bad) = others.iter().find(|t| !valid_tag(t)) {
            let message = format!("the tag list holds a malformed tag {bad:?}");
            return Err(RegistryError::protocol("list_tags", message));
        }
        if !others.is_empty() {
            let mut other_tags = Vec::new();
            // Any lookup error aborts: the digest is not proven unshared without all.
            for tag in others {
                if s.head_digest(&manifest(&tag), "resolve").await?.as_deref() == Some(digest) {
                    other_tags.push(tag);
                }
            }
            if !other_tags.is_empty() {
                self.http.observer.tag_kept();
                return Ok(DeleteOutcome::KeptSharedDigest { other_tags });
            }
            match s.head_digest(&tagged, "recheck").await? {
                None => return Ok(DeleteOutcome::Absent),
                Some(found) if found != digest => return Ok(DeleteOutcome::Moved { found }),
                Some(_) => {}
            }
        }
        let reference = format!("{}/{repository}@{digest}", snapshot.registry());
        if s.delete(&manifest(digest), &reference, "delete_digest")
            .await?
        {
            return Ok(DeleteOutcome::Deleted);
        }
        // S5: a 404 ends the debt only once the tag agrees that the snapshot is gone.
        match s.head_digest(&tagged, "confirm").await? {
            None => Ok(DeleteOutcome::Absent),
            Some(found) if found != digest => Ok(DeleteOutcome::Moved { found }),
            Some(_) => {
                let message = format!(
                    "the registry answered 404 to DELETE {reference}, \
                     yet {snapshot} still names that manifest"
                );
                Err(RegistryError::protocol("delete_digest", message))
            }
        }
    }
}

impl SnapshotStore for RegistryClient {
    fn snapshot_digest<'a>(&'a self, vm: &'a str) -> Fut<'a, Option<String>> {
        let probe = |deadline| self.probe(vm, deadline);
        Box::pin(self.within("probe", Instant::now() + FAR, probe))
    }

    fn delete_snapshot_before<'a>(
        &'a self,
        vm: &'a str,
        digest: &'a str,
        at: Instant,
    ) -> Fut<'a, DeleteOutcome> {
        Box::pin(self.within("delete", at, move |deadline| async move {
            let result = self.delete(vm, digest, deadline).await;
            debug!(vm, digest, ?result, "registry delete");
            result
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RegistryAuth;

    /// The controller spawns these calls on a multi-threaded runtime (C2).
    #[allow(dead_code)]
    fn calls_are_send_and_client_is_shareable(client: RegistryClient) {
        fn send<T: Send>(_: &T) {}
        fn shareable<T: Send + Sync + Clone + 'static>() {}
        shareable::<RegistryClient>();
        send(&client.snapshot_exists("vm"));
        send(&client.delete_snapshot("vm", "sha256:0"));
        send(&client.delete_snapshot_before("vm", "sha256:0", Instant::now()));
        send(&client.snapshot_digest("vm"));
        fn error<T: std::error::Error + Send + Sync + 'static>() {}
        error::<RegistryError>();
    }

    /// S1/S7: once its deadline has come, an operation is not polled again, though tokio's
    /// timer fires with it (`timeout_at` polls the inner future first, and a process
    /// resumed after a pause would go on with it).
    #[tokio::test(flavor = "current_thread")]
    async fn s1_s7_an_operation_past_its_deadline_is_not_polled_again() {
        let config = RegistryConfig {
            base: "127.0.0.1:9".into(),
            plain_http: true,
            auth: RegistryAuth::Anonymous,
            extra_ca_pems: vec![],
            timeout: Duration::from_secs(60),
        };
        let client = RegistryClient::new(config).unwrap();
        let not_after = Instant::now() + Duration::from_millis(100);
        // The pause, between two polls of the operation: the runtime's only thread stops
        // until past the deadline.
        let pause = tokio::spawn(async move {
            let left = not_after.saturating_duration_since(Instant::now());
            std::thread::sleep(left + Duration::from_millis(50));
        });
        let polls = std::sync::atomic::AtomicUsize::new(0);
        let operation = |_| {
            std::future::poll_fn(|cx| {
                if polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst) > 0 {
                    return Poll::Ready(Ok(()));
                }
                cx.waker().wake_by_ref();
                Poll::Pending
            })
        };
        let result = client.within("delete", not_after, operation).await;
        assert!(
            matches!(result, Err(RegistryError::Timeout { .. })),
            "{result:?}"
        );
        assert_eq!(polls.load(std::sync::atomic::Ordering::SeqCst), 1);
        pause.await.unwrap();
    }

    #[test]
    fn client_debug_redacts_secrets() {
        let client = RegistryClient::new(RegistryConfig {
            base: "reg.example:5000/snap".into(),
            plain_http: false,
            auth: RegistryAuth::Basic("alice".into(), "hunter2".into()),
            extra_ca_pems: vec![],
            timeout: Duration::from_secs(3),
        })
        .unwrap();
        let printed = format!("{client:?}");
        assert!(printed.contains("reg.example:5000"), "{printed}");
        assert!(!printed.contains("hunter2"), "{printed}");
    }
}
