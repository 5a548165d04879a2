//! Runs commands as a user types them (kubectl, helm, the plugin), each bounded in time,
//! so a step that hangs fails with what the command printed so far.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::world::{Result, World};

/// What a finished command printed, and its exit code.
pub struct Ran {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout ---\n{}--- stderr ---\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// Runs `command` to its end, or kills it after `limit`. Output goes to files, so a
/// chatty command never blocks on a full pipe.
pub async fn run(mut command: Command, limit: Duration) -> Result<Ran> {
    let dir = tempfile::tempdir()?;
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    command
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?);
    let what = format!("{command:?}");
    let mut child = command.spawn().map_err(|e| format!("{what}: {e}"))?;
    let start = Instant::now();
    let status = loop {
        if let Some(status) = child.try_wait()? {
            break status;
        }
        if start.elapsed() >= limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{what}: still running after {limit:?}, killed\n--- stdout ---\n{}--- stderr ---\n{}",
                read(&out),
                read(&err)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Ok(Ran {
        code: status.code().unwrap_or(-1),
        stdout: read(&out),
        stderr: read(&err),
    })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `script` in `bash -euo pipefail`, with helm and the cluster's kubectl first on PATH
/// (KUBECONFIG is the cluster's already); its stdout, or an error with all it printed.
pub async fn sh(world: &World, script: &str, limit: Duration) -> Result<String> {
    let mut path =
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()).collect::<Vec<_>>();
    let helm_dir = world.helm.parent().ok_or("COCOON_HELM has no directory")?;
    let kubectl_dir = world.kubectl.parent().ok_or("kubectl has no directory")?;
    path.insert(0, kubectl_dir.to_path_buf());
    path.insert(0, helm_dir.to_path_buf());
    let mut command = Command::new("bash");
    command
        .args(["-euo", "pipefail", "-c", script])
        .env("PATH", std::env::join_paths(path)?);
    let ran = run(command, limit).await?;
    println!("  $ {}", script.replace('\n', "\n    "));
    if ran.code != 0 {
        return Err(format!("`{script}` failed: {ran}").into());
    }
    Ok(ran.stdout)
}
