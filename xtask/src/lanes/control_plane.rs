//! The one door to the control plane for every run here (test lanes, bench, compat,
//! install suite, demo): start or reuse one, stop one, read its env file.
//! It runs `cargo xtask cluster-up`/`cluster-down` ([`crate::cluster`]) as a child, so a
//! run's progress lines can go to its lane's log and a version can be asked through the
//! environment (`K8S_VERSION`), as for any other child.

use crate::cmd::{self, Error, Result, fail};
use crate::lanes::last_line;
use std::fs::{File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// What to start: the state dir (`None`: the scripts' default, `COCOON_STATE_DIR` or
/// `~/.cache/cocoon-hibernation/cluster`; for a node `node-cluster`), a real node or
/// loopback only, a Kubernetes version other than the default, and where the progress
/// lines go (`None`: stderr).
#[derive(Default)]
pub struct Up<'a> {
    pub dir: Option<&'a Path>,
    pub node: bool,
    pub k8s_version: Option<&'a str>,
    pub log: Option<File>,
}

/// Starts (or reuses a healthy) control plane; returns its env file.
pub fn up(opts: &Up<'_>) -> Result<PathBuf> {
    let mut cmd = script("cluster-up", opts.node, opts.dir)?;
    if let Some(v) = opts.k8s_version {
        cmd.env("K8S_VERSION", v);
    }
    if let Some(log) = &opts.log {
        let log = log
            .try_clone()
            .map_err(|e| Error(format!("log file: {e}")))?;
        cmd.stderr(log);
    }
    let stdout = cmd::output(&mut cmd)?;
    match last_line(&stdout) {
        Some(env) => Ok(PathBuf::from(env)),
        None => fail("cargo xtask cluster-up printed no env file"),
    }
}

/// Stops the control plane in `dir` (`None`: the default one) and removes its runtime
/// state; quiet, safe to run twice.
pub fn down(dir: Option<&Path>, node: bool) -> Result<()> {
    let mut cmd = script("cluster-down", node, dir)?;
    cmd::run(cmd.stdout(Stdio::null()).stderr(Stdio::null()))
}

fn script(name: &str, node: bool, dir: Option<&Path>) -> Result<Command> {
    let mut cmd = crate::lanes::scripts::xtask(&[name])?;
    if node {
        cmd.arg("--node");
    }
    if let Some(dir) = dir {
        cmd.arg(dir);
    }
    Ok(cmd)
}

/// `path` opened for appending (created if missing).
pub fn append(path: &Path) -> Result<File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error(format!("{}: {e}", path.display())))
}

/// A control plane's env file: `KEY=value` lines (what `set -a; . env` would export).
pub struct Env {
    pub path: PathBuf,
    pub vars: Vec<(String, String)>,
}

impl Env {
    pub fn read(path: &Path) -> Result<Env> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error(format!("env file {}: {e}", path.display())))?;
        Ok(Env {
            path: path.to_path_buf(),
            vars: parse_env(&text),
        })
    }

    /// A variable the file must have.
    pub fn get(&self, key: &str) -> Result<&str> {
        match self.vars.iter().find(|(k, _)| k == key) {
            Some((_, v)) => Ok(v),
            None => fail(format!("{} has no {key}", self.path.display())),
        }
    }

    /// The cluster's kubectl (`$COCOON_BIN_DIR/kubectl`).
    pub fn kubectl(&self) -> Result<PathBuf> {
        Ok(Path::new(self.get("COCOON_BIN_DIR")?).join("kubectl"))
    }

    /// Every variable set on `cmd`, as a shell that sourced the file would pass them.
    pub fn apply<'c>(&self, cmd: &'c mut Command) -> &'c mut Command {
        cmd.envs(self.vars.iter().map(|(k, v)| (k, v)))
    }
}

fn parse_env(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_lines_are_key_value_pairs_and_comments_are_skipped() {
        let vars = parse_env("# made by cluster-up\nKUBECONFIG=/s/kubeconfig\n\nA=b=c\nnoise\n");
        assert_eq!(
            vars,
            [
                ("KUBECONFIG".to_string(), "/s/kubeconfig".to_string()),
                ("A".to_string(), "b=c".to_string())
            ]
        );
    }
}
