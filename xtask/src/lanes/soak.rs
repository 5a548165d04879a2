//! `cargo xtask soak` (`make soak`): the randomized soak (tests/soak), SOAK_CRS CRs
//! (default 1000) flipped at random under registry, apiserver, process and simulator
//! faults, judged against the rules. It starts its OWN control plane (SOAK_STATE_DIR,
//! default ~/.cache/cocoon-hibernation/cluster-soak) because it restarts kube-apiserver,
//! and stops it at the end (SOAK_KEEP_CLUSTER=1 keeps it). Other knobs: SOAK_SEED,
//! SOAK_OUT (default <target>/soak/<seed>), SOAK_CHAOS_S, SOAK_VK_DROPS_TAG (default 0.3).
//! The last line: `soak: seed=… crs=… transitions=… faults=… invariants=… violations=…
//! undecidable=…`.

use crate::cmd::Result;
use crate::lanes::{Out, cargo, run, var};
use std::process::Command;

/// The soak as a command: the shared cluster's variables removed, so it never uses it.
pub fn command(default_crs: &str) -> Result<Command> {
    let mut cmd = cargo()?;
    cmd.args(["test", "--locked", "--test", "soak"])
        .env(
            "SOAK_CRS",
            var("SOAK_CRS").as_deref().unwrap_or(default_crs),
        )
        .env_remove("COCOON_CLUSTER_ENV")
        .env_remove("COCOON_STATE_DIR");
    Ok(cmd)
}

pub fn main() -> Result<()> {
    run(&Out::Terminal, &mut command("1000")?)
}
