//! `cargo xtask plugin`: the kubectl plugin as users get it: `make plugin` (build),
//! `make plugin-dist` (the linux/amd64 tarball and the krew manifest), and the krew test.

use super::{cache_root, cargo, log, mkdir, read, sha256_hex, target_dir, write};
use crate::cmd::{self, Error, Result, fail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

const TAG: &str = "plugin";
const KREW_VERSION: &str = "v0.4.3";

#[derive(clap::Subcommand)]
pub enum Action {
    /// (make plugin) The release kubectl-cocoon, copied into DIR (default $PLUGIN_DIR,
    /// else ~/.cache/cocoon-hibernation/plugin); prints where it is and the line that puts
    /// it on PATH.
    Build { dir: Option<PathBuf> },
    /// (make plugin-dist) DIR (default ~/.cache/cocoon-hibernation/plugin-dist) gets
    /// kubectl-cocoon_v<version>_linux_amd64.tar.gz and cocoon.yaml, the krew manifest
    /// (krew/cocoon.yaml) with that tarball's sha256.
    Dist { dir: Option<PathBuf> },
    /// Builds krew ($KREW_VERSION, default v0.4.3) from the Go module proxy (cached in
    /// ~/.cache/cocoon-hibernation/tools), installs the dist tarball with `kubectl krew
    /// install --manifest --archive` into a temporary KREW_ROOT without a network (a
    /// network namespace of its own), and runs `kubectl cocoon --help` through the
    /// installed copy.
    KrewTest,
}

pub fn run(root: &Path, action: Action) -> Result<()> {
    match action {
        Action::Build { dir } => build(root, dir),
        Action::Dist { dir } => {
            let out = match dir {
                Some(d) => d,
                None => cache_root()?.join("plugin-dist"),
            };
            let d = dist(root, &out)?;
            println!("tarball: {}", d.tarball.display());
            println!("sha256: {}", d.sha256);
            println!("manifest: {}", d.manifest.display());
            Ok(())
        }
        Action::KrewTest => krew_test(root),
    }
}

/// The first `version = "..."` of Cargo.toml.
pub fn cargo_version(manifest: &str) -> Option<&str> {
    manifest.lines().find_map(|l| {
        l.strip_prefix("version = \"")?
            .strip_suffix('"')
            .filter(|v| !v.is_empty())
    })
}

fn release_bin(root: &Path) -> Result<PathBuf> {
    let target = target_dir()?;
    log(
        TAG,
        format!(
            "cargo build --release kubectl-cocoon (CARGO_TARGET_DIR={})",
            target.display()
        ),
    );
    cmd::run(
        cargo(root)?
            .args(["build", "--release", "--locked"])
            .args(super::plugin_package_args(root)),
    )?;
    let bin = target.join("release/kubectl-cocoon");
    if !bin.is_file() {
        return fail(format!("cargo built no {}", bin.display()));
    }
    Ok(bin)
}

/// Copies `from` to `to` with the given mode.
fn install(from: &Path, to: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::copy(from, to)
        .and_then(|_| fs::set_permissions(to, fs::Permissions::from_mode(mode)))
        .map(|_| ())
        .map_err(|e| {
            Error(format!(
                "cannot copy {} to {}: {e}",
                from.display(),
                to.display()
            ))
        })
}

fn absolute(dir: &Path) -> Result<PathBuf> {
    mkdir(dir)?;
    fs::canonicalize(dir).map_err(|e| Error(format!("{}: {e}", dir.display())))
}

fn build(root: &Path, dir: Option<PathBuf>) -> Result<()> {
    let dir = match dir.or_else(|| std::env::var_os("PLUGIN_DIR").map(PathBuf::from)) {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => cache_root()?.join("plugin"),
    };
    let bin = release_bin(root)?;
    let dir = absolute(&dir)?;
    install(&bin, &dir.join("kubectl-cocoon"), 0o755)?;
    println!("kubectl-cocoon: {}", dir.join("kubectl-cocoon").display());
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|p| p == dir) {
        println!(
            "{} is on PATH already: kubectl cocoon --help",
            dir.display()
        );
    } else {
        println!("put it on PATH (then: kubectl cocoon --help):");
        println!("export PATH=\"{}:$PATH\"", dir.display());
    }
    Ok(())
}

pub struct Dist {
    pub tarball: PathBuf,
    pub sha256: String,
    pub manifest: PathBuf,
    pub bin: PathBuf,
}

