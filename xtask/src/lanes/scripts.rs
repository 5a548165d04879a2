//! The other tools the runs call, one function each: the chart checks, the previous
//! release, the plugin's krew test and the chart tooling (this binary's own subcommands,
//! run as a child so each keeps its output, environment and exit apart), and `make image`
//! (shell by nature).

use crate::cmd::{self, Result, fail, repo_root};
use crate::lanes::control_plane::{Env, append};
use crate::lanes::{Out, last_line, run};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

fn bash(script: &str) -> Result<Command> {
    let root = repo_root()?;
    let mut cmd = Command::new("bash");
    cmd.current_dir(&root).arg(root.join(script));
    Ok(cmd)
}

/// This binary with a subcommand (`cargo xtask <args>` without going through cargo again).
pub fn xtask(args: &[&str]) -> Result<Command> {
    let exe = std::env::current_exe().map_err(|e| cmd::Error(format!("current_exe: {e}")))?;
    let mut cmd = Command::new(exe);
    cmd.current_dir(repo_root()?).args(args);
    Ok(cmd)
}

/// The chart checks against the control plane in `env`; `extra` adds or overrides
/// variables (COCOON_BIN, KUBECTL, CHECK_NAMESPACE).
pub fn check_chart(out: &Out, env: &Env, extra: &[(&str, &Path)]) -> Result<()> {
    let mut cmd = xtask(&["chart-check"])?;
    env.apply(&mut cmd);
    cmd.envs(extra.iter().copied());
    run(out, &mut cmd)
}

/// The chart-version gate: the chart's files changed only with a version bump.
pub fn chart_version(out: &Out) -> Result<()> {
    run(out, &mut xtask(&["chart-version"])?)
}

/// The krew install of the plugin's tarball, offline.
pub fn plugin_krew_test(out: &Out) -> Result<()> {
    run(out, &mut xtask(&["plugin", "krew-test"])?)
}

/// The previous release's binary, built once and cached; its output goes to `out`.
pub fn old_release_build(out: &Out) -> Result<()> {
    run(out, &mut xtask(&["old-release", "build"])?)
}

/// The previous release's commit.
pub fn old_release_commit() -> Result<String> {
    let stdout = cmd::output(&mut xtask(&["old-release", "commit"])?)?;
    Ok(stdout.trim().to_string())
}

/// The previous release's chart, unpacked under `dir`; returns the chart's path.
pub fn old_release_chart(dir: &Path) -> Result<PathBuf> {
    let mut cmd = xtask(&["old-release", "chart"])?;
    cmd.arg(dir).stderr(Stdio::inherit());
    let stdout = cmd::output(&mut cmd)?;
    match last_line(&stdout) {
        Some(p) => Ok(PathBuf::from(p)),
        None => fail("cargo xtask old-release chart printed no path"),
    }
}

/// The previous release's image, pushed to the registry of `env`: its `repo@digest`.
pub fn old_release_image(env: &Env) -> Result<String> {
    let mut cmd = xtask(&["old-release", "image"])?;
    env.apply(&mut cmd)
        .env("IMAGE_REGISTRY", env.get("COCOON_REGISTRY")?)
        .stderr(Stdio::inherit());
    let stdout = cmd::output(&mut cmd)?;
    let line = last_line(&stdout).unwrap_or_default();
    match Image::parse(line) {
        Some(image) => Ok(image.reference()),
        None => fail(format!(
            "cargo xtask old-release image printed no pushed reference: {line}"
        )),
    }
}

/// helm and the other chart tools, built once; returns their bin dir. Progress lines go
/// to `log` when given, else to stderr.
pub fn install_tools(log: Option<&Path>) -> Result<PathBuf> {
    let mut cmd = xtask(&["tools"])?;
    cmd.stderr(match log {
        Some(log) => Stdio::from(append(log)?),
        None => Stdio::inherit(),
    });
    let stdout = cmd::output(&mut cmd)?;
    match last_line(&stdout) {
        Some(p) => Ok(PathBuf::from(p)),
        None => fail("cargo xtask tools printed no bin dir"),
    }
}

/// `make image` pushed to `registry`. Its progress goes to `log` when given, else stderr.
pub fn push_image(registry: &str, log: Option<&Path>) -> Result<Image> {
    let mut cmd = bash("hack/image.sh")?;
    cmd.arg("build").env("IMAGE_REGISTRY", registry);
    cmd.stderr(match log {
        Some(log) => Stdio::from(append(log)?),
        None => Stdio::inherit(),
    });
    let stdout = cmd::output(&mut cmd)?;
    let line = last_line(&stdout).unwrap_or_default();
    match Image::parse(line) {
        Some(image) => Ok(image),
        None => fail(format!("make image printed no pushed reference: {line}")),
    }
}

/// image.sh's last line: `image: <repo>:<tag>@sha256:<64 hex> size_mb=<n>`.
#[derive(Debug, PartialEq)]
pub struct Image {
    pub repo: String,
    pub digest: String,
    pub size_mb: String,
    /// The whole line without `image: `.
    pub line: String,
}

impl Image {
    pub fn parse(line: &str) -> Option<Image> {
        let rest = line.strip_prefix("image: ")?;
        let (reference, size) = rest.split_once(' ')?;
        let size_mb = size.strip_prefix("size_mb=")?;
        let sized = !size_mb.is_empty() && size_mb.chars().all(|c| c.is_ascii_digit() || c == '.');
        let (name, digest) = reference.split_once('@')?;
        let hex = digest.strip_prefix("sha256:")?;
        let (repo, tag) = name.rsplit_once(':')?;
        let ok = sized
            && hex.len() == 64
            && hex.chars().all(|c| matches!(c, '0'..='9' | 'a'..='f'))
            && !repo.is_empty()
            && !tag.is_empty()
            && !tag.contains('/');
        ok.then(|| Image {
            repo: repo.to_string(),
            digest: digest.to_string(),
            size_mb: size_mb.to_string(),
            line: rest.to_string(),
        })
    }

    /// `repo@sha256:…`: what the chart and the install suite pull.
    pub fn reference(&self) -> String {
        format!("{}@{}", self.repo, self.digest)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_image_line_gives_repo_digest_and_size() {
        let hex = "ab".repeat(32);
        let line =
            format!("image: 127.0.0.1:5000/cocoon-hibernation:dev@sha256:{hex} size_mb=41.5");
        let image = Image::parse(&line);
        assert_eq!(
            image.as_ref().map(Image::reference),
            Some(format!("127.0.0.1:5000/cocoon-hibernation@sha256:{hex}"))
        );
        assert_eq!(image.map(|i| i.size_mb), Some("41.5".to_string()));
    }

    #[test]
    fn a_line_without_a_pushed_digest_is_refused() {
        let hex = "ab".repeat(32);
        for line in [
            "image: r/x:t size_mb=1".to_string(),
            format!("image: r/x@sha256:{hex} size_mb=1"),
            format!("image: r/x:t@sha256:{} size_mb=1", &hex[1..]),
            format!("image: r/x:t@sha256:{hex}"),
            format!("built r/x:t@sha256:{hex} size_mb=1"),
        ] {
            assert_eq!(Image::parse(&line), None, "{line}");
        }
    }
}
