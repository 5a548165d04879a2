//! The local control plane: etcd, kube-apiserver and a registry (and, with `node`, a real
//! node), started detached in a state dir and stopped from it.

use crate::cmd::{self, Result};
use std::path::PathBuf;
use std::process::Command;

/// What `cargo xtask cluster-up` takes.
#[derive(Clone, Debug, Default)]
pub struct UpOptions {
    /// Where pid files, logs, PKI and the env file live; `None` is the default dir.
    pub state_dir: Option<PathBuf>,
    /// A real single-node cluster (root only).
    pub node: bool,
    /// Stop and start only kube-apiserver of the running cluster.
    pub restart_apiserver: bool,
}

/// What `cargo xtask cluster-down` takes.
#[derive(Clone, Debug, Default)]
pub struct DownOptions {
    pub state_dir: Option<PathBuf>,
    pub node: bool,
}

/// Starts (or reuses) the control plane; returns its env file.
pub fn up(opts: &UpOptions) -> Result<PathBuf> {
    let mut script = Command::new("bash");
    script.arg(cmd::repo_root()?.join("hack/cluster-up.sh"));
    if opts.node {
        script.arg("--node");
    }
    if opts.restart_apiserver {
        script.arg("--restart-apiserver");
    }
    script.args(&opts.state_dir);
    let out = cmd::output(script.stderr(std::process::Stdio::inherit()))?;
    match out.lines().last() {
        Some(line) if !line.trim().is_empty() => Ok(PathBuf::from(line.trim())),
        _ => cmd::fail("cluster-up printed no env file path"),
    }
}

/// Stops what [`up`] started and removes its runtime state.
pub fn down(opts: &DownOptions) -> Result<()> {
    let mut script = Command::new("bash");
    script.arg(cmd::repo_root()?.join("hack/cluster-down.sh"));
    if opts.node {
        script.arg("--node");
    }
    script.args(&opts.state_dir);
    cmd::run(&mut script)
}
