//! The test binaries are counted in one place: docs/architecture.md's "The test binaries"
//! lists exactly the test targets cargo builds (the `[[test]]` entries of Cargo.toml and
//! what cargo finds by itself in `tests/`: `tests/*.rs` and `tests/*/main.rs`), and the
//! number it states is their count. The other docs link there instead of counting.

use std::collections::BTreeSet;
use std::path::Path;

const HEADING: &str = "### The test binaries";
const NUMBERS: [&str; 10] = [
    "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
];

/// The `path`s of Cargo.toml's `[[test]]` tables. Read line by line: the manifest's
/// `[[test]]` tables are flat `key = "value"` lines, and no TOML parser is built here.
fn declared(manifest: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_test = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_test = line == "[[test]]";
        } else if in_test && let Some(value) = line.strip_prefix("path = ") {
            out.push(value.trim_matches('"').to_string());
        }
    }
    out
}

/// What cargo finds by itself (autotests): `tests/*.rs`, `tests/*/main.rs`.
fn discovered(root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(root.join("tests")).expect("tests/") {
        let entry = entry.expect("tests/ entry");
        let name = entry.file_name().to_string_lossy().into_owned();
        let path = entry.path();
        if path.is_file() && name.ends_with(".rs") {
            out.push(format!("tests/{name}"));
        } else if path.join("main.rs").is_file() {
            out.push(format!("tests/{name}/main.rs"));
        }
    }
    out
}

/// Every test target, as the docs name it: `tests/unit` for `tests/unit/main.rs`.
fn targets(root: &Path) -> BTreeSet<String> {
    let manifest = std::fs::read_to_string(root.join("Cargo.toml")).expect("Cargo.toml");
    let mut paths = declared(&manifest);
    if !manifest.contains("autotests = false") {
        paths.extend(discovered(root));
    }
    paths
        .into_iter()
        .map(|p| p.trim_end_matches("/main.rs").to_string())
        .collect()
}

/// The binaries the section's first table lists (first cell), and the number its text states.
fn listed(architecture: &str) -> (BTreeSet<String>, Option<usize>) {
    let mut lines = architecture.lines().skip_while(|l| *l != HEADING);
    assert!(
        lines.next().is_some(),
        "docs/architecture.md has no {HEADING:?}"
    );
    let section: Vec<&str> = lines.take_while(|l| !l.starts_with('#')).collect();
    // The first table only: the section goes on to what each test file proves.
    let rows = section
        .iter()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter(|l| l.starts_with("| `"))
        .filter_map(|l| l.split('`').nth(1))
        .map(str::to_string)
        .collect();
    let text = section.join(" ");
    let stated = NUMBERS
        .iter()
        .position(|n| text.contains(&format!("are {n} test binaries")))
        .map(|i| i + 1);
    (rows, stated)
}

#[test]
fn the_one_list_of_test_binaries_is_every_test_target() {
    let root = &testkit::repo_root();
    let found = targets(root);
    assert!(found.contains("tests/unit"), "{found:?}");
    let architecture =
        std::fs::read_to_string(root.join("docs/architecture.md")).expect("architecture.md");
    let (rows, stated) = listed(&architecture);
    assert_eq!(
        rows, found,
        "docs/architecture.md's {HEADING:?} table (left) is not the test targets (right)"
    );
    assert_eq!(
        stated,
        Some(found.len()),
        "docs/architecture.md must say \"There are {} test binaries\"",
        NUMBERS.get(found.len() - 1).unwrap_or(&"(a number)")
    );
}

#[test]
fn only_the_section_its_rows_its_count_and_the_test_tables_are_read() {
    let doc = "### The test binaries\n\nThere are two test binaries:\n\n\
               | binary | what |\n|---|---|\n| `tests/unit` | x |\n| `tests/e2e` | y |\n\n\
               | `tests/unit/x.rs` | a file |\n## Next\n\
               | `tests/other` | not in the section |\n";
    let (rows, stated) = listed(doc);
    assert_eq!(
        rows,
        BTreeSet::from(["tests/unit".into(), "tests/e2e".into()])
    );
    assert_eq!(stated, Some(2));
    let manifest = "[package]\npath = \"no\"\n[[test]]\nname = \"e2e\"\npath = \"tests/e2e/main.rs\"\ntest = false\n\n[[bench]]\npath = \"benches/x.rs\"\n";
    assert_eq!(declared(manifest), ["tests/e2e/main.rs"]);
}
