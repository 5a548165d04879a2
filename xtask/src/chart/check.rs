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
//! PyYAML (hack/chart-schemas.py), and Go on a cold tool cache (hack/install-tools.sh).
//! Optional: COCOON_BIN (the binary; default `cargo run`), KUBECTL, CHECK_NAMESPACE
//! (default cocoon-chart-check), COCOON_CACHE. kubeconform cannot download schemas here:
//! hack/chart-schemas.py converts the apiserver's /openapi/v2 (cached per server version)
//! and the CRD's schema; cert-manager and Prometheus Operator kinds have none and are
//! skipped.

use super::{Steps, Tools, Work, log, mkdir, read, run_quiet_stdout, write};
use crate::cmd::{self, Error, Result, fail};
use serde_json::Value;
use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

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

/// `kubectl version -o json`'s server gitVersion, and it as helm's --kube-version
/// (`v1.34.4-foo` → `1.34.4`).
fn server_version(json: &str) -> Option<(String, String)> {
    let v: Value = serde_json::from_str(json).ok()?;
    let git = v["serverVersion"]["gitVersion"].as_str()?.to_string();
    let kube = git.strip_prefix('v').unwrap_or(&git);
    let kube = kube.split('-').next().unwrap_or(kube).to_string();
    Some((git, kube))
}

/// helm unittest's `Tests: N passed, M total` line (the regex `^Tests: +[0-9]+ passed,
/// [0-9]+ total`).
pub fn unittest_summary(line: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let Some(rest) = line.strip_prefix("Tests: ") else {
        return false;
    };
    let Some((passed, rest)) = rest.trim_start_matches(' ').split_once(" passed, ") else {
        return false;
    };
    rest.split_once(" total")
        .is_some_and(|(total, _)| digits(passed) && digits(total))
}

/// The PrometheusRule's spec as the rule file it ships: after `spec:`, unindented once.
pub fn rule_file(rendered: &str) -> String {
    let mut out = String::new();
    for line in rendered.lines().skip_while(|l| *l != "spec:").skip(1) {
        out.push_str(line.strip_prefix("  ").unwrap_or(line));
        out.push('\n');
    }
    out
}

/// The dashboard's queries as recording rules, so promtool parses each one.
pub fn dashboard_rules(dashboard: &Value) -> Result<String> {
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    if exprs.is_empty() {
        return fail("the dashboard has no queries");
    }
    let mut out = String::from("groups:\n  - name: dashboard\n    rules:\n");
    for (i, e) in exprs.iter().enumerate() {
        let e = e
            .replace("$__rate_interval", "5m")
            .replace("$namespace", ".*");
        out.push_str(&format!(
            "      - record: dashboard_query_{i}\n        expr: {}\n",
            Value::String(e)
        ));
    }
    Ok(out)
}

/// P5: the 1-based lines of ClusterRole rules with no comment right above them (comments
/// do not survive rendering, so this reads the template).
pub fn uncommented_rules(rbac: &str) -> Vec<usize> {
    let (mut in_cluster_role, mut prev, mut bad) = (false, "", Vec::new());
    for (i, line) in rbac.lines().enumerate() {
        if line == "kind: ClusterRole" {
            in_cluster_role = true;
        }
        if line.starts_with("---") {
            in_cluster_role = false;
        }
        if in_cluster_role
            && line.trim_start().starts_with("- apiGroups:")
            && !prev.trim_start().starts_with('#')
        {
            bad.push(i + 1);
        }
        prev = line;
    }
    bad
}

/// The value of the first `KEY: value` line (unique keys only).
pub fn field<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    text.lines().find_map(|l| {
        l.trim_start_matches(' ')
            .strip_prefix(key)?
            .strip_prefix(':')
            .map(|v| v.trim_start_matches(' '))
    })
}

