//! `cargo xtask old-release`: the previous release, for the install suite's upgrade
//! (tests/e2e_install/upgrade.rs): its chart and its image, from the one pinned commit.
//! The source comes from git (`git archive`; a fresh clone has the history); the release
//! binary is built once with a target dir of its own and cached by commit, so later runs
//! only rebuild the image. Cache: `${COCOON_CACHE:-~/.cache/cocoon-hibernation}/
//! old-release/<commit>/` (src/, target/ and the finished binary). The cold build took
//! 26m13s wall (8m41s CPU) on a 2-core machine busy with other builds; a cached one takes
//! no time. Runs unattended (CI=true, no stdin).

use super::{cache_root, cargo, log, mkdir};
use crate::cmd::{self, Error, Result, fail};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The previous release: chart 0.4.0. Pinned here only; everything else asks this module.
pub const COMMIT: &str = "f7064839ce863a7d3c44ba2de8a3334dede36002";

const TAG: &str = "old-release";

#[derive(clap::Subcommand)]
pub enum Action {
    /// Prints the pinned commit (full hash).
    Commit,
    /// Builds (or reuses) the old release binary; prints its path last.
    Build,
    /// Writes the old chart into DIR/cocoon-hibernation; prints that path last.
    Chart { dir: PathBuf },
    /// The old image, pushed like `make image` (needs IMAGE_REGISTRY or a cluster env
    /// file); the last line as hack/image.sh's: `image: <repo>:<tag>@sha256:… size_mb=…`.
    Image,
}

pub fn run(root: &Path, action: Action) -> Result<()> {
    let cache = cache_root()?.join("old-release").join(COMMIT);
    match action {
        Action::Commit => println!("{COMMIT}"),
        Action::Build => println!("{}", build(root, &cache)?.display()),
        Action::Chart { dir } => println!("{}", chart(root, &dir)?.display()),
        Action::Image => image(root, &cache)?,
    }
    Ok(())
}

fn have_commit(root: &Path) -> Result<()> {
    let ok = super::succeeds(Command::new("git").arg("-C").arg(root).args([
        "cat-file",
        "-e",
        &format!("{COMMIT}^{{commit}}"),
    ]));
    if ok {
        Ok(())
    } else {
        fail(format!(
            "commit {COMMIT} is not in this clone: git fetch --unshallow (a shallow clone lacks it)"
        ))
    }
}

/// `git archive COMMIT [paths] | tar -x -C dir [tar args]`, through a file.
fn unpack(root: &Path, dir: &Path, paths: &[&str], tar_args: &[&str]) -> Result<()> {
    mkdir(dir)?;
    let tarball = dir.join(".archive.tar");
    cmd::run(
        Command::new("git")
            .arg("-C")
            .arg(root)
            .args(["archive", "--format=tar", "-o"])
            .arg(&tarball)
            .arg(COMMIT)
            .args(paths),
    )?;
    let out = cmd::run(
        Command::new("tar")
            .arg("-x")
            .arg("-f")
            .arg(&tarball)
            .arg("-C")
            .arg(dir)
            .args(tar_args),
    );
    let _ = fs::remove_file(&tarball);
    out
}

/// The old tree's source, unpacked once (a finished unpack leaves .done).
fn old_source(root: &Path, cache: &Path) -> Result<PathBuf> {
    let src = cache.join("src");
    if !src.join(".done").is_file() {
        have_commit(root)?;
        let _ = fs::remove_dir_all(&src);
        unpack(root, &src, &[], &[])?;
        super::write(&src.join(".done"), "")?;
    }
    Ok(src)
}

/// The old release binary, built once per commit.
pub fn build(root: &Path, cache: &Path) -> Result<PathBuf> {
    let bin = cache.join("cocoon-hibernation");
    if bin.is_file() {
        log(TAG, format!("cached: {}", bin.display()));
        return Ok(bin);
    }
    let src = old_source(root, cache)?;
    let target = cache.join("target");
    let t = Instant::now();
    log(
        TAG,
        format!(
            "cold build of {}'s release binary (CARGO_TARGET_DIR={}); it takes minutes",
            &COMMIT[..7],
            target.display()
        ),
    );
    cmd::run(cargo(&src)?.env("CARGO_TARGET_DIR", &target).args([
        "build",
        "--release",
        "--locked",
        "--bin",
        "cocoon-hibernation",
    ]))
    .map_err(|e| Error(format!("cargo build of {COMMIT} failed: {e}")))?;
    // Copied out, then renamed: the cache holds a binary only once it is whole.
    let tmp = cache.join("cocoon-hibernation.tmp");
    fs::copy(target.join("release/cocoon-hibernation"), &tmp)
        .and_then(|_| fs::rename(&tmp, &bin))
        .map_err(|e| Error(format!("cannot install {}: {e}", bin.display())))?;
    log(TAG, format!("built in {}s", t.elapsed().as_secs()));
    Ok(bin)
}

/// The old chart, into `dir/cocoon-hibernation`.
pub fn chart(root: &Path, dir: &Path) -> Result<PathBuf> {
    have_commit(root)?;
    let out = dir.join("cocoon-hibernation");
    let _ = fs::remove_dir_all(&out);
    unpack(
        root,
        dir,
        &["charts/cocoon-hibernation"],
        &["--strip-components=1"],
    )?;
    if !out.join("Chart.yaml").is_file() {
        return fail(format!("no chart at {COMMIT}"));
    }
    // An absolute path, as the script printed one for an absolute DIR.
    Ok(std::path::absolute(&out).unwrap_or(out))
}

/// The old tree's own image.sh (its Dockerfile and labels) on the cached binary, tagged by
/// commit so it never replaces this tree's tag; its timestamps are the commit's.
fn image(root: &Path, cache: &Path) -> Result<()> {
    let bin = build(root, cache)?;
    let src = old_source(root, cache)?;
    let epoch = cmd::output(Command::new("git").arg("-C").arg(root).args([
        "log",
        "-1",
        "--format=%ct",
        COMMIT,
    ]))?;
    cmd::run(
        Command::new("bash")
            .arg(src.join("hack/image.sh"))
            .arg("build")
            .env("IMAGE_BIN", &bin)
            .env("IMAGE_TAG", format!("old-{}", &COMMIT[..12]))
            .env("SOURCE_DATE_EPOCH", epoch.trim()),
    )
}
