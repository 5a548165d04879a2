//! The Helm chart: rendering, and the product's identity under the chart's RBAC.

use super::crs::eventually;
use crate::cluster::Cluster;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// The chart this repository ships.
pub fn chart_dir() -> PathBuf {
    crate::repo_root().join("charts/cocoon-hibernation")
}

/// helm, found the way `cargo xtask chart-check` finds it: `hack/install-tools.sh` builds it
/// on first use (Go needed) and prints its bin dir. Panics, never skips, without it.
pub fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let script = crate::repo_root().join("hack/install-tools.sh");
        let out = Command::new("bash")
            .arg(&script)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {}: {e}", script.display()));
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{} failed ({}); it builds helm with Go >= 1.24 on a cold cache\n{}",
            script.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let helm = Path::new(stdout.lines().last().unwrap_or_default().trim()).join("helm");
        assert!(
            helm.is_file(),
            "{} printed no bin dir holding helm (got {})",
            script.display(),
            helm.display()
        );
        helm
    })
}

/// `helm template` of the chart as release `release` in `namespace`, with only
/// `registry.base` set before `args`: the chart's defaults otherwise. Returns helm's output,
/// success or not.
pub fn helm_template_output(
    cluster: &Cluster,
    release: &str,
    namespace: &str,
    args: &[&str],
) -> std::process::Output {
    // `v1.34.4` or `v1.34.4-dirty` -> `1.34.4`
    let kube_version = cluster.k8s_version.trim_start_matches('v');
    let kube_version = kube_version.split('-').next().unwrap_or(kube_version);
    Command::new(helm())
        .args(["template", release])
        .arg(chart_dir())
        .args(["--namespace", namespace, "--kube-version", kube_version])
        .args(["--set", "registry.base=e2e.invalid/snapshots"])
        .args(args)
        .output()
        .expect("run helm template")
}

/// The chart's values file naming the writers of the pods' VM annotations, which an
/// install must name (S3 is on by default): vk-cocoon by user name, the CocoonSet
/// operator by group.
pub fn chart_writers_values() -> PathBuf {
    chart_dir().join("tests/values/writers.yaml")
}

