//! One control plane's state dir and how to ask it things: the paths inside it, the lock,
//! and health checks (curl, with the admin client certificate).

use super::daemons;
use super::node::Net;
use super::state::RunState;
use crate::cmd::{self, Result};
use crate::tools::{env_nonempty, home, mkdir};
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The daemons of every control plane, in start order.
pub const DAEMONS: [&str; 3] = ["etcd", "kube-apiserver", "registry"];

/// The state dir: `arg`, else the default, made absolute and created.
pub fn resolve_dir(arg: Option<&Path>, node: bool) -> Result<PathBuf> {
    let dir = match arg {
        Some(dir) => dir.to_path_buf(),
        None if node => match env_nonempty("COCOON_NODE_STATE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => home()?.join(".cache/cocoon-hibernation/node-cluster"),
        },
        None => match env_nonempty("COCOON_STATE_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => home()?.join(".cache/cocoon-hibernation/cluster"),
        },
    };
    // The env file is sourced by shells: a space would split its values.
    if dir.to_string_lossy().chars().any(char::is_whitespace) {
        return cmd::fail(format!(
            "state dir must not contain whitespace: {}",
            dir.display()
        ));
    }
    mkdir(&dir)?;
    dir.canonicalize()
        .map_err(|e| cmd::Error(format!("cannot resolve {}: {e}", dir.display())))
}

/// A control plane being brought up or down.
pub struct Plane {
    pub dir: PathBuf,
    /// Set on a real node.
    pub net: Option<Net>,
    /// Where the apiserver and the registry listen.
    pub api_host: String,
    pub bin_dir: PathBuf,
}

impl Plane {
    /// Serializes cluster-up and cluster-down of one state dir across processes (several
    /// test binaries may start at once); held until the file drops.
    pub fn lock(dir: &Path) -> Result<File> {
        crate::tools::lock(&dir.join(".lock"))
    }

    pub fn pki(&self) -> PathBuf {
        self.dir.join("pki")
    }

    pub fn kubeconfig(&self) -> PathBuf {
        self.dir.join("kubeconfig")
    }

    pub fn run_state(&self) -> PathBuf {
        self.dir.join("run.state")
    }

    /// Every daemon of this plane, in start order.
    pub fn daemons(&self) -> Vec<&'static str> {
        let mut all = DAEMONS.to_vec();
        if self.net.is_some() {
            all.extend(super::node::DAEMONS);
        }
        all
    }

    /// `GET https://<api>/<path>` as admin; the body when it answers 2xx within 2 s.
    pub fn api_get(&self, port: u16, path: &str) -> Option<String> {
        let pki = self.pki();
        curl(
            Command::new("curl")
                .arg("--cacert")
                .arg(pki.join("ca.crt"))
                .arg("--cert")
                .arg(pki.join("admin.crt"))
                .arg("--key")
                .arg(pki.join("admin.key"))
                .arg(format!("https://{}:{port}{path}", self.api_host)),
        )
    }

    pub fn apiserver_healthy(&self, port: u16) -> bool {
        self.api_get(port, "/healthz").as_deref() == Some("ok")
    }

    pub fn default_ns_exists(&self, port: u16) -> bool {
        self.api_get(port, "/api/v1/namespaces/default").is_some()
    }

    /// The running cluster's state, when every daemon is ours and healthy and it runs the
    /// binaries we would start (another version or place means a restart, not a reuse).
    pub fn running_and_healthy(&self) -> Option<RunState> {
        if !self.pki().join("ca.key").is_file() || !self.kubeconfig().is_file() {
            return None;
        }
        let run = RunState::parse(&std::fs::read_to_string(self.run_state()).ok()?)?;
        if run.bin_dir != self.bin_dir {
            return None;
        }
        if !self
            .daemons()
            .iter()
            .all(|d| daemons::pid(&self.dir, d).is_some())
        {
            return None;
        }
        let healthy = etcd_healthy(run.etcd_port)
            && self.apiserver_healthy(run.api_port)
            && self.default_ns_exists(run.api_port)
            && registry_healthy(&run.registry);
        if !healthy || (self.net.is_some() && !super::node::ready(self)) {
            return None;
        }
        Some(run)
    }
}

/// `curl -fsS --max-time 2 ...`: stdout on success. curl, not a Rust HTTP client: it
/// speaks TLS with client certificates and keeps the harness free of a TLS stack.
pub fn curl(cmd: &mut Command) -> Option<String> {
    let out = cmd
        .args(["-fsS", "--max-time", "2"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

pub fn etcd_healthy(port: u16) -> bool {
    curl(Command::new("curl").arg(format!("http://127.0.0.1:{port}/health")))
        .is_some_and(|body| body.contains("\"health\":\"true\""))
}

pub fn registry_healthy(registry: &str) -> bool {
    curl(Command::new("curl").arg(format!("http://{registry}/v2/"))).is_some()
}

/// `gitVersion` of a `/version` answer.
pub fn git_version(body: &str) -> Option<&str> {
    let rest = body.split("\"gitVersion\"").nth(1)?;
    let rest = rest.trim_start().strip_prefix(':')?.trim_start();
    rest.strip_prefix('"')?.split('"').next()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_git_version_of_a_version_answer() {
        let body =
            "{\n  \"major\": \"1\",\n  \"gitVersion\": \"v1.34.4\",\n  \"gitCommit\": \"\"\n}";
        assert_eq!(git_version(body), Some("v1.34.4"));
        assert_eq!(
            git_version("{\"gitVersion\":\"v0.0.0-master\"}"),
            Some("v0.0.0-master")
        );
        assert_eq!(git_version("{}"), None);
    }

    #[test]
    fn a_state_dir_with_whitespace_is_refused() {
        let err = resolve_dir(Some(Path::new("/tmp/a b")), false)
            .err()
            .map(|e| e.0);
        assert!(
            err.as_deref().is_some_and(|e| e.contains("whitespace")),
            "{err:?}"
        );
    }
}
