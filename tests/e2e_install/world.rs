//! The install suite's world: the real node cluster from `cargo xtask cluster-up --node`, the
//! image `make image` pushed, helm, and small helpers over them.

use std::collections::BTreeMap;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use testkit::vk_sim;

pub type Error = Box<dyn std::error::Error + Send + Sync>;
pub type Result<T> = std::result::Result<T, Error>;

pub const RELEASE: &str = "cocoon-hibernation";
pub const RELEASE_NS: &str = "cocoon-system";
/// The chart's defaults (`leaderElection.leaseDuration`), used to judge the fence.
pub const LEASE_DURATION: Duration = Duration::from_secs(15);

pub struct World {
    pub client: kube::Client,
    pub helm: PathBuf,
    /// The cluster's own kubectl (`COCOON_BIN_DIR`), for the documented commands.
    pub kubectl: PathBuf,
    pub chart: PathBuf,
    pub values: PathBuf,
    pub registry: String,
    pub containerd_sock: String,
    pub registry_log: PathBuf,
    pub virtual_node: String,
    pub vm_ns: String,
}

fn required(name: &str) -> Result<String> {
    std::env::var(name)
        .map_err(|_| format!("{name} is not set: run this suite with `make install-test`").into())
}

/// KEY=value lines of the cluster's env file.
fn env_file(path: &str) -> Result<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect())
}

