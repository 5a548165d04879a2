//! The docs cite only paths that exist: every `code` span in README.md, hack/README.md,
//! certs/README.md and docs/*.md that starts with a top-level directory of the repository
//! and has no whitespace (`src/cache/mod.rs`, `charts/cocoon-hibernation/values.yaml`,
//! `tests/e2e/`) must name a file or directory that is there. Placeholders stand for one path part
//! (`fuzz/corpus/<target>`), `…` or `...` for any number of directories, `*`/`**` are
//! globs and `{a,b}` lists alternatives; each must match at least one path. Fenced code
//! blocks are commands and output, not citations, and are left out.

use std::path::Path;

/// Paths that a run makes, which the docs name but a checkout does not have.
const MADE_BY_A_RUN: &[&str] = &["fuzz/artifacts"];

/// The docs the check reads, relative to the repository.
fn docs(root: &Path) -> Vec<String> {
    let mut out = vec![
        "README.md".to_string(),
        "hack/README.md".to_string(),
        "certs/README.md".to_string(),
    ];
    let mut more: Vec<String> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|e| {
            e.expect("docs/ entry")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    more.sort();
    out.extend(more);
    out
}

/// The repository's top-level directories (not hidden, not `target`).
fn top_dirs(root: &Path) -> Vec<String> {
    std::fs::read_dir(root)
        .expect("repository root")
        .map(|e| e.expect("root entry"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.') && n != "target")
        .collect()
}

/// Markdown without its fenced code blocks.
fn without_fences(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// The inline code spans of Markdown (CommonMark: a run of N backticks up to the next
/// run of exactly N), which may wrap across lines.
fn code_spans(text: &str) -> Vec<String> {
    let runs = |s: &str| -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let b = s.as_bytes();
        let mut i = 0;
        while i < b.len() {
            if b[i] == b'`' {
                let start = i;
                while i < b.len() && b[i] == b'`' {
                    i += 1;
                }
                out.push((start, i - start));
            } else {
                i += 1;
            }
        }
        out
    };
    let runs = runs(text);
    let mut spans = Vec::new();
    let mut k = 0;
    while k < runs.len() {
        let (open, n) = runs[k];
        match runs[k + 1..].iter().position(|&(_, m)| m == n) {
            Some(j) => {
                let (close, _) = runs[k + 1 + j];
                spans.push(text[open + n..close].trim().to_string());
                k += j + 2;
            }
            None => k += 1,
        }
    }
    spans
}

/// The spans that cite a repository path.
fn path_citations(spans: &[String], top: &[String]) -> Vec<String> {
    spans
        .iter()
        .filter(|s| !s.chars().any(char::is_whitespace) && s.contains('/'))
        .filter(|s| top.iter().any(|d| s.split('/').next() == Some(d.as_str())))
        .cloned()
        .collect()
}

/// The glob patterns a citation stands for: placeholders to `*`, `…` to `**`, `{a,b}`
/// expanded. A trailing `/` (a directory) is dropped.
fn patterns(cited: &str) -> Vec<String> {
    let mut out = String::new();
    let mut rest = cited.trim_end_matches('/');
    while let Some(i) = rest.find('<') {
        out.push_str(&rest[..i]);
        match rest[i..].find('>') {
            Some(j) => {
                out.push('*');
                rest = &rest[i + j + 1..];
            }
            None => {
                out.push_str(&rest[i..]);
                rest = "";
            }
        }
    }
    out.push_str(rest);
    let out = out.replace('…', "**").replace("...", "**");
    match (out.find('{'), out.find('}')) {
        (Some(a), Some(b)) if a < b => out[a + 1..b]
            .split(',')
            .flat_map(|alt| patterns(&format!("{}{alt}{}", &out[..a], &out[b + 1..])))
            .collect(),
        _ => vec![out],
    }
}

/// Whether a citation names something in the repository at `root`.
fn exists(root: &Path, cited: &str) -> bool {
    if MADE_BY_A_RUN.iter().any(|m| cited.starts_with(m)) {
        return true;
    }
    patterns(cited).iter().all(|p| {
        let full = format!("{}/{p}", root.display());
        glob::glob(&full).is_ok_and(|mut hits| hits.any(|h| h.is_ok()))
    })
}

/// Each `(doc, span)` whose path is not in the repository.
fn missing(root: &Path, doc: &str, text: &str) -> Vec<(String, String)> {
    let spans = code_spans(&without_fences(text));
    path_citations(&spans, &top_dirs(root))
        .into_iter()
        .filter(|c| !exists(root, c))
        .map(|c| (doc.to_string(), c))
        .collect()
}

#[test]
fn every_path_the_docs_cite_exists() {
    let root = &testkit::repo_root();
    let mut bad = Vec::new();
    let mut cited = 0;
    for doc in docs(root) {
        let text = std::fs::read_to_string(root.join(&doc)).expect(&doc);
        cited += path_citations(&code_spans(&without_fences(&text)), &top_dirs(root)).len();
        bad.extend(missing(root, &doc, &text));
    }
    assert!(
        cited > 100,
        "only {cited} path citations found: is the parser broken?"
    );
    let lines: Vec<String> = bad.iter().map(|(d, p)| format!("{d}: `{p}`")).collect();
    assert!(
        bad.is_empty(),
        "the docs cite paths that do not exist:\n{}",
        lines.join("\n")
    );
}

#[test]
fn a_planted_bad_path_is_reported_and_real_ones_are_not() {
    let root = &testkit::repo_root();
    let text = "See `src/cache/nope.rs`, `tests/unit/main.rs`, `src/**`,\n\
                `charts/…/Chart.yaml`, `hack/{image,node}.sh`, `testkit/src/<part>.rs`,\n\
                `hack/{test,gone}.sh`, ``tests/e2e/`` and `cargo test --test e2e`.\n\
                ```sh\nbash src/in/a/fence.sh\n```\n`docs/missing/` and `$HOME/x/y`.";
    let found: Vec<String> = missing(root, "planted.md", text)
        .into_iter()
        .map(|(_, p)| p)
        .collect();
    assert_eq!(
        found,
        ["src/cache/nope.rs", "hack/{test,gone}.sh", "docs/missing/"]
    );
}

#[test]
fn spans_pair_runs_of_equal_length_across_lines() {
    let spans = code_spans("a `x` b ``y ` z`` c `wrapped\nspan` d `unclosed");
    assert_eq!(spans, ["x", "y ` z", "wrapped\nspan"]);
}
