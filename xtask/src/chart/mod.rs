//! The chart and release tooling: the chart checks (`check`, `upgrade`), the chart's version
//! record (`version`), the previous release (`old_release`) and the kubectl plugin as users
//! get it (`plugin`). Helm, helm-unittest, kubeconform, promtool and krew do the checking;
//! these modules only drive them. What they share is here: where the caches are, the
//! tools, a work directory kept on failure, and the timed steps with one summary line.

pub mod check;
pub mod old_release;
pub mod plugin;
pub mod upgrade;
pub mod version;

use crate::cmd::{self, Error, Result, fail};
use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// `${COCOON_CACHE:-~/.cache/cocoon-hibernation}`: tools, schemas, old releases, plugin.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("COCOON_CACHE").filter(|d| !d.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    match std::env::var_os("HOME").filter(|h| !h.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache/cocoon-hibernation")),
        None => fail("neither COCOON_CACHE nor HOME is set"),
    }
}

/// `CARGO_TARGET_DIR`, else the cache's `target` (as the Makefile's default).
pub fn target_dir() -> Result<PathBuf> {
    match std::env::var_os("CARGO_TARGET_DIR").filter(|d| !d.is_empty()) {
        Some(dir) => Ok(PathBuf::from(dir)),
        None => Ok(cache_root()?.join("target")),
    }
}

/// The cargo that runs this harness (`CARGO`), with the target dir made explicit and
/// without the variables `cargo run` set for this harness: build scripts watch some (ring's
/// watches CARGO_MANIFEST_DIR), so inheriting them would rebuild the whole tree here and
/// again at the next plain `cargo build`.
pub fn cargo(root: &Path) -> Result<Command> {
    let mut c = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    for (name, _) in std::env::vars_os() {
        if is_cargo_run_var(&name.to_string_lossy()) {
            c.env_remove(name);
        }
    }
    c.current_dir(root).env("CARGO_TARGET_DIR", target_dir()?);
    Ok(c)
}

/// A variable `cargo run` sets for the program it runs (not a setting of cargo's own).
fn is_cargo_run_var(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "OUT_DIR"
        )
}

/// The cargo arguments that select the kubectl plugin's binary: its own package once it
/// has one (crates/kubectl-cocoon), else the root package's bin.
pub fn plugin_package_args(root: &Path) -> Vec<&'static str> {
    if root.join("crates/kubectl-cocoon/Cargo.toml").is_file() {
        vec!["-p", "kubectl-cocoon", "--bin", "kubectl-cocoon"]
    } else {
        vec!["--bin", "kubectl-cocoon"]
    }
}

/// Prints `[tag] msg` on stderr, as the scripts did.
pub fn log(tag: &str, msg: impl AsRef<str>) {
    eprintln!("[{tag}] {}", msg.as_ref());
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// On Ctrl-C the running tool (same process group) stops and its step fails, and no
/// further step starts: the check then removes what it made on a shared control plane
/// instead of dying with it left behind.
pub fn clean_up_on_interrupt() {
    let _ = ctrlc::set_handler(|| {
        INTERRUPTED.store(true, Ordering::SeqCst);
        eprintln!("[xtask] interrupted: cleaning up");
    });
}

fn not_interrupted() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        fail("interrupted")
    } else {
        Ok(())
    }
}

/// Lowercase hex sha256 of `data`.
pub fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(data)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Six random hex digits, so names on a shared control plane never collide.
pub fn random_suffix() -> Result<String> {
    let mut b = [0u8; 3];
    fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| Error(format!("/dev/urandom: {e}")))?;
    Ok(b.iter().map(|b| format!("{b:02x}")).collect())
}

pub fn read(path: &Path) -> Result<String> {
    fs::read_to_string(path).map_err(|e| Error(format!("cannot read {}: {e}", path.display())))
}

pub fn write(path: &Path, text: impl AsRef<[u8]>) -> Result<()> {
    fs::write(path, text).map_err(|e| Error(format!("cannot write {}: {e}", path.display())))
}

pub fn mkdir(path: &Path) -> Result<()> {
    fs::create_dir_all(path).map_err(|e| Error(format!("cannot create {}: {e}", path.display())))
}

/// Runs `cmd`, its stdout shown on our stderr (our stdout is for the summary line).
pub fn run_quiet_stdout(cmd: &mut Command) -> Result<()> {
    cmd::run(cmd.stdout(Stdio::from(std::io::stderr())))
}

