//! `cargo xtask test` (`make test`, the README's test command): the quality gates, then
//! three lanes at once, each on a control plane of its own: every cargo test and the chart
//! checks on the shared local control plane, the short soak, and the install suite on a
//! real node. The lanes mostly wait on clocks (the e2e lane leaves a 2-core machine ~85%
//! idle), so running them side by side costs little CPU and saves their sum. Each lane's
//! output goes to `$CARGO_TARGET_DIR/make-test/<lane>.log`; a failing lane's log is printed
//! in full; the last line is `N passed, M failed`.

use crate::cmd::{Error, Result, fail, repo_root};
use crate::lanes::control_plane::{self, Env, Up};
use crate::lanes::{
    Out, cache_home, cargo, catch_interrupts, flag, interrupted, run, scripts, soak, tally,
    target_dir, var,
};
use clap::{Args, ValueEnum};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::sync::mpsc;
use std::time::Instant;

#[derive(Args)]
pub struct TestArgs {
    /// Run only these lanes (repeat the flag; default: all three).
    #[arg(long = "lane", value_enum)]
    lanes: Vec<Lane>,
    /// Skip the quality gates (fmt, rule index, links, shellcheck, clippy, builds).
    #[arg(long)]
    no_gates: bool,
}

#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Lane {
    /// Every cargo test and the chart checks on the shared local control plane.
    Tests,
    /// The short soak (SOAK_CRS, default 60) on a control plane of its own.
    Soak,
    /// The install suite on a real node (`cargo xtask install-test`).
    Install,
}

impl Lane {
    const ALL: [Lane; 3] = [Lane::Tests, Lane::Soak, Lane::Install];

    fn name(self) -> &'static str {
        match self {
            Lane::Tests => "tests",
            Lane::Soak => "soak",
            Lane::Install => "install",
        }
    }
}

/// The `test = false` targets: a bare `cargo test` leaves them out, so they are named.
const CLUSTER_TESTS: [&str; 4] = ["--test", "e2e", "--test", "e2e_alone"];
const OFF_TARGETS: [&str; 8] = [
    "--test",
    "e2e",
    "--test",
    "e2e_alone",
    "--test",
    "soak",
    "--test",
    "e2e_install",
];

pub fn main(args: &TestArgs) -> Result<ExitCode> {
    let lanes: Vec<Lane> = Lane::ALL
        .into_iter()
        .filter(|l| args.lanes.is_empty() || args.lanes.contains(l))
        .collect();
    catch_interrupts();
    if !args.no_gates {
        gates(&Out::Terminal)?;
    }
    lanes_at_once(&lanes)
}

fn command(program: &str, args: &[&str]) -> Result<Command> {
    let mut cmd = Command::new(program);
    cmd.args(args).current_dir(repo_root()?);
    Ok(cmd)
}

fn cargo_with(args: &[&str]) -> Result<Command> {
    let mut cmd = cargo()?;
    cmd.args(args);
    Ok(cmd)
}

/// Every check that needs no control plane, in order; the first failure ends the run.
fn gates(out: &Out) -> Result<()> {
    out.step("toolchain");
    run(out, &mut cargo_with(&["--version"])?)?;
    run(out, &mut command("go", &["version"])?).map_err(|e| {
        Error(format!(
            "{e}: Go is required to build kube-apiserver, etcd and helm (bash hack/prereqs.sh test says which)"
        ))
    })?;

    out.step("cargo fmt --check");
    run(out, &mut cargo_with(&["fmt", "--all", "--", "--check"])?)?;
    // The fuzz crate is outside the workspace (it needs nightly to build, not to format).
    let mut fuzz_fmt = cargo_with(&["fmt", "--", "--check"])?;
    run(out, fuzz_fmt.current_dir(repo_root()?.join("fuzz")))?;
    out.step("rule IDs cited by tests are defined in docs/rules.md");
    run(out, &mut command("python3", &["hack/rule-index.py"])?)?;
    out.step("chart files changed only with a version bump and a CHANGELOG section");
    scripts::chart_version(out)?;
    // The check's own cases on temporary copies, with the rest of the harness's unit tests.
    run(out, &mut cargo_with(&["test", "--locked", "-p", "xtask"])?)?;
    out.step("every link in README and docs resolves inside the repository");
    run(out, &mut command("python3", &["hack/check-links.py"])?)?;
    out.step("shellcheck: every tracked shell script");
    shellcheck(out)?;

    out.step("cargo clippy --all-targets -- -D warnings");
    run(
        out,
        &mut cargo_with(&[
            "clippy",
            "--locked",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ])?,
    )?;
    let mut clippy_off = cargo_with(&["clippy", "--locked"])?;
    run(
        out,
        clippy_off.args(OFF_TARGETS).args(["--", "-D", "warnings"]),
    )?;
    out.step("cargo build");
    run(
        out,
        &mut cargo_with(&["build", "--locked", "--all-targets"])?,
    )?;
    run(out, cargo_with(&["build", "--locked"])?.args(OFF_TARGETS))?;
    // The install suite's image binary, built here rather than beside the tests: a 2-core
    // machine cannot compile and keep the tests' second-scale timeouts at the same time.
    run(
        out,
        &mut cargo_with(&[
            "build",
            "--locked",
            "--release",
            "-p",
            "cocoon-hibernation",
            "-p",
            "kubectl-cocoon",
        ])?,
    )?;
    // The previous release's binary for the install suite's upgrade: built once, cached.
    scripts::old_release_build(out)?;
    out.step("the kubectl plugin through krew (offline)");
    scripts::plugin_krew_test(out)?;
    out.step("certs/ tooling");
    run(out, &mut command("bash", &["certs/test.sh"])?)
}

