//! Running other programs: one checked runner, so a failure always names its command.

use std::fmt;
use std::path::PathBuf;
use std::process::{Command, Output};

/// A harness failure: what was being done and why it failed.
#[derive(Debug)]
pub struct Error(pub String);

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Error {}

pub type Result<T> = std::result::Result<T, Error>;

/// Formats an error the same way everywhere.
pub fn fail<T>(what: impl Into<String>) -> Result<T> {
    Err(Error(what.into()))
}

/// The repository root: the checkout the harness runs in.
pub fn repo_root() -> Result<PathBuf> {
    // Found at run time: one target dir serves every checkout and cargo does not rebuild
    // a binary whose checkout moved, so the compile-time manifest dir may be another one.
    let starts = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .into_iter()
        .chain(std::env::current_dir().ok());
    for start in starts {
        if let Some(root) = start
            .ancestors()
            .find(|d| d.join("Cargo.lock").is_file() && d.join("xtask/Cargo.toml").is_file())
        {
            return Ok(root.to_path_buf());
        }
    }
    fail("not inside the repository: run the harness from its checkout (`cargo xtask`)")
}

/// The command line, for error messages.
pub fn describe(cmd: &Command) -> String {
    let mut line = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        line.push(' ');
        line.push_str(&arg.to_string_lossy());
    }
    line
}

/// Runs `cmd` with inherited stdio; an exit other than 0 is an error naming it.
pub fn run(cmd: &mut Command) -> Result<()> {
    let line = describe(cmd);
    let status = cmd
        .status()
        .map_err(|e| Error(format!("could not start `{line}`: {e}")))?;
    if status.success() {
        Ok(())
    } else {
        fail(format!("`{line}` failed ({status})"))
    }
}

/// Runs `cmd` and returns its stdout; an exit other than 0 is an error with its stderr.
pub fn output(cmd: &mut Command) -> Result<String> {
    let line = describe(cmd);
    let Output {
        status,
        stdout,
        stderr,
    } = cmd
        .output()
        .map_err(|e| Error(format!("could not start `{line}`: {e}")))?;
    if status.success() {
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    } else {
        fail(format!(
            "`{line}` failed ({status}): {}",
            String::from_utf8_lossy(&stderr).trim()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failing_command_is_named_in_the_error() {
        let err = run(Command::new("false").arg("--flag")).err().map(|e| e.0);
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("`false --flag` failed")),
            "{err:?}"
        );
    }

    #[test]
    fn output_returns_stdout_and_names_a_missing_program() {
        assert_eq!(
            output(Command::new("echo").arg("hi")).ok().as_deref(),
            Some("hi\n")
        );
        let err = output(&mut Command::new("no-such-program-xtask"))
            .err()
            .map(|e| e.0);
        assert!(
            err.as_deref()
                .is_some_and(|e| e.contains("could not start `no-such-program-xtask`")),
            "{err:?}"
        );
    }
}
