//! `cargo xtask chart-version`: the chart's version follows its files (a gate of `make test`).
//!
//! hack/chart-releases.txt records, for each released chart version, a digest of the
//! chart's files as released. The check fails when
//!   - Chart.yaml names a released version but the files differ from that release
//!     (a change without a bump),
//!   - Chart.yaml names a new version that is not greater than every released one, or
//!   - CHANGELOG.md has no section for Chart.yaml's version.
//!
//! `--release` (`make chart-release`, when the chart ships) records the current version's
//! digest. The digest: sha256 over every file's path and bytes, sorted by path; tests/ is
//! left out (helm unittest suites, not in the package: .helmignore).

use super::read;
use crate::cmd::{Error, Result, fail};
use std::cmp::Ordering;
use std::fs;
use std::path::{Path, PathBuf};

const CHART: &str = "charts/cocoon-hibernation";
const RECORD: &str = "hack/chart-releases.txt";

/// Checks (or with `release`, records) the chart in the repository at `root`.
pub fn run(root: &Path, release: bool) -> Result<()> {
    if release {
        println!("{}", record(root)?);
        return Ok(());
    }
    let errors = check(root)?;
    for e in &errors {
        eprintln!("chart-version: FAIL: {e}");
    }
    if !errors.is_empty() {
        return fail(format!("{} chart version problem(s) (above)", errors.len()));
    }
    let chart = root.join(CHART);
    println!(
        "chart-version: ok ({}, {}…)",
        version_of(&chart)?,
        &digest(&chart)?[..19]
    );
    Ok(())
}

/// Every file under `dir` but tests/, as (path relative to `dir`, absolute path).
fn files(dir: &Path, rel: &Path, out: &mut Vec<(PathBuf, PathBuf)>) -> Result<()> {
    let entries = fs::read_dir(dir).map_err(|e| Error(format!("{}: {e}", dir.display())))?;
    for entry in entries {
        let entry = entry.map_err(|e| Error(format!("{}: {e}", dir.display())))?;
        let path = entry.path();
        let rel = rel.join(entry.file_name());
        if path.is_dir() {
            files(&path, &rel, out)?;
        } else if path.is_file() {
            out.push((rel, path));
        }
    }
    Ok(())
}

/// `sha256:<hex>` over every file's path, length and bytes, sorted by path (component by
/// component, as `PathBuf` sorts), tests/ left out.
pub fn digest(chart: &Path) -> Result<String> {
    let mut all = Vec::new();
    files(chart, Path::new(""), &mut all)?;
    all.retain(|(rel, _)| !rel.starts_with("tests"));
    all.sort();
    let mut data = Vec::new();
    for (rel, path) in all {
        let bytes = fs::read(&path).map_err(|e| Error(format!("{}: {e}", path.display())))?;
        data.extend_from_slice(rel.to_string_lossy().as_bytes());
        data.push(0);
        data.extend_from_slice(bytes.len().to_string().as_bytes());
        data.push(0);
        data.extend_from_slice(&bytes);
    }
    Ok(format!("sha256:{}", super::sha256_hex(&data)))
}

/// Chart.yaml's `version:`.
pub fn version_of(chart: &Path) -> Result<String> {
    let file = chart.join("Chart.yaml");
    let found = read(&file)?.lines().find_map(|l| {
        let v = l.strip_prefix("version:")?.trim_start();
        let v = v.strip_prefix(['"', '\'']).unwrap_or(v);
        let end = v
            .find(|c: char| c == '"' || c == '\'' || c == '#' || c.is_whitespace())
            .unwrap_or(v.len());
        Some(v[..end].to_string()).filter(|v| !v.is_empty())
    });
    match found {
        Some(v) => Ok(v),
        None => fail(format!("chart-version: no version in {}", file.display())),
    }
}

/// A SemVer version's precedence: a pre-release sorts before its release; build metadata
/// is ignored.
#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Key {
    core: (u64, u64, u64),
    release: bool,
    pre: Vec<(u8, u64, String)>,
}

pub fn key(version: &str) -> Result<Key> {
    let bad = || {
        Error(format!(
            "chart-version: {version:?} is not SemVer (MAJOR.MINOR.PATCH)"
        ))
    };
    let ident = |s: &str| {
        !s.is_empty()
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
    };
    let (rest, build) = match version.split_once('+') {
        Some((r, b)) => (r, Some(b)),
        None => (version, None),
    };
    if build.is_some_and(|b| !ident(b)) {
        return Err(bad());
    }
    let (core, pre) = match rest.split_once('-') {
        Some((c, p)) if ident(p) => (c, Some(p)),
        Some(_) => return Err(bad()),
        None => (rest, None),
    };
    let nums: Vec<u64> = core
        .split('.')
        .map(|n| {
            if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                n.parse().map_err(|_| bad())
            } else {
                Err(bad())
            }
        })
        .collect::<Result<_>>()?;
    let [major, minor, patch] = nums[..] else {
        return Err(bad());
    };
    let release = pre.is_none();
    let pre = pre
        .map(|p| {
            p.split('.')
                .map(|part| match part.parse::<u64>() {
                    Ok(n) if part.bytes().all(|b| b.is_ascii_digit()) => (0, n, String::new()),
                    _ => (1, 0, part.to_string()),
                })
                .collect()
        })
        .unwrap_or_default();
    Ok(Key {
        core: (major, minor, patch),
        release,
        pre,
    })
}