/// `shellcheck -x` over every tracked `*.sh`, `.ci/run` and any tracked file whose first
/// line is a sh or bash shebang; any finding fails.
fn shellcheck(out: &Out) -> Result<()> {
    run(out, &mut command("shellcheck", &["--version"])?).map_err(|e| {
        Error(format!(
            "{e}: shellcheck is required (bash hack/prereqs.sh test installs it)"
        ))
    })?;
    let root = repo_root()?;
    let listed = crate::cmd::output(&mut command("git", &["ls-files"])?)?;
    let mut scripts: Vec<&str> = listed
        .lines()
        .filter(|f| {
            f.ends_with(".sh")
                || *f == ".ci/run"
                || std::fs::read(root.join(f)).is_ok_and(|b| is_shell_shebang(first_line(&b)))
        })
        .collect();
    scripts.sort_unstable();
    scripts.dedup();
    run(out, command("shellcheck", &["-x"])?.args(&scripts))?;
    out.line(&format!("{} scripts, no findings", scripts.len()));
    Ok(())
}

fn first_line(bytes: &[u8]) -> &str {
    let line = bytes.split(|b| *b == b'\n').next().unwrap_or_default();
    std::str::from_utf8(line).unwrap_or_default()
}

/// `#!/bin/sh`, `#!/usr/bin/env bash -e`, …: the interpreter (or env's program) is sh or bash.
fn is_shell_shebang(line: &str) -> bool {
    line.strip_prefix("#!").is_some_and(|rest| {
        rest.split_whitespace()
            .any(|word| matches!(word.rsplit('/').next(), Some("sh" | "bash")))
    })
}

/// The shared control plane's state dir argument: the scripts' default.
const SHARED: Option<&Path> = None;

fn soak_state_dir() -> Result<PathBuf> {
    Ok(var("SOAK_STATE_DIR").map_or(cache_home()?.join("cluster-soak"), PathBuf::from))
}

fn stop_shared_cluster(out: &Out) {
    if flag("COCOON_KEEP_CLUSTER") {
        out.line("control plane kept running (COCOON_KEEP_CLUSTER=1); stop it with: cargo xtask cluster-down");
    } else if control_plane::down(SHARED, false).is_err() {
        out.line("cargo xtask cluster-down failed");
    }
}

/// Lane "tests": the shared control plane, every cargo test, then the chart checks.
fn lane_tests(out: &Out) -> Result<()> {
    let t0 = Instant::now();
    // CI starts from an empty control plane: objects left by an earlier run would change
    // what the tests see (cluster-up otherwise reuses a running one, for quick reruns).
    if var("CI").as_deref() == Some("true") {
        control_plane::down(SHARED, false)?;
    }
    let result = control_plane::up(&Up {
        log: out.file()?,
        ..Up::default()
    })
    .and_then(|env_file| {
        out.line(&format!(
            "control plane ready in {}s",
            t0.elapsed().as_secs()
        ));
        tests_on(out, &Env::read(&env_file)?)
    });
    // COCOON_KEEP_CLUSTER=1 keeps the control plane for a quick rerun of single tests.
    stop_shared_cluster(out);
    result
}