/// krew/cocoon.yaml with the version and the tarball's sha256 filled in (`@SHA256@` once
/// per line, as the manifest has it once).
pub fn manifest(template: &str, version: &str, sha: &str) -> Result<String> {
    let mut out = String::new();
    for line in template.split_inclusive('\n') {
        out.push_str(
            &line
                .replace("@VERSION@", version)
                .replacen("@SHA256@", sha, 1),
        );
    }
    if let Some(p) = placeholder(&out) {
        return fail(format!("a placeholder is left in the krew manifest: {p}"));
    }
    Ok(out)
}

/// The first `@[A-Z0-9]*@` in `text`.
fn placeholder(text: &str) -> Option<&str> {
    let mut rest = text;
    let mut offset = 0;
    while let Some(i) = rest.find('@') {
        let after = &rest[i + 1..];
        let n = after
            .bytes()
            .take_while(|b| b.is_ascii_uppercase() || b.is_ascii_digit())
            .count();
        if after.as_bytes().get(n) == Some(&b'@') {
            let start = offset + i;
            return Some(&text[start..start + n + 2]);
        }
        offset += i + 1;
        rest = after;
    }
    None
}

pub fn dist(root: &Path, out: &Path) -> Result<Dist> {
    let version = match cargo_version(&read(&root.join("Cargo.toml"))?) {
        Some(v) => format!("v{v}"),
        None => return fail("no version in Cargo.toml"),
    };
    if std::env::consts::ARCH != "x86_64" {
        return fail(format!(
            "the dist tarball is linux/amd64; this machine is {}",
            std::env::consts::ARCH
        ));
    }
    let bin = release_bin(root)?;
    let out = absolute(out)?;
    let stage = out.join(".stage");
    let _ = fs::remove_dir_all(&stage);
    mkdir(&stage)?;
    install(&bin, &stage.join("kubectl-cocoon"), 0o755)?;
    install(&root.join("LICENSE"), &stage.join("LICENSE"), 0o644)?;
    let tarball = out.join(format!("kubectl-cocoon_{version}_linux_amd64.tar.gz"));
    // Same binary, same bytes: fixed order, owner and times, no gzip name or time.
    let epoch =
        cmd::output(
            Command::new("git")
                .arg("-C")
                .arg(root)
                .args(["log", "-1", "--format=%ct"]),
        )
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "0".into());
    let tar = stage.join("plugin.tar");
    cmd::run(
        Command::new("tar")
            .arg("-C")
            .arg(&stage)
            .args(["--sort=name", &format!("--mtime=@{epoch}")])
            .args(["--owner=0", "--group=0", "--numeric-owner", "-cf"])
            .arg(&tar)
            .args(["LICENSE", "kubectl-cocoon"]),
    )?;
    let gz = fs::File::create(&tarball)
        .map_err(|e| Error(format!("cannot write {}: {e}", tarball.display())))?;
    cmd::run(
        Command::new("gzip")
            .args(["-n", "-9", "-c"])
            .arg(&tar)
            .stdout(Stdio::from(gz)),
    )?;
    let _ = fs::remove_dir_all(&stage);
    let bytes =
        fs::read(&tarball).map_err(|e| Error(format!("cannot read {}: {e}", tarball.display())))?;
    let sha256 = sha256_hex(&bytes);
    let manifest_path = out.join("cocoon.yaml");
    write(
        &manifest_path,
        manifest(&read(&root.join("krew/cocoon.yaml"))?, &version, &sha256)?,
    )?;
    Ok(Dist {
        tarball,
        sha256,
        manifest: manifest_path,
        bin,
    })
}

/// The cached krew, built from the Go module proxy if missing.
fn krew_bin(version: &str) -> Result<PathBuf> {
    let dir = cache_root()?.join("tools").join(format!("krew-{version}"));
    let krew = dir.join("krew");
    if krew.is_file() {
        return Ok(krew);
    }
    if !super::succeeds(Command::new("go").arg("version")) {
        return fail("go is required to build krew (install Go >= 1.24)");
    }
    log(TAG, format!("building sigs.k8s.io/krew/cmd/krew@{version}"));
    mkdir(&dir)?;
    let built = cmd::run(
        Command::new("go")
            .current_dir(&dir)
            .env("CGO_ENABLED", "0")
            .env("GOBIN", &dir)
            .env("GOFLAGS", "-buildvcs=false")
            .args(["install", "-trimpath"])
            .arg(format!(
                "-ldflags=-s -w -X sigs.k8s.io/krew/internal/version.gitTag={version}"
            ))
            .arg(format!("sigs.k8s.io/krew/cmd/krew@{version}"))
            .stdout(Stdio::from(std::io::stderr())),
    );
    if let Err(e) = built {
        let _ = fs::remove_dir_all(&dir);
        return fail(format!("building krew failed: {e}"));
    }
    if !krew.is_file() {
        return fail(format!("go install left no {}", krew.display()));
    }
    Ok(krew)
}

