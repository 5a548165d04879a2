//! SPEC P3 A3 K8: the docs name everything a user meets. Every visible flag of
//! `cocoon-hibernation` (the same clap model `--help` prints) has a row in install.md's
//! Configuration table with its env var, and no row names a flag that does not exist;
//! every Reason the product writes (the CR's conditions, the schedule's Ready) has a row
//! in operations.md's troubleshooting tables, and no row names a reason it never writes.

use cocoon_hibernation::config::Cli;
use std::collections::BTreeSet;

fn doc(rel: &str) -> String {
    let path = testkit::repo_root().join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The lines of the section that starts with `heading`, up to the next heading of the
/// same or a higher level.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    let level = heading.split(' ').next().unwrap_or_default();
    let mut lines = text.lines().skip_while(|l| *l != heading);
    assert!(lines.next().is_some(), "no section {heading:?}");
    lines
        .take_while(|l| {
            let hashes = l.split(' ').next().unwrap_or_default();
            !(l.starts_with('#') && hashes.chars().all(|c| c == '#') && hashes.len() <= level.len())
        })
        .collect()
}

/// The table rows of some lines, as cells (header and separator rows left out).
fn rows<'a>(lines: &[&'a str]) -> Vec<Vec<&'a str>> {
    let mut out = Vec::new();
    for l in lines.iter().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
        let header = cells
            .first()
            .is_some_and(|c| c.starts_with("---") || !c.starts_with('`') && !c.starts_with('('));
        if !header {
            out.push(cells);
        }
    }
    out
}

/// The `code` spans of a cell.
fn spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Each visible long flag of every subcommand (and the top level), with its env var.
fn visible_flags() -> Vec<(String, Option<String>)> {
    let root = <Cli as clap::CommandFactory>::command();
    let mut out = Vec::new();
    let commands =
        std::iter::once(&root).chain(root.get_subcommands().filter(|c| !c.is_hide_set()));
    for command in commands {
        for arg in command.get_arguments().filter(|a| !a.is_hide_set()) {
            let Some(long) = arg.get_long() else { continue };
            if long == "help" || long == "version" {
                continue;
            }
            let env = arg.get_env().map(|e| e.to_string_lossy().into_owned());
            let flag = (format!("--{long}"), env);
            if !out.contains(&flag) {
                out.push(flag);
            }
        }
    }
    out
}

/// SPEC P3: every flag documented, with its env var; no documented flag is missing.
#[test]
fn p3_every_flag_has_a_row_in_the_configuration_table() {
    let install = doc("docs/install.md");
    let table = rows(&section(&install, "## Configuration"));
    assert!(table.len() > 20, "{} rows", table.len());
    let mut documented = BTreeSet::new();
    for row in &table {
        let (flags, envs) = (
            spans(row[0]),
            spans(row.get(1).copied().unwrap_or_default()),
        );
        for flag in flags {
            let (_, env) = visible_flags()
                .into_iter()
                .find(|(f, _)| f == flag)
                .unwrap_or_else(|| {
                    panic!("install.md documents {flag}, which the binary does not have")
                });
            if let Some(env) = env {
                assert!(
                    envs.contains(&env.as_str()),
                    "install.md's row for {flag} lacks {env}"
                );
            }
            documented.insert(flag.to_owned());
        }
    }
    let missing: Vec<String> = visible_flags()
        .into_iter()
        .map(|(f, _)| f)
        .filter(|f| !documented.contains(f))
        .collect();
    assert!(
        missing.is_empty(),
        "flags missing from install.md's Configuration table: {missing:?}"
    );
}

/// SPEC P3: each bounded flag's row states the binary's own range (config::LIMITS).
#[test]
fn p3_each_flags_row_states_its_range() {
    use cocoon_hibernation::config::{Bound, LIMITS, format_duration};
    let install = doc("docs/install.md");
    let table = rows(&section(&install, "## Configuration"));
    for limit in LIMITS {
        let range = match limit.bound {
            Bound::Integer { min, max } => format!("{min}–{max}"),
            Bound::Duration { min, max } => {
                format!("{}–{}", format_duration(min), format_duration(max))
            }
        };
        let row = table
            .iter()
            .find(|r| spans(r[0]).contains(&limit.flag))
            .unwrap_or_else(|| panic!("no row for {}", limit.flag));
        assert!(
            row.last().is_some_and(|m| m.contains(&range)),
            "install.md's row for {} does not state its range {range}",
            limit.flag
        );
    }
}

