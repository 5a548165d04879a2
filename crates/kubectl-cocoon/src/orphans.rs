//! `orphans`: list the `:hibernate` tags no CocoonHibernation holds; with `--delete`
//! (and a confirmation), delete them through the server's own registry client, only
//! under the install's own registry base (S10).

use super::audit::{self, Orphan, Recheck, Tag};
use super::claims::gather;
use super::cli::OrphansArgs;
use super::confirm::confirm;
use super::connect::Connection;
use super::error::PluginError;
use super::install;
use super::table::render;
use super::terminal::{say, table_layout, warn};
use cocoon_api::cluster::cluster_id;
use cocoon_oci::{DeleteOutcome, RegistryClient, SnapshotStore};
use cocoon_oci::{InstallId, RegistryArgs};
use futures::{StreamExt as _, TryStreamExt as _};

/// Tag lookups in flight at once.
const PROBES: usize = 8;

pub async fn run(conn: &Connection, args: &OrphansArgs) -> Result<(), PluginError> {
    // S10: the base is the install's; the flag only checks it.
    let install = install::find(&conn.client, args.install.as_deref()).await?;
    install::check_base(args.registry.registry_base.as_deref(), &install)?;
    let registry = client(&args.registry, &install.base)?;
    let base = install.base.clone();
    let ours = InstallId {
        cluster: cluster_id(&conn.client)
            .await
            .map_err(|e| PluginError::api("reading namespace kube-system (the cluster's id)", e))?,
        release: install.release.clone(),
    };
    let refused = not_ours(&registry, &ours, &base).await?;
    if let Some(why) = &refused {
        warn(&format!("warning: {why}"));
    }
    let tags = snapshot_tags(&registry).await?;
    let claims = gather(&conn.client).await?;
    let found = audit::orphans(tags.clone(), &claims);
    if found.is_empty() {
        say(&format!(
            "No orphaned snapshot tags: every one of the {} `:hibernate` tag(s) under {base} is held by a CocoonHibernation.",
            tags.len()
        ));
        return Ok(());
    }
    say(render(
        &["VM", "SNAPSHOT", "DIGEST", "NOTE"],
        &rows(&found),
        table_layout(),
    )
    .trim_end());
    say(&format!(
        "{} orphaned snapshot tag(s) of {} under {base}.",
        found.len(),
        tags.len()
    ));
    if !args.delete {
        say("Nothing deleted. To delete them: kubectl cocoon orphans --delete");
        return Ok(());
    }
    if let Some(why) = refused {
        return Err(PluginError::Refused(format!("{why}. Nothing deleted.")));
    }
    let deletable: Vec<&Orphan> = found.iter().filter(|o| o.deletable()).collect();
    if deletable.is_empty() {
        say("Nothing to delete: a pod still names the VM of each of them.");
        return Ok(());
    }
    confirm(deletable.len(), args.yes)?;
    // A confirmation may take a while: the markers are read again.
    if let Some(why) = not_ours(&registry, &ours, &base).await? {
        return Err(PluginError::Refused(format!("{why}. Nothing deleted.")));
    }
    let mut failed = 0usize;
    for orphan in deletable {
        if let Err(e) = delete_one(conn, &registry, orphan).await {
            warn(&format!("error: {e}"));
            failed += 1;
        }
    }
    if failed > 0 {
        return Err(PluginError::Refused(format!(
            "{failed} snapshot tag(s) could not be deleted (see above)"
        )));
    }
    Ok(())
}

/// S10: why this install may not delete on `base`, if it may not (its markers).
async fn not_ours(
    registry: &RegistryClient,
    ours: &InstallId,
    base: &str,
) -> Result<Option<String>, PluginError> {
    let markers = registry
        .owner_markers(ours)
        .await
        .map_err(|e| PluginError::registry("reading the registry base's owner markers", e))?;
    Ok(install::refusal(ours, &markers, base))
}

