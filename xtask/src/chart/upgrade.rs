//! `cargo xtask chart-upgrade-check` (S11): an upgrade keeps the safety. On a real
//! kube-apiserver, installs the chart of a pinned earlier commit (release 0.3.0, whose
//! values.yaml has no vmIdentityPolicy.enabled: it rendered S3's policy whenever writers
//! were listed), then upgrades that release to this chart, once by each command, and
//! checks after each upgrade that S3's ValidatingAdmissionPolicy and its binding still
//! exist and that every safety setting of the Deployment and the webhook is what the old
//! release had:
//!   documented  docs/install.md: `kubectl apply --server-side --force-conflicts` of crds/,
//!               then `helm upgrade --reset-then-reuse-values`
//!   reuse       `helm upgrade --reuse-values` (the old chart's values.yaml, so keys that
//!               chart lacked arrive absent)
//! and that the documented CRD upgrade works on CRDs Helm installed (a copy of the CRD
//! renamed to a group of its own, installed by the old chart: the shared CRD is never
//! touched).
//!
//! The pods need not run (no image is pulled; nothing waits for them). The release's
//! policy and webhook bind only in namespaces with a label no namespace carries, so other
//! tests on a shared control plane never meet them. It stays on 0.3.0 although 0.4.0 is
//! the previous release: 0.3.0 is the chart whose values lack the safety keys (and whose
//! releases without writers had no S3 policy), which is what this check is about, and it
//! runs in seconds on the shared control plane. The upgrade from 0.4.0 (`cargo xtask
//! old-release`) is tested with its image, on the real node, under load: the install suite
//! (tests/e2e_install/upgrade.rs).

use super::{Steps, Tools, Work, log, mkdir, read, write};
use crate::cmd::{self, Error, Result, fail};
use serde_json::{Map, Value, json};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the chart became 0.3.0 (`OLD_COMMIT` overrides it).
pub const OLD_COMMIT: &str = "1a123bd9ab16321b8a92a0a673ed2a926d168bf5";

const TAG: &str = "chart-upgrade-check";
const REFUSED: &str = "vmIdentityPolicy (S3) is on by default and names no writer";

/// Runs the check; prints the summary line on stdout (`chart-upgrade-check: PASS ...`).
pub fn run(root: &Path) -> Result<()> {
    super::clean_up_on_interrupt();
    let tools = Tools {
        bin: super::tools_bin(root)?,
        kubectl: super::find_kubectl()?,
        kubeconfig: super::kubeconfig()?,
    };
    let (ok, line) = check(root, &tools)?;
    println!("{line}");
    if ok {
        Ok(())
    } else {
        fail("the upgrade check failed (above)")
    }
}

/// The whole check, cleaned up after; (passed, summary line).
pub fn check(root: &Path, tools: &Tools) -> Result<(bool, String)> {
    let suffix = super::random_suffix()?;
    let u = Upgrade {
        tools,
        work: Work::new("chart-upgrade-check")?,
        ns: format!("cocoon-upgrade-{suffix}"),
        // Also the fullname: cluster-scoped names are unique.
        release: format!("cocoon-hibernation-up{suffix}"),
        group: format!("upgrade-{suffix}.cocoonstack.io"),
        scope: format!("cocoon-upgrade-check-{suffix}"),
        new_chart: std::env::var_os("NEW_CHART")
            .filter(|c| !c.is_empty())
            .map_or_else(|| root.join("charts/cocoon-hibernation"), PathBuf::from),
    };
    let mut steps = Steps::new(TAG);
    let result = u.all(root, &mut steps);
    u.cleanup();
    if let Err(e) = &result {
        log(TAG, format!("ERROR: {e}"));
    }
    let line = steps.summary(result.is_ok(), "files", &u.work.0);
    if result.is_ok() {
        u.work.remove();
    }
    Ok((result.is_ok(), line))
}

struct Upgrade<'a> {
    tools: &'a Tools,
    work: Work,
    ns: String,
    release: String,
    group: String,
    scope: String,
    new_chart: PathBuf,
}

/// `version:` of a Chart.yaml, for the log.
fn chart_version(chart: &Path) -> String {
    read(&chart.join("Chart.yaml"))
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("version: ").map(str::to_string))
        })
        .unwrap_or_default()
}

