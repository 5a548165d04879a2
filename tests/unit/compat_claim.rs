//! The oldest Kubernetes minor the project claims is the one `make compat` runs: the docs,
//! the chart's `kubeVersion`, `cargo xtask compat`'s default versions (xtask/src/lanes/compat.rs) and the harness smoke
//! test's floor name the same minor, so raising or lowering it is one change everywhere.

fn read(rel: &str) -> String {
    let path = testkit::repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The text after the first `prefix` in `text`, up to the first character not in `1.0-9`
/// (a version like `1.30` or `1.30.14`).
fn version_after<'a>(text: &'a str, prefix: &str, file: &str) -> &'a str {
    let start = text
        .find(prefix)
        .unwrap_or_else(|| panic!("{file} has no `{prefix}`"))
        + prefix.len();
    let rest = &text[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(rest.len());
    rest[..end].trim_end_matches('.')
}

/// `1.30.14` -> `1.30`
fn minor(version: &str) -> String {
    version.split('.').take(2).collect::<Vec<_>>().join(".")
}

#[test]
fn the_claimed_minimum_is_the_minor_make_compat_runs() {
    let docs = read("docs/install.md");
    let claimed = version_after(&docs, "Requirements: Kubernetes ≥ ", "docs/install.md");
    let tested = version_after(&docs, "Tested: v", "docs/install.md");
    let chart = read("charts/cocoon-hibernation/Chart.yaml");
    let chart_floor = version_after(&chart, "kubeVersion: \">=", "Chart.yaml");
    let compat = read("xtask/src/lanes/compat.rs");
    let compat_oldest = version_after(&compat, "DEFAULT_VERSIONS: &[&str] = &[\"v", "compat.rs");
    let smoke = read("tests/e2e/harness_smoke.rs");
    let smoke_floor = version_after(&smoke, "const OLDEST_MINOR: u32 = ", "harness_smoke.rs");

    assert!(claimed.split('.').count() == 2, "docs claim `{claimed}`");
    assert_eq!(minor(chart_floor), claimed, "Chart.yaml kubeVersion");
    assert_eq!(
        compat_oldest, tested,
        "cargo xtask compat runs what the docs say was tested"
    );
    assert_eq!(
        minor(compat_oldest),
        claimed,
        "cargo xtask compat's oldest version"
    );
    assert_eq!(
        format!("1.{smoke_floor}"),
        claimed,
        "harness_smoke's OLDEST_MINOR"
    );
}