/// Runs `cmd` with every output discarded; true when it exited 0 (a probe, not a step).
pub fn succeeds(cmd: &mut Command) -> bool {
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Shows `diff -u a b` on stderr (a human reads it; the caller already knows they differ).
pub fn show_diff(a: &Path, b: &Path) {
    let _ = Command::new("diff")
        .arg("-u")
        .arg(a)
        .arg(b)
        .stdout(Stdio::from(std::io::stderr()))
        .status();
}

/// A scratch directory: removed after a pass, kept (and named) after a failure.
pub struct Work(pub PathBuf);

impl Work {
    pub fn new(prefix: &str) -> Result<Work> {
        let base = std::env::var_os("TMPDIR")
            .filter(|d| !d.is_empty())
            .map_or_else(|| PathBuf::from("/tmp"), PathBuf::from);
        let dir = base.join(format!("{prefix}.{}", random_suffix()?));
        mkdir(&dir)?;
        Ok(Work(dir))
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    pub fn remove(&self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Timed steps and the one summary line: `<name>: PASS (steps) in Ns` or
/// `<name>: FAIL in step 'x' (passed: ...) after Ns; <what> kept in DIR`.
pub struct Steps {
    name: &'static str,
    start: Instant,
    pub current: String,
    passed: Vec<String>,
}

impl Steps {
    pub fn new(name: &'static str) -> Steps {
        Steps {
            name,
            start: Instant::now(),
            current: "setup".into(),
            passed: Vec::new(),
        }
    }

    /// Runs one step, timed and logged.
    pub fn step(&mut self, name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        self.at(name)?;
        let t = Instant::now();
        log(self.name, format!("---- {name}"));
        f()?;
        log(
            self.name,
            format!("---- {name}: ok ({}s)", t.elapsed().as_secs()),
        );
        self.passed.push(name.to_string());
        Ok(())
    }

    /// Names the part now running (for the summary); an error once interrupted.
    pub fn at(&mut self, name: &str) -> Result<()> {
        self.current = name.to_string();
        not_interrupted()
    }

    /// Marks a part as passed without timing it.
    pub fn passed(&mut self, name: &str) {
        self.passed.push(name.to_string());
    }

    pub fn summary(&self, ok: bool, kept: &str, work: &Path) -> String {
        let secs = self.start.elapsed().as_secs();
        if ok {
            format!("{}: PASS ({}) in {secs}s", self.name, self.passed.join(" "))
        } else {
            let passed = if self.passed.is_empty() {
                "none".to_string()
            } else {
                self.passed.join(" ")
            };
            format!(
                "{}: FAIL in step '{}' (passed: {passed}) after {secs}s; {kept} kept in {}",
                self.name,
                self.current,
                work.display()
            )
        }
    }
}

/// The helm, kubeconform, promtool and helm-unittest builds (`cargo xtask tools`,
/// cached by version); their bin dir.
pub fn tools_bin(_root: &Path) -> Result<PathBuf> {
    crate::tools::chart_tools()
}

/// The control plane's binaries (built once, cached); their bin dir.
pub fn control_plane_bin(_root: &Path) -> Result<PathBuf> {
    crate::tools::control_plane(false)
}

/// `KUBECONFIG`, else the one in `COCOON_CLUSTER_ENV`'s env file.
pub fn kubeconfig() -> Result<String> {
    if let Ok(k) = std::env::var("KUBECONFIG")
        && !k.is_empty()
    {
        return Ok(k);
    }
    if let Ok(env) = std::env::var("COCOON_CLUSTER_ENV")
        && !env.is_empty()
    {
        let text = read(Path::new(&env))?;
        if let Some(k) = env_file_value(&text, "KUBECONFIG") {
            return Ok(k.to_string());
        }
        return fail(format!("{env} sets no KUBECONFIG"));
    }
    fail(
        "KUBECONFIG is not set. Start a cluster first (make cluster-up), then set KUBECONFIG \
         or COCOON_CLUSTER_ENV to its env file and run this again (the checks need a real \
         kube-apiserver)",
    )
}

/// `KEY=value` from an env file's text (the cluster's env file has no quoting).
pub fn env_file_value<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// `KUBECTL`, else the newest kubectl in the control plane's cache, else PATH.
pub fn find_kubectl() -> Result<PathBuf> {
    if let Some(k) = std::env::var_os("KUBECTL").filter(|k| !k.is_empty()) {
        return Ok(PathBuf::from(k));
    }
    let mut cached: Vec<PathBuf> = fs::read_dir(cache_root()?.join("bin"))
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("k8s-"))
                .map(|e| e.path().join("kubectl"))
                .filter(|p| p.is_file())
                .collect()
        })
        .unwrap_or_default();
    cached.sort_by_key(|p| version_key(&p.to_string_lossy()));
    if let Some(k) = cached.pop() {
        return Ok(k);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join("kubectl"))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error("kubectl not found: set KUBECTL or run cargo xtask control-plane".into())
        })
}

