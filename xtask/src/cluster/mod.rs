//! The local control plane for tests and demos: etcd, kube-apiserver and a registry (and,
//! with `node`, a real node), started detached in a state dir and stopped from it.
//! `cargo xtask cluster-up` / `cluster-down` call [`up`] and [`down`]; so do the test kit,
//! the soak and the test lanes.

pub mod daemons;
mod down;
mod node;
mod plane;
mod state;
mod up;

use crate::cmd::Result;
use std::hash::{BuildHasher, RandomState};
use std::path::PathBuf;

pub use up::{CA_COMMON_NAME, Up, up_report};

/// What `cargo xtask cluster-up` takes.
#[derive(Clone, Debug, Default)]
pub struct UpOptions {
    /// Where pid files, logs, PKI and the env file live. `None`: `$COCOON_STATE_DIR` or
    /// `~/.cache/cocoon-hibernation/cluster` (a node: `$COCOON_NODE_STATE_DIR` or
    /// `~/.cache/cocoon-hibernation/node-cluster`).
    pub state_dir: Option<PathBuf>,
    /// A real single-node cluster (root only); the apiserver and the registry then listen
    /// on the node's bridge address, not on loopback.
    pub node: bool,
    /// Stop and start only kube-apiserver of the running cluster (same port, etcd, PKI and
    /// audit log); the soak uses it.
    pub restart_apiserver: bool,
}

/// What `cargo xtask cluster-down` takes.
#[derive(Clone, Debug, Default)]
pub struct DownOptions {
    pub state_dir: Option<PathBuf>,
    pub node: bool,
}

/// Starts (or reuses) the control plane; returns its env file (`KEY=value` lines).
/// Idempotent: a healthy running cluster is reused; stale state is cleaned and restarted.
pub fn up(opts: &UpOptions) -> Result<PathBuf> {
    up_report(opts).map(|up| up.env_file)
}

/// Stops what [`up`] started and removes its runtime state.
pub fn down(opts: &DownOptions) -> Result<()> {
    down::down(opts)
}

/// A random u64 without a `rand` dependency: std's hasher keys are random per instance.
pub(crate) fn random_u64() -> u64 {
    RandomState::new().hash_one(std::time::SystemTime::now())
}
