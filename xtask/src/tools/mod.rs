//! The Go-built tools the harness needs, built from the Go module proxy into a cache
//! outside the repository and reused from there: the control plane's binaries (`kube`)
//! and the chart checks' tools (`chart`).

pub mod chart;
mod go;
pub mod kube;

use crate::cmd::{self, Result};
use std::fs::File;
use std::path::{Path, PathBuf};

pub use chart::chart_tools;
pub use kube::control_plane;

/// `$COCOON_CACHE`, else `${XDG_CACHE_HOME:-$HOME/.cache}/cocoon-hibernation`.
pub fn cache_root() -> Result<PathBuf> {
    if let Some(dir) = env_nonempty("COCOON_CACHE") {
        return Ok(PathBuf::from(dir));
    }
    let base = match env_nonempty("XDG_CACHE_HOME") {
        Some(dir) => PathBuf::from(dir),
        None => home()?.join(".cache"),
    };
    Ok(base.join("cocoon-hibernation"))
}

pub fn home() -> Result<PathBuf> {
    match env_nonempty("HOME") {
        Some(home) => Ok(PathBuf::from(home)),
        None => cmd::fail("HOME is not set"),
    }
}

/// An environment variable, unset when empty (as `${X:-default}` reads it).
pub fn env_nonempty(key: &str) -> Option<String> {
    std::env::var(key).ok().filter(|v| !v.is_empty())
}

/// `[tag] message` on stderr, the harness's log line.
pub fn log(tag: &str, msg: impl std::fmt::Display) {
    eprintln!("[{tag}] {msg}");
}

/// An exclusive lock on `path` (created), held until the returned file drops. Our files
/// are close-on-exec, so the daemons and builds we start never hold it.
pub fn lock(path: &Path) -> Result<File> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| cmd::Error(format!("cannot create {}: {e}", dir.display())))?;
    }
    let file = File::create(path)
        .map_err(|e| cmd::Error(format!("cannot open {}: {e}", path.display())))?;
    file.lock()
        .map_err(|e| cmd::Error(format!("cannot lock {}: {e}", path.display())))?;
    Ok(file)
}

/// Whether `path` is an executable file.
pub fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Whether `program` is an executable file in a directory of `PATH`.
pub fn on_path(program: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|path| {
        std::env::split_paths(&path).any(|dir| is_executable(&dir.join(program)))
    })
}

/// Writes `text` to `path`, naming the path on failure.
pub fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text)
        .map_err(|e| cmd::Error(format!("cannot write {}: {e}", path.display())))
}

pub fn mkdir(path: &Path) -> Result<()> {
    std::fs::create_dir_all(path)
        .map_err(|e| cmd::Error(format!("cannot create {}: {e}", path.display())))
}