/// The values a user installed 0.3.0 with: the registry, S3's writers; plus the check's
/// scoping (policy and webhook bind only in namespaces labelled `scope`).
fn values_yaml(scope: &str, writers: bool) -> String {
    let w = if writers {
        "  allowedUsernames: [system:serviceaccount:vk:vk-cocoon]\n  \
         allowedGroups: [system:serviceaccounts:cocoonset-system]\n"
    } else {
        ""
    };
    format!(
        "registry: {{base: registry.example.com:5000/cocoon/snapshots}}\n\
         vmIdentityPolicy:\n{w}  namespaceSelector: {{matchLabels: {{{scope}: \"true\"}}}}\n\
         webhook:\n  namespaceSelector: {{matchLabels: {{{scope}: \"true\"}}}}\n"
    )
}

/// Every crds/*.yaml of a chart, in name order, with the group renamed.
fn renamed_crds(chart: &Path, group: &str) -> Result<String> {
    let dir = chart.join("crds");
    let mut files: Vec<PathBuf> = fs::read_dir(&dir)
        .map_err(|e| Error(format!("{}: {e}", dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    let mut out = String::new();
    for f in files {
        out.push_str(&read(&f)?.replace("cocoonset.cocoonstack.io", group));
    }
    Ok(out)
}

/// The safety settings of a release as the apiserver holds them: S3's policy and binding,
/// the webhook's failure policy and rules, the Deployment's replicas, strategy and safety
/// flags (a flag the old Deployment did not set is the binary's default, which the chart's
/// fallbacks equal).
pub fn safety(vap: &Value, vapb: &Value, hook: &Value, dep: &Value) -> Value {
    let spec = &vap["spec"];
    let allowed: Vec<Value> = spec["variables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|v| v["name"] == "allowed")
        .map(|v| v["expression"].clone())
        .collect();
    let webhooks: Map<String, Value> = hook["webhooks"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|h| {
            let name = h["name"].as_str().unwrap_or_default().to_string();
            let v = json!({"failurePolicy": h["failurePolicy"], "rules": h["rules"]});
            (name, v)
        })
        .collect();
    let env: Map<String, Value> = dep["spec"]["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|e| {
            let name = e["name"].as_str().unwrap_or_default().to_string();
            (name, e.get("value").cloned().unwrap_or(Value::Null))
        })
        .collect();
    // The binary's default, for a Deployment without the flag.
    let default = |k: &str| match k {
        "COCOON_INFORMER_STALL_LIMIT" => json!("5m"),
        _ => Value::Null,
    };
    let flags: Map<String, Value> = [
        "COCOON_LEADER_ELECTION",
        "COCOON_LEASE_NAME",
        "COCOON_LEASE_DURATION",
        "COCOON_INFORMER_STALL_LIMIT",
        "COCOON_HIBERNATE_TIMEOUT",
        "COCOON_WAKE_TIMEOUT",
        "COCOON_REGISTRY_BASE",
        "COCOON_REGISTRY_PLAIN_HTTP",
    ]
    .iter()
    .map(|k| {
        (
            k.to_string(),
            env.get(*k).cloned().unwrap_or_else(|| default(k)),
        )
    })
    .collect();
    json!({
        "policy": {
            "failurePolicy": spec["failurePolicy"],
            "matchConstraints": spec["matchConstraints"],
            "allowed": allowed,
            "validations": spec["validations"].as_array().map_or(0, Vec::len),
        },
        "binding": {
            "policyName": vapb["spec"]["policyName"],
            "validationActions": vapb["spec"]["validationActions"],
            "matchResources": vapb["spec"]["matchResources"],
        },
        "webhook": webhooks,
        "deployment": {
            "replicas": dep["spec"]["replicas"],
            "strategy": dep["spec"]["strategy"]["type"],
            "env": flags,
        },
    })
}

/// What changed between two `safety` values: a section, a webhook the old release had,
/// or a webhook the new chart adds that does not fail closed.
pub fn changed(old: &Value, new: &Value) -> Vec<String> {
    let mut bad: Vec<String> = ["policy", "binding", "deployment"]
        .iter()
        .filter(|k| old[**k] != new[**k])
        .map(|k| k.to_string())
        .collect();
    let (old_hooks, new_hooks) = (&old["webhook"], &new["webhook"]);
    for (name, h) in old_hooks.as_object().into_iter().flatten() {
        if new_hooks.get(name) != Some(h) {
            bad.push(format!("webhook {name}"));
        }
    }
    for (name, h) in new_hooks.as_object().into_iter().flatten() {
        if old_hooks.get(name).is_none() && h["failurePolicy"] != "Fail" {
            bad.push(format!("webhook {name} (new)"));
        }
    }
    bad
}

fn parse(text: &str, what: &str) -> Result<Value> {
    serde_json::from_str(text).map_err(|e| Error(format!("{what} is not JSON: {e}")))
}

impl Upgrade<'_> {
    fn helm(&self) -> Command {
        let mut c = self.tools.helm();
        c.args(["--namespace", &self.ns]);
        c
    }

    fn kubectl(&self) -> Command {
        self.tools.kubectl()
    }

    fn get_json(&self, args: &[&str], what: &str) -> Result<Value> {
        let out = cmd::output(self.kubectl().args(["get", "-o", "json"]).args(args))?;
        parse(&out, what)
    }

    fn crd_name(&self) -> String {
        format!("cocoonhibernations.{}", self.group)
    }

    fn all(&self, root: &Path, steps: &mut Steps) -> Result<()> {
        let old_commit = std::env::var("OLD_COMMIT")
            .ok()
            .filter(|c| !c.is_empty())
            .unwrap_or_else(|| OLD_COMMIT.into());
        // The old chart, as that commit had it.
        let old = self.work.path("old");
        mkdir(&old)?;
        let tarball = self.work.path("old.tar");
        cmd::run(
            Command::new("git")
                .arg("-C")
                .arg(root)
                .args(["archive", "--format=tar", "-o"])
                .arg(&tarball)
                .args([old_commit.as_str(), "charts/cocoon-hibernation"]),
        )?;
        cmd::run(
            Command::new("tar")
                .arg("-xf")
                .arg(&tarball)
                .arg("-C")
                .arg(&old),
        )?;
        let old_chart = old.join("charts/cocoon-hibernation");
        log(
            TAG,
            format!(
                "old chart: {old_commit}, version {}; new: {}",
                chart_version(&old_chart),
                chart_version(&self.new_chart)
            ),
        );
        // Both CRDs renamed to a group of our own: Helm installs the old one (it exists
        // nowhere else).
        let old_crds = renamed_crds(&old_chart, &self.group)?;
        for e in fs::read_dir(old_chart.join("crds")).map_err(|e| Error(e.to_string()))? {
            let _ = fs::remove_file(e.map_err(|e| Error(e.to_string()))?.path());
        }
        write(&old_chart.join("crds/crd.yaml"), old_crds)?;
        let new_crds = self.work.path("new-crds");
        mkdir(&new_crds)?;
        write(
            &new_crds.join("crd.yaml"),
            renamed_crds(&self.new_chart, &self.group)?,
        )?;
        let values = self.work.path("values.yaml");
        write(&values, values_yaml(&self.scope, true))?;

        // 1. The documented commands.
        steps.at("install documented")?;
        let before = self.install_old(&old_chart, &values)?;
        steps.at("crd upgrade")?;
        self.crd_upgrade(&new_crds)?;
        steps.passed("crd-upgrade");
        steps.at("documented upgrade")?;
        self.upgrade("--reset-then-reuse-values")?;
        self.same_safety(&before, "documented upgrade (--reset-then-reuse-values)")?;
        steps.passed("documented");

        // 2. --reuse-values, from a fresh old release.
        steps.at("install reuse")?;
        let before = self.install_old(&old_chart, &values)?;
        steps.at("reuse-values upgrade")?;
        self.upgrade("--reuse-values")?;
        self.same_safety(&before, "helm upgrade --reuse-values")?;
        steps.passed("reuse-values");

        // 3. A release of 0.3.0 installed without writers had no policy (that chart
        // rendered it only with writers). Upgrading it by either command turns S3 on, so
        // it is refused with the message naming vmIdentityPolicy, never carried on
        // silently without the policy; the release stays as it was.
        steps.at("no writers refused")?;
        cmd::output(self.helm().args(["uninstall", &self.release, "--wait"]))?;
        let no_writers = self.work.path("no-writers.yaml");
        write(&no_writers, values_yaml(&self.scope, false))?;
        cmd::output(
            self.helm()
                .args(["install", &self.release])
                .arg(&old_chart)
                .arg("--skip-crds")
                .arg("-f")
                .arg(&no_writers),
        )?;
        for how in ["--reset-then-reuse-values", "--reuse-values"] {
            match cmd::output(
                self.helm()
                    .args(["upgrade", &self.release])
                    .arg(&self.new_chart)
                    .arg(how),
            ) {
                Ok(_) => {
                    return fail(format!(
                        "helm upgrade {how} of a release without writers succeeded without S3's policy"
                    ));
                }
                Err(e) if e.0.contains(REFUSED) => {}
                Err(e) => {
                    return fail(format!(
                        "helm upgrade {how} refused without naming vmIdentityPolicy: {e}"
                    ));
                }
            }
        }
        let history = cmd::output(self.helm().args(["history", &self.release, "-o", "json"]))?;
        let revisions = parse(&history, "helm history")?
            .as_array()
            .map_or(0, Vec::len);
        if revisions != 1 {
            return fail(format!(
                "a refused upgrade left a revision behind ({revisions} revisions)"
            ));
        }
        log(
            TAG,
            "a release without writers: both upgrades refused, naming vmIdentityPolicy",
        );
        steps.passed("no-writers-refused");
        steps.current = "done".into();
        Ok(())
    }

    fn upgrade(&self, how: &str) -> Result<()> {
        cmd::output(
            self.helm()
                .args(["upgrade", &self.release])
                .arg(&self.new_chart)
                .arg(how),
        )
        .map(|_| ())
    }

    /// The release's safety settings now, also written to `file` for a look after a failure.
    fn safety_now(&self, file: &str) -> Result<Value> {
        let vap = format!("{}-vm-identity", self.release);
        let get = |kind: &str, what: &str| {
            self.get_json(&[kind, &vap], what)
                .map_err(|_| Error(format!("S3: {what} {vap} is gone")))
        };
        let s = safety(
            &get("validatingadmissionpolicy", "ValidatingAdmissionPolicy")?,
            &get(
                "validatingadmissionpolicybinding",
                "ValidatingAdmissionPolicyBinding",
            )?,
            &self.get_json(
                &["validatingwebhookconfiguration", &self.release],
                "the webhook configuration",
            )?,
            &self.get_json(
                &["-n", &self.ns, "deployment", &self.release],
                "the Deployment",
            )?,
        );
        write(
            &self.work.path(file),
            serde_json::to_string_pretty(&s).unwrap_or_default(),
        )?;
        Ok(s)
    }

    /// The release's safety settings equal those the old release installed; a webhook the
    /// new chart adds (e.g. for schedules) fails closed like the others.
    fn same_safety(&self, before: &Value, what: &str) -> Result<()> {
        let after = self.safety_now(&format!("after-{}.json", what.replace(' ', "-")))?;
        let bad = changed(before, &after);
        for k in &bad {
            let section = k.split(' ').next().unwrap_or(k);
            eprintln!(
                "{k}:\n  before {}\n  after  {}",
                before[section], after[section]
            );
        }
        if !bad.is_empty() {
            return fail(format!("S11: {what} changed a safety setting (above)"));
        }
        log(
            TAG,
            format!("{what}: S3's policy and binding in force, every safety setting unchanged"),
        );
        Ok(())
    }

    fn install_old(&self, old_chart: &Path, values: &Path) -> Result<Value> {
        let _ = cmd::output(self.helm().args(["uninstall", &self.release, "--wait"]));
        cmd::output(self.kubectl().args([
            "delete",
            "crd",
            &self.crd_name(),
            "--ignore-not-found",
        ]))?;
        cmd::output(
            self.helm()
                .args(["install", &self.release])
                .arg(old_chart)
                .arg("--create-namespace")
                .arg("-f")
                .arg(values),
        )?;
        if self
            .get_json(&["crd", &self.crd_name()], "the CRD")
            .is_err()
        {
            return fail("helm install did not install the old chart's CRD");
        }
        let before = self.safety_now("before.json")?;
        log(TAG, "old release installed: S3's policy and binding exist");
        Ok(before)
    }

    /// The documented CRD upgrade (docs/install.md), on CRDs Helm installed. Helm created
    /// them (field manager `helm`, an Update), so a plain server-side apply conflicts with
    /// `helm` on .spec.versions; Helm never writes a CRD again, so taking those fields over
    /// is safe.
    fn crd_upgrade(&self, new_crds: &Path) -> Result<()> {
        cmd::output(
            self.kubectl()
                .args(["apply", "--server-side", "--force-conflicts", "-f"])
                .arg(new_crds),
        )
        .map_err(|e| {
            Error(format!(
                "the documented CRD upgrade failed on the CRD Helm installed: {e}"
            ))
        })?;
        // The new schema is the one served: the versions' schemas against the file's.
        let name = self.crd_name();
        let live = self.get_json(&["crd", &name], "the CRD")?;
        // One JSON object per document (kubectl prints them one after the other).
        let file = cmd::output(
            self.kubectl()
                .args(["create", "--dry-run=client", "-o", "json", "-f"])
                .arg(new_crds.join("crd.yaml")),
        )?;
        let docs = serde_json::Deserializer::from_str(&file)
            .into_iter::<Value>()
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(|e| Error(format!("the new CRDs are not JSON: {e}")))?;
        let want = docs.iter().find(|d| d["metadata"]["name"] == name.as_str());
        let schemas = |crd: &Value| -> Vec<(Value, Value)> {
            crd["spec"]["versions"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|v| (v["name"].clone(), v["schema"].clone()))
                .collect()
        };
        match want {
            Some(w) if schemas(w) == schemas(&live) && !schemas(w).is_empty() => {}
            Some(_) => {
                return fail(
                    "the CRD in the apiserver is not the new one: served schema differs from crds/",
                );
            }
            None => return fail(format!("no {name} in the renamed crds/")),
        }
        log(
            TAG,
            "kubectl apply --server-side --force-conflicts upgraded the CRD Helm installed",
        );
        Ok(())
    }

    /// Removes the release, its namespace and the renamed CRDs, whatever happened.
    fn cleanup(&self) {
        let quiet = |c: &mut Command| {
            super::succeeds(c);
        };
        quiet(
            self.helm()
                .args(["uninstall", &self.release, "--wait=false"]),
        );
        quiet(self.kubectl().args([
            "delete",
            "namespace",
            &self.ns,
            "--wait=false",
            "--ignore-not-found",
        ]));
        quiet(self.kubectl().args([
            "delete",
            "crd",
            &format!("cocoonhibernations.{}", self.group),
            &format!("cocoonhibernationschedules.{}", self.group),
            &format!("cocoonidlepolicies.{}", self.group),
            "--ignore-not-found",
        ]));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(failure: &str, stall: Option<&str>) -> Value {
        let mut env = vec![json!({"name": "COCOON_LEADER_ELECTION", "value": "true"})];
        if let Some(s) = stall {
            env.push(json!({"name": "COCOON_INFORMER_STALL_LIMIT", "value": s}));
        }
        safety(
            &json!({"spec": {"failurePolicy": "Fail", "matchConstraints": {"a": 1},
                "variables": [{"name": "allowed", "expression": "x"}, {"name": "o", "expression": "y"}],
                "validations": [{}, {}]}}),
            &json!({"spec": {"policyName": "p", "validationActions": ["Deny"]}}),
            &json!({"webhooks": [{"name": "a.x", "failurePolicy": failure, "rules": []}]}),
            &json!({"spec": {"replicas": 2, "strategy": {"type": "RollingUpdate"},
                "template": {"spec": {"containers": [{"env": env}]}}}}),
        )
    }

    /// SPEC S11: the comparison the upgrade check rests on.
    #[test]
    fn s11_a_missing_flag_is_the_binarys_default_and_a_weaker_webhook_is_named() {
        let s = sample("Fail", None);
        assert_eq!(s["policy"]["allowed"], json!(["x"]));
        assert_eq!(s["policy"]["validations"], json!(2));
        assert_eq!(s["binding"]["matchResources"], Value::Null);
        assert_eq!(
            s["deployment"]["env"]["COCOON_INFORMER_STALL_LIMIT"],
            json!("5m")
        );
        assert_eq!(
            changed(&s, &sample("Fail", Some("5m"))),
            Vec::<String>::new()
        );
        assert_eq!(changed(&s, &sample("Fail", Some("1m"))), vec!["deployment"]);
        assert_eq!(changed(&s, &sample("Ignore", None)), vec!["webhook a.x"]);
        let mut added = s.clone();
        added["webhook"]["b.x"] = json!({"failurePolicy": "Ignore", "rules": []});
        assert_eq!(changed(&s, &added), vec!["webhook b.x (new)"]);
        added["webhook"]["b.x"]["failurePolicy"] = json!("Fail");
        assert_eq!(changed(&s, &added), Vec::<String>::new());
    }

    #[test]
    fn the_values_without_writers_drop_only_the_writers() {
        let with = values_yaml("scope-1", true);
        let without = values_yaml("scope-1", false);
        let kept: Vec<&str> = with
            .lines()
            .filter(|l| !l.contains("allowedUsernames") && !l.contains("allowedGroups"))
            .collect();
        assert_eq!(kept, without.lines().collect::<Vec<_>>());
        assert!(with.contains("allowedUsernames: [system:serviceaccount:vk:vk-cocoon]"));
        assert!(without.contains("namespaceSelector: {matchLabels: {scope-1: \"true\"}}"));
    }
}
