//! Test support: runs the real `cocoon-hibernation` binary against the local control
//! plane, installs the CRD and a ValidatingWebhookConfiguration pointing at it, and
//! offers polling helpers. Include with `#[path = "support/product.rs"] mod product;`
//! next to `cluster.rs` and `ports.rs`.
//!
//! The binary runs under the Helm chart's RBAC, not as admin (P5): the chart's
//! ServiceAccount, ClusterRole and bindings are rendered with `helm template` and applied
//! once per chart content ([`product_identity`]); the binary authenticates as that
//! ServiceAccount with a client certificate; a product with leader election gets the
//! chart's Lease Role bound in its lease namespace ([`bind_lease_role`]). A verb the
//! chart lacks therefore fails the e2e suite. [`ProductOptions::as_admin`] is the escape
//! hatch.
#![allow(dead_code)] // each test binary uses a different subset

use super::cluster::Cluster;
use base64::Engine;
use cocoon_hibernation::api::{CocoonHibernation, CocoonHibernationSpec, Desire, Phase, PodRef};
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, CustomResourceExt};
use std::future::Future;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_cocoon-hibernation");

/// How one product process is started.
#[derive(Clone, Debug)]
pub struct ProductOptions {
    pub namespace: String,
    /// `host:port[/prefix]` of a plain-http registry.
    pub registry_base: String,
    pub hibernate_timeout: String,
    pub wake_timeout: String,
    /// `Some(lease name)` turns leader election on.
    pub lease: Option<String>,
    pub lease_duration: String,
    pub identity: Option<String>,
    /// Run with the admin kubeconfig instead of the chart's ServiceAccount and RBAC.
    pub as_admin: bool,
    /// Further flags, e.g. a shorter backoff than production's.
    pub extra_args: Vec<String>,
    /// Extra environment for the process, applied last (e.g. `KUBECONFIG` pointing at a
    /// proxy, `COCOON_APISERVER_TIMEOUT`).
    pub env: Vec<(String, String)>,
}

impl ProductOptions {
    pub fn new(namespace: &str, registry_base: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            registry_base: registry_base.to_owned(),
            hibernate_timeout: "60s".into(),
            wake_timeout: "60s".into(),
            lease: None,
            lease_duration: "4s".into(),
            identity: None,
            as_admin: false,
            extra_args: Vec::new(),
            env: Vec::new(),
        }
    }
}

/// One running server process; killed on drop.
pub struct Product {
    child: Option<Child>,
    args: Vec<String>,
    kubeconfig: PathBuf,
    env: Vec<(String, String)>,
    pub webhook_port: u16,
    pub admin_port: u16,
    pub dir: tempfile::TempDir,
    pub log: PathBuf,
    starts: u32,
}

pub use super::ports::free_port;

impl Product {
    /// Starts the binary and waits until /readyz answers 200 (both caches synced).
    pub async fn start(cluster: &Cluster, opts: &ProductOptions) -> Self {
        assert!(
            std::path::Path::new(BIN).exists(),
            "the cocoon-hibernation binary is missing at {BIN}: run `cargo build`"
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = cluster.serving_cert(&["127.0.0.1", "localhost"]);
        std::fs::write(dir.path().join("tls.crt"), cert).expect("write cert");
        std::fs::write(dir.path().join("tls.key"), key).expect("write key");
        let webhook_port = free_port();
        let admin_port = free_port();
        let mut args: Vec<String> = vec![
            "run".into(),
            format!("--webhook-addr=127.0.0.1:{webhook_port}"),
            format!("--admin-addr=127.0.0.1:{admin_port}"),
            format!("--tls-cert-file={}", dir.path().join("tls.crt").display()),
            format!("--tls-key-file={}", dir.path().join("tls.key").display()),
            format!("--registry-base={}", opts.registry_base),
            "--registry-plain-http".into(),
            "--registry-timeout=3s".into(),
            format!("--hibernate-timeout={}", opts.hibernate_timeout),
            format!("--wake-timeout={}", opts.wake_timeout),
            format!("--watch-namespace={}", opts.namespace),
            "--shutdown-grace=5s".into(),
        ];
        // A `--log-filter` in `extra_args` replaces this default (clap refuses repeats).
        if !opts
            .extra_args
            .iter()
            .any(|a| a.starts_with("--log-filter"))
        {
            args.push("--log-filter=info,cocoon_hibernation=debug".into());
        }
        match &opts.lease {
            Some(lease) => {
                args.push("--leader-election=true".into());
                args.push(format!("--lease-name={lease}"));
                args.push(format!("--lease-namespace={}", opts.namespace));
                args.push(format!("--lease-duration={}", opts.lease_duration));
            }
            None => args.push("--leader-election=false".into()),
        }
        if let Some(id) = &opts.identity {
            args.push(format!("--identity={id}"));
        }
        args.extend(opts.extra_args.iter().cloned());
        let kubeconfig = if opts.as_admin {
            cluster.kubeconfig.clone()
        } else {
            let identity = product_identity(cluster).await;
            if let Some(lease) = &opts.lease {
                bind_lease_role(cluster, &opts.namespace, lease).await;
            }
            identity.kubeconfig.clone()
        };
        let log = dir.path().join("server.log");
        let mut p = Self {
            child: None,
            args,
            kubeconfig,
            env: opts.env.clone(),
            webhook_port,
            admin_port,
            dir,
            log,
            starts: 0,
        };
        p.spawn();
        p.wait_ready().await;
        p
    }

    fn spawn(&mut self) {
        self.starts += 1;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("open server log");
        let err = log.try_clone().expect("clone log handle");
        let child = Command::new(BIN)
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("COCOON_REGISTRY_BASE")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {BIN}: {e}"));
        self.child = Some(child);
    }

    pub async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "server exited with {status} before it was ready; log:\n{}",
                    self.log_text()
                );
            }
            if self
                .get("/readyz")
                .map(|(code, _)| code == 200)
                .unwrap_or(false)
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("server never became ready; log:\n{}", self.log_text());
    }

    /// `kill -9`: no drain, no lease release.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the same process again (after [`Self::kill9`]).
    pub async fn restart(&mut self) {
        self.kill9();
        self.spawn();
        self.wait_ready().await;
    }

    /// SIGTERM, then waits for the exit status.
    pub fn sigterm(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success());
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = child.try_wait().expect("wait") {
                return status;
            }
            assert!(Instant::now() < deadline, "no exit within 30s of SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status when the process ended by itself: `None` while it runs, and after
    /// [`Self::kill9`] or [`Self::sigterm`] (they take the process).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A plain HTTP/1.0 GET against the admin port.
    pub fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.admin_port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.0\r\nhost: 127.0.0.1\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
        Ok((code, body))
    }

    /// The value of one metric sample line, e.g. `cocoon_hibernation_leader`.
    pub fn metric(&self, sample: &str) -> f64 {
        let Ok((_, body)) = self.get("/metrics") else {
            return f64::NAN;
        };
        body.lines()
            .find(|l| l.starts_with(sample) && l[sample.len()..].starts_with(' '))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    }
}

