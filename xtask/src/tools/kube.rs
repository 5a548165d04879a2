//! kube-apiserver, kubectl and etcd (and, for a real node, kubelet,
//! kube-controller-manager and kube-scheduler), built from the Go module proxy into
//! `<cache>/bin/k8s-<K8S_VERSION>-etcd-<ETCD_VERSION>`. A `KUBEBUILDER_ASSETS` dir holding
//! them wins, then the `PATH` entry holding kube-apiserver when it has them all.
//! `K8S_VERSION` and `ETCD_VERSION` pick other versions.

use super::{env_nonempty, go, is_executable, log, mkdir, write};
use crate::cmd::{self, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const K8S_VERSION: &str = "v1.34.4";
pub const ETCD_VERSION: &str = "v3.6.16";
const BASE: [&str; 3] = ["kube-apiserver", "etcd", "kubectl"];
const NODE: [&str; 3] = ["kubelet", "kube-controller-manager", "kube-scheduler"];
const TAG: &str = "build-control-plane";

fn has_all(dir: &Path, node: bool) -> bool {
    let node_bins: &[&str] = if node { &NODE } else { &[] };
    BASE.iter()
        .chain(node_bins)
        .all(|b| is_executable(&dir.join(b)))
}

/// The directory holding the control plane's binaries, building what is missing.
pub fn control_plane(node: bool) -> Result<PathBuf> {
    if let Some(assets) = env_nonempty("KUBEBUILDER_ASSETS") {
        let assets = PathBuf::from(assets);
        if has_all(&assets, node) {
            log(
                TAG,
                format!("using KUBEBUILDER_ASSETS={}", assets.display()),
            );
            return Ok(assets);
        }
        log(
            TAG,
            format!(
                "KUBEBUILDER_ASSETS={} lacks kube-apiserver, etcd or kubectl; building instead",
                assets.display()
            ),
        );
    }
    // Binaries already on PATH win too, unless a version was asked for (`make compat`).
    if env_nonempty("K8S_VERSION").is_none()
        && let Some(dir) = dir_on_path("kube-apiserver")
        && has_all(&dir, node)
    {
        log(
            TAG,
            format!("using the binaries on PATH in {}", dir.display()),
        );
        return Ok(dir);
    }
    let k8s = env_nonempty("K8S_VERSION").unwrap_or_else(|| K8S_VERSION.to_owned());
    let etcd = env_nonempty("ETCD_VERSION").unwrap_or_else(|| ETCD_VERSION.to_owned());
    let cache = super::cache_root()?;
    let out = cache.join("bin").join(format!("k8s-{k8s}-etcd-{etcd}"));
    if has_all(&out, node) {
        log(TAG, format!("cached: {}", out.display()));
        return Ok(out);
    }
    // Two control planes in two state dirs may want the same build at once.
    let _lock = super::lock(&cache.join("bin/.lock"))?;
    if has_all(&out, node) {
        return Ok(out);
    }
    go::need("kube-apiserver and etcd")?;
    mkdir(&out)?;
    let work = cache.join("build");
    if !is_executable(&out.join("etcd")) {
        build_etcd(&work.join(format!("etcd-{etcd}")), &etcd, &out)?;
    }
    if !has_all(&out, node) {
        build_kubernetes(&work.join(format!("kubernetes-{k8s}")), &k8s, &out, node)?;
    }
    if !has_all(&out, node) {
        return cmd::fail(format!(
            "build finished without all binaries in {}",
            out.display()
        ));
    }
    log(TAG, format!("built into {}", out.display()));
    Ok(out)
}

/// The first `PATH` entry holding an executable `name`.
fn dir_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find(|dir| is_executable(&dir.join(name)))
}

/// `go` in `dir` with CGO off and modules resolved on the fly (the caller's GOFLAGS kept).
fn go_in(dir: &Path) -> Command {
    let mut go = Command::new("go");
    let flags = env_nonempty("GOFLAGS").unwrap_or_default();
    go.current_dir(dir)
        .env("CGO_ENABLED", "0")
        .env("GOFLAGS", format!("{flags} -mod=mod"));
    go
}

/// `go mod tidy` may complain about test-only imports of the wrapped module; the build
/// that follows says whether it matters.
fn tidy(dir: &Path) {
    let _ = go_in(dir).args(["mod", "tidy"]).output();
}

