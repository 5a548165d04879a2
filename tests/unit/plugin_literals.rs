//! The plugin names every controller word it matches on (condition types, reasons,
//! phases) by the operator's constants, never by a string literal: a renamed reason then
//! breaks the build instead of the plugin's verdicts. The words are read from the files
//! that define them, so a new reason is checked without touching this test. Tests inside
//! the plugin's files may spell the wire format out; product code may not.

use cocoon_hibernation::api::Phase;
use std::path::Path;

/// The files whose `pub const NAME: &str = "..."` are the controller's words.
const DEFINED_IN: &[&str] = &["crates/api/src/conditions.rs", "crates/api/src/schedule.rs"];

/// The string literals in `code`, in order; `\"` inside one and the char `'"'` are handled.
fn literals(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' if chars.peek() == Some(&'"') => {
                chars.next();
            }
            '"' => {
                let mut text = String::new();
                while let Some(c) = chars.next() {
                    match c {
                        '\\' => text.extend(chars.next()),
                        '"' => break,
                        c => text.push(c),
                    }
                }
                out.push(text);
            }
            _ => {}
        }
    }
    out
}

/// A file's product code: up to its `#[cfg(test)]`, comment lines left out.
fn product_code(source: &str) -> String {
    source
        .lines()
        .take_while(|l| l.trim() != "#[cfg(test)]")
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Every word the controller writes that the plugin may match on.
fn controller_words(root: &Path) -> Vec<String> {
    let mut words: Vec<String> = Phase::ALL.iter().map(|p| p.as_str().into()).collect();
    for file in DEFINED_IN {
        let source = std::fs::read_to_string(root.join(file)).expect(file);
        for line in source.lines() {
            let Some(rest) = line.strip_prefix("pub const ") else {
                continue;
            };
            if rest.contains(": &str = ") {
                words.extend(literals(rest));
            }
        }
    }
    words.sort();
    words.dedup();
    words
}

/// The plugin's sources: `crates/kubectl-cocoon/src/*.rs`, its binary included.
fn plugin_files(root: &Path) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(root.join("crates/kubectl-cocoon/src"))
        .expect("crates/kubectl-cocoon/src/")
        .map(|e| e.expect("crates/kubectl-cocoon/src/ entry").file_name())
        .map(|n| format!("crates/kubectl-cocoon/src/{}", n.to_string_lossy()))
        .filter(|n| n.ends_with(".rs"))
        .collect();
    files.sort();
    files
}

#[test]
fn the_scanner_finds_literals_and_skips_comments_and_tests() {
    let cases: &[(&str, &[&str])] = &[
        (r#"if r == "Failed" { x("a\"b") }"#, &["Failed", "a\"b"]),
        (r#"let q = '"'; let s = "Done";"#, &["Done"]),
        ("/// was \"Failed\"\nlet a = 1;", &[]),
        (
            "let a = \"Done\";\n#[cfg(test)]\nlet b = \"Failed\";",
            &["Done"],
        ),
    ];
    for (code, want) in cases {
        assert_eq!(literals(&product_code(code)), *want, "{code}");
    }
    let words = controller_words(&testkit::repo_root());
    for known in [
        "Ready",
        "Progressing",
        "Failed",
        "Conflict",
        "VMChanged",
        "Applied",
    ] {
        assert!(
            words.iter().any(|w| w == known),
            "{known} not read: {words:?}"
        );
    }
}

#[test]
fn the_plugin_matches_controller_words_by_their_constants() {
    let root = &testkit::repo_root();
    let words = controller_words(root);
    let mut found = Vec::new();
    for file in plugin_files(root) {
        let source = std::fs::read_to_string(root.join(&file)).expect(&file);
        for literal in literals(&product_code(&source)) {
            if words.contains(&literal) {
                found.push(format!("{file}: \"{literal}\""));
            }
        }
    }
    assert!(
        found.is_empty(),
        "use the constants of crates/api/src/conditions.rs, crates/api/src/schedule.rs or \
         api::Phase instead of: {found:#?}"
    );
}
