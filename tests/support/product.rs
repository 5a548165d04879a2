//! Test support: runs the real `cocoon-hibernation` binary against the local control
//! plane, installs the CRD and a ValidatingWebhookConfiguration pointing at it, and
//! offers polling helpers. Include with `#[path = "support/product.rs"] mod product;`
//! next to `cluster.rs`.
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
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
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

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free loopback port")
}

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
            "--log-filter=info,cocoon_hibernation=debug".into(),
        ];
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
        let log = dir.path().join("server.log");
        let mut p = Self {
            child: None,
            args,
            kubeconfig: cluster.kubeconfig.clone(),
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

/// Installs the CRD with its CEL rule (server-side apply) and waits until Established.
pub async fn ensure_crd(client: &kube::Client) {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let crd = CocoonHibernation::crd();
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

/// A ValidatingWebhookConfiguration for one namespace, pointing at `port` on loopback.
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
            "rules": [{
                "apiGroups": [group],
                "apiVersions": ["v1"],
                "operations": ["CREATE", "UPDATE"],
                "resources": ["cocoonhibernations"],
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
    name
}

pub fn new_cr(name: &str, pod: &str, desire: Desire) -> CocoonHibernation {
    CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire,
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