fn build_etcd(dir: &Path, version: &str, out: &Path) -> Result<()> {
    mkdir(dir)?;
    write(
        &dir.join("go.mod"),
        &format!(
            "module local/etcd-build\n\ngo 1.24\n\nrequire go.etcd.io/etcd/server/v3 {version}\n"
        ),
    )?;
    write(
        &dir.join("tools.go"),
        "//go:build tools\n\npackage tools\n\nimport _ \"go.etcd.io/etcd/server/v3\"\n",
    )?;
    tidy(dir);
    log(TAG, format!("building etcd {version}"));
    cmd::run(
        go_in(dir)
            .args(["build", "-trimpath", "-ldflags", "-s -w", "-o"])
            .arg(out.join("etcd"))
            .arg("go.etcd.io/etcd/server/v3"),
    )
}

/// The wrapper module's go.mod: upstream's go and godebug lines, and each staging module
/// upstream maps to ./staging mapped to its published v0.x.y.
pub fn wrapper_go_mod(upstream: &str, k8s_version: &str) -> String {
    let staging = format!("v0.{}", k8s_version.trim_start_matches("v1."));
    let line = |prefix: &str| upstream.lines().find(|l| l.starts_with(prefix));
    let mut text = String::from("module local/kubernetes-build\n\n");
    if let Some(go) = line("go ") {
        text.push_str(go);
        text.push('\n');
    }
    if let Some(godebug) = line("godebug ") {
        text.push_str(godebug);
        text.push('\n');
    }
    text.push_str(&format!(
        "\nrequire k8s.io/kubernetes {k8s_version}\n\nreplace (\n"
    ));
    for l in upstream.lines() {
        let mut words = l.split_whitespace();
        if let (Some(module), Some("=>"), Some(target)) = (words.next(), words.next(), words.next())
            && module.starts_with("k8s.io/")
            && target == format!("./staging/src/{module}")
        {
            text.push_str(&format!("\t{module} => {module} {staging}\n"));
        }
    }
    text.push_str(")\n");
    text
}

fn build_kubernetes(dir: &Path, version: &str, out: &Path, node: bool) -> Result<()> {
    mkdir(dir)?;
    let upstream = go::mod_download(dir, &format!("k8s.io/kubernetes@{version}"), "GoMod")?;
    let upstream = std::fs::read_to_string(&upstream).map_err(|e| {
        cmd::Error(format!(
            "cannot download k8s.io/kubernetes@{version}: {upstream}: {e}"
        ))
    })?;
    write(&dir.join("go.mod"), &wrapper_go_mod(&upstream, version))?;
    let mut tools = String::from("//go:build tools\n\npackage tools\n\nimport (\n");
    for c in [
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kubelet",
    ] {
        tools.push_str(&format!("\t_ \"k8s.io/kubernetes/cmd/{c}\"\n"));
    }
    tools.push_str(")\n");
    write(&dir.join("tools.go"), &tools)?;
    tidy(dir);
    let minor = version
        .trim_start_matches("v1.")
        .split('.')
        .next()
        .unwrap_or_default();
    // Without the version flags the apiserver reports v0.0.0 and clients refuse it.
    let ld = format!(
        "-s -w -X k8s.io/component-base/version.gitVersion={version} \
         -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor={minor} \
         -X k8s.io/client-go/pkg/version.gitVersion={version}"
    );
    let node_bins: &[&str] = if node { &NODE } else { &[] };
    for c in ["kube-apiserver", "kubectl"].iter().chain(node_bins) {
        if is_executable(&out.join(c)) {
            continue;
        }
        log(
            TAG,
            format!("building {c} {version} (slow on a cold cache)"),
        );
        cmd::run(
            go_in(dir)
                .args(["build", "-trimpath", "-ldflags", &ld, "-o"])
                .arg(out.join(c))
                .arg(format!("k8s.io/kubernetes/cmd/{c}")),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wrapper_maps_each_staging_module_to_its_published_version() {
        let upstream = "module k8s.io/kubernetes\n\ngo 1.24.0\n\ngodebug default=go1.24\n\nrequire (\n\tk8s.io/api v0.0.0\n)\n\nreplace (\n\tk8s.io/api => ./staging/src/k8s.io/api\n\tk8s.io/client-go => ./staging/src/k8s.io/client-go\n\tgithub.com/x/y => github.com/x/z v1.0.0\n)\n";
        assert_eq!(
            wrapper_go_mod(upstream, "v1.34.4"),
            "module local/kubernetes-build\n\ngo 1.24.0\ngodebug default=go1.24\n\nrequire k8s.io/kubernetes v1.34.4\n\nreplace (\n\tk8s.io/api => k8s.io/api v0.34.4\n\tk8s.io/client-go => k8s.io/client-go v0.34.4\n)\n"
        );
    }
}