impl World {
    pub async fn new() -> Result<Self> {
        let env = env_file(&required("COCOON_NODE_CLUSTER_ENV")?)?;
        let get = |k: &str| {
            env.get(k)
                .cloned()
                .ok_or_else(|| Error::from(format!("the cluster's env file has no {k}")))
        };
        if get("COCOON_NODE")? != "1" {
            return Err(
                "COCOON_NODE_CLUSTER_ENV is not a real-node cluster (cargo xtask cluster-up --node)"
                    .into(),
            );
        }
        let kubeconfig = get("KUBECONFIG")?;
        let image = required("COCOON_IMAGE_REF")?;
        let (repo_tag, digest) = image
            .split_once('@')
            .ok_or_else(|| format!("COCOON_IMAGE_REF {image} has no @sha256: digest"))?;
        let repository = match repo_tag.rsplit_once(':') {
            Some((repo, tag)) if !tag.contains('/') => repo,
            _ => repo_tag,
        };
        let registry = get("COCOON_REGISTRY")?;
        let state = PathBuf::from(get("COCOON_STATE_DIR")?);
        let config = kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&kubeconfig)?,
            &kube::config::KubeConfigOptions::default(),
        )
        .await?;
        let client = kube::Client::try_from(config)?;
        let chart = testkit::repo_root().join("charts/cocoon-hibernation");
        // Only what a user sets: the image by digest, the registry, TLS, and who writes
        // the pods' VM annotations (S3; here the admin who creates the test's pods).
        let values = state.join("install-values.yaml");
        std::fs::write(
            &values,
            format!(
                "image:\n  repository: {repository}\n  digest: \"{digest}\"\n\
                 registry:\n  base: \"{registry}\"\n  plainHTTP: true\n\
                 tls:\n  mode: self-signed\n\
                 vmIdentityPolicy:\n  allowedUsernames: [admin]\n"
            ),
        )?;
        let world = World {
            client,
            helm: PathBuf::from(required("COCOON_HELM")?),
            kubectl: PathBuf::from(get("COCOON_BIN_DIR")?).join("kubectl"),
            chart,
            values,
            registry,
            containerd_sock: get("COCOON_CONTAINERD_SOCK")?,
            registry_log: state.join("registry.log"),
            virtual_node: get("COCOON_VIRTUAL_NODE")?,
            vm_ns: format!("vms-{}", std::process::id()),
        };
        // helm reads KUBECONFIG from the environment: it must be the cluster the client uses.
        if std::env::var("KUBECONFIG").ok().as_deref() != Some(kubeconfig.as_str()) {
            return Err(
                format!("KUBECONFIG must be {kubeconfig} (make install-test sets it)").into(),
            );
        }
        Ok(world)
    }

    /// Runs helm; its output on failure.
    pub fn helm(&self, args: &[&str]) -> Result<String> {
        checked(&mut Command::new(&self.helm), "helm", args)
    }

    /// Runs kubectl in `dir` (documented commands name paths relative to the repository);
    /// its output on failure.
    pub fn kubectl_in(&self, dir: &Path, args: &[&str]) -> Result<String> {
        checked(
            Command::new(&self.kubectl).current_dir(dir),
            "kubectl",
            args,
        )
    }

    /// `helm install` (or `upgrade --install`) of the chart as it ships, waiting for Ready.
    pub fn helm_install(&self, extra: &[&str]) -> Result<String> {
        let chart = self.chart.to_string_lossy().into_owned();
        let values = self.values.to_string_lossy().into_owned();
        let mut args = vec![
            "upgrade",
            "--install",
            RELEASE,
            &chart,
            "-n",
            RELEASE_NS,
            "--create-namespace",
            "-f",
            &values,
            "--wait",
            "--timeout",
            "180s",
        ];
        args.extend_from_slice(extra);
        self.helm(&args)
    }

    pub fn crs(&self) -> Api<CocoonHibernation> {
        Api::namespaced(self.client.clone(), &self.vm_ns)
    }
    pub fn product_pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), RELEASE_NS)
    }

    /// The product's pods, not terminating.
    pub async fn live_product_pods(&self) -> Result<Vec<Pod>> {
        let lp = ListParams::default().labels("app.kubernetes.io/name=cocoon-hibernation");
        Ok(self
            .product_pods()
            .list(&lp)
            .await?
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .collect())
    }

    pub async fn ready_replicas(&self) -> Result<i32> {
        let d = Api::<Deployment>::namespaced(self.client.clone(), RELEASE_NS)
            .get(RELEASE)
            .await?;
        Ok(d.status.and_then(|s| s.ready_replicas).unwrap_or(0))
    }

    /// (holder, renewTime) of the product's Lease.
    pub async fn lease(&self) -> Result<(Option<String>, Option<jiff::Timestamp>)> {
        let lease = Api::<Lease>::namespaced(self.client.clone(), RELEASE_NS)
            .get_opt(RELEASE)
            .await?;
        let spec = lease.and_then(|l| l.spec).unwrap_or_default();
        Ok((
            spec.holder_identity.filter(|h| !h.is_empty()),
            spec.renew_time.map(|t| t.0),
        ))
    }

    pub async fn create_namespace(&self) -> Result<()> {
        let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(self.client.clone());
        let body = serde_json::from_value(json!({ "metadata": { "name": self.vm_ns } }))?;
        ns.create(&PostParams::default(), &body).await?;
        Ok(())
    }

    /// A VM pod bound to the simulator's virtual node, as vk-cocoon runs it.
    pub async fn vm_pod(&self, name: &str) -> Result<()> {
        vk_sim::create_vm_pod_on(
            &self.client,
            &self.vm_ns,
            name,
            &format!("{}-{name}", self.vm_ns),
            Some(&self.virtual_node),
        )
        .await?;
        Ok(())
    }

    pub fn vm_of(&self, pod: &str) -> String {
        format!("{}-{pod}", self.vm_ns)
    }

    pub async fn create_cr(&self, pod: &str, desire: Desire, dry_run: bool) -> Result<()> {
        self.post_cr(pod, pod, desire, dry_run).await
    }

    /// A CR named `name` for `pod`: the webhook refuses it unless the names match (V2).
    pub async fn create_cr_named(&self, name: &str, pod: &str) -> Result<()> {
        self.post_cr(name, pod, Desire::Hibernate, true).await
    }

    async fn post_cr(&self, name: &str, pod: &str, desire: Desire, dry_run: bool) -> Result<()> {
        let cr: CocoonHibernation = serde_json::from_value(json!({
            "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonHibernation",
            "metadata": { "name": name },
            "spec": { "podRef": { "name": pod }, "desire": desire },
        }))?;
        let pp = PostParams {
            dry_run,
            ..Default::default()
        };
        self.crs().create(&pp, &cr).await?;
        Ok(())
    }

    pub async fn set_desire(&self, pod: &str, desire: Desire) -> Result<()> {
        let patch = json!({ "spec": { "desire": desire } });
        self.crs()
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        Ok(())
    }

    /// Digest of `<vm>:hibernate`, if the tag exists.
    pub async fn tag(&self, pod: &str) -> Result<Option<String>> {
        vk_sim::snapshot_digest(&self.registry, &self.vm_of(pod)).await
    }

    /// Phases of the suite's CRs by name.
    pub async fn phases(&self) -> Result<BTreeMap<String, (Desire, Option<Phase>)>> {
        Ok(self
            .crs()
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .filter_map(|cr| {
                let name = cr.metadata.name.clone()?;
                let phase = cr.status.as_ref().and_then(|s| s.phase);
                Some((name, (cr.spec.desire, phase)))
            })
            .collect())
    }
}

/// The phase a CR settles in for its desire.
pub fn settled(desire: Desire) -> Option<Phase> {
    match desire {
        Desire::Hibernate => Some(Phase::Hibernated),
        Desire::Wake => Some(Phase::Active),
        Desire::Unknown => None,
    }
}

/// Polls `check` every 250 ms until it holds or `timeout` passes.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<bool>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => {}
            Err(e) if start.elapsed() >= timeout => {
                return Err(format!("{what}: not reached in {timeout:?}; last error: {e}").into());
            }
            Err(_) => {}
        }
        if start.elapsed() >= timeout {
            return Err(format!("{what}: not reached in {timeout:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Runs `command` with `args` to its end: its stdout, or an error with all it printed.
fn checked(command: &mut Command, name: &str, args: &[&str]) -> Result<String> {
    let out = command.args(args).output()?;
    if !out.status.success() {
        return Err(format!(
            "{name} {} failed: {}{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
