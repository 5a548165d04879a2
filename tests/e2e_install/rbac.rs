//! P5, for people: the chart's ClusterRoles, aggregated by kube-controller-manager into
//! the built-in `edit` and `view`, are all a namespace editor or viewer needs for the
//! plugin's namespaced commands, and what they may not do is refused in one clear line.
//! The real plugin binary runs with a kubeconfig that impersonates each user (`as:`).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use cocoon_hibernation::api::Desire;
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::shell::{Ran, run};
use crate::world::{Result, World, wait_for};

/// The plugin binary: another package's, which the test kit builds on first use.
fn plugin_bin() -> &'static str {
    testkit::plugin_bin()
}
const EDITOR: &str = "cocoon-editor";
const VIEWER: &str = "cocoon-viewer";
const POD: &str = "rbac-0";
/// A plugin run that takes longer is stuck.
const RUN_LIMIT: Duration = Duration::from_secs(150);

/// A RoleBinding in the suite's namespace from `user` to the built-in ClusterRole `role`.
async fn bind(world: &World, user: &str, role: &str) -> Result<()> {
    let rb: RoleBinding = serde_json::from_value(json!({
        "metadata": { "name": format!("{user}-{role}") },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role },
        "subjects": [{ "apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user }],
    }))?;
    Api::<RoleBinding>::namespaced(world.client.clone(), &world.vm_ns)
        .create(&PostParams::default(), &rb)
        .await?;
    Ok(())
}

/// Whether the built-in `role` has been given `verb` on CocoonHibernations by aggregation.
async fn aggregated(world: &World, role: &str, verb: &str) -> Result<bool> {
    let cr = Api::<ClusterRole>::all(world.client.clone())
        .get(role)
        .await?;
    Ok(cr.rules.unwrap_or_default().iter().any(|r| {
        r.resources
            .as_ref()
            .is_some_and(|rs| rs.iter().any(|x| x == "cocoonhibernations"))
            && r.verbs.iter().any(|v| v == verb)
    }))
}

/// The admin kubeconfig with every user impersonating `user` (kube-rs honours `as:`).
fn kubeconfig_as(dir: &Path, user: &str) -> Result<PathBuf> {
    let admin = std::env::var("KUBECONFIG")?;
    let mut config = kube::config::Kubeconfig::read_from(&admin)?;
    for auth in &mut config.auth_infos {
        if let Some(info) = auth.auth_info.as_mut() {
            info.impersonate = Some(user.to_owned());
        }
    }
    let path = dir.join(format!("{user}.kubeconfig"));
    // JSON is YAML: kube and kubectl read it as a kubeconfig.
    std::fs::write(&path, serde_json::to_vec(&config)?)?;
    Ok(path)
}

async fn plugin(world: &World, kubeconfig: &Path, args: &[&str]) -> Result<Ran> {
    let bin = plugin_bin();
    if !Path::new(bin).exists() {
        return Err(format!("the plugin binary is missing at {bin}").into());
    }
    let mut command = Command::new(bin);
    command
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["-n", &world.vm_ns])
        .args(args);
    // A user's registry settings would leak into `orphans`.
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("COCOON_REGISTRY") {
            command.env_remove(k);
        }
    }
    let ran = run(command, RUN_LIMIT).await?;
    println!(
        "  kubectl cocoon {} -> exit {}{}",
        args.join(" "),
        ran.code,
        ran.stderr
            .lines()
            .next()
            .map(|l| format!(": {l}"))
            .unwrap_or_default()
    );
    Ok(ran)
}

fn expect_ok(ran: &Ran, what: &str, stdout_has: &str) -> Result<()> {
    if ran.code != 0 || !ran.stdout.contains(stdout_has) {
        return Err(format!("{what}: want exit 0 and {stdout_has:?} in stdout, got {ran}").into());
    }
    Ok(())
}

/// Refused with exit 1 and one line that says forbidden, names `what_failed` and points
/// at RBAC: no stack of errors.
fn expect_refused(ran: &Ran, what: &str, what_failed: &str) -> Result<()> {
    let lines: Vec<&str> = ran
        .stderr
        .lines()
        .filter(|l| !l.trim().is_empty())
        .collect();
    let clear = matches!(lines.as_slice(), [line]
        if line.starts_with("error: ")
            && line.contains(what_failed)
            && line.contains("forbidden")
            && line.contains("RBAC"));
    if ran.code != 1 || !clear {
        return Err(format!(
            "{what}: want exit 1 and one line `error: {what_failed}: ... forbidden ... RBAC`, got {ran}"
        )
        .into());
    }
    Ok(())
}

pub async fn p5_users(world: &Arc<World>) -> Result<()> {
    world.vm_pod(POD).await?;
    bind(world, EDITOR, "edit").await?;
    bind(world, VIEWER, "view").await?;
    wait_for(
        "kube-controller-manager aggregates the chart's roles into edit and view",
        Duration::from_secs(60),
        || async {
            Ok(aggregated(world, "edit", "create").await?
                && aggregated(world, "view", "watch").await?)
        },
    )
    .await?;
    let dir = tempfile::tempdir()?;
    let editor = kubeconfig_as(dir.path(), EDITOR)?;
    let viewer = kubeconfig_as(dir.path(), VIEWER)?;

    // The editor: hibernate and wake with --wait (a watch), status; orphans is refused.
    let ran = plugin(
        world,
        &editor,
        &["hibernate", POD, "--wait", "--timeout", "2m"],
    )
    .await?;
    expect_ok(&ran, "editor: hibernate --wait", "is Hibernated")?;
    let ran = plugin(world, &editor, &["wake", POD, "--wait", "--timeout", "2m"]).await?;
    expect_ok(&ran, "editor: wake --wait", "is Active")?;
    let ran = plugin(world, &editor, &["status"]).await?;
    expect_ok(&ran, "editor: status", POD)?;
    let ran = plugin(world, &editor, &["orphans"]).await?;
    expect_refused(&ran, "editor: orphans", "in every namespace")?;

    // The viewer: status and schedule; hibernate and wake are refused and change nothing.
    let ran = plugin(world, &viewer, &["status"]).await?;
    expect_ok(&ran, "viewer: status", POD)?;
    let ran = plugin(world, &viewer, &["status", POD]).await?;
    expect_ok(&ran, "viewer: status POD", "Active")?;
    let ran = plugin(world, &viewer, &["schedule"]).await?;
    if ran.code != 0 {
        return Err(format!("viewer: schedule: want exit 0, got {ran}").into());
    }
    let ran = plugin(world, &viewer, &["hibernate", POD]).await?;
    expect_refused(&ran, "viewer: hibernate", POD)?;
    let desire = world.crs().get(POD).await?.spec.desire;
    if desire != Desire::Wake {
        return Err(
            format!("{POD}: desire {desire:?} after the viewer's refused hibernate").into(),
        );
    }
    Ok(())
}
