//! `cargo xtask install-test` (`make install-test`, a lane of `make test`): the install
//! suite (tests/e2e_install): the chart as users install it, on a real node, first the
//! previous release (its chart and image), then upgraded to this tree. Builds what it
//! needs, starts a fresh node cluster, runs the suite and stops the cluster again
//! (COCOON_KEEP_NODE=1 leaves it running; `cargo xtask cluster-down --node` stops it).
//! Needs root. The last line is the suite's summary:
//! `install: image_mb=… upgrade_from=… reuse_values=ok admissions=… failed=… …`.

use crate::cmd::{Error, Result, fail};
use crate::lanes::control_plane::{self, Env, Up};
use crate::lanes::{Out, cargo, catch_interrupts, flag, scripts, status};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

fn log(line: &str) {
    eprintln!("[install-test] {line}");
}

fn stop_node_cluster() {
    if flag("COCOON_KEEP_NODE") {
        log(
            "node cluster kept running (COCOON_KEEP_NODE=1); stop it with: cargo xtask cluster-down --node",
        );
    } else if control_plane::down(None, true).is_err() {
        log("cargo xtask cluster-down --node failed");
    }
}

pub fn main() -> Result<ExitCode> {
    let t0 = Instant::now();
    catch_interrupts();
    let tools_bin = scripts::install_tools(None)?;
    // The previous release's binary (cached by commit; a cold build takes minutes), before
    // the cluster starts: its clocks should not race a compile.
    let quiet =
        Out::Log(std::fs::File::create("/dev/null").map_err(|e| Error(format!("/dev/null: {e}")))?);
    scripts::old_release_build(&quiet)?;
    // A fresh node: what an earlier run left (releases, CRs, tags) would change what it sees.
    let _ = control_plane::down(None, true);
    let result = control_plane::up(&Up {
        node: true,
        ..Up::default()
    })
    .and_then(|env_file| {
        log(&format!(
            "node cluster ready in {}s",
            t0.elapsed().as_secs()
        ));
        suite(&Env::read(&env_file)?, &tools_bin)
    });
    stop_node_cluster();
    let (summary, code) = result?;
    log(&format!("install suite took {}s", t0.elapsed().as_secs()));
    let Some(summary) = summary else {
        return fail("the install suite printed no summary line");
    };
    println!("{summary}");
    Ok(code)
}

/// The old and new images pushed, then the suite; its summary line and exit code.
fn suite(env: &Env, tools_bin: &Path) -> Result<(Option<String>, ExitCode)> {
    let old_image = scripts::old_release_image(env)?;
    let old_chart =
        scripts::old_release_chart(&Path::new(env.get("COCOON_STATE_DIR")?).join("old-chart"))?;
    let old_commit = scripts::old_release_commit()?;
    log(&format!(
        "previous release {}: image {old_image}, chart {}",
        old_commit.get(..7).unwrap_or(&old_commit),
        old_chart.display()
    ));
    // The image users build, pushed to the node's registry (containerd pulls it there).
    let image = scripts::push_image(env.get("COCOON_REGISTRY")?, None)?;
    log(&format!(
        "image {} ({} MB)",
        image.reference(),
        image.size_mb
    ));

    log("running tests/e2e_install");
    let (reader, writer) = std::io::pipe().map_err(|e| Error(format!("pipe: {e}")))?;
    let mut test = cargo()?;
    env.apply(&mut test)
        .args(["test", "--locked", "--test", "e2e_install"])
        .env("COCOON_NODE_CLUSTER_ENV", &env.path)
        .env("COCOON_IMAGE_REF", image.reference())
        .env("COCOON_IMAGE_MB", &image.size_mb)
        .env("COCOON_HELM", tools_bin.join("helm"))
        .env("COCOON_UPGRADE_FROM", &old_commit)
        .env("COCOON_OLD_CHART", &old_chart)
        .env("COCOON_OLD_IMAGE_REF", &old_image)
        .stdout(
            writer
                .try_clone()
                .map_err(|e| Error(format!("pipe: {e}")))?,
        )
        .stderr(writer);
    // Its output tee'd to ours, the last summary line kept; the runner waits on a thread
    // while this one reads (the pipe's write ends close with `test`).
    let (summary, code) = std::thread::scope(|scope| {
        let waiter = scope.spawn(move || status(&Out::Terminal, &mut test));
        let mut summary = None;
        for line in BufReader::new(reader)
            .lines()
            .map_while(std::result::Result::ok)
        {
            println!("{line}");
            if line.starts_with("install: ") {
                summary = Some(line);
            }
        }
        let code = match waiter.join() {
            Ok(Ok(s)) if s.success() => ExitCode::SUCCESS,
            Ok(Ok(_)) => ExitCode::FAILURE,
            Ok(Err(e)) => {
                log(&e.0);
                ExitCode::FAILURE
            }
            Err(_) => ExitCode::FAILURE,
        };
        (summary, code)
    });
    Ok((summary, code))
}