/// The registry client on the install's `base`, with the server's other registry flags
/// and variables.
fn client(args: &RegistryArgs, base: &str) -> Result<RegistryClient, PluginError> {
    let mut args = args.clone();
    args.registry_base = Some(base.to_string());
    let sources = [
        args.registry_username.is_some(),
        args.registry_docker_config.is_some(),
        args.registry_token_file.is_some(),
    ];
    if sources.iter().filter(|s| **s).count() > 1 {
        return Err(PluginError::Config(
            "choose one of --registry-username, --registry-docker-config, --registry-token-file"
                .into(),
        ));
    }
    let config = args
        .config()
        .map_err(|e| PluginError::Config(e.to_string()))?;
    RegistryClient::new(config).map_err(|e| PluginError::Config(e.to_string()))
}

/// Every `<vm>:hibernate` under the base: the catalog, then one HEAD per repository.
async fn snapshot_tags(registry: &RegistryClient) -> Result<Vec<Tag>, PluginError> {
    let vms = registry
        .catalog_vms()
        .await
        .map_err(|e| PluginError::registry("reading the registry catalog", e))?;
    let found: Vec<Option<Tag>> = futures::stream::iter(vms)
        .map(|vm| async move {
            let digest = registry
                .snapshot_digest(&vm)
                .await
                .map_err(|e| PluginError::registry(format!("looking up {vm}:hibernate"), e))?;
            let Some(digest) = digest else {
                return Ok(None);
            };
            let location = registry
                .snapshot_location(&vm)
                .map_err(|e| PluginError::registry(format!("naming {vm}:hibernate"), e))?;
            Ok::<_, PluginError>(Some(Tag {
                vm,
                location,
                digest,
            }))
        })
        .buffered(PROBES)
        .try_collect()
        .await?;
    Ok(found.into_iter().flatten().collect())
}

fn rows(found: &[Orphan]) -> Vec<Vec<String>> {
    found
        .iter()
        .map(|o| {
            let note = if o.pods.is_empty() {
                String::new()
            } else {
                format!(
                    "kept: pod {} names this VM (no CocoonHibernation)",
                    o.pods.join(", ")
                )
            };
            vec![
                o.tag.vm.clone(),
                o.tag.location.clone(),
                o.tag.digest.clone(),
                note,
            ]
        })
        .collect()
}

/// A fresh look at the cluster and the tag, then the delete if it is still an orphan.
async fn delete_one(
    conn: &Connection,
    registry: &RegistryClient,
    orphan: &Orphan,
) -> Result<(), PluginError> {
    let vm = &orphan.tag.vm;
    let location = &orphan.tag.location;
    let claims = gather(&conn.client).await?;
    let digest_now = registry
        .snapshot_digest(vm)
        .await
        .map_err(|e| PluginError::registry(format!("re-checking {location}"), e))?;
    match audit::recheck(orphan, &claims, digest_now.as_deref()) {
        Recheck::Delete => {}
        Recheck::Held(crs) => {
            say(&format!(
                "kept {location}: CocoonHibernation {} holds it now",
                crs.join(", ")
            ));
            return Ok(());
        }
        Recheck::Named(pods) => {
            say(&format!(
                "kept {location}: pod {} names its VM now",
                pods.join(", ")
            ));
            return Ok(());
        }
        Recheck::Gone => {
            say(&format!("{location} is gone already"));
            return Ok(());
        }
        Recheck::Moved { now } => {
            say(&format!(
                "kept {location}: it was pushed again meanwhile (now {now})"
            ));
            return Ok(());
        }
    }
    // S7: the digest audited, never the tag: a push after the audit is another manifest.
    let outcome = registry
        .delete_snapshot(vm, &orphan.tag.digest)
        .await
        .map_err(|e| PluginError::registry(format!("deleting {location}"), e))?;
    say(&match outcome {
        DeleteOutcome::Deleted => format!("deleted {location} ({})", orphan.tag.digest),
        DeleteOutcome::Absent => format!("{location} is gone already"),
        DeleteOutcome::KeptSharedDigest { other_tags } => format!(
            "kept {location}: tag(s) {} share its manifest, and a delete by digest would remove them too",
            other_tags.join(", ")
        ),
        DeleteOutcome::Moved { found } => {
            format!("kept {location}: it was pushed again meanwhile (now {found})")
        }
    });
    Ok(())
}