impl Drop for Product {
    fn drop(&mut self) {
        self.kill9();
        if std::thread::panicking() {
            eprintln!(
                "---- server log ({}) ----\n{}",
                self.log.display(),
                self.log_text()
            );
        }
    }
}

/// Installs both CRDs (CocoonHibernation with its CEL rule, and the schedules' of K1) by
/// server-side apply and waits until they are Established.
pub async fn ensure_crd(client: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        CocoonHibernation::crd(),
        cocoon_hibernation::schedule::CocoonHibernationSchedule::crd(),
    ] {
        let name = crd.metadata.name.clone().expect("crd name");
        api.patch(
            &name,
            &PatchParams::apply("cocoon-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("apply CRD");
        eventually("CRD established", Duration::from_secs(30), || async {
            let crd = api.get(&name).await.ok()?;
            crd.status?
                .conditions?
                .iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
                .then_some(())
        })
        .await;
    }
}

/// A ValidatingWebhookConfiguration for one namespace, pointing at `port` on loopback,
/// with the chart's `matchConditions` (V7).
pub async fn install_webhook(
    client: &kube::Client,
    cluster: &Cluster,
    namespace: &str,
    port: u16,
    group: &str,
) -> String {
    let name = format!(
        "cocoon-e2e-{namespace}-{}",
        group.split('.').next().unwrap_or("g")
    );
    let ca = base64::engine::general_purpose::STANDARD.encode(&cluster.ca_cert_pem);
    let vwc: ValidatingWebhookConfiguration = serde_json::from_value(serde_json::json!({
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": { "name": name },
        "webhooks": [{
            "name": "validate.cocoonhibernation.cocoonstack.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "timeoutSeconds": 5,
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/validate-cocoonhibernation"),
                "caBundle": ca,
            },
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": namespace } },
            // V7: the chart's own conditions, so the two cannot drift.
            "matchConditions": chart_match_conditions(cluster),
            "rules": [{
                "apiGroups": [group],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["cocoonhibernations"],
                "scope": "Namespaced",
            }],
        }, {
            // K1: schedules, as the chart's second webhook.
            "name": "validate.cocoonhibernationschedule.cocoonstack.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "timeoutSeconds": 5,
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/validate-cocoonhibernationschedule"),
                "caBundle": ca,
            },
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": namespace } },
            "matchConditions": [{
                "name": "create-or-spec-change",
                "expression": "request.operation == 'CREATE' || object.spec != oldObject.spec",
            }],
            "rules": [{
                "apiGroups": [group],
                "apiVersions": ["v1alpha1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["cocoonhibernationschedules"],
                "scope": "Namespaced",
            }],
        }],
    }))
    .expect("valid webhook configuration");
    let api: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    api.patch(
        &name,
        &PatchParams::apply("cocoon-e2e").force(),
        &Patch::Apply(&vwc),
    )
    .await
    .expect("apply webhook configuration");
    wait_webhook_in_effect(client, namespace, group).await;
    name
}