/// hack/chart-releases.txt: version → digest, in file order.
fn released(root: &Path) -> Result<Vec<(String, String)>> {
    let path = root.join(RECORD);
    if !path.exists() {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for line in read(&path)?.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        match line.split_whitespace().collect::<Vec<_>>()[..] {
            [v, d] => out.push((v.to_string(), d.to_string())),
            _ => return fail(format!("{RECORD}: not `VERSION DIGEST`: {line}")),
        }
    }
    Ok(out)
}

/// A `## [VERSION]` (or `## VERSION`) heading in CHANGELOG.md.
fn has_changelog(root: &Path, version: &str) -> bool {
    let Ok(text) = fs::read_to_string(root.join("CHANGELOG.md")) else {
        return false;
    };
    text.lines().any(|line| {
        let Some(rest) = line.strip_prefix("## ") else {
            return false;
        };
        let rest = rest.strip_prefix('[').unwrap_or(rest);
        let Some(rest) = rest.strip_prefix(version) else {
            return false;
        };
        let rest = rest.strip_prefix(']').unwrap_or(rest);
        rest.is_empty() || rest.starts_with(char::is_whitespace)
    })
}

/// The check's findings; empty when the chart's version follows its files.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let chart = root.join(CHART);
    let (version, now, rel) = (version_of(&chart)?, digest(&chart)?, released(root)?);
    let mut errors = Vec::new();
    if let Some((_, d)) = rel.iter().find(|(v, _)| *v == version) {
        if *d != now {
            errors.push(format!(
                "chart files changed since {version} was released: \
                 bump version in Chart.yaml and add a CHANGELOG entry"
            ));
        }
    } else {
        let mine = key(&version)?;
        let mut keyed = rel
            .iter()
            .map(|(v, _)| Ok((key(v)?, v.as_str())))
            .collect::<Result<Vec<_>>>()?;
        keyed.sort_by(|a, b| a.0.cmp(&b.0));
        let newer: Vec<&str> = keyed
            .iter()
            .filter(|(k, _)| k.cmp(&mine) != Ordering::Less)
            .map(|(_, v)| *v)
            .collect();
        if let (false, Some((_, max))) = (newer.is_empty(), keyed.last()) {
            errors.push(format!(
                "Chart.yaml version {version} is new but not greater than the released {}: \
                 bump past {max}",
                newer.join(", ")
            ));
        }
    }
    if !has_changelog(root, &version) {
        errors.push(format!("CHANGELOG.md has no section '## [{version}]'"));
    }
    Ok(errors)
}

/// Records the current version's digest; the line to print.
pub fn record(root: &Path) -> Result<String> {
    let chart = root.join(CHART);
    let (version, now, rel) = (version_of(&chart)?, digest(&chart)?, released(root)?);
    key(&version)?;
    if !has_changelog(root, &version) {
        return fail(format!(
            "chart-version: CHANGELOG.md has no section '## [{version}]'"
        ));
    }
    match rel.iter().find(|(v, _)| *v == version) {
        Some((_, d)) if *d == now => {
            return Ok(format!("chart-version: {version} already recorded"));
        }
        Some(_) => {
            return fail(format!(
                "chart-version: {version} was released with other files: bump the version"
            ));
        }
        None => {}
    }
    let path = root.join(RECORD);
    let mut text = fs::read_to_string(&path).unwrap_or_default();
    text.push_str(&format!("{version} {now}\n"));
    super::write(&path, text)?;
    Ok(format!(
        "chart-version: recorded {version} {now} in {RECORD}"
    ))
}

#[cfg(test)]
mod tests {
    //! Each case changes one thing in a copy of the chart, the release record and
    //! CHANGELOG.md, and expects a pass or the failure it names.
    use super::*;

    /// A copy of the repository's parts the check reads, removed on drop.
    struct Copy(PathBuf);

    impl Drop for Copy {
        fn drop(&mut self) {
            let _ = fs::remove_dir_all(&self.0);
        }
    }

