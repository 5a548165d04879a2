//! The chart checks' tools: helm, kubeconform, the helm-unittest plugin and promtool, each
//! built once into `<cache>/tools/<name>-<version>/<name>` and linked into one bin dir per
//! version set, `<cache>/tools/bin-helm-<v>-kubeconform-<v>-unittest-<v>-promtool-<v>/`.
//! helm-unittest is laid out as a Helm plugin in `<bin>/helm-plugins`
//! (`HELM_PLUGINS=<bin>/helm-plugins helm unittest CHART`). Versions: `HELM_VERSION`,
//! `HELM_V4_VERSION`, `KUBECONFORM_VERSION`, `HELM_UNITTEST_VERSION`, `PROMTOOL_VERSION`.

use super::{env_nonempty, go, is_executable, log, mkdir, write};
use crate::cmd::{self, Result};
use std::path::{Path, PathBuf};
use std::process::Command;

const TAG: &str = "install-tools";

fn version(key: &str, default: &str) -> String {
    env_nonempty(key).unwrap_or_else(|| default.to_owned())
}

/// One Go tool to build.
struct Tool<'a> {
    name: &'a str,
    version: &'a str,
    /// `pkg@version` for `go install`, or a package path inside `module`.
    pkg: String,
    ldflags: String,
    /// Built inside this module's source: its go.mod has replace directives, which
    /// `go install pkg@version` refuses.
    module: Option<&'a str>,
    tags: &'a str,
}

/// Builds `tool` into `<tools>/<name>-<version>` unless there; returns that dir.
fn go_install(tools: &Path, tool: &Tool) -> Result<PathBuf> {
    let dir = tools.join(format!("{}-{}", tool.name, tool.version));
    if is_executable(&dir.join(tool.name)) {
        log(TAG, format!("cached: {}", dir.join(tool.name).display()));
        return Ok(dir);
    }
    go::need(tool.name)?;
    log(
        TAG,
        format!("building {} (a few minutes on a cold Go cache)", tool.pkg),
    );
    mkdir(&dir)?;
    let started = std::time::Instant::now();
    let ldflags = format!("-s -w {}", tool.ldflags);
    let tags = format!("-tags={}", tool.tags);
    let built = match tool.module {
        Some(module) => go::mod_download(tools, &format!("{module}@{}", tool.version), "Dir")
            .and_then(|src| {
                let pkg = tool.pkg.strip_prefix(module).unwrap_or(&tool.pkg);
                cmd::run(
                    Command::new("go")
                        .current_dir(src)
                        .env("CGO_ENABLED", "0")
                        .env("GOFLAGS", "-buildvcs=false -mod=readonly")
                        .args(["build", "-trimpath", &tags, "-ldflags", &ldflags, "-o"])
                        .arg(dir.join(tool.name))
                        .arg(format!(".{pkg}")),
                )
            }),
        // A clean GOFLAGS: a caller's -mod=vendor or similar must not leak into go install.
        None => cmd::run(
            Command::new("go")
                .current_dir(tools)
                .env("CGO_ENABLED", "0")
                .env("GOBIN", &dir)
                .env("GOFLAGS", "-buildvcs=false")
                .args([
                    "install",
                    "-trimpath",
                    &tags,
                    "-ldflags",
                    &ldflags,
                    &tool.pkg,
                ]),
        ),
    };
    match built {
        Ok(()) if is_executable(&dir.join(tool.name)) => {
            log(
                TAG,
                format!(
                    "built {} {} in {}s",
                    tool.name,
                    tool.version,
                    started.elapsed().as_secs()
                ),
            );
            Ok(dir)
        }
        other => {
            let _ = std::fs::remove_dir_all(&dir);
            other.and_then(|()| cmd::fail(format!("{} built no binary", tool.name)))
        }
    }
}

/// What helm's Makefile sets: without the Kubernetes version flags `helm template`
/// assumes Kubernetes v1.20 and refuses charts needing newer.
pub fn helm_ldflags(major: &str, version: &str, client_go: &str) -> Option<String> {
    let minor = client_go.strip_prefix("v0.")?.split('.').next()?;
    minor.parse::<u32>().ok()?;
    let p = format!("helm.sh/helm/{major}");
    let x = |var: &str, value: &str| format!(" -X {p}/{var}={value}");
    let mut flags = format!("-X {p}/internal/version.version={version}");
    let vars: &[&str] = if major == "v3" {
        &["pkg/chartutil.k8sVersion", "pkg/lint/rules.k8sVersion"]
    } else {
        &[
            "internal/version.kubeClientVersion",
            "pkg/chart/common.k8sVersion",
            "pkg/chart/v2/lint/rules.k8sVersion",
        ]
    };
    for var in vars {
        flags.push_str(&x(&format!("{var}Major"), "1"));
        flags.push_str(&x(&format!("{var}Minor"), minor));
    }
    Some(flags)
}

