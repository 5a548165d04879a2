//! `cargo xtask compat [VERSION...]` (`make compat`): the e2e suite and the chart checks
//! against each Kubernetes version the docs claim, each on a fresh control plane of its
//! own (`~/.cache/cocoon-hibernation/cluster-compat-<version>`, built like make test's),
//! stopped again afterwards. Versions: the arguments, else COMPAT_VERSIONS, else
//! [`DEFAULT_VERSIONS`]. Prints one line per version, then a total:
//! `compat: v1.30.14 passed=62 failed=0 chart=pass took_s=…`. Logs in
//! `$CARGO_TARGET_DIR/compat/<version>.log`. ~6 min per version on 2 cores; a cold build
//! of another kube-apiserver ~20 min. Not in make test: with it, CI's 90 min do not fit.

use crate::cmd::{Result, fail};
use crate::lanes::control_plane::{self, Env, Up, append};
use crate::lanes::{
    Out, cache_home, cargo, catch_interrupts, run, scripts, status, tally, target_dir, var,
};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// The oldest minor docs/install.md claims (its newest patch), and make test's version.
/// tests/unit/compat_claim.rs checks the first against the docs and the chart.
pub const DEFAULT_VERSIONS: &[&str] = &["v1.30.14", "v1.34.4"];

fn log(line: &str) {
    eprintln!("[compat] {line}");
}

/// `v1.<minor>.<patch>`, digits only.
fn is_version(v: &str) -> bool {
    let Some(rest) = v.strip_prefix("v1.") else {
        return false;
    };
    let parts: Vec<&str> = rest.split('.').collect();
    parts.len() == 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
}

fn versions(args: &[String]) -> Result<Vec<String>> {
    let chosen: Vec<String> = if !args.is_empty() {
        args.iter()
            .flat_map(|a| a.split_whitespace())
            .map(String::from)
            .collect()
    } else if let Some(env) = var("COMPAT_VERSIONS") {
        env.split_whitespace().map(String::from).collect()
    } else {
        DEFAULT_VERSIONS.iter().map(|v| v.to_string()).collect()
    };
    match chosen.iter().find(|v| !is_version(v)) {
        Some(bad) => fail(format!(
            "not a Kubernetes version: '{bad}' (want e.g. v1.30.14)"
        )),
        None => Ok(chosen),
    }
}