/// `sort -V` in short: runs of digits compare as numbers.
fn version_key(s: &str) -> Vec<(u64, String)> {
    let mut out = Vec::new();
    let mut text = String::new();
    let mut digits = String::new();
    for c in s.chars().chain(std::iter::once('\0')) {
        if c.is_ascii_digit() {
            digits.push(c);
        } else {
            if !digits.is_empty() {
                out.push((
                    digits.parse().unwrap_or(u64::MAX),
                    std::mem::take(&mut text),
                ));
                digits.clear();
            }
            text.push(c);
        }
    }
    out.push((0, text));
    out
}

/// The tools the chart checks call, each with KUBECONFIG (and helm its plugins) set.
pub struct Tools {
    pub bin: PathBuf,
    pub kubectl: PathBuf,
    pub kubeconfig: String,
}

impl Tools {
    pub fn helm(&self) -> Command {
        let mut c = Command::new(self.bin.join("helm"));
        c.env("KUBECONFIG", &self.kubeconfig)
            .env("HELM_PLUGINS", self.bin.join("helm-plugins"));
        c
    }

    pub fn kubectl(&self) -> Command {
        let mut c = Command::new(&self.kubectl);
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    pub fn tool(&self, name: &str) -> Command {
        Command::new(self.bin.join(name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_variables_cargo_run_sets_are_dropped_for_nested_cargo() {
        for v in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION_MAJOR",
            "OUT_DIR",
        ] {
            assert!(is_cargo_run_var(v), "{v}");
        }
        for v in [
            "CARGO_TARGET_DIR",
            "CARGO_HOME",
            "CARGO_BUILD_JOBS",
            "CARGO_TERM_COLOR",
            "CARGO",
        ] {
            assert!(!is_cargo_run_var(v), "{v}");
        }
    }

    #[test]
    fn env_file_values_are_found_by_exact_key() {
        let text = "KUBECONFIG_X=no\nKUBECONFIG=/a/kubeconfig\nCOCOON_NODE=0\n";
        assert_eq!(env_file_value(text, "KUBECONFIG"), Some("/a/kubeconfig"));
        assert_eq!(env_file_value(text, "COCOON_NODE"), Some("0"));
        assert_eq!(env_file_value(text, "MISSING"), None);
    }

    #[test]
    fn the_newest_cached_kubectl_sorts_last() {
        let mut v = [
            "/c/bin/k8s-v1.34.4-etcd-v3.6.16/kubectl",
            "/c/bin/k8s-v1.30.14-etcd-v3.5.21/kubectl",
            "/c/bin/k8s-v1.34.10-etcd-v3.6.16/kubectl",
        ];
        v.sort_by_key(|p| version_key(p));
        assert_eq!(v.last(), Some(&"/c/bin/k8s-v1.34.10-etcd-v3.6.16/kubectl"));
    }

    #[test]
    fn a_failed_run_names_its_step_and_keeps_its_files() {
        let mut s = Steps::new("chart-check");
        assert!(s.step("one", || Ok(())).is_ok());
        assert!(s.step("two", || fail("no")).is_err());
        let line = s.summary(false, "renders", Path::new("/tmp/w"));
        assert!(
            line.starts_with("chart-check: FAIL in step 'two' (passed: one) after "),
            "{line}"
        );
        assert!(line.ends_with("s; renders kept in /tmp/w"), "{line}");
        let ok = Steps::new("x");
        assert!(
            ok.summary(true, "", Path::new("/"))
                .starts_with("x: PASS () in ")
        );
    }
}