fn helm(tools: &Path, major: &str, version: &str) -> Result<PathBuf> {
    let dir = tools.join(format!("helm-{version}"));
    if is_executable(&dir.join("helm")) {
        log(TAG, format!("cached: {}", dir.join("helm").display()));
        return Ok(dir);
    }
    go::need("helm")?;
    let go_mod = go::mod_download(tools, &format!("helm.sh/helm/{major}@{version}"), "GoMod")?;
    let go_mod = std::fs::read_to_string(&go_mod)
        .map_err(|e| cmd::Error(format!("cannot read {go_mod}: {e}")))?;
    let flags = go::required_version(&go_mod, "k8s.io/client-go")
        .and_then(|client_go| helm_ldflags(major, version, &client_go));
    let Some(ldflags) = flags else {
        return cmd::fail(format!("cannot read helm {version}'s client-go version"));
    };
    go_install(
        tools,
        &Tool {
            name: "helm",
            version,
            pkg: format!("helm.sh/helm/{major}/cmd/helm@{version}"),
            ldflags,
            module: None,
            tags: "",
        },
    )
}

/// The bin dir holding helm, kubeconform, promtool and `helm-plugins/unittest`.
pub fn chart_tools() -> Result<PathBuf> {
    let tools = super::cache_root()?.join("tools");
    // One install at a time: test processes and the chart checks share one cache.
    let _lock = super::lock(&tools.join(".lock"))?;
    let helm_v3 = version("HELM_VERSION", "v3.21.4");
    let helm_dir = match helm(&tools, "v3", &helm_v3) {
        Ok(dir) => dir,
        Err(e) => {
            let v4 = version("HELM_V4_VERSION", "v4.3.2");
            log(
                TAG,
                format!("helm {helm_v3} failed to build ({e}); trying helm {v4}"),
            );
            helm(&tools, "v4", &v4)?
        }
    };
    let kubeconform = version("KUBECONFORM_VERSION", "v0.8.0");
    let kubeconform_dir = go_install(
        &tools,
        &Tool {
            name: "kubeconform",
            version: &kubeconform,
            pkg: format!("github.com/yannh/kubeconform/cmd/kubeconform@{kubeconform}"),
            ldflags: format!("-X main.version={kubeconform}"),
            module: None,
            tags: "",
        },
    )?;
    let unittest = version("HELM_UNITTEST_VERSION", "v1.1.2");
    let unittest_bare = unittest.trim_start_matches('v');
    let unittest_dir = go_install(
        &tools,
        &Tool {
            name: "helm-unittest",
            version: &unittest,
            pkg: "github.com/helm-unittest/helm-unittest/cmd/helm-unittest".to_owned(),
            ldflags: format!(
                "-X github.com/helm-unittest/helm-unittest/internal/build.version={unittest_bare}"
            ),
            module: Some("github.com/helm-unittest/helm-unittest"),
            tags: "",
        },
    )?;
    // Prometheus' Go module is tagged v0.<minor>.<patch> for release 3.<minor>.<patch>.
    let promtool = version("PROMTOOL_VERSION", "v0.316.0");
    let promtool_dir = go_install(
        &tools,
        &Tool {
            name: "promtool",
            version: &promtool,
            pkg: format!("github.com/prometheus/prometheus/cmd/promtool@{promtool}"),
            ldflags: format!(
                "-X github.com/prometheus/common/version.Version={}",
                promtool.trim_start_matches('v')
            ),
            module: None,
            // No service-discovery plugins (cloud SDKs): rule tests need none of them,
            // and the build takes a fraction of the time.
            tags: "remove_all_sd",
        },
    )?;
    let helm_name = helm_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let bin = tools.join(format!(
        "bin-{helm_name}-kubeconform-{kubeconform}-unittest-{unittest}-promtool-{promtool}"
    ));
    let plugin = bin.join("helm-plugins/unittest");
    mkdir(&plugin)?;
    link(&helm_dir.join("helm"), &bin.join("helm"))?;
    link(
        &kubeconform_dir.join("kubeconform"),
        &bin.join("kubeconform"),
    )?;
    link(&promtool_dir.join("promtool"), &bin.join("promtool"))?;
    link(&unittest_dir.join("helm-unittest"), &plugin.join("untt"))?;
    // The plugin manifest Helm reads from $HELM_PLUGINS/unittest (what `helm plugin
    // install` would lay down, minus its download hooks).
    write(
        &plugin.join("plugin.yaml"),
        &format!(
            "name: \"unittest\"\nversion: \"{unittest_bare}\"\nusage: \"unittest for helm charts\"\n\
             description: \"helm-unittest, built from the Go module proxy by cargo xtask tools\"\n\
             ignoreFlags: false\ncommand: \"$HELM_PLUGIN_DIR/untt\"\n"
        ),
    )?;
    log(TAG, format!("tools in {}", bin.display()));
    Ok(bin)
}

/// `ln -sfn target link`.
fn link(target: &Path, link: &Path) -> Result<()> {
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(target, link).map_err(|e| {
        cmd::Error(format!(
            "cannot link {} to {}: {e}",
            link.display(),
            target.display()
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helm_v3_gets_the_kubernetes_version_of_its_client_go() {
        assert_eq!(
            helm_ldflags("v3", "v3.21.4", "v0.36.2").as_deref(),
            Some(
                "-X helm.sh/helm/v3/internal/version.version=v3.21.4 \
                 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=1 \
                 -X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=36 \
                 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=1 \
                 -X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=36"
            )
        );
        assert!(
            helm_ldflags("v4", "v4.3.2", "v0.36.2")
                .is_some_and(|f| f.contains("v4/pkg/chart/v2/lint/rules.k8sVersionMinor=36"))
        );
        assert_eq!(helm_ldflags("v3", "v3.21.4", "v1.2.3"), None);
    }
}