/// The first `---`-separated document, its `---` line included.
pub fn first_document(text: &str) -> String {
    let mut n = 0;
    let mut out = String::new();
    for line in text.lines() {
        if line == "---" {
            n += 1;
        }
        if n == 1 {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Lines of `ld.so --list` naming a library outside `rootfs`.
pub fn outside_rootfs(list: &str, rootfs: &Path) -> Vec<String> {
    let inside = format!("{}/", rootfs.display());
    list.lines()
        .filter(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            f.get(1) == Some(&"=>")
                && f.get(2)
                    .is_some_and(|p| p.starts_with('/') && !p.starts_with(&inside))
        })
        .map(str::to_string)
        .collect()
}

/// One line of `cocoon-hibernation value-limits --samples`: value, kind, verdict, sample.
pub struct Sample<'a> {
    pub value: &'a str,
    pub string: bool,
    pub refused: bool,
    pub sample: &'a str,
}

pub fn samples(tsv: &str) -> Result<Vec<Sample<'_>>> {
    tsv.lines()
        .filter(|l| !l.is_empty())
        .map(|l| match l.splitn(4, '\t').collect::<Vec<_>>()[..] {
            [value, kind, verdict @ ("accepted" | "refused"), sample] => Ok(Sample {
                value,
                string: kind == "string",
                refused: verdict == "refused",
                sample,
            }),
            _ => fail(format!("not a value-limits sample: {l:?}")),
        })
        .collect()
}

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
    fn render(&self, mode: &str, out: &str, args: &[&dyn AsRefOsStr]) -> Result<PathBuf> {
        let mut c = self.template();
        c.args(self.writers())
            .args(["--set", &format!("tls.mode={mode}")]);
        for a in args {
            c.arg(a.os());
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

    fn alerts(&self) -> Result<()> {
        // The rule file the chart ships is the one promtool tests: the rendered spec,
        // unindented.
        let rendered = self.render(
            "self-signed",
            "rule.yaml",
            &[
                &"-s",
                &"templates/prometheusrule.yaml",
                &"--set",
                &"prometheusRule.enabled=true",
            ],
        )?;
        let rules = self.w("rules.yaml");
        write(&rules, rule_file(&read(&rendered)?))?;
        let shipped = self.chart.join("files/prometheus-rules.yaml");
        if read(&shipped)? != read(&rules)? {
            super::show_diff(&shipped, &rules);
            return fail("the rendered PrometheusRule differs from files/prometheus-rules.yaml");
        }
        let promtool = |args: &[&Path]| {
            let mut c = self.tools.tool("promtool");
            for a in args {
                c.arg(a);
            }
            run_quiet_stdout(&mut c)
        };
        promtool(&[Path::new("check"), Path::new("rules"), &rules])?;
        promtool(&[
            Path::new("test"),
            Path::new("rules"),
            &self.chart.join("tests/promtool/alerts_test.yaml"),
        ])?;
        let dashboard: Value =
            serde_json::from_str(&read(&self.chart.join("files/grafana-dashboard.json"))?)
                .map_err(|e| Error(format!("files/grafana-dashboard.json: {e}")))?;
        let queries = self.w("dashboard-rules.yaml");
        write(&queries, dashboard_rules(&dashboard)?)?;
        promtool(&[Path::new("check"), Path::new("rules"), &queries])
    }

    fn lint(&self) -> Result<()> {
        let lint = |args: &[&dyn AsRefOsStr]| {
            let mut c = self.tools.helm();
            c.args(["lint", "--strict"]).arg(&self.chart).args([
                "--kube-version",
                &self.kube_version,
                "--namespace",
                &self.ns,
            ]);
            for a in args {
                c.arg(a.os());
            }
            run_quiet_stdout(&mut c)
        };
        let base = format!("registry.base={REGISTRY_BASE}");
        let [wf, writers] = self.writers();
        let [ff, full] = self.full();
        lint(&[&"--set", &base, &wf, &writers])?;
        let mut args: Vec<&dyn AsRefOsStr> = vec![&"--set", &"tls.mode=cert-manager"];
        args.extend(OPTIONAL.iter().map(|a| a as &dyn AsRefOsStr));
        args.extend([&ff as &dyn AsRefOsStr, &full, &wf, &writers]);
        lint(&args)?;
        let vm_identity = self.values.join("vm-identity.yaml");
        lint(&[&"--set", &base, &"-f", &vm_identity])?;
        lint(&[&"--set", &base, &"--set", &"vmIdentityPolicy.enabled=false"])?;
        // S3: the chart's default values (only the required registry.base) are refused, and
        // the message names vmIdentityPolicy and the values to set. (helm lint cannot show
        // this: in lint mode Helm logs a template's `fail` as INFO and passes.)
        let out = captured(&mut self.template())?;
        let err = String::from_utf8_lossy(&out.stderr);
        if out.status.success() {
            return fail(
                "helm template with the chart's default values succeeded; S3 needs the writers named",
            );
        }
        if !err.contains(S3_REFUSED) {
            return fail(format!(
                "default values failed without naming vmIdentityPolicy: {err}"
            ));
        }
        log(TAG, "default values refused, naming vmIdentityPolicy (S3)");
        let bad = uncommented_rules(&read(&self.chart.join("templates/rbac.yaml"))?);
        if !bad.is_empty() {
            return fail(format!(
                "every ClusterRole rule in templates/rbac.yaml needs a comment saying what it \
                 is for (uncommented at lines {bad:?})"
            ));
        }
        Ok(())
    }

    /// P3: the chart refuses exactly the samples the binary refuses (its unit tests prove
    /// the binary's side on the same samples:
    /// config::tests::p3_the_binary_enforces_every_limit_on_the_charts_samples).
    fn value_limits(&self) -> Result<()> {
        let tsv = self.cocoon(&["value-limits", "--samples"])?;
        write(&self.w("samples.tsv"), &tsv)?;
        let all = samples(&tsv)?;
        let mut bad = 0;
        for s in &all {
            let set = if s.string { "--set-string" } else { "--set" };
            let out = captured(
                self.template()
                    .args(self.writers())
                    .args([set, &format!("{}={}", s.value, s.sample)]),
            )?;
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().last().unwrap_or_default();
            match (out.status.success(), s.refused) {
                (true, true) => {
                    log(
                        TAG,
                        format!("{}={} rendered; the binary refuses it", s.value, s.sample),
                    );
                    bad += 1;
                }
                (false, false) => {
                    log(TAG, format!("{}={} refused: {last}", s.value, s.sample));
                    bad += 1;
                }
                // Refused for the value itself, not for something else.
                (false, true) if !err.contains(s.value.rsplit('.').next().unwrap_or(s.value)) => {
                    log(
                        TAG,
                        format!("{}={} refused without naming it: {err}", s.value, s.sample),
                    );
                    bad += 1;
                }
                _ => {}
            }
        }
        let n = all.len();
        if n < 30 {
            return fail(format!(
                "only {n} samples from 'cocoon-hibernation value-limits --samples'"
            ));
        }
        if bad > 0 {
            return fail(format!(
                "{bad} of {n} value samples disagree with the binary (above)"
            ));
        }
        log(
            TAG,
            format!("{n} value samples: the chart refuses exactly what the binary refuses"),
        );
        Ok(())
    }

    /// The kubeconform schemas: built-in kinds from the apiserver's OpenAPI (cached per
    /// server version and converter), the CRD's from the chart.
    fn schemas(&self) -> Result<(PathBuf, PathBuf)> {
        let converter = self.root.join("hack/chart-schemas.py");
        let bytes =
            fs::read(&converter).map_err(|e| Error(format!("{}: {e}", converter.display())))?;
        let key = &super::sha256_hex(&bytes)[..12];
        let base = super::cache_root()?.join("kubeconform-schemas");
        let builtin = base.join(format!("{}-{key}", self.server_version));
        if builtin.join(".complete").is_file() {
            log(
                TAG,
                format!("built-in schemas: {} (cached)", builtin.display()),
            );
        } else {
            log(
                TAG,
                format!(
                    "generating built-in schemas from {}'s /openapi/v2",
                    self.server_version
                ),
            );
            // Older converter versions.
            let prefix = format!("{}-", self.server_version);
            for e in fs::read_dir(&base).into_iter().flatten().flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    let _ = fs::remove_dir_all(e.path());
                }
            }
            mkdir(&builtin)?;
            let swagger = self.w("swagger.json");
            write(
                &swagger,
                cmd::output(self.tools.kubectl().args(["get", "--raw", "/openapi/v2"]))?,
            )?;
            let n = cmd::output(
                Command::new("python3")
                    .arg(&converter)
                    .arg("swagger")
                    .arg(&swagger)
                    .arg(&builtin),
            )?;
            log(
                TAG,
                format!("{} schemas in {}", n.trim(), builtin.display()),
            );
            write(&builtin.join(".complete"), "")?;
        }
        let crd = self.w("crd-schemas");
        run_quiet_stdout(
            Command::new("python3")
                .arg(&converter)
                .arg("crd")
                .arg(&self.crd_file)
                .arg(&crd),
        )?;
        if !crd.join("cocoonhibernation-cocoonset-v1.json").is_file() {
            return fail("no CocoonHibernation schema generated");
        }
        Ok((builtin, crd))
    }

    fn kubeconform(&self, schemas: &(PathBuf, PathBuf), file: &Path) -> Command {
        let mut c = self.tools.tool("kubeconform");
        c.args(["-strict", "-summary", "-exit-on-error=false"])
            .args(["-kubernetes-version", &self.kube_version]);
        for dir in [&schemas.0, &schemas.1] {
            c.arg("-schema-location").arg(format!(
                "{}/{{{{ .ResourceKind }}}}{{{{ .KindSuffix }}}}.json",
                dir.display()
            ));
        }
        c.args(["-skip", "Certificate,Issuer,ServiceMonitor,PrometheusRule"])
            .arg(file);
        c
    }

    fn validate(&self) -> Result<()> {
        let schemas = self.schemas()?;
        let [ff, full] = self.full();
        let mut all: Vec<&dyn AsRefOsStr> = vec![&"--include-crds", &ff, &full];
        all.extend(OPTIONAL.iter().map(|a| a as &dyn AsRefOsStr));
        self.render("self-signed", "self-signed.yaml", &all)?;
        self.render("cert-manager", "cert-manager.yaml", &all)?;
        // One replica without election (strategy Recreate) and without the S3 policy, on
        // purpose.
        let single = self.render(
            "self-signed",
            "single.yaml",
            &[
                &"--set",
                &"replicas=1",
                &"--set",
                &"leaderElection.enabled=false",
                &"--set",
                &"log.format=json",
                &"--set",
                &"registry.plainHTTP=true",
                &"--set",
                &"vmIdentityPolicy.enabled=false",
            ],
        )?;
        let single = read(&single)?;
        if !single.lines().any(|l| l == "    type: Recreate") {
            return fail("no strategy Recreate without leader election");
        }
        if single
            .lines()
            .any(|l| l.starts_with("kind: ValidatingAdmissionPolicy"))
        {
            return fail("vmIdentityPolicy.enabled=false still rendered the policy");
        }
        let kitchen = self.values.join("kitchen-sink.yaml");
        self.render("self-signed", "kitchen-sink.yaml", &[&"-f", &kitchen])?;
        let vm_identity = self.values.join("vm-identity.yaml");
        self.render("self-signed", "vm-identity.yaml", &[&"-f", &vm_identity])?;
        write(&self.w("example-cr.yaml"), EXAMPLE_CR)?;
        for f in [
            "self-signed",
            "cert-manager",
            "single",
            "kitchen-sink",
            "vm-identity",
            "example-cr",
        ] {
            log(TAG, format!("kubeconform {f}"));
            run_quiet_stdout(&mut self.kubeconform(&schemas, &self.w(&format!("{f}.yaml"))))?;
        }
        // The schemas must bite: unknown fields and bad enums are errors.
        write(
            &self.w("bad-cr.yaml"),
            EXAMPLE_CR.replace("desire: Hibernate", "desire: Sleep"),
        )?;
        let deploy: String = read(&self.w("self-signed.yaml"))?
            .lines()
            .map(|l| {
                if l == "  replicas: 2" {
                    "  replicas: 2\n  replicaz: 2\n".to_string()
                } else {
                    format!("{l}\n")
                }
            })
            .collect();
        if !deploy.contains("replicaz") {
            return fail("could not build the negative Deployment sample");
        }
        write(&self.w("bad-deploy.yaml"), deploy)?;
        for f in ["bad-cr", "bad-deploy"] {
            let out = captured(&mut self.kubeconform(&schemas, &self.w(&format!("{f}.yaml"))))?;
            if out.status.success() {
                eprint!("{}", String::from_utf8_lossy(&out.stdout));
                return fail(format!(
                    "kubeconform accepted {f}.yaml; the schemas are not being applied"
                ));
            }
        }
        log(TAG, "negative samples rejected, as they should be");
        Ok(())
    }

    /// A server-side dry run against the real apiserver.
    fn apply_dry(&self, file: &Path) -> Result<()> {
        run_quiet_stdout(
            self.tools
                .kubectl()
                .args(["apply", "--server-side", "--dry-run=server"])
                .arg(format!("--field-manager={FIELD_MANAGER}"))
                .arg("-f")
                .arg(file),
        )
    }

    fn dry_run(&self) -> Result<()> {
        // CRD for real (later objects reference its kind), namespace for real, the rest
        // dry-run. A CRD someone else already installed (tests may install a variant) is
        // left as it is: ours is then only dry-run against it.
        let kubectl = || self.tools.kubectl();
        let crds = self.chart.join("crds/");
        if super::succeeds(kubectl().args(["get", "crd", CRD_NAME])) {
            log(
                TAG,
                format!("CRD {CRD_NAME} already installed; server-side dry run of ours only"),
            );
            run_quiet_stdout(
                kubectl()
                    .args([
                        "apply",
                        "--server-side",
                        "--force-conflicts",
                        "--dry-run=server",
                    ])
                    .arg(format!("--field-manager={FIELD_MANAGER}"))
                    .arg("-f")
                    .arg(&crds),
            )?;
        } else {
            run_quiet_stdout(
                kubectl()
                    .args(["apply", "--server-side"])
                    .arg(format!("--field-manager={FIELD_MANAGER}"))
                    .arg("-f")
                    .arg(&crds),
            )?;
        }
        run_quiet_stdout(kubectl().args([
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            &format!("crd/{CRD_NAME}"),
        ]))?;
        if !super::succeeds(kubectl().args(["get", "namespace", &self.ns])) {
            run_quiet_stdout(kubectl().args(["create", "namespace", &self.ns]))?;
        }
        // Kinds this cluster has no CRD for (cert-manager, Prometheus Operator) are left out.
        let core: Vec<String> = [
            "serviceaccount",
            "rbac",
            "deployment",
            "service",
            "pdb",
            "webhook",
            "grafana-dashboard",
            "vmidentitypolicy",
        ]
        .iter()
        .flat_map(|t| ["-s".to_string(), format!("templates/{t}.yaml")])
        .collect();
        let [ff, full] = self.full();
        for mode in ["self-signed", "cert-manager"] {
            let mut args: Vec<&dyn AsRefOsStr> = vec![&ff, &full];
            args.extend(OPTIONAL.iter().map(|a| a as &dyn AsRefOsStr));
            args.extend(core.iter().map(|a| a as &dyn AsRefOsStr));
            let file = self.render(mode, &format!("{mode}.dry.yaml"), &args)?;
            log(TAG, format!("server-side dry run: {mode}"));
            self.apply_dry(&file)?;
        }
        // Also refuses duplicate env names (extraEnv replacing a built-in).
        log(TAG, "server-side dry run: kitchen-sink values");
        self.apply_dry(&self.w("kitchen-sink.yaml"))?;
        // The apiserver type-checks the VM identity policy's CEL (S3).
        log(TAG, "server-side dry run: VM identity policy");
        let vm_identity = self.values.join("vm-identity.yaml");
        let vap = self.render(
            "self-signed",
            "vap.yaml",
            &[
                &"-f",
                &vm_identity,
                &"-s",
                &"templates/vmidentitypolicy.yaml",
            ],
        )?;
        self.apply_dry(&vap)?;
        // A CR is accepted by the real CRD (schema + CEL compile) too.
        self.apply_dry(&self.w("example-cr.yaml"))?;
        let secret = format!("{RELEASE}-tls");
        let result = self.certificate(&secret);
        let _ = cmd::output(kubectl().args([
            "-n",
            &self.ns,
            "delete",
            "secret",
            &secret,
            "--ignore-not-found",
        ]));
        result
    }

    /// self-signed: the webhook trusts the CA of the Secret it renders; an upgrade reuses
    /// that certificate (lookup) and renews it when it is about to expire. helm
    /// --dry-run=server lets lookup see the cluster.
    fn certificate(&self, secret: &str) -> Result<()> {
        let kubectl = || self.tools.kubectl();
        cmd::output(kubectl().args([
            "-n",
            &self.ns,
            "delete",
            "secret",
            secret,
            "--ignore-not-found",
        ]))?;
        let render = |out: &str, templates: &[&str]| -> Result<String> {
            let mut args: Vec<&dyn AsRefOsStr> = vec![&"--dry-run=server"];
            for t in templates {
                args.extend([&"-s" as &dyn AsRefOsStr, t]);
            }
            read(&self.render("self-signed", out, &args)?)
        };
        let install = render("install.yaml", &["templates/webhook.yaml"])?;
        let ca_bundle = field(&install, "caBundle").unwrap_or_default().to_string();
        if ca_bundle.is_empty() || Some(ca_bundle.as_str()) != field(&install, "ca.crt") {
            return fail("caBundle is not the CA of the rendered TLS Secret");
        }
        let first = first_document(&install);
        if !first.lines().any(|l| l == "kind: Secret") {
            return fail("templates/webhook.yaml no longer starts with the Secret");
        }
        let secret_file = self.w("secret.yaml");
        write(&secret_file, first)?;
        cmd::output(
            kubectl()
                .args(["apply", "--server-side"])
                .arg(format!("--field-manager={FIELD_MANAGER}"))
                .arg("-f")
                .arg(&secret_file),
        )?;
        // As Helm would have left it (Helm 4's --dry-run=server checks release ownership).
        cmd::output(kubectl().args([
            "-n",
            &self.ns,
            "annotate",
            "secret",
            secret,
            "--overwrite",
            &format!("meta.helm.sh/release-name={RELEASE}"),
            &format!("meta.helm.sh/release-namespace={}", self.ns),
        ]))?;
        let install_dep = render("install-dep.yaml", &["templates/deployment.yaml"])?;
        let upgrade = render(
            "upgrade.yaml",
            &["templates/webhook.yaml", "templates/deployment.yaml"],
        )?;
        if field(&upgrade, "caBundle") != Some(ca_bundle.as_str()) {
            return fail("upgrade regenerated the self-signed CA although the Secret is valid");
        }
        if field(&install_dep, "checksum/tls") != field(&upgrade, "checksum/tls") {
            return fail("upgrade changed checksum/tls although the certificate was reused");
        }
        log(
            TAG,
            "upgrade reuses the self-signed certificate and keeps checksum/tls",
        );
        let soon = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs() + 86400)
            .unwrap_or_default();
        cmd::output(kubectl().args([
            "-n",
            &self.ns,
            "annotate",
            "secret",
            secret,
            "--overwrite",
            &format!("cocoon-hibernation.cocoonstack.io/tls-expires={soon}"),
        ]))?;
        let renew = render("renew.yaml", &["templates/webhook.yaml"])?;
        if field(&renew, "caBundle") == Some(ca_bundle.as_str()) {
            return fail("a certificate expiring within renewBeforeDays was not renewed");
        }
        log(TAG, "upgrade renews a certificate that is about to expire");
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

    /// The image recipe without buildah or a release build: stage the rootfs around the
    /// debug binary (same libraries) and run it with the staged loader and libraries only.
    fn image_rootfs(&self) -> Result<()> {
        let image_sh = self.root.join("hack/image.sh");
        let usage = cmd::output(Command::new("bash").arg(&image_sh).arg("--help"))?;
        if !usage.lines().any(|l| l.starts_with("usage: hack/image.sh")) {
            return fail("hack/image.sh --help printed no usage");
        }
        let bin = match std::env::var_os("COCOON_BIN").filter(|b| !b.is_empty()) {
            Some(b) => PathBuf::from(b),
            None => {
                cmd::run(super::cargo(&self.root)?.args([
                    "build",
                    "-q",
                    "--locked",
                    "--bin",
                    "cocoon-hibernation",
                ]))?;
                cmd::run(
                    super::cargo(&self.root)?
                        .args(["build", "-q", "--locked"])
                        .args(super::plugin_package_args(&self.root)),
                )?;
                super::target_dir()?.join("debug/cocoon-hibernation")
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

/// An argument of a mixed list: string literals and paths alike.
trait AsRefOsStr {
    fn os(&self) -> &std::ffi::OsStr;
}

impl AsRefOsStr for &str {
    fn os(&self) -> &std::ffi::OsStr {
        self.as_ref()
    }
}

impl AsRefOsStr for String {
    fn os(&self) -> &std::ffi::OsStr {
        self.as_ref()
    }
}

impl AsRefOsStr for PathBuf {
    fn os(&self) -> &std::ffi::OsStr {
        self.as_os_str()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helm_unittests_summary_line() {
        assert!(unittest_summary("Tests:       131 passed, 131 total"));
        assert!(!unittest_summary(
            "Tests:       1 failed, 130 passed, 131 total"
        ));
        assert!(!unittest_summary("Tests: no passed, 1 total"));
        assert!(!unittest_summary("Snapshot: 0 passed, 0 total"));
    }

    #[test]
    fn the_rule_file_is_the_spec_unindented_once() {
        let rendered =
            "kind: PrometheusRule\nmetadata:\n  name: x\nspec:\n  groups:\n    - name: a\n";
        assert_eq!(rule_file(rendered), "groups:\n  - name: a\n");
        assert_eq!(rule_file("kind: X\n"), "");
    }

    #[test]
    fn every_dashboard_query_becomes_a_recording_rule() {
        let d = serde_json::json!({"panels": [
            {"targets": [{"expr": "rate(x[$__rate_interval])"}]},
            {"targets": [{"expr": "y{namespace=~\"$namespace\"}"}]}]});
        assert_eq!(
            dashboard_rules(&d).ok().as_deref(),
            Some(
                "groups:\n  - name: dashboard\n    rules:\n      - record: dashboard_query_0\n        \
                 expr: \"rate(x[5m])\"\n      - record: dashboard_query_1\n        \
                 expr: \"y{namespace=~\\\".*\\\"}\"\n"
            )
        );
        assert!(dashboard_rules(&serde_json::json!({"panels": []})).is_err());
    }

    /// SPEC P5: every ClusterRole rule says what it is for.
    #[test]
    fn p5_an_uncommented_cluster_role_rule_is_found() {
        let rbac = "kind: ClusterRole\nrules:\n  # pods: read\n  - apiGroups: [\"\"]\n  - apiGroups: [x]\n---\nkind: Role\nrules:\n  - apiGroups: [y]\n";
        assert_eq!(uncommented_rules(rbac), vec![5]);
        assert_eq!(
            uncommented_rules("kind: ClusterRole\n# a\n- apiGroups: []\n"),
            Vec::<usize>::new()
        );
    }

    #[test]
    fn fields_and_the_first_document() {
        let text = "---\nkind: Secret\ndata:\n  ca.crt: AAA\n---\nkind: X\n  caBundle: AAA\n";
        assert_eq!(field(text, "ca.crt"), Some("AAA"));
        assert_eq!(field(text, "caBundle"), Some("AAA"));
        assert_eq!(field(text, "missing"), None);
        assert_eq!(
            first_document(text),
            "---\nkind: Secret\ndata:\n  ca.crt: AAA\n"
        );
    }

    #[test]
    fn a_library_outside_the_rootfs_is_named() {
        let list = "\tlinux-vdso.so.1 (0x7ff)\n\
                    \tlibc.so.6 => /r/rootfs/lib/libc.so.6 (0x1)\n\
                    \tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x2)\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x3)\n";
        assert_eq!(
            outside_rootfs(list, Path::new("/r/rootfs")),
            vec!["\tlibm.so.6 => /lib/x86_64-linux-gnu/libm.so.6 (0x2)"]
        );
    }

    /// SPEC P3: the samples the chart is rendered with are read as the binary prints them.
    #[test]
    fn p3_value_limit_samples_parse() {
        let s = samples("a.b\tduration\trefused\t0s\nc\tstring\taccepted\t1h 30m\n").unwrap();
        assert_eq!(s.len(), 2);
        assert!(s[0].refused && !s[0].string && s[0].value == "a.b" && s[0].sample == "0s");
        assert!(!s[1].refused && s[1].string && s[1].sample == "1h 30m");
        assert!(samples("a\tb\tmaybe\tc\n").is_err());
    }

    #[test]
    fn the_server_version_and_helms_kube_version() {
        let j = r#"{"clientVersion":{"gitVersion":"v1.30.0"},"serverVersion":{"gitVersion":"v1.34.4-rc.1"}}"#;
        assert_eq!(
            server_version(j),
            Some(("v1.34.4-rc.1".into(), "1.34.4".into()))
        );
        assert_eq!(server_version(r#"{"clientVersion":{}}"#), None);
    }
}
