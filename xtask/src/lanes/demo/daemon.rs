//! The demo's own processes (the server, the simulator): daemons of the demo dir, as the
//! control plane's are (`cluster::daemons`: a session of their own, pid file guarded
//! against pid reuse, SIGTERM then SIGKILL), with the control plane's environment.

use crate::cluster::daemons;
use crate::cmd::{Result, fail};
use crate::lanes::control_plane::Env;
use std::net::{Ipv4Addr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct Daemons {
    pub dir: PathBuf,
}

impl Daemons {
    pub fn pid_file(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.pid"))
    }

    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    /// The pid of `name` when its pid file names a live process running it.
    pub fn pid(&self, name: &str) -> Option<u32> {
        daemons::pid(&self.dir, name)
    }

    /// Starts `program args` as `name` with the cluster's environment, detached, output
    /// appended to its log.
    pub fn start(&self, name: &str, env: &Env, program: &Path, args: &[String]) -> Result<u32> {
        daemons::start_with_env(&self.dir, name, program, args, &env.vars)
    }

    pub fn stop(&self, name: &str) {
        daemons::stop(&self.dir, name);
    }
}

/// Someone listens on 127.0.0.1:`port`.
pub fn port_in_use(port: u16) -> bool {
    TcpStream::connect_timeout(
        &(Ipv4Addr::LOCALHOST, port).into(),
        Duration::from_millis(200),
    )
    .is_ok()
}

/// A loopback port nobody listens on, not in `taken`.
pub fn free_port(taken: &[u16]) -> Result<u16> {
    daemons::free_port(&mut taken.to_vec())
}

/// The port the user gave in `var` (refused if taken), else a free one.
pub fn port(var: &str, taken: &[u16]) -> Result<u16> {
    let Some(given) = crate::lanes::var(var) else {
        return free_port(taken);
    };
    let Ok(port) = given.parse::<u16>() else {
        return fail(format!("{var}={given} is not a port"));
    };
    if port_in_use(port) {
        return fail(format!(
            "{var}={given}: another program listens on 127.0.0.1:{given}; pick another port, or unset {var} for a free one"
        ));
    }
    Ok(port)
}

/// What still runs of `pid_files`: "name (pid), …" (or "nothing") and their resident MB.
pub fn running(pid_files: &[PathBuf]) -> (String, u64) {
    let mut list = Vec::new();
    let mut kb = 0;
    for f in pid_files {
        let Some(pid) = std::fs::read_to_string(f)
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
            continue;
        };
        if status
            .lines()
            .any(|l| l.starts_with("State:") && l.contains("zombie"))
        {
            continue;
        }
        kb += rss_kb(&status);
        let name = f
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default();
        list.push(format!("{name} ({pid})"));
    }
    let list = if list.is_empty() {
        "nothing".to_string()
    } else {
        list.join(", ")
    };
    (list, kb / 1024)
}

fn rss_kb(proc_status: &str) -> u64 {
    proc_status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

/// The `*.pid` files in each of `dirs`, by name.
pub fn pid_files(dirs: &[PathBuf]) -> Vec<PathBuf> {
    let mut all = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let mut files: Vec<PathBuf> = entries
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "pid"))
            .collect();
        files.sort();
        all.extend(files);
    }
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resident_memory_is_read_from_proc_status() {
        assert_eq!(rss_kb("Name:\tx\nVmRSS:\t   2048 kB\nThreads: 1\n"), 2048);
        assert_eq!(rss_kb("Name:\tx\n"), 0);
    }

    #[test]
    fn a_pid_file_of_another_program_is_not_ours() {
        let dir = std::env::temp_dir().join(format!("xtask-demo-daemon-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let daemons = Daemons { dir: dir.clone() };
        // Our own pid runs the test binary, not `cocoon-hibernation`.
        std::fs::write(
            daemons.pid_file("cocoon-hibernation"),
            std::process::id().to_string(),
        )
        .expect("pid file");
        assert_eq!(daemons.pid("cocoon-hibernation"), None);
        std::fs::write(daemons.pid_file("x"), "not a pid").expect("pid file");
        assert_eq!(daemons.pid("x"), None);
        let (list, _) = running(&pid_files(std::slice::from_ref(&dir)));
        assert_eq!(list, format!("cocoon-hibernation ({})", std::process::id()));
        std::fs::remove_dir_all(&dir).expect("clean up");
    }

    #[test]
    fn a_free_port_is_not_one_taken() {
        let port = free_port(&[]).expect("a free port");
        assert!((20_000..32_000).contains(&port));
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("bind");
        assert!(port_in_use(port));
        drop(listener);
    }
}
