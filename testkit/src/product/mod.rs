//! Test support: runs the real `cocoon-hibernation` binary against the local control
//! plane, installs the CRD and a ValidatingWebhookConfiguration pointing at it, and
//! offers polling helpers.
//!
//! The binary runs under the Helm chart's RBAC, not as admin (P5): the chart's
//! ServiceAccount, ClusterRole and bindings are rendered with `helm template` and applied
//! once per chart content ([`product_identity`]); the binary authenticates as that
//! ServiceAccount with a client certificate; a product with leader election gets the
//! chart's Lease Role bound in its lease namespace ([`bind_lease_role`]). A verb the
//! chart lacks therefore fails the e2e suite. [`ProductOptions::as_admin`] is the escape
//! hatch.

mod chart;
mod crs;
mod install;

pub use chart::{
    ProductIdentity, apply_docs, bind_lease_role, chart_dir, chart_match_conditions,
    chart_writers_values, helm, helm_template, helm_template_output, product_identity,
    wait_allowed,
};
pub use crs::{
    create_cr, delete_and_wait_gone, event_reasons, eventually, never_phase, new_cr, phase,
    set_desire, wait_gone, wait_phase,
};
pub use install::{ensure_crd, install_webhook, wait_webhook_in_effect};

use crate::cluster::Cluster;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The `cocoon-hibernation` binary cargo built beside the running test, bench or soak;
/// `COCOON_PRODUCT_BIN` names another build instead, so today's bench can measure a
/// baseline's commit (docs/performance.md).
pub fn bin() -> PathBuf {
    std::env::var_os(PRODUCT_BIN_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::cargo_bin("cocoon-hibernation"))
}

pub const PRODUCT_BIN_ENV: &str = "COCOON_PRODUCT_BIN";

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

pub use crate::ports::free_port;

impl Product {
    /// Starts the binary and waits until /readyz answers 200 (both caches synced).
    pub async fn start(cluster: &Cluster, opts: &ProductOptions) -> Self {
        assert!(
            bin().exists(),
            "the cocoon-hibernation binary is missing at {}: run `cargo build`",
            bin().display()
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
        let child = Command::new(bin())
            .args(&self.args)
            .env("KUBECONFIG", &self.kubeconfig)
            .env_remove("COCOON_REGISTRY_BASE")
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin().display()));
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

    /// Starts the process again with `flag` (`--name=value`) in place of the flag of the
    /// same name, e.g. a schedule clock moved past a boundary while it was down.
    pub async fn restart_with(&mut self, flag: &str) {
        let name = flag.split_once('=').map_or(flag, |(name, _)| name);
        self.args
            .retain(|a| a.split_once('=').map_or(a.as_str(), |(n, _)| n) != name);
        self.args.push(flag.to_owned());
        self.restart().await;
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