fn tests_on(out: &Out, env: &Env) -> Result<()> {
    out.line(&format!(
        "kube-apiserver version: {}",
        env.get("COCOON_K8S_VERSION")?
    ));
    out.step("cargo test");
    let t0 = Instant::now();
    let threads = format!(
        "--test-threads={}",
        var("COCOON_TEST_THREADS").as_deref().unwrap_or("4")
    );
    for targets in [&["--lib", "--bins", "--tests"][..], &CLUSTER_TESTS[..]] {
        let mut test = cargo_with(&["test", "--locked"])?;
        env.apply(&mut test)
            .env("COCOON_CLUSTER_ENV", &env.path)
            .args(targets)
            .args(["--", &threads]);
        run(out, &mut test)?;
    }
    out.line(&format!("cargo test took {}s", t0.elapsed().as_secs()));
    out.step("chart checks");
    let bin = target_dir()?.join("debug/cocoon-hibernation");
    scripts::check_chart(out, env, &[("COCOON_BIN", &bin)])
}

/// Lane "soak": 60 CRs, every fault kind, on a control plane of its own, because it
/// restarts kube-apiserver (tests/soak/main.rs).
fn lane_soak(out: &Out) -> Result<()> {
    let t0 = Instant::now();
    let mut soak = soak::command("60")?;
    run(out, soak.env("SOAK_STATE_DIR", soak_state_dir()?))?;
    out.line(&format!("short soak took {}s", t0.elapsed().as_secs()));
    Ok(())
}

/// Lane "install": the image and the chart on a real node (`cargo xtask install-test`),
/// as a process of its own so its lines and clean-up are the command's.
fn lane_install(out: &Out) -> Result<()> {
    let exe = std::env::current_exe().map_err(|e| Error(format!("the harness' own path: {e}")))?;
    // A gate's `cargo build` may have replaced our binary meanwhile; the new one is there.
    let exe = PathBuf::from(exe.to_string_lossy().trim_end_matches(" (deleted)"));
    let mut install = Command::new(exe);
    install
        .arg("install-test")
        .env("CARGO_TARGET_DIR", target_dir()?);
    run(out, &mut install)
}

fn run_lane(lane: Lane, out: &Out) -> Result<()> {
    match lane {
        Lane::Tests => lane_tests(out),
        Lane::Soak => lane_soak(out),
        Lane::Install => lane_install(out),
    }
}

/// An interrupted run stops every control plane the lanes start.
fn stop_every_control_plane() {
    stop_shared_cluster(&Out::Terminal);
    if let Ok(dir) = soak_state_dir() {
        let _ = control_plane::down(Some(&dir), false);
    }
    let _ = control_plane::down(None, true);
}

fn lanes_at_once(lanes: &[Lane]) -> Result<ExitCode> {
    let out = Out::Terminal;
    let logs = target_dir()?.join("make-test");
    // Every lane writes its log here; this run's logs replace the last run's.
    let _ = std::fs::remove_dir_all(&logs);
    std::fs::create_dir_all(&logs).map_err(|e| Error(format!("{}: {e}", logs.display())))?;
    out.step(&format!(
        "{} lane(s) at once (logs in {})",
        lanes.len(),
        logs.display()
    ));
    let t0 = Instant::now();
    let (done, finished) = mpsc::channel();
    let results = std::thread::scope(|scope| -> Result<Vec<(Lane, bool)>> {
        for &lane in lanes {
            let path = logs.join(format!("{}.log", lane.name()));
            let log = Out::create(&path)?;
            out.line(&format!(
                "lane {} started (log {})",
                lane.name(),
                path.display()
            ));
            let done = done.clone();
            scope.spawn(move || {
                let result = run_lane(lane, &log);
                if let Err(e) = &result {
                    log.line(&format!("lane {} FAILED: {e}", lane.name()));
                }
                let _ = done.send((lane, result.is_ok()));
            });
        }
        drop(done);
        let mut results = Vec::new();
        for (lane, ok) in finished.iter() {
            let verdict = if ok { "passed" } else { "FAILED" };
            let after = t0.elapsed().as_secs();
            out.line(&format!("lane {} {verdict} after {after}s", lane.name()));
            results.push((lane, ok));
        }
        Ok(results)
    })?;
    if interrupted() {
        stop_every_control_plane();
        return fail("interrupted; every control plane the lanes started is stopped");
    }
    report(&out, &logs, &results)
}