/// `helm template` of the chart as release `release` in `namespace`, as a user installs
/// it (`registry.base` and the S3 writers of [`chart_writers_values`] set), plus `args`
/// (e.g. `--set`, `--show-only`; `--set`/`--set-json` override the writers). Returns every
/// rendered document as JSON; panics on failure.
pub fn helm_template(
    cluster: &Cluster,
    release: &str,
    namespace: &str,
    args: &[&str],
) -> Vec<serde_json::Value> {
    use serde::Deserialize;
    let writers = chart_writers_values();
    let writers = writers.to_str().expect("chart path is UTF-8");
    let args = [&["-f", writers][..], args].concat();
    let out = helm_template_output(cluster, release, namespace, &args);
    assert!(
        out.status.success(),
        "helm template {release} {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("helm output is UTF-8");
    serde_norway::Deserializer::from_str(&text)
        .map(|doc| serde_json::Value::deserialize(doc).expect("helm output is YAML"))
        .filter(|doc| !doc.is_null())
        .collect()
}

/// The `matchConditions` of the chart's ValidatingWebhookConfiguration (V7), rendered once.
pub fn chart_match_conditions(cluster: &Cluster) -> serde_json::Value {
    static CONDITIONS: OnceLock<serde_json::Value> = OnceLock::new();
    CONDITIONS
        .get_or_init(|| {
            let docs = helm_template(
                cluster,
                "cocoon-hibernation",
                "cocoon-system",
                &[
                    "--set",
                    "tls.mode=cert-manager",
                    "--show-only",
                    "templates/webhook.yaml",
                ],
            );
            let vwc = docs
                .iter()
                .find(|d| d["kind"] == "ValidatingWebhookConfiguration")
                .expect("the chart renders a ValidatingWebhookConfiguration");
            let conditions = vwc["webhooks"][0]["matchConditions"].clone();
            assert!(
                conditions.as_array().is_some_and(|c| !c.is_empty()),
                "the chart's webhook has no matchConditions (V7): {vwc}"
            );
            conditions
        })
        .clone()
}

/// Server-side applies rendered documents (any kind the apiserver serves) as admin.
pub async fn apply_docs(client: &kube::Client, docs: &[serde_json::Value]) {
    use kube::core::{DynamicObject, GroupVersionKind, TypeMeta};
    use kube::discovery::Scope;
    for doc in docs {
        let types: TypeMeta = serde_json::from_value(doc.clone())
            .unwrap_or_else(|e| panic!("no apiVersion/kind in {doc}: {e}"));
        let gvk = GroupVersionKind::try_from(&types).expect("parse apiVersion");
        let (ar, caps) = kube::discovery::pinned_kind(client, &gvk)
            .await
            .unwrap_or_else(|e| panic!("discover {gvk:?}: {e}"));
        let name = doc["metadata"]["name"].as_str().expect("metadata.name");
        let api: Api<DynamicObject> = match caps.scope {
            Scope::Namespaced => {
                let ns = doc["metadata"]["namespace"]
                    .as_str()
                    .unwrap_or_else(|| panic!("{} {name} has no namespace", types.kind));
                Api::namespaced_with(client.clone(), ns, &ar)
            }
            Scope::Cluster => Api::all_with(client.clone(), &ar),
        };
        api.patch(
            name,
            &PatchParams::apply("cocoon-e2e").force(),
            &Patch::Apply(doc),
        )
        .await
        .unwrap_or_else(|e| panic!("apply {} {name}: {e}", types.kind));
    }
}

/// Waits until RBAC lets `user` in `groups` do `verb` on `resource` (`group/resource`
/// or `resource`, optionally one `name`) in `namespace` (None: cluster-wide). RBAC
/// objects reach the authorizer through its informers, a moment after they are written.
pub async fn wait_allowed(
    client: &kube::Client,
    user: &str,
    groups: &[&str],
    verb: &str,
    resource: &str,
    name: Option<&str>,
    namespace: Option<&str>,
) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let (group, resource) = resource.split_once('/').unwrap_or(("", resource));
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.to_owned()),
            groups: Some(groups.iter().map(|g| (*g).to_owned()).collect()),
            resource_attributes: Some(ResourceAttributes {
                group: Some(group.to_owned()),
                resource: Some(resource.to_owned()),
                verb: Some(verb.to_owned()),
                name: name.map(str::to_owned),
                namespace: namespace.map(str::to_owned),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let api: Api<SubjectAccessReview> = Api::all(client.clone());
    eventually(
        &format!("RBAC lets {user} {verb} {group}/{resource} in {namespace:?}"),
        Duration::from_secs(30),
        || async {
            let res = api.create(&PostParams::default(), &review).await.ok()?;
            res.status?.allowed.then_some(())
        },
    )
    .await;
}

/// The identity the product runs as in tests: the chart's ServiceAccount.
#[derive(Clone, Debug)]
pub struct ProductIdentity {
    /// Release name and namespace of the rendered RBAC, `cocoon-e2e-<chart hash>`.
    pub release: String,
    /// `system:serviceaccount:<namespace>:<name>`.
    pub username: String,
    pub groups: Vec<String>,
    /// A kubeconfig authenticating as `username` with a client certificate.
    pub kubeconfig: PathBuf,
}

/// `cocoon-e2e-<hash of the chart's templates and values>`: each chart version gets its
/// own release, so test processes (or worktrees) testing different charts against one
/// cluster never overwrite each other's RBAC.
fn e2e_release() -> String {
    use std::hash::{DefaultHasher, Hash, Hasher};
    let chart = chart_dir();
    let mut files: Vec<PathBuf> = std::fs::read_dir(chart.join("templates"))
        .expect("read chart templates")
        .map(|e| e.expect("dir entry").path())
        .collect();
    files.sort();
    files.push(chart.join("values.yaml"));
    files.push(chart.join("Chart.yaml"));
    let mut h = DefaultHasher::new(); // fixed keys: the same in every process
    for f in &files {
        f.file_name().hash(&mut h);
        std::fs::read(f)
            .unwrap_or_else(|e| panic!("read {}: {e}", f.display()))
            .hash(&mut h);
    }
    format!("cocoon-e2e-{:010x}", h.finish() & 0xff_ffff_ffff)
}

/// The chart's RBAC documents for the e2e release, `extra` values added.
fn chart_rbac_docs(cluster: &Cluster, release: &str, extra: &[&str]) -> Vec<serde_json::Value> {
    let mut args = vec![
        "--set",
        "tls.mode=cert-manager", // no key generation: only RBAC is shown
        "--show-only",
        "templates/rbac.yaml",
        "--show-only",
        "templates/serviceaccount.yaml",
    ];
    let full = format!("fullnameOverride={release}");
    args.extend(["--set", &full]);
    args.extend(extra);
    helm_template(cluster, release, release, &args)
}

/// Applies the chart's ServiceAccount, ClusterRole and ClusterRoleBinding (and the Lease
/// Role of its release namespace) once per process, waits until RBAC grants them, and
/// writes a kubeconfig for the ServiceAccount. Concurrent test processes apply the same
/// objects (server-side apply, idempotent) and each write the file atomically.
pub async fn product_identity(cluster: &Cluster) -> &'static ProductIdentity {
    static IDENTITY: tokio::sync::OnceCell<ProductIdentity> = tokio::sync::OnceCell::const_new();
    IDENTITY
        .get_or_init(|| async {
            let client = cluster.client().await;
            let release = e2e_release();
            let docs = chart_rbac_docs(cluster, &release, &[]);
            let sa = docs
                .iter()
                .find(|d| d["kind"] == "ServiceAccount")
                .expect("the chart renders a ServiceAccount");
            let sa_name = sa["metadata"]["name"].as_str().expect("SA name").to_owned();
            let sa_ns = sa["metadata"]["namespace"]
                .as_str()
                .expect("SA namespace")
                .to_owned();
            let namespace = serde_json::json!({
                "apiVersion": "v1", "kind": "Namespace", "metadata": { "name": sa_ns },
            });
            apply_docs(&client, &[namespace]).await;
            apply_docs(&client, &docs).await;
            let username = format!("system:serviceaccount:{sa_ns}:{sa_name}");
            let groups = vec![
                "system:serviceaccounts".to_owned(),
                format!("system:serviceaccounts:{sa_ns}"),
            ];
            let group_refs: Vec<&str> = groups.iter().map(String::as_str).collect();
            // The last rule of the ClusterRole and the binding are in effect.
            wait_allowed(
                &client,
                &username,
                &group_refs,
                "create",
                "events.k8s.io/events",
                None,
                None,
            )
            .await;
            let kubeconfig = cluster.state_dir.join(format!("{release}.kubeconfig"));
            let tmp = cluster
                .state_dir
                .join(format!("{release}.kubeconfig.{}", std::process::id()));
            std::fs::write(&tmp, cluster.kubeconfig_for(&username, &group_refs))
                .unwrap_or_else(|e| panic!("write {}: {e}", tmp.display()));
            std::fs::rename(&tmp, &kubeconfig)
                .unwrap_or_else(|e| panic!("rename to {}: {e}", kubeconfig.display()));
            ProductIdentity {
                release,
                username,
                groups,
                kubeconfig,
            }
        })
        .await
}

/// Binds the chart's Lease Role for `lease` in `namespace` to the product's
/// ServiceAccount: the chart puts it in the release namespace, tests elect in the test
/// namespace (`--lease-namespace`). Same rules, only the namespace differs.
pub async fn bind_lease_role(cluster: &Cluster, namespace: &str, lease: &str) {
    let identity = product_identity(cluster).await;
    let lease_value = format!("leaderElection.leaseName={lease}");
    let mut docs: Vec<serde_json::Value> =
        chart_rbac_docs(cluster, &identity.release, &["--set", &lease_value])
            .into_iter()
            .filter(|d| d["kind"] == "Role" || d["kind"] == "RoleBinding")
            .collect();
    assert_eq!(
        docs.len(),
        2,
        "the chart renders a Lease Role and RoleBinding with leader election on"
    );
    for d in &mut docs {
        d["metadata"]["namespace"] = namespace.into();
    }
    let client = cluster.client().await;
    apply_docs(&client, &docs).await;
    let groups: Vec<&str> = identity.groups.iter().map(String::as_str).collect();
    wait_allowed(
        &client,
        &identity.username,
        &groups,
        "get",
        "coordination.k8s.io/leases",
        Some(lease),
        Some(namespace),
    )
    .await;
}
