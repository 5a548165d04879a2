//! `cargo xtask chart-check`: checks the Helm chart charts/cocoon-hibernation (P5): what
//! needs a cluster or another tool. What the rendered objects say is tested by the
//! helm-unittest suites in the chart's tests/.
//!   crd-drift     `cocoon-hibernation crd` == the chart's crds/cocoonhibernations.yaml
//!   unittest      `helm unittest charts/cocoon-hibernation` (tests/*_test.yaml)
//!   alerts        the PrometheusRule renders files/prometheus-rules.yaml unchanged;
//!                 `promtool test rules` proves every alert; every dashboard query parses
//!   lint          helm lint --strict, both TLS modes; every ClusterRole rule has a
//!                 comment; the chart's default values are refused, naming
//!                 vmIdentityPolicy (S3)
//!   value-limits  every sample of the binary's flag bounds (`cocoon-hibernation
//!                 value-limits --samples`): helm template refuses each value the binary
//!                 refuses and renders each one it accepts (P3)
//!   kubeconform   helm template (every values file) | kubeconform -strict, offline schemas
//!   dry-run       the CRD applied for real (dry run only if one is installed), the rest
//!                 `kubectl apply --server-side --dry-run=server`; the self-signed
//!                 certificate is trusted, reused on upgrade and renewed near expiry
//!   upgrade       `chart-upgrade-check` (S11, the `upgrade` module)
//!   image-rootfs  `hack/image.sh --help`; the root filesystem `make image` stages holds
//!                 the binary, its libraries and loader (the binary prints the CRD with
//!                 only those), the CA bundle, user 65532 and /tmp, and the kubectl plugin
//!                 at /usr/local/bin/kubectl-cocoon (it prints its help with only those)
//! Prints one summary line: `chart-check: PASS ...` or `chart-check: FAIL ...`.
//!
//! Needs KUBECONFIG (or COCOON_CLUSTER_ENV) for a reachable kube-apiserver, python3 with
//! PyYAML (hack/chart-schemas.py), and Go on a cold tool cache (`cargo xtask tools`).
//! Optional: COCOON_BIN (the binary; default `cargo run`), KUBECTL, CHECK_NAMESPACE
//! (default cocoon-chart-check), COCOON_CACHE. kubeconform cannot download schemas here:
//! hack/chart-schemas.py converts the apiserver's /openapi/v2 (cached per server version)
//! and the CRD's schema; cert-manager and Prometheus Operator kinds have none and are
//! skipped.

mod dry_run;
mod image;
mod kubeconform;
mod text;
mod values;

use super::{Steps, Tools, Work, log, read, write};
use crate::cmd::{self, Error, Result, fail};
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use text::*;

const TAG: &str = "chart-check";
const RELEASE: &str = "cocoon-hibernation";
const REGISTRY_BASE: &str = "registry.example.com:5000/cocoon/snapshots";
const FIELD_MANAGER: &str = "cocoon-check-chart";
const CRD_NAME: &str = "cocoonhibernations.cocoonset.cocoonstack.io";
const S3_REFUSED: &str = "vmIdentityPolicy (S3) is on by default and names no writer: \
                          set vmIdentityPolicy.allowedUsernames";
/// Every optional branch the Prometheus Operator and Grafana kinds add.
const OPTIONAL: [&str; 6] = [
    "--set",
    "serviceMonitor.enabled=true",
    "--set",
    "prometheusRule.enabled=true",
    "--set",
    "grafanaDashboard.enabled=true",
];
/// A CocoonHibernation as a user writes it, so the CRD schema is exercised too.
const EXAMPLE_CR: &str = "apiVersion: cocoonset.cocoonstack.io/v1
kind: CocoonHibernation
metadata:
  name: vm-pod-0
  namespace: default
spec:
  podRef:
    name: vm-pod-0
  desire: Hibernate
";

/// Runs every step; prints the summary line on stdout.
pub fn run(root: &Path) -> Result<()> {
    super::clean_up_on_interrupt();
    let mut steps = Steps::new(TAG);
    let work = Work::new("chart-check")?;
    let result = Check::new(root, &work).and_then(|c| c.all(&mut steps));
    if let Err(e) = &result {
        log(TAG, format!("ERROR: {e}"));
    }
    println!("{}", steps.summary(result.is_ok(), "renders", &work.0));
    match result {
        Ok(()) => {
            work.remove();
            Ok(())
        }
        Err(_) => fail("the chart checks failed (above)"),
    }
}

struct Check<'a> {
    root: PathBuf,
    chart: PathBuf,
    values: PathBuf,
    crd_file: PathBuf,
    ns: String,
    tools: Tools,
    server_version: String,
    kube_version: String,
    work: &'a Work,
}