fn krew_test(root: &Path) -> Result<()> {
    let t = Instant::now();
    let version = std::env::var("KREW_VERSION")
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| KREW_VERSION.into());
    // The tests' kubectl (built and cached like the control plane): no host kubectl needed.
    let kube_bin = super::control_plane_bin(root)?;
    if !super::succeeds(Command::new("unshare").arg("--version")) {
        return fail("unshare not found: apt-get install -y util-linux");
    }
    let krew = krew_bin(&version)?;
    let work = super::Work::new("plugin-krew-test")?;
    let result = krew_install(root, &work.0, &krew, &kube_bin);
    work.remove();
    result?;
    println!(
        "plugin: krew {version} installed cocoon offline; kubectl cocoon --help ok in {}s",
        t.elapsed().as_secs()
    );
    Ok(())
}

fn krew_install(root: &Path, work: &Path, krew: &Path, kube_bin: &Path) -> Result<()> {
    let d = dist(root, &work.join("dist"))?;
    let krew_root = work.join("krew");
    // A network namespace of its own (loopback only, down): krew cannot reach anything.
    let install = Command::new("unshare")
        .args(["--map-root-user", "--net"])
        .arg(krew)
        .arg("install")
        .arg(format!("--manifest={}", d.manifest.display()))
        .arg(format!("--archive={}", d.tarball.display()))
        .env("KREW_ROOT", &krew_root)
        .env("KREW_NO_UPGRADE_CHECK", "1")
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error(format!("could not start unshare: {e}")))?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&install.stdout),
        String::from_utf8_lossy(&install.stderr)
    );
    if !install.status.success() {
        return fail(format!("krew install --manifest --archive failed: {said}"));
    }
    // krew's receipt of the install (`krew list` needs an index, which this test has none of).
    let receipt = read(&krew_root.join("receipts/cocoon.yaml")).unwrap_or_default();
    if !receipt.lines().any(|l| l == "  name: cocoon") {
        return fail(format!("krew wrote no receipt for cocoon: {said}"));
    }
    // kubectl finds the krew-installed copy, and it is the tarball's binary.
    let path = std::env::join_paths(
        [krew_root.join("bin"), kube_bin.to_path_buf()]
            .into_iter()
            .chain(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            )),
    )
    .map_err(|e| Error(format!("PATH: {e}")))?;
    let kubectl = |args: &[&str]| {
        Command::new(kube_bin.join("kubectl"))
            .args(args)
            .env("PATH", &path)
            .output()
    };
    let installed = krew_root.join("bin/kubectl-cocoon");
    let list = kubectl(&["plugin", "list"])
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    if !list.lines().any(|l| Path::new(l) == installed) {
        return fail(format!(
            "kubectl plugin list does not show {}: {list}",
            installed.display()
        ));
    }
    let same = fs::canonicalize(&installed)
        .and_then(fs::read)
        .ok()
        .zip(fs::read(&d.bin).ok())
        .is_some_and(|(a, b)| a == b);
    if !same {
        return fail("the installed kubectl-cocoon is not the one built");
    }
    let help = match kubectl(&["cocoon", "--help"]) {
        Ok(o) if o.status.success() => String::from_utf8_lossy(&o.stdout).into_owned(),
        _ => return fail("kubectl cocoon --help failed"),
    };
    for cmd in ["hibernate", "wake", "status", "orphans", "schedule"] {
        if !help.lines().any(|l| l.starts_with(&format!("  {cmd} "))) {
            return fail(format!("kubectl cocoon --help does not list {cmd}: {help}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_is_cargo_tomls_first() {
        let toml =
            "[package]\nname = \"x\"\nversion = \"0.1.0\"\n[dependencies]\nversion = \"2\"\n";
        assert_eq!(cargo_version(toml), Some("0.1.0"));
        assert_eq!(cargo_version("[package]\nname = \"x\"\n"), None);
    }

    #[test]
    fn the_manifest_gets_version_and_sha_and_no_placeholder_stays() {
        let m = manifest(
            "version: @VERSION@\nuri: x/@VERSION@/a.tar.gz\nsha256: @SHA256@\n",
            "v1.2.3",
            "abc",
        );
        assert_eq!(
            m.ok().as_deref(),
            Some("version: v1.2.3\nuri: x/v1.2.3/a.tar.gz\nsha256: abc\n")
        );
        let left = manifest("a: @VERSION@\nb: @OTHER1@\n", "v1", "s").err();
        assert!(
            left.as_ref().is_some_and(|e| e.0.contains("@OTHER1@")),
            "{left:?}"
        );
        assert_eq!(placeholder("mail@example.com and @x@"), None);
        assert_eq!(placeholder("a @@ b"), Some("@@"));
    }
}
