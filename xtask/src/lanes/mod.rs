//! The runs built on control planes: `make test` and its three lanes, the soak, the
//! benchmark, the install suite, the compatibility runs and the demo. This module holds
//! what they share: where output goes, an interruptible runner, the cargo command.

pub mod bench;
pub mod compat;
pub mod control_plane;
pub mod demo;
pub mod install;
pub mod scripts;
pub mod soak;
pub mod test;

use crate::cmd::{Error, Result, describe, fail, repo_root};
use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, ExitStatus};
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);
static HANDLER: Once = Once::new();

/// From now on Ctrl-C or SIGTERM does not end the harness at once: it stops the command
/// running now, and the run goes on to stop what it started (control planes, daemons).
pub fn catch_interrupts() {
    HANDLER.call_once(|| {
        if let Err(e) = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst)) {
            eprintln!("xtask: no signal handler ({e}); an interrupted run may leave daemons");
        }
    });
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Where a run's own lines and its commands' output go: the terminal or a lane's log.
pub enum Out {
    Terminal,
    Log(File),
}

impl Out {
    /// A new log file (replacing an old one) at `path`, written in append mode so other
    /// handles on it (a child's stderr) never overwrite each other.
    pub fn create(path: &std::path::Path) -> Result<Out> {
        File::create(path).map_err(|e| Error(format!("{}: {e}", path.display())))?;
        control_plane::append(path).map(Out::Log)
    }

    /// One line of the run's own: stdout on the terminal, else the log.
    pub fn line(&self, text: &str) {
        match self {
            Out::Terminal => println!("{text}"),
            // A log that cannot be written to has nowhere better to report it.
            Out::Log(f) => {
                let mut f: &File = f;
                let _ = writeln!(f, "{text}");
            }
        }
    }

    /// `=== WHAT (HH:MM:SS)` after an empty line, as every step of `make test` starts.
    pub fn step(&self, what: &str) {
        self.line(&format!("\n=== {what} ({})", utc_hms()));
    }

    /// The log file (a new handle), `None` on the terminal.
    pub fn file(&self) -> Result<Option<File>> {
        match self {
            Out::Terminal => Ok(None),
            Out::Log(f) => f
                .try_clone()
                .map(Some)
                .map_err(|e| Error(format!("log file: {e}"))),
        }
    }

    /// Sends `cmd`'s stdout and stderr where this run's output goes.
    pub fn attach(&self, cmd: &mut Command) -> Result<()> {
        if let Out::Log(f) = self {
            let clone = || f.try_clone().map_err(|e| Error(format!("log file: {e}")));
            cmd.stdout(clone()?).stderr(clone()?);
        }
        Ok(())
    }
}

/// Runs `cmd` with its output sent to `out`; a failure names it. An interrupt stops it.
pub fn run(out: &Out, cmd: &mut Command) -> Result<()> {
    let status = status(out, cmd)?;
    if status.success() {
        Ok(())
    } else {
        fail(format!("`{}` failed ({status})", describe(cmd)))
    }
}

/// Like [`run`], but returns the exit status instead of failing on it.
pub fn status(out: &Out, cmd: &mut Command) -> Result<ExitStatus> {
    if interrupted() {
        return fail(format!("interrupted before `{}`", describe(cmd)));
    }
    out.attach(cmd)?;
    let mut child = cmd
        .spawn()
        .map_err(|e| Error(format!("could not start `{}`: {e}", describe(cmd))))?;
    let mut stopped = false;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) => {}
            Err(e) => return fail(format!("waiting for `{}`: {e}", describe(cmd))),
        }
        if interrupted() && !stopped {
            terminate(child.id());
            stopped = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// SIGTERM to `pid`, through kill(1): the crate forbids unsafe code, so no libc call.
pub fn terminate(pid: u32) {
    let _ = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// `cargo` (the one running us) in the repository root, with the target dir every run uses.
/// Without the variables `cargo run` set for us (see [`crate::chart::cargo`]).
pub fn cargo() -> Result<Command> {
    crate::chart::cargo(&repo_root()?)
}

/// `$HOME`, which every default cache path starts from.
pub fn home() -> Result<PathBuf> {
    match std::env::var_os("HOME") {
        Some(h) if !h.is_empty() => Ok(PathBuf::from(h)),
        _ => fail("HOME is not set"),
    }
}

/// `~/.cache/cocoon-hibernation`: control planes, tools and the default target dir.
pub fn cache_home() -> Result<PathBuf> {
    Ok(home()?.join(".cache/cocoon-hibernation"))
}

/// `$CARGO_TARGET_DIR`, default `~/.cache/cocoon-hibernation/target` (as the Makefile's).
pub fn target_dir() -> Result<PathBuf> {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(d) if !d.is_empty() => Ok(PathBuf::from(d)),
        _ => Ok(cache_home()?.join("target")),
    }
}

/// An environment variable, `None` when unset or empty (as `${X:-default}` reads it).
pub fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// The flag variables' reading: set to exactly `1`.
pub fn flag(name: &str) -> bool {
    var(name).as_deref() == Some("1")
}

/// The wall clock's time of day in UTC, `HH:MM:SS`.
pub fn utc_hms() -> String {
    hms(now().as_secs())
}

/// The same with milliseconds, `HH:MM:SS.mmm`.
pub fn utc_hms_ms() -> String {
    let now = now();
    format!("{}.{:03}", hms(now.as_secs()), now.subsec_millis())
}

fn now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

fn hms(unix_secs: u64) -> String {
    let day = unix_secs % 86_400;
    format!("{:02}:{:02}:{:02}", day / 3600, day % 3600 / 60, day % 60)
}

/// Sums cargo's `test result: ok. N passed; M failed; ...` lines: (passed, failed).
pub fn tally(text: &str) -> (u64, u64) {
    let mut sum = (0, 0);
    for line in text.lines().filter(|l| l.starts_with("test result:")) {
        let words: Vec<&str> = line.split_whitespace().collect();
        let number = |i: usize| {
            words
                .get(i)
                .and_then(|w| w.trim_end_matches(';').parse::<u64>().ok())
                .unwrap_or(0)
        };
        sum.0 += number(3);
        sum.1 += number(5);
    }
    sum
}

/// The last non-empty line of a command's stdout: what the scripts print for callers.
pub fn last_line(stdout: &str) -> Option<&str> {
    stdout.lines().rev().map(str::trim).find(|l| !l.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tally_sums_every_test_result_line_and_ignores_the_rest() {
        let log = "running 3 tests\n\
            test result: ok. 12 passed; 0 failed; 1 ignored; 0 measured\n\
            noise: test result: 99 passed\n\
            test result: FAILED. 3 passed; 2 failed; 0 ignored\n";
        assert_eq!(tally(log), (15, 2));
        assert_eq!(tally(""), (0, 0));
    }

    #[test]
    fn time_of_day_is_zero_padded_utc() {
        assert_eq!(hms(0), "00:00:00");
        assert_eq!(hms(86_400 + 3_600 * 13 + 60 * 5 + 9), "13:05:09");
    }

    #[test]
    fn last_line_skips_trailing_blank_lines() {
        assert_eq!(last_line("a\nb\n\n"), Some("b"));
        assert_eq!(last_line("\n"), None);
    }
}