/// Runs `cmd`, its stdout shown on stderr and returned; an exit other than 0 is an error.
fn shown(cmd: &mut Command) -> Result<String> {
    let out = captured(cmd)?;
    eprint!("{}", String::from_utf8_lossy(&out.stdout));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    } else {
        fail(format!(
            "`{}` failed ({}): {}",
            cmd.get_program().to_string_lossy(),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

fn captured(cmd: &mut Command) -> Result<Output> {
    cmd.stdin(Stdio::null()).output().map_err(|e| {
        Error(format!(
            "could not start `{}`: {e}",
            cmd.get_program().to_string_lossy()
        ))
    })
}

impl<'a> Check<'a> {
    fn new(root: &Path, work: &'a Work) -> Result<Check<'a>> {
        let kubeconfig = super::kubeconfig()?;
        if !super::succeeds(Command::new("python3").args(["-c", "import yaml"])) {
            return fail(
                "python3 cannot import yaml (PyYAML). Install it: apt-get install python3-yaml, \
                 or pip install pyyaml",
            );
        }
        let kubectl = super::find_kubectl()?;
        let tools = Tools {
            bin: super::tools_bin(root)?,
            kubectl,
            kubeconfig,
        };
        let first = |c: &mut Command| {
            cmd::output(c)
                .map(|o| o.lines().next().unwrap_or_default().to_string())
                .unwrap_or_else(|e| e.0)
        };
        log(
            TAG,
            format!(
                "helm {}, kubeconform {}, {}, kubectl {}",
                first(tools.helm().args(["version", "--short"])),
                first(tools.tool("kubeconform").arg("-v")),
                first(tools.tool("promtool").arg("--version")),
                tools.kubectl.display()
            ),
        );
        let version = cmd::output(tools.kubectl().args(["version", "-o", "json"]))
            .ok()
            .and_then(|j| server_version(&j));
        let Some((server_version, kube_version)) = version else {
            return fail(format!(
                "cannot reach the kube-apiserver of KUBECONFIG={}",
                tools.kubeconfig
            ));
        };
        log(TAG, format!("kube-apiserver {server_version}"));
        let chart = root.join("charts/cocoon-hibernation");
        Ok(Check {
            root: root.to_path_buf(),
            values: chart.join("tests/values"),
            crd_file: chart.join("crds/cocoonhibernations.yaml"),
            chart,
            ns: std::env::var("CHECK_NAMESPACE")
                .ok()
                .filter(|n| !n.is_empty())
                .unwrap_or_else(|| "cocoon-chart-check".into()),
            tools,
            server_version,
            kube_version,
            work,
        })
    }

    fn all(&self, steps: &mut Steps) -> Result<()> {
        steps.step("crd-drift", || self.crd_drift())?;
        steps.step("unittest", || self.unittest())?;
        steps.step("alerts", || self.alerts())?;
        steps.step("lint", || self.lint())?;
        steps.step("value-limits", || self.value_limits())?;
        steps.step("kubeconform", || self.validate())?;
        steps.step("dry-run", || self.dry_run())?;
        steps.step("upgrade", || self.upgrade())?;
        steps.step("image-rootfs", || self.image_rootfs())
    }

    fn w(&self, name: &str) -> PathBuf {
        self.work.path(name)
    }

    /// The writers of the pods' VM annotations, which an install must name (S3 is on by
    /// default).
    fn writers(&self) -> [PathBuf; 2] {
        ["-f".into(), self.values.join("writers.yaml")]
    }

    /// The registry mounts (full).
    fn full(&self) -> [PathBuf; 2] {
        ["-f".into(), self.values.join("full.yaml")]
    }

    /// `helm template` of the chart as a release in the check's namespace, as a user
    /// installs it (registry.base and the writers named), into `out`.
    fn render(&self, mode: &str, out: &str, args: &[&dyn AsRef<OsStr>]) -> Result<PathBuf> {
        let mut c = self.template();
        c.args(self.writers())
            .args(["--set", &format!("tls.mode={mode}")]);
        for a in args {
            c.arg(a);
        }
        let path = self.w(out);
        write(&path, cmd::output(&mut c)?)?;
        Ok(path)
    }

    /// `helm template` with the release, namespace, version and registry.base.
    fn template(&self) -> Command {
        let mut c = self.tools.helm();
        c.args(["template", RELEASE])
            .arg(&self.chart)
            .args([
                "--namespace",
                &self.ns,
                "--kube-version",
                &self.kube_version,
            ])
            .args(["--set", &format!("registry.base={REGISTRY_BASE}")]);
        c
    }

    /// The binary under test (COCOON_BIN, else cargo run); its stdout.
    fn cocoon(&self, args: &[&str]) -> Result<String> {
        match std::env::var_os("COCOON_BIN").filter(|b| !b.is_empty()) {
            Some(bin) => {
                if !Path::new(&bin).is_file() {
                    return fail(format!(
                        "COCOON_BIN={} is not executable",
                        bin.to_string_lossy()
                    ));
                }
                cmd::output(Command::new(bin).args(args))
            }
            None => cmd::output(
                super::cargo(&self.root)?
                    .args(["run", "-q", "--locked", "--bin", "cocoon-hibernation", "--"])
                    .args(args),
            ),
        }
    }

    fn crd_drift(&self) -> Result<()> {
        let crd = self.cocoon(&["crd"])?;
        if crd.is_empty() {
            return fail("'cocoon-hibernation crd' printed nothing");
        }
        if crd != read(&self.crd_file)? {
            let mine = self.w("crd.yaml");
            write(&mine, &crd)?;
            super::show_diff(&mine, &self.crd_file);
            return fail(
                "the chart's CRD differs from 'cocoon-hibernation crd'; regenerate it:\n    \
                 cocoon-hibernation crd > charts/cocoon-hibernation/crds/cocoonhibernations.yaml",
            );
        }
        Ok(())
    }

    fn unittest(&self) -> Result<()> {
        let out = shown(
            self.tools
                .helm()
                .args(["unittest", "--color=false"])
                .arg(&self.chart),
        )?;
        let ran = out.lines().any(unittest_summary);
        if !ran {
            return fail("helm unittest ran no test, or some failed");
        }
        Ok(())
    }

    /// S11, on the real apiserver: its own namespace, release and CRD group, removed after.
    fn upgrade(&self) -> Result<()> {
        let (ok, line) = super::upgrade::check(&self.root, &self.tools)?;
        log(TAG, &line);
        if ok {
            Ok(())
        } else {
            fail("the upgrade check failed (above)")
        }
    }
}
