//! The chart checks' pure parts: reading what the tools print and the files they need.

use crate::cmd::{Result, fail};
use serde_json::Value;
use std::path::Path;

/// `kubectl version -o json`'s server gitVersion, and it as helm's --kube-version
/// (`v1.34.4-foo` → `1.34.4`).
pub fn server_version(json: &str) -> Option<(String, String)> {
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