/// Waits until the apiserver sends CREATEs of `group`'s CocoonHibernations in `namespace`
/// to a webhook: a dry-run CREATE (no side effects) is answered by a webhook, or fails
/// calling it, instead of being admitted. A configuration takes a moment to reach the
/// admission chain; until then requests pass unchecked, and an update that is a no-op by
/// then is never sent (matchConditions).
pub async fn wait_webhook_in_effect(client: &kube::Client, namespace: &str, group: &str) {
    use kube::core::{ApiResource, DynamicObject};
    let ar = ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "CocoonHibernation".into(),
        plural: "cocoonhibernations".into(),
    };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ar);
    // Named unlike its pod: V1 denies it, so it is never admitted once the webhook is asked.
    let probe: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": format!("{group}/v1"),
        "kind": "CocoonHibernation",
        "metadata": { "name": "cocoon-e2e-webhook-probe" },
        "spec": { "podRef": { "name": "cocoon-e2e-webhook-probe-pod" }, "desire": "Wake" },
    }))
    .expect("probe CR");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    eventually(
        &format!("the webhook configuration in effect for {group} in {namespace}"),
        Duration::from_secs(60),
        || async {
            match api.create(&dry_run, &probe).await {
                Err(kube::Error::Api(s))
                    if s.message.contains("admission webhook")
                        || s.message.contains("failed calling webhook") =>
                {
                    Some(())
                }
                _ => None,
            }
        },
    )
    .await;
}

pub fn new_cr(name: &str, pod: &str, desire: Desire) -> CocoonHibernation {
    CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    )
}

pub async fn create_cr(
    api: &Api<CocoonHibernation>,
    name: &str,
    pod: &str,
    desire: Desire,
) -> CocoonHibernation {
    let cr = new_cr(name, pod, desire);
    api.create(&PostParams::default(), &cr)
        .await
        .unwrap_or_else(|e| panic!("create CocoonHibernation {name}: {e}"))
}

pub async fn set_desire(api: &Api<CocoonHibernation>, name: &str, desire: Desire) {
    let patch = serde_json::json!({ "spec": { "desire": desire } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("flip desire of {name}: {e}"));
}

pub fn phase(cr: &CocoonHibernation) -> Option<Phase> {
    cr.status.as_ref().and_then(|s| s.phase)
}

/// Polls `probe` every 100 ms until it yields `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the CR to reach `want`, recording every phase seen on the way. A watch sees
/// every write in order, so a phase that lasts only milliseconds is still recorded.
pub async fn wait_phase(
    api: &Api<CocoonHibernation>,
    name: &str,
    want: Phase,
    timeout: Duration,
    seen: &mut Vec<Phase>,
) -> CocoonHibernation {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api.clone(), cfg).applied_objects();
    futures::pin_mut!(stream);
    let found = tokio::time::timeout(timeout, async {
        while let Some(item) = stream.next().await {
            let Ok(cr) = item else { continue };
            if let Some(p) = phase(&cr) {
                if seen.last() != Some(&p) {
                    seen.push(p);
                }
                if p == want {
                    return Some(cr);
                }
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(cr)) => cr,
        _ => panic!("{name} did not reach {want} within {timeout:?}; phases seen: {seen:?}"),
    }
}

/// Deletes a CR and waits until it is gone (finalizers done).
pub async fn delete_and_wait_gone(api: &Api<CocoonHibernation>, name: &str, timeout: Duration) {
    api.delete(name, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    wait_gone(api, name, timeout).await;
}

pub async fn wait_gone(api: &Api<CocoonHibernation>, name: &str, timeout: Duration) {
    eventually(&format!("{name} gone"), timeout, || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Asserts the CR stays out of `forbidden` for `hold`.
pub async fn never_phase(
    api: &Api<CocoonHibernation>,
    name: &str,
    forbidden: Phase,
    hold: Duration,
) {
    let deadline = Instant::now() + hold;
    while Instant::now() < deadline {
        let cr = api.get(name).await.expect("get CR");
        assert_ne!(
            phase(&cr),
            Some(forbidden),
            "{name} reached {forbidden} too early"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reasons of the events recorded for one CR, oldest first.
pub async fn event_reasons(client: &kube::Client, namespace: &str, name: &str) -> Vec<String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), namespace);
    let mut events: Vec<_> = api
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    events.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
    events.into_iter().filter_map(|e| e.reason).collect()
}

// ---------------------------------------------------------------------------------------
// The Helm chart: rendering, and the product's identity under the chart's RBAC.

/// The chart this repository ships.
pub fn chart_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/cocoon-hibernation")
}

/// helm, found the way `hack/check-chart.sh` finds it: `hack/install-tools.sh` builds it
/// on first use (Go needed) and prints its bin dir. Panics, never skips, without it.
pub fn helm() -> &'static Path {
    static HELM: OnceLock<PathBuf> = OnceLock::new();
    HELM.get_or_init(|| {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/install-tools.sh");
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
