//! The demo's own processes (the server, the simulator): started detached with a pid file
//! and a log in the demo dir, found again by pid file guarded against pid reuse, stopped
//! with SIGTERM, then SIGKILL after 10 s.

use crate::cmd::{Error, Result, fail};
use crate::lanes::control_plane::{Env, append};
use crate::lanes::terminate;
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

    /// The pid of `name` when its pid file names a live process running an executable
    /// called `name` (so a reused pid is not taken for ours).
    pub fn pid(&self, name: &str) -> Option<u32> {
        let pid: u32 = std::fs::read_to_string(self.pid_file(name))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let exe = std::fs::read_link(format!("/proc/{pid}/exe")).ok()?;
        // Rebuilt since it started (cargo replaced the demo's server): still ours.
        let exe = exe.to_string_lossy();
        let exe = exe.trim_end_matches(" (deleted)");
        (Path::new(exe).file_name()?.to_str()? == name).then_some(pid)
    }

    /// Starts `program args` as `name` with the cluster's environment, in a process group
    /// of its own (a Ctrl-C of the caller leaves it running), stdin closed, output
    /// appended to its log.
    pub fn start(&self, name: &str, env: &Env, program: &Path, args: &[String]) -> Result<u32> {
        let pid_file = self.pid_file(name);
        let _ = std::fs::remove_file(&pid_file);
        let log = append(&self.log(name))?;
        let err = log.try_clone().map_err(|e| Error(format!("log: {e}")))?;
        let mut cmd = Command::new(program);
        let child = env
            .apply(&mut cmd)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .process_group(0)
            .spawn()
            .map_err(|e| Error(format!("{name} did not start ({}): {e}", program.display())))?;
        std::fs::write(&pid_file, format!("{}\n", child.id()))
            .map_err(|e| Error(format!("{}: {e}", pid_file.display())))?;
        Ok(child.id())
    }

    pub fn stop(&self, name: &str) {
        if let Some(pid) = self.pid(name) {
            terminate(pid);
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.pid(name).is_some() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(100));
            }
            if self.pid(name).is_some() {
                eprintln!("[demo] {name} ({pid}) ignored SIGTERM for 10s; sending SIGKILL");
                let _ = Command::new("kill")
                    .args(["-KILL", &pid.to_string()])
                    .status();
            }
        }
        let _ = std::fs::remove_file(self.pid_file(name));
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

/// A loopback port nobody listens on, below the kernel's ephemeral range (so outgoing
/// connections do not grab it meanwhile), not in `taken`.
pub fn free_port(taken: &[u16]) -> Result<u16> {
    use std::hash::{BuildHasher, Hasher};
    for _ in 0..200 {
        // RandomState's keys are random per instance: a random number without a crate.
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u8(0);
        let port = 20_000 + u16::try_from(h.finish() % 12_000).unwrap_or(0);
        if !taken.contains(&port)
            && !port_in_use(port)
            && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
        {
            return Ok(port);
        }
    }
    fail("no free loopback port found")
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
        let dir = std::env::temp_dir().join(format!("xtask-daemon-{}", std::process::id()));
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
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, port)).expect("bind");
        assert!(port_in_use(port));
        drop(listener);
    }
}