/// The failed lanes' logs, the summary lines worth reading, and `N passed, M failed`.
fn report(out: &Out, logs: &Path, results: &[(Lane, bool)]) -> Result<ExitCode> {
    let read = |lane: Lane| {
        std::fs::read_to_string(logs.join(format!("{}.log", lane.name()))).unwrap_or_default()
    };
    let failed_lanes: Vec<Lane> = Lane::ALL
        .into_iter()
        .filter(|l| results.contains(&(*l, false)))
        .collect();
    for &lane in &failed_lanes {
        out.step(&format!(
            "lane {} FAILED; its log ({})",
            lane.name(),
            logs.join(format!("{}.log", lane.name())).display()
        ));
        print!("{}", read(lane));
    }
    let texts: Vec<String> = [Lane::Install, Lane::Soak, Lane::Tests]
        .into_iter()
        .map(read)
        .collect();
    for line in summary_lines(&texts) {
        out.line(line);
    }
    let (passed, failed) = count(results, &read(Lane::Tests));
    if failed_lanes.is_empty() {
        out.step("all checks passed");
        out.line(&format!("{passed} passed, {failed} failed"));
        Ok(ExitCode::SUCCESS)
    } else {
        out.step(&format!("checks FAILED in {} lane(s)", failed_lanes.len()));
        out.line(&format!("{passed} passed, {failed} failed"));
        Ok(ExitCode::FAILURE)
    }
}

/// The lines worth reading even when all pass, each once (the install lane repeats the
/// suite's own summary line).
fn summary_lines(logs: &[String]) -> Vec<&str> {
    const WORTH: [&str; 5] = [
        "cargo test took",
        "short soak took",
        "soak: ",
        "install: ",
        "[install-test] install suite took",
    ];
    let mut seen: Vec<&str> = Vec::new();
    for line in logs.iter().flat_map(|l| l.lines()) {
        if WORTH.iter().any(|w| line.starts_with(w)) && !seen.contains(&line) {
            seen.push(line);
        }
    }
    seen
}

/// The tests lane counts its cargo test results; the soak and the install suite count one
/// each (single harness-less tests). A tests lane that failed before any test result (say,
/// at its control plane) counts as one failure.
fn count(results: &[(Lane, bool)], tests_log: &str) -> (u64, u64) {
    let (mut passed, mut failed) = (0, 0);
    for &(lane, ok) in results {
        match (lane, ok) {
            (Lane::Tests, ok) => {
                let (p, f) = tally(tests_log);
                passed += p;
                failed += f;
                if !ok && f == 0 {
                    failed += 1;
                }
            }
            (_, true) => passed += 1,
            (_, false) => failed += 1,
        }
    }
    (passed, failed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shebang_names_sh_or_bash_directly_or_through_env() {
        for yes in [
            "#!/bin/sh",
            "#!/usr/bin/env bash",
            "#!/bin/bash -eu",
            "#! /bin/sh",
        ] {
            assert!(is_shell_shebang(yes), "{yes}");
        }
        for no in [
            "#!/usr/bin/env python3",
            "#!/bin/zsh",
            "# bash",
            "#!/usr/bin/fish",
            "",
        ] {
            assert!(!is_shell_shebang(no), "{no}");
        }
    }

    #[test]
    fn counts_take_cargo_results_and_one_per_other_lane() {
        let log = "test result: ok. 10 passed; 0 failed; 0 ignored\n";
        let all = [
            (Lane::Tests, true),
            (Lane::Soak, true),
            (Lane::Install, false),
        ];
        assert_eq!(count(&all, log), (11, 1));
        // A tests lane that stopped before any result still counts as a failure.
        assert_eq!(count(&[(Lane::Tests, false)], ""), (0, 1));
        // One whose tests failed counts those, not one more.
        let red = "test result: FAILED. 3 passed; 2 failed; 0 ignored\n";
        assert_eq!(count(&[(Lane::Tests, false)], red), (3, 2));
    }

    #[test]
    fn summary_lines_are_picked_once_each() {
        let logs = [
            "[install-test] install suite took 300s\ninstall: image_mb=40\n".to_string(),
            "noise\ninstall: image_mb=40\nshort soak took 200s\n".to_string(),
            "cargo test took 500s\ntest result: ok.\n".to_string(),
        ];
        assert_eq!(
            summary_lines(&logs),
            [
                "[install-test] install suite took 300s",
                "install: image_mb=40",
                "short soak took 200s",
                "cargo test took 500s"
            ]
        );
    }
}