    fn copy_dir(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            if e.path().is_dir() {
                copy_dir(&e.path(), &to.join(e.file_name()));
            } else {
                fs::copy(e.path(), to.join(e.file_name())).unwrap();
            }
        }
    }

    fn fresh() -> Copy {
        let repo = crate::cmd::repo_root().unwrap();
        let dir = std::env::temp_dir().join(format!(
            "chart-version-test.{}",
            crate::chart::random_suffix().unwrap()
        ));
        copy_dir(&repo.join(CHART), &dir.join(CHART));
        fs::create_dir_all(dir.join("hack")).unwrap();
        fs::copy(repo.join(RECORD), dir.join(RECORD)).unwrap();
        fs::copy(repo.join("CHANGELOG.md"), dir.join("CHANGELOG.md")).unwrap();
        Copy(dir)
    }

    impl Copy {
        fn set_version(&self, v: &str) {
            let p = self.0.join(CHART).join("Chart.yaml");
            let text = fs::read_to_string(&p).unwrap();
            let text: Vec<String> = text
                .lines()
                .map(|l| {
                    if l.starts_with("version:") {
                        format!("version: {v}")
                    } else {
                        l.to_string()
                    }
                })
                .collect();
            fs::write(&p, text.join("\n") + "\n").unwrap();
        }

        fn append(&self, rel: &str, text: &str) {
            let p = self.0.join(rel);
            let mut t = fs::read_to_string(&p).unwrap();
            t.push_str(text);
            fs::write(&p, t).unwrap();
        }

        fn errors(&self) -> Vec<String> {
            check(&self.0).unwrap()
        }
    }

    fn assert_fails(errors: &[String], text: &str) {
        assert!(
            errors.iter().any(|e| e.contains(text)),
            "want {text:?}: {errors:?}"
        );
    }

    #[test]
    fn the_repository_as_it_is_passes() {
        assert_eq!(fresh().errors(), Vec::<String>::new());
    }

    #[test]
    fn the_released_version_with_a_changed_file_fails() {
        let r = fresh();
        r.set_version("0.4.0");
        r.append(&format!("{CHART}/templates/NOTES.txt"), "# a new comment\n");
        assert_fails(
            &r.errors(),
            "chart files changed since 0.4.0 was released: bump version in Chart.yaml",
        );
    }

    #[test]
    fn a_file_changed_after_release_recorded_the_version_fails() {
        let r = fresh();
        assert!(record(&r.0).is_ok());
        r.append(&format!("{CHART}/values.yaml"), "# a new comment\n");
        assert_fails(&r.errors(), "chart files changed since");
    }

    #[test]
    fn a_change_under_tests_after_release_passes() {
        let r = fresh();
        let line = record(&r.0).unwrap();
        assert!(line.starts_with("chart-version: recorded "), "{line}");
        assert_eq!(
            record(&r.0).ok().map(|l| l.ends_with("already recorded")),
            Some(true)
        );
        r.append(&format!("{CHART}/tests/defaults_test.yaml"), "# changed\n");
        assert_eq!(r.errors(), Vec::<String>::new());
    }

    #[test]
    fn a_new_version_below_the_released_one_fails() {
        let r = fresh();
        r.set_version("0.3.9");
        r.append("CHANGELOG.md", "\n## [0.3.9]\n");
        assert_fails(&r.errors(), "not greater than the released 0.4.0");
    }

    #[test]
    fn a_pre_release_of_a_released_version_fails() {
        let r = fresh();
        r.set_version("0.4.0-rc.1");
        r.append("CHANGELOG.md", "\n## [0.4.0-rc.1]\n");
        assert_fails(&r.errors(), "not greater than the released 0.4.0");
    }

    #[test]
    fn a_new_version_needs_its_changelog_section() {
        let r = fresh();
        r.set_version("0.9.0");
        assert_fails(&r.errors(), "CHANGELOG.md has no section '## [0.9.0]'");
        r.append("CHANGELOG.md", "\n## [0.9.0] - unreleased\n");
        assert_eq!(r.errors(), Vec::<String>::new());
    }

    #[test]
    fn semver_precedence() {
        let k = |v: &str| key(v).unwrap();
        assert!(k("0.4.0-rc.1") < k("0.4.0"));
        assert!(k("0.4.0-alpha") < k("0.4.0-alpha.1"));
        assert!(k("0.4.0-alpha.1") < k("0.4.0-alpha.beta"));
        assert!(k("0.4.0-rc.2") < k("0.4.0-rc.10"));
        assert!(k("0.10.0") > k("0.9.9"));
        assert_eq!(k("1.0.0+build.1"), k("1.0.0"));
        for bad in ["0.4", "v0.4.0", "0.4.0-", "0.4.x", "0.4.0-rc_1"] {
            assert!(key(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn the_digest_sorts_paths_component_by_component() {
        let r = fresh();
        let chart = r.0.join("c");
        fs::create_dir_all(chart.join("a")).unwrap();
        fs::create_dir_all(chart.join("a-b")).unwrap();
        fs::write(chart.join("a/b"), "1").unwrap();
        fs::write(chart.join("a-b/x"), "2").unwrap();
        // "a/b" before "a-b/x" (Python's PurePath order, which the record was made with).
        let want = super::super::sha256_hex(b"a/b\x001\x001a-b/x\x001\x002");
        assert_eq!(digest(&chart).ok(), Some(format!("sha256:{want}")));
    }
}