pub fn main(args: &[String]) -> Result<ExitCode> {
    let versions = versions(args)?;
    let logs = target_dir()?.join("compat");
    std::fs::create_dir_all(&logs)
        .map_err(|e| crate::cmd::Error(format!("{}: {e}", logs.display())))?;
    let cache = var("COCOON_CACHE").map_or(cache_home()?, PathBuf::from);
    catch_interrupts();

    // Build the tests once, before any control plane runs (a 2-core machine cannot compile
    // and keep the tests' second-scale timeouts at the same time).
    log("building the e2e tests");
    let build_log = logs.join("build.log");
    let out = Out::create(&build_log)?;
    let build = cargo()
        .and_then(|mut c| {
            run(
                &out,
                c.args([
                    "test",
                    "--locked",
                    "--test",
                    "e2e",
                    "--test",
                    "e2e_alone",
                    "--no-run",
                ]),
            )
        })
        .and_then(|()| cargo())
        .and_then(|mut c| {
            run(
                &out,
                c.args(["build", "--locked", "--bin", "cocoon-hibernation"]),
            )
        });
    if let Err(e) = build {
        return fail(format!("{e} (see {})", build_log.display()));
    }

    let mut results = Vec::new();
    for v in &versions {
        let state = cache.join(format!("cluster-compat-{v}"));
        let result = one_version(v, &state, &logs.join(format!("{v}.log")));
        let _ = control_plane::down(Some(&state), false).inspect_err(|_| {
            log(&format!(
                "cargo xtask cluster-down {} failed",
                state.display()
            ))
        });
        let line = result?;
        log(&line);
        results.push(line);
    }
    println!();
    for line in &results {
        println!("{line}");
    }
    let (passed, failed) = totals(&results);
    println!("{passed} passed, {failed} failed");
    Ok(if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// One control plane, the e2e suite, the chart checks: the version's result line. Fails
/// only for a control plane that does not start.
fn one_version(v: &str, state: &Path, log_file: &Path) -> Result<String> {
    let t0 = Instant::now();
    let out = Out::create(log_file)?;
    log(&format!(
        "{v}: control plane in {} (building kube-apiserver {v} first if not cached: ~20 min on 2 cores)",
        state.display()
    ));
    // Always a fresh one: objects left by an earlier run would change what the tests see.
    control_plane::down(Some(state), false)?;
    let env_file = control_plane::up(&Up {
        dir: Some(state),
        k8s_version: Some(v),
        log: Some(append(log_file)?),
        ..Up::default()
    })
    .or_else(|e| fail(format!("{v}: {e} (see {})", log_file.display())))?;
    let env = Env::read(&env_file)?;
    let served = env.get("COCOON_K8S_VERSION")?;
    if served != v {
        return fail(format!(
            "{v}: the control plane in {} serves '{served}'",
            state.display()
        ));
    }

    log(&format!("{v}: e2e suite (log {})", log_file.display()));
    let threads = format!(
        "--test-threads={}",
        var("COCOON_TEST_THREADS").as_deref().unwrap_or("4")
    );
    let mut test = cargo()?;
    test.args([
        "test",
        "--locked",
        "--no-fail-fast",
        "--test",
        "e2e",
        "--test",
        "e2e_alone",
        "--",
        &threads,
    ])
    .env("COCOON_CLUSTER_ENV", &env_file);
    let ok = status(&out, &mut test).is_ok_and(|s| s.success());
    let text = std::fs::read_to_string(log_file).unwrap_or_default();
    let (passed, mut failed) = tally(&text);
    // A run that stopped before any test result (a build or harness failure) counts as one.
    if !ok && failed == 0 {
        failed += 1;
    }

    log(&format!("{v}: chart checks against its apiserver"));
    let bin = target_dir()?.join("debug/cocoon-hibernation");
    let kubectl = env.kubectl()?;
    let namespace = PathBuf::from("cocoon-compat-check");
    let chart = scripts::check_chart(
        &out,
        &env,
        &[
            ("KUBECTL", &kubectl),
            ("COCOON_BIN", &bin),
            ("CHECK_NAMESPACE", &namespace),
        ],
    );
    let chart = if chart.is_ok() { "pass" } else { "fail" };
    Ok(format!(
        "compat: {v} passed={passed} failed={failed} chart={chart} took_s={}",
        t0.elapsed().as_secs()
    ))
}

/// Sums the result lines; a failed chart check counts as one failure.
fn totals(lines: &[String]) -> (u64, u64) {
    let field = |line: &str, key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or(0)
    };
    lines.iter().fold((0, 0), |(p, f), line| {
        let chart_failed = u64::from(!line.contains(" chart=pass"));
        (
            p + field(line, "passed="),
            f + field(line, "failed=") + chart_failed,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_v1_minor_patch() {
        assert!(DEFAULT_VERSIONS.iter().all(|v| is_version(v)));
        for bad in [
            "1.30.14",
            "v1.30",
            "v2.0.1",
            "v1.30.x",
            "v1..1",
            "v1.30.14.1",
        ] {
            assert!(!is_version(bad), "{bad}");
        }
    }

    #[test]
    fn arguments_win_and_a_bad_version_is_refused() {
        let args = vec!["v1.31.2 v1.32.0".to_string()];
        assert_eq!(
            versions(&args).ok(),
            Some(vec!["v1.31.2".into(), "v1.32.0".into()])
        );
        assert!(versions(&["latest".to_string()]).is_err());
    }

    #[test]
    fn totals_count_a_failed_chart_check_as_one_failure() {
        let lines = [
            "compat: v1.30.14 passed=60 failed=2 chart=pass took_s=300".to_string(),
            "compat: v1.34.4 passed=62 failed=0 chart=fail took_s=310".to_string(),
        ];
        assert_eq!(totals(&lines), (122, 3));
    }
}
