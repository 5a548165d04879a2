//! `hibernate` and `wake`: create the pod's CocoonHibernation, or set its desire, then
//! optionally wait for the result.

use super::cli::ChangeArgs;
use super::connect::Connection;
use super::error::PluginError;
use super::resources;
use super::terminal::say;
use super::view::CrView;
use super::wait::wait;
use super::wait_verdict::{Target, Want};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};

/// What the write did.
struct Written {
    cr: CrView,
    /// The desire was written (a create, or a changed desire).
    changed: bool,
    summary: String,
}

pub async fn run(conn: &Connection, want: Want, args: &ChangeArgs) -> Result<(), PluginError> {
    let written = request(conn, want, &args.pod, args.until).await?;
    say(&written.summary);
    if !args.wait {
        return Ok(());
    }
    let target = Target::new(want, &written.cr, written.changed);
    let cr = wait(
        &conn.client,
        &conn.namespace,
        &written.cr.name,
        &target,
        args.timeout,
    )
    .await?;
    say(&format!(
        "cocoonhibernation/{} is {}",
        cr.name,
        want.terminal_phase()
    ));
    Ok(())
}

async fn request(
    conn: &Connection,
    want: Want,
    pod: &str,
    until: Option<jiff::Timestamp>,
) -> Result<Written, PluginError> {
    let ns = &conn.namespace;
    let api = resources::crs(&conn.client, ns);
    // A create that loses a race with another one finds that CR on the second round.
    for _ in 0..2 {
        if let Some(cr) = find(&api, ns, pod).await? {
            return set_desire(&api, cr, want, until).await;
        }
        ensure_pod(conn, pod).await?;
        let object = resources::new_cr(ns, pod, want.desire())
            .map_err(|e| PluginError::Config(format!("cannot build the CocoonHibernation: {e}")))?;
        match api.create(&PostParams::default(), &object).await {
            Ok(created) => {
                let cr = resources::view(&created);
                return Ok(Written {
                    summary: format!(
                        "cocoonhibernation/{} created in namespace {ns}: desire {}",
                        cr.name,
                        want.desire()
                    ),
                    cr,
                    changed: true,
                });
            }
            Err(kube::Error::Api(status)) if status.is_already_exists() => continue,
            Err(e) => {
                return Err(PluginError::api(
                    format!("creating CocoonHibernation {ns}/{pod}"),
                    e,
                ));
            }
        }
    }
    Err(PluginError::Refused(format!(
        "CocoonHibernation {ns}/{pod} keeps appearing and disappearing; try again"
    )))
}

/// The CR acting on `pod`: the one named after it, else (one created without the
/// webhook) the oldest whose podRef names it, which is the one the server acts on.
async fn find(
    api: &Api<DynamicObject>,
    ns: &str,
    pod: &str,
) -> Result<Option<CrView>, PluginError> {
    let action = || format!("reading CocoonHibernations in namespace {ns}");
    if let Some(object) = api
        .get_opt(pod)
        .await
        .map_err(|e| PluginError::api(action(), e))?
    {
        return Ok(Some(resources::view(&object)));
    }
    let list = match api.list(&ListParams::default()).await {
        Ok(list) => list,
        // May read its CR by name but not list: then the create says what it finds.
        Err(kube::Error::Api(status)) if status.code == 403 => return Ok(None),
        Err(e) => return Err(PluginError::api(action(), e)),
    };
    let mut same_pod: Vec<CrView> = list
        .items
        .iter()
        .map(resources::view)
        .filter(|cr| cr.pod == pod)
        .collect();
    same_pod.sort_by(|a, b| a.created.cmp(&b.created).then(a.name.cmp(&b.name)));
    Ok(same_pod.into_iter().next())
}

async fn set_desire(
    api: &Api<DynamicObject>,
    cr: CrView,
    want: Want,
    until: Option<jiff::Timestamp>,
) -> Result<Written, PluginError> {
    if cr.deleting {
        return Err(PluginError::Refused(format!(
            "CocoonHibernation {} is being deleted; try again once its cleanup is over",
            cr.key()
        )));
    }
    if cr.desire == want.desire() && until.is_none() {
        return Ok(Written {
            summary: format!(
                "cocoonhibernation/{} unchanged: desire is already {}",
                cr.name,
                want.desire()
            ),
            cr,
            changed: false,
        });
    }
    let mut patch = serde_json::json!({ "spec": { "desire": want.desire() } });
    if let Some(until) = until {
        // K5: a schedule leaves this desire alone until then.
        let key = cocoon_api::schedule::OVERRIDE_UNTIL;
        patch["metadata"] = serde_json::json!({ "annotations": { key: until.to_string() } });
    }
    let patched = api
        .patch(&cr.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| PluginError::api(format!("setting the desire of {}", cr.key()), e))?;
    let updated = resources::view(&patched);
    Ok(Written {
        summary: format!(
            "cocoonhibernation/{} desire set to {} (was {})",
            updated.name,
            want.desire(),
            if cr.desire.is_empty() {
                "unset"
            } else {
                &cr.desire
            }
        ),
        cr: updated,
        changed: true,
    })
}

/// A CR for a pod that does not exist would sit in Pending: say so now. A user who may
/// not read pods gets the CR anyway.
async fn ensure_pod(conn: &Connection, pod: &str) -> Result<(), PluginError> {
    let pods: Api<Pod> = Api::namespaced(conn.client.clone(), &conn.namespace);
    match pods.get_metadata_opt(pod).await {
        Ok(Some(_)) => Ok(()),
        Ok(None) => Err(PluginError::Refused(format!(
            "pod {}/{pod} not found (check the name, or pass -n NAMESPACE)",
            conn.namespace
        ))),
        Err(kube::Error::Api(status)) if status.code == 403 => Ok(()),
        Err(e) => Err(PluginError::api(
            format!("reading pod {}/{pod}", conn.namespace),
            e,
        )),
    }
}
