//! The steps on what helm renders from values: the alerts, lint and the value limits.

use super::text::*;
use super::{Check, OPTIONAL, REGISTRY_BASE, S3_REFUSED, TAG, captured};
use crate::chart::{log, read, run_quiet_stdout, write};
use crate::cmd::{Error, Result, fail};
use serde_json::Value;
use std::ffi::OsStr;
use std::path::Path;

impl Check<'_> {
    pub(super) fn alerts(&self) -> Result<()> {
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
            crate::chart::show_diff(&shipped, &rules);
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

    pub(super) fn lint(&self) -> Result<()> {
        let lint = |args: &[&dyn AsRef<OsStr>]| {
            let mut c = self.tools.helm();
            c.args(["lint", "--strict"]).arg(&self.chart).args([
                "--kube-version",
                &self.kube_version,
                "--namespace",
                &self.ns,
            ]);
            for a in args {
                c.arg(a);
            }
            run_quiet_stdout(&mut c)
        };
        let base = format!("registry.base={REGISTRY_BASE}");
        let [wf, writers] = self.writers();
        let [ff, full] = self.full();
        lint(&[&"--set", &base, &wf, &writers])?;
        let mut args: Vec<&dyn AsRef<OsStr>> = vec![&"--set", &"tls.mode=cert-manager"];
        args.extend(OPTIONAL.iter().map(|a| a as &dyn AsRef<OsStr>));
        args.extend([&ff as &dyn AsRef<OsStr>, &full, &wf, &writers]);
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
    pub(super) fn value_limits(&self) -> Result<()> {
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
}
