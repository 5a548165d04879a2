//! `cargo xtask bench [ARGS]` (`make bench`): the system benchmark (benches/system.rs)
//! against a fresh control plane of its own (BENCH_STATE_DIR, default
//! ~/.cache/cocoon-hibernation/bench-cluster), stopped again at the end
//! (BENCH_KEEP_CLUSTER=1 keeps it). ARGS go to the benchmark (`--n 1000`, `--parts …`,
//! …; each also read as BENCH_<NAME>). Output in BENCH_OUT (default <target>/bench); the
//! last line printed is its summary (`bench: writes_per_round=…`). COCOON_PRODUCT_BIN
//! runs another build of the product (a baseline's commit) under today's benchmark.

use crate::cmd::{self, Result, fail};
use crate::lanes::control_plane::{self, Up};
use crate::lanes::{Out, cache_home, cargo, flag, status, target_dir, var};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};

pub fn main(args: &[String]) -> Result<ExitCode> {
    let out_dir = var("BENCH_OUT").map_or(target_dir()?.join("bench"), PathBuf::from);
    eprintln!("=== build: the benchmark, then the product with `cargo build --release`");
    // The bench build links the binary with dev-dependency features (tokio test-util, …):
    // building the product last leaves target/release/cocoon-hibernation as `cargo build
    // --release` makes it, and the benchmark runs directly, not through `cargo bench`
    // (which would relink the binary its way).
    let mut build = cargo()?;
    build.args([
        "bench",
        "--locked",
        "--bench",
        "system",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ]);
    let json = cmd::output(build.stderr(Stdio::inherit()))?;
    let Some(exe) = bench_executable(&json) else {
        return fail("bench executable not found in cargo's output");
    };
    let mut release = cargo()?;
    release
        .args([
            "build",
            "--locked",
            "--release",
            "--bin",
            "cocoon-hibernation",
        ])
        .stdout(std::io::stderr());
    cmd::run(&mut release)?;

    // A control plane of its own, fresh and stopped at the end: the scale part leaves 10k
    // pods behind, which would cost a core and gigabytes, and would skew the next run.
    let state = var("BENCH_STATE_DIR").map_or(cache_home()?.join("bench-cluster"), PathBuf::from);
    eprintln!("=== local control plane ({}, fresh)", state.display());
    crate::lanes::catch_interrupts();
    let _ = control_plane::down(Some(&state), false);
    let result = run_bench(&state, &exe, &out_dir, args);
    if flag("BENCH_KEEP_CLUSTER") {
        eprintln!(
            "=== control plane kept running (BENCH_KEEP_CLUSTER=1); stop it with: cargo xtask cluster-down {}",
            state.display()
        );
    } else if control_plane::down(Some(&state), false).is_err() {
        eprintln!("cargo xtask cluster-down {} failed", state.display());
    }
    result
}

fn run_bench(state: &Path, exe: &Path, out_dir: &Path, args: &[String]) -> Result<ExitCode> {
    let env = control_plane::up(&Up {
        dir: Some(state),
        ..Up::default()
    })?;
    eprintln!(
        "=== system benchmark: {} (output in {})",
        exe.display(),
        out_dir.display()
    );
    let mut bench = Command::new(exe);
    bench
        .args(args)
        .env("COCOON_CLUSTER_ENV", &env)
        .env("BENCH_OUT", out_dir)
        .env("CARGO_TARGET_DIR", target_dir()?)
        .current_dir(crate::cmd::repo_root()?);
    let status = status(&Out::Terminal, &mut bench)?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::FAILURE,
    })
}

/// The last `"executable":"…/system-…"` in cargo's JSON messages (no JSON parser: the
/// path is the only field read, and cargo writes it unescaped for a plain path).
fn bench_executable(json: &str) -> Option<PathBuf> {
    json.lines()
        .filter_map(|l| {
            let start = l.find("\"executable\":\"")? + "\"executable\":\"".len();
            let path = &l[start..start + l[start..].find('"')?];
            let name = Path::new(path).file_name()?.to_str()?;
            name.starts_with("system-").then(|| PathBuf::from(path))
        })
        .next_back()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_system_bench_executable_is_the_last_one_named_system() {
        let json = r#"{"reason":"compiler-artifact","executable":null}
{"reason":"compiler-artifact","executable":"/t/release/deps/system-aa11"}
{"reason":"compiler-artifact","executable":"/t/release/deps/hot_paths-bb22"}
{"reason":"compiler-artifact","executable":"/t/release/deps/system-cc33"}
{"reason":"build-finished","success":true}"#;
        assert_eq!(
            bench_executable(json),
            Some(PathBuf::from("/t/release/deps/system-cc33"))
        );
        assert_eq!(bench_executable(r#"{"executable":"/t/x-1"}"#), None);
    }
}
