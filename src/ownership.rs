//! S10: this install's owner marker under its registry base, written at start-up (by
//! every replica: the write is idempotent) and checked again now and then. Another
//! install's marker there means the base is shared: logged at error level and reported
//! by the gauge `registry_base_shared`. The orphan audit refuses such a base.

use crate::api::cluster::cluster_id;
use crate::metrics::Metrics;
use crate::registry::{InstallId, Ownership, RegistryClient, describe_owners, ownership};
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// How often a marked base is looked at again, for an install that came later.
const RECHECK: Duration = Duration::from_secs(600);
/// The wait after a failed check (registry or apiserver unreachable).
const RETRY: Duration = Duration::from_secs(30);

/// Keeps the marker until `stop`.
pub async fn keep(
    client: kube::Client,
    registry: RegistryClient,
    release: String,
    metrics: Metrics,
    stop: CancellationToken,
) {
    loop {
        let wait = match check(&client, &registry, &release).await {
            Ok((ours, verdict)) => {
                report(&ours, &verdict, &metrics);
                RECHECK
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot check the registry base's owner marker; retrying");
                RETRY
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// Marks the base for this install if it is not, then reads every marker again.
async fn check(
    client: &kube::Client,
    registry: &RegistryClient,
    release: &str,
) -> Result<(InstallId, Ownership), String> {
    let cluster = cluster_id(client)
        .await
        .map_err(|e| format!("reading namespace kube-system: {e}"))?;
    let ours = InstallId {
        cluster,
        release: release.to_string(),
    };
    let markers = registry
        .owner_markers(&ours)
        .await
        .map_err(|e| e.to_string())?;
    if markers.iter().any(|m| m.tag == ours.tag()) {
        return Ok((ours.clone(), ownership(&ours, &markers)));
    }
    registry
        .mark_owner(&ours)
        .await
        .map_err(|e| e.to_string())?;
    tracing::info!(install = %ours, tag = %ours.tag(), "marked the registry base as this install's");
    // Read again: another install marking at the same time shows up now.
    let markers = registry
        .owner_markers(&ours)
        .await
        .map_err(|e| e.to_string())?;
    Ok((ours.clone(), ownership(&ours, &markers)))
}

fn report(ours: &InstallId, verdict: &Ownership, metrics: &Metrics) {
    match verdict {
        Ownership::Shared { others } => {
            metrics.registry_base_shared.set(1);
            tracing::error!(
                install = %ours,
                others = %describe_owners(others),
                "the registry base is shared with another install: give each install a \
                 base of its own (the orphan audit refuses to delete on this one)"
            );
        }
        Ownership::Ours | Ownership::Unmarked => {
            metrics.registry_base_shared.set(0);
        }
    }
}