/// SPEC P3: every visible subcommand is named in install.md.
#[test]
fn p3_every_subcommand_is_documented() {
    let install = doc("docs/install.md");
    let root = <Cli as clap::CommandFactory>::command();
    for command in root.get_subcommands().filter(|c| !c.is_hide_set()) {
        let named = format!("cocoon-hibernation {}", command.get_name());
        assert!(install.contains(&named), "install.md never names `{named}`");
    }
}

/// The string values of `pub const REASON_*: &str = "...";` in a source file.
fn reason_constants(rel: &str) -> BTreeSet<String> {
    let source = doc(rel);
    let found: BTreeSet<String> = source
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub const REASON_"))
        .filter_map(|l| l.split('"').nth(1))
        .map(str::to_owned)
        .collect();
    assert!(!found.is_empty(), "{rel} has no REASON_ constant");
    found
}

/// The reasons named in the first column of a section's tables.
fn documented_reasons(text: &str, heading: &str) -> BTreeSet<String> {
    rows(&section(text, heading))
        .iter()
        .flat_map(|row| spans(row[0]))
        .map(str::to_owned)
        .collect()
}

/// SPEC A3: every reason of a CR's Ready, Progressing and SnapshotDeleted conditions
/// has a row under operations.md's "Troubleshooting by Reason"; every row is a reason.
#[test]
fn a3_every_cr_reason_is_in_the_troubleshooting_tables() {
    let ops = doc("docs/operations.md");
    let written = reason_constants("crates/api/src/conditions.rs");
    let documented = documented_reasons(&ops, "## Troubleshooting by Reason");
    let missing: Vec<&String> = written.difference(&documented).collect();
    assert!(
        missing.is_empty(),
        "reasons missing from operations.md: {missing:?}"
    );
    // The schedule's table is a subsection; its reasons are checked below.
    let known: BTreeSet<String> = written
        .union(&reason_constants("crates/api/src/schedule.rs"))
        .cloned()
        .collect();
    let stale: Vec<&String> = documented.difference(&known).collect();
    assert!(
        stale.is_empty(),
        "operations.md documents reasons never written: {stale:?}"
    );
    let snapshot = documented_reasons(&ops, "### The SnapshotDeleted condition");
    for reason in [
        "Done",
        "DeleteFailed",
        "SharedDigest",
        "SnapshotMoved",
        "KeptForHibernate",
        "HibernateNotRecorded",
    ] {
        assert!(
            snapshot.contains(reason),
            "SnapshotDeleted's table lacks {reason}"
        );
    }
}

/// SPEC K8: every reason of a schedule's Ready condition has a row in operations.md.
#[test]
fn k8_every_schedule_reason_is_in_the_troubleshooting_tables() {
    let ops = doc("docs/operations.md");
    let written = reason_constants("crates/api/src/schedule.rs");
    let documented = documented_reasons(&ops, "### A schedule's Ready reasons");
    assert_eq!(written, documented, "operations.md's schedule reasons");
}

/// The full install commands in the docs name an image that exists: the chart's default
/// repository is not published, so a command keeping it never starts (P5).
#[test]
fn p5_every_documented_install_command_names_the_image() {
    let mut commands = 0;
    for rel in ["docs/install.md", "docs/operations.md", "README.md"] {
        let text = doc(rel);
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            if !line
                .trim_start()
                .starts_with("helm install cocoon-hibernation ")
            {
                continue;
            }
            commands += 1;
            // The command runs on while its lines end with a backslash.
            let command: Vec<&str> = lines[i..]
                .iter()
                .take_while(|l| !l.trim().is_empty() && !l.starts_with("```"))
                .copied()
                .collect();
            let command = command.join("\n");
            assert!(
                command.contains("image.repository="),
                "{rel} line {}: the install command keeps the unpublished default image:\n{command}",
                i + 1
            );
        }
    }
    assert!(
        commands >= 2,
        "found {commands} full install commands in the docs"
    );
}
