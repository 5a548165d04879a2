//! SPEC P3 P5: the chart's values accept what the binary's flags accept. The bounds live
//! in one table, `config::LIMITS`; these tests hold the chart to it: values.schema.json
//! (form and integer ranges), files/value-limits.yaml (duration bounds, checked by
//! templates/validate-limits.yaml) and the env var each value becomes.
//! `cargo xtask chart-check` renders the chart with every sample of the table.

use cocoon_hibernation::config::{Bound, ChartValue, Cli, LIMITS, value_limits_yaml};
use cocoon_hibernation::flags::{CHART_DURATION_MAX_LENGTH, CHART_DURATION_PATTERN};
use serde_json::{Value, json};

fn chart_file(rel: &str) -> String {
    let path = testkit::repo_root()
        .join("charts/cocoon-hibernation")
        .join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn schema() -> Value {
    serde_json::from_str(&chart_file("values.schema.json")).unwrap()
}

/// The schema node of a dotted value path.
fn node<'a>(schema: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(schema, |n, key| &n["properties"][key])
}

/// The env var a flag reads (its clap `env`).
fn env_of(flag: &str) -> String {
    let command = <Cli as clap::CommandFactory>::command();
    let long = flag.trim_start_matches("--");
    let arg = command
        .get_arguments()
        .find(|a| a.get_long() == Some(long))
        .unwrap_or_else(|| panic!("{flag} is no flag"));
    let env = arg.get_env().unwrap_or_else(|| panic!("{flag} has no env"));
    env.to_string_lossy().into_owned()
}

/// SPEC P3: the chart's duration bounds are the binary's, printed by the binary.
#[test]
fn p3_value_limits_file_is_what_the_binary_prints() {
    let shipped = chart_file("files/value-limits.yaml");
    assert!(
        shipped == value_limits_yaml(),
        "files/value-limits.yaml drifted from the binary's LIMITS: run `cargo run -- value-limits > charts/cocoon-hibernation/files/value-limits.yaml`"
    );
}

/// SPEC P3: each value that sets a bounded flag has that flag's bounds in the values
/// schema: the duration form (which the binary reads) or the integer range.
#[test]
fn p3_values_schema_has_the_binarys_bounds() {
    let schema = schema();
    let mut checked = 0;
    for limit in LIMITS {
        let (path, want) = match (limit.value, limit.bound) {
            (ChartValue::None, _) => continue,
            (ChartValue::Integer(p), Bound::Integer { min, max }) => (
                p,
                json!({"type": "integer", "minimum": min, "maximum": max}),
            ),
            (ChartValue::Seconds(p), Bound::Duration { min, max }) => (
                p,
                json!({"type": "integer", "minimum": min.as_secs(), "maximum": max.as_secs()}),
            ),
            (ChartValue::Duration(p), Bound::Duration { .. }) => (
                p,
                json!({"type": "string", "pattern": CHART_DURATION_PATTERN, "maxLength": CHART_DURATION_MAX_LENGTH}),
            ),
            other => panic!("{}: a {other:?} pair the chart has no form for", limit.flag),
        };
        let got = node(&schema, path);
        for (key, value) in want.as_object().unwrap() {
            assert_eq!(
                &got[key], value,
                "values.schema.json {path}.{key}: the binary's {} wants {value}",
                limit.flag
            );
        }
        checked += 1;
    }
    assert!(checked >= 8, "{checked}");
}

/// SPEC P3: no other value of the schema takes a duration without a bound in LIMITS.
#[test]
fn p3_every_duration_value_has_a_limit() {
    fn walk(node: &Value, path: &str, out: &mut Vec<String>) {
        if node["pattern"] == CHART_DURATION_PATTERN {
            out.push(path.trim_start_matches('.').to_owned());
        }
        if let Some(props) = node["properties"].as_object() {
            for (key, sub) in props {
                walk(sub, &format!("{path}.{key}"), out);
            }
        }
    }
    let mut durations = Vec::new();
    walk(&schema(), "", &mut durations);
    let limited: Vec<&str> = LIMITS
        .iter()
        .filter_map(|l| match l.value {
            ChartValue::Duration(p) => Some(p),
            _ => None,
        })
        .collect();
    durations.sort();
    let mut limited_sorted = limited.clone();
    limited_sorted.sort();
    assert_eq!(durations, limited_sorted);
}

/// SPEC P3: each limited value reaches the flag the table names: the chart sets that
/// flag's env var from it.
#[test]
fn p3_each_limited_value_sets_its_flags_env() {
    let helpers = chart_file("templates/_helpers.tpl");
    for limit in LIMITS {
        let path = match limit.value {
            ChartValue::None => continue,
            ChartValue::Integer(p) | ChartValue::Duration(p) | ChartValue::Seconds(p) => p,
        };
        let env = env_of(limit.flag);
        let entry = format!("- name: {env}\n  value: ");
        let at = helpers
            .find(&entry)
            .unwrap_or_else(|| panic!("templates/_helpers.tpl sets no {env}"));
        let line = helpers[at + entry.len()..]
            .lines()
            .next()
            .unwrap_or_default();
        let needle = format!(".Values.{path}");
        let whole = line.match_indices(&needle).any(|(i, _)| {
            let next = line[i + needle.len()..].chars().next();
            next.is_some_and(|c| !c.is_alphanumeric() && c != '.')
        });
        assert!(
            whole,
            "{env} (for {}) is set from `{line}`, not from {path}",
            limit.flag
        );
    }
}
