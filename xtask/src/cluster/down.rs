//! cluster-down: stops what cluster-up started (by pid file) and removes its runtime
//! state; the built binaries (outside the state dir) stay. Safe to run twice.

use super::node::{self, Net};
use super::plane::{DAEMONS, Plane, resolve_dir};
use super::state::RunState;
use super::{DownOptions, daemons};
use crate::cmd::Result;
use crate::tools::log;

pub fn down(opts: &DownOptions) -> Result<()> {
    let dir = resolve_dir(opts.state_dir.as_deref(), opts.node)?;
    let _lock = Plane::lock(&dir)?;
    let ran_node = std::fs::read_to_string(dir.join("run.state"))
        .ok()
        .and_then(|t| RunState::parse(&t))
        .is_some_and(|r| r.node);
    // A real node's containers, mounts and bridge go first (they outlive the daemons).
    if ran_node || dir.join("containerd/config.toml").is_file() {
        node::stop(&dir, &Net::from_env())?;
    }
    // Reverse start order: the apiserver goes before the etcd it writes to.
    for name in DAEMONS.iter().rev() {
        daemons::stop(&dir, name);
    }
    // Everything but the lock file, which a concurrent cluster-up may be waiting on.
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for entry in entries.flatten() {
            if entry.file_name() == ".lock" {
                continue;
            }
            let path = entry.path();
            let _ = if path.is_dir() && !path.is_symlink() {
                std::fs::remove_dir_all(&path)
            } else {
                std::fs::remove_file(&path)
            };
        }
    }
    log(
        "cluster-down",
        format!("stopped; cleaned {}", dir.display()),
    );
    Ok(())
}
