//! The image's root filesystem, staged by hack/image.sh and run with only what it holds.

use super::text::*;
use super::{Check, TAG};
use crate::chart::{log, read, run_quiet_stdout, write};
use crate::cmd::{self, Error, Result, fail};
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Directories under `dir` holding a `*.so*` entry (symlinked directories not followed).
fn library_dirs(dir: &Path, out: &mut BTreeSet<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().contains(".so") {
            out.insert(dir.to_path_buf());
        }
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            library_dirs(&e.path(), out);
        }
    }
}

impl Check<'_> {
    /// The image recipe without buildah or a release build: stage the rootfs around the
    /// debug binary (same libraries) and run it with the staged loader and libraries only.
    pub(super) fn image_rootfs(&self) -> Result<()> {
        let image_sh = self.root.join("hack/image.sh");
        let usage = cmd::output(Command::new("bash").arg(&image_sh).arg("--help"))?;
        if !usage.lines().any(|l| l.starts_with("usage: hack/image.sh")) {
            return fail("hack/image.sh --help printed no usage");
        }
        let bin = match std::env::var_os("COCOON_BIN").filter(|b| !b.is_empty()) {
            Some(b) => PathBuf::from(b),
            None => {
                cmd::run(crate::chart::cargo(&self.root)?.args([
                    "build",
                    "-q",
                    "--locked",
                    "--bin",
                    "cocoon-hibernation",
                ]))?;
                cmd::run(
                    crate::chart::cargo(&self.root)?
                        .args(["build", "-q", "--locked"])
                        .args(crate::chart::plugin_package_args(&self.root)),
                )?;
                crate::chart::target_dir()?.join("debug/cocoon-hibernation")
            }
        };
        let image = self.w("image");
        run_quiet_stdout(
            Command::new("bash")
                .arg(&image_sh)
                .arg("stage")
                .arg(&image)
                .env("IMAGE_BIN", &bin),
        )?;
        let r = image.join("rootfs");
        for f in [
            "cocoon-hibernation",
            "usr/local/bin/kubectl-cocoon",
            "etc/ssl/certs/ca-certificates.crt",
            "etc/passwd",
            "etc/group",
        ] {
            if fs::metadata(r.join(f)).map_or(true, |m| m.len() == 0) {
                return fail(format!("the staged rootfs has no /{f}"));
            }
        }
        if !r.join("tmp").is_dir() {
            return fail("the staged rootfs has no /tmp");
        }
        if !read(&r.join("etc/passwd"))?
            .lines()
            .any(|l| l == "nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin")
        {
            return fail("no user 65532 in the staged /etc/passwd");
        }
        if !read(&r.join("etc/group"))?
            .lines()
            .any(|l| l == "nonroot:x:65532:")
        {
            return fail("no group 65532 in the staged /etc/group");
        }
        let mut loaders: Vec<PathBuf> = fs::read_dir(r.join("lib64"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name()
                    .map(|n| n.to_string_lossy())
                    .is_some_and(|n| n.starts_with("ld-linux-") && n.contains(".so."))
            })
            .collect();
        loaders.sort();
        let Some(loader) = loaders.first() else {
            return fail(format!("no dynamic loader in {}/lib64", r.display()));
        };
        let mut dirs = BTreeSet::new();
        library_dirs(&r, &mut dirs);
        let libdirs = dirs
            .iter()
            .map(|d| d.to_string_lossy().into_owned())
            .collect::<Vec<_>>()
            .join(":");
        let staged = |args: &[&Path]| {
            let mut c = Command::new(loader);
            c.args(["--inhibit-cache", "--library-path", &libdirs]);
            for a in args {
                c.arg(a);
            }
            c
        };
        let server = r.join("cocoon-hibernation");
        let plugin = r.join("usr/local/bin/kubectl-cocoon");
        // Every library resolves inside the rootfs, then the binary runs on them.
        let mut ldd = cmd::output(&mut staged(&[Path::new("--list"), &server]))?;
        ldd.push_str(&cmd::output(&mut staged(&[Path::new("--list"), &plugin]))?);
        write(&image.join("ldd.txt"), &ldd)?;
        let outside = outside_rootfs(&ldd, &r);
        if !outside.is_empty() {
            return fail(format!(
                "a library resolved outside the staged rootfs: {}",
                outside.join("; ")
            ));
        }
        if cmd::output(&mut staged(&[&server, Path::new("crd")]))? != read(&self.crd_file)? {
            return fail("the staged binary's 'crd' differs from the chart's CRD");
        }
        // The plugin users copy out of the image (docs/install.md) runs on the same
        // libraries.
        let help = cmd::output(&mut staged(&[&plugin, Path::new("--help")]))
            .map_err(|e| Error(format!("the staged kubectl-cocoon --help failed: {e}")))?;
        if !help
            .lines()
            .any(|l| l.starts_with("Usage: kubectl cocoon "))
        {
            let head: String = help.chars().take(500).collect();
            return fail(format!(
                "the staged kubectl-cocoon printed no usage: {head}"
            ));
        }
        let size = cmd::output(Command::new("du").arg("-sh").arg(&r))?;
        log(
            TAG,
            format!(
                "staged rootfs: {}, {} objects loaded from it",
                size.split_whitespace().next().unwrap_or("?"),
                ldd.lines().count()
            ),
        );
        Ok(())
    }
}
