//! The daemons of a state dir: each started detached in its own session (a Ctrl-C or a
//! killed test process group leaves it running), with `<name>.pid` and `<name>.log` in the
//! state dir. A pid file counts only while `/proc/<pid>/exe` is still that daemon's
//! program, so a reused pid is never signalled.

use crate::cmd::{self, Result};
use std::fs::OpenOptions;
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The program a daemon's `/proc/<pid>/exe` must name.
pub fn program_of(name: &str) -> &str {
    match name {
        "registry" => "docker-registry",
        other => other,
    }
}

/// Whether `exe` (a `/proc/<pid>/exe` target) is daemon `name`'s program. A binary rebuilt
/// since it started reads `<path> (deleted)`, and still counts.
pub fn exe_is(name: &str, exe: &Path) -> bool {
    let exe = exe.to_string_lossy();
    let exe = exe.strip_suffix(" (deleted)").unwrap_or(&exe);
    Path::new(exe)
        .file_name()
        .is_some_and(|f| f == program_of(name))
}

/// Parses a pid file's text.
pub fn parse_pid(text: &str) -> Option<u32> {
    text.trim().parse().ok().filter(|&pid| pid > 0)
}

fn pid_file(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.pid"))
}

/// Whether `pid` runs `name`'s program now (a zombie or a reused pid does not).
pub fn is_running(pid: u32, name: &str) -> bool {
    std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|exe| exe_is(name, &exe))
}

/// The pid of daemon `name` of `dir`, if its pid file names a live process running it.
pub fn pid(dir: &Path, name: &str) -> Option<u32> {
    let pid = parse_pid(&std::fs::read_to_string(pid_file(dir, name)).ok()?)?;
    is_running(pid, name).then_some(pid)
}

/// Starts `program args` as daemon `name`: stdin from /dev/null, stdout and stderr
/// appended to `<dir>/<name>.log`, in a session of its own (`setsid`: std cannot call
/// setsid(2) without unsafe code).
pub fn start(dir: &Path, name: &str, program: &Path, args: &[String]) -> Result<u32> {
    start_with_env(dir, name, program, args, &[])
}

/// [`start`], with `env` set for the daemon (the demo's server and simulator get the
/// control plane's variables).
pub fn start_with_env(
    dir: &Path,
    name: &str,
    program: &Path,
    args: &[String],
    env: &[(String, String)],
) -> Result<u32> {
    let pid_path = pid_file(dir, name);
    let _ = std::fs::remove_file(&pid_path);
    let log_path = dir.join(format!("{name}.log"));
    let log = OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)
        .map_err(|e| cmd::Error(format!("cannot open {}: {e}", log_path.display())))?;
    let err = log
        .try_clone()
        .map_err(|e| cmd::Error(format!("cannot open {}: {e}", log_path.display())))?;
    // Our child is never a process group leader, so setsid(1) calls setsid(2) and execs
    // without forking: the child's pid is the daemon's.
    let mut setsid = Command::new("setsid");
    let inherited = inherited_fds();
    if !inherited.is_empty() {
        // Descriptors our caller left open across exec (flock(1)'s lock, cargo's jobserver
        // pipes) would be held by the daemon for its whole life: closed before its exec.
        // std cannot close them in the child without unsafe code; bash can (dash only
        // knows descriptors 0-9).
        let closes: String = inherited
            .iter()
            .map(|fd| format!("exec {fd}>&-; "))
            .collect();
        setsid
            .args(["bash", "-c"])
            .arg(format!("{closes}exec \"$0\" \"$@\""));
    }
    let mut child = setsid
        .arg(program)
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(err)
        .spawn()
        .map_err(|e| {
            cmd::Error(format!(
                "cannot start {name} (setsid {}): {e}",
                program.display()
            ))
        })?;
    let pid = child.id();
    // Reap it if it dies while we live (a long-lived caller such as the soak); a CLI
    // caller exits and init adopts it.
    std::thread::spawn(move || child.wait());
    let started = Instant::now();
    while !is_running(pid, name) {
        if started.elapsed() > Duration::from_secs(2) {
            return cmd::fail(format!("{name} did not start (see {})", log_path.display()));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    crate::tools::write(&pid_path, &format!("{pid}\n"))?;
    Ok(pid)
}

/// Whether an fdinfo's `flags:` (octal) lack O_CLOEXEC, i.e. the fd survives an exec.
pub fn survives_exec(fdinfo: &str) -> bool {
    const O_CLOEXEC: u32 = 0o2_000_000;
    fdinfo
        .lines()
        .find_map(|l| l.strip_prefix("flags:"))
        .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
        .is_some_and(|flags| flags & O_CLOEXEC == 0)
}

/// Our descriptors above stderr that an exec would pass on.
fn inherited_fds() -> Vec<u32> {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return Vec::new();
    };
    let mut fds: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&fd| fd > 2)
        .filter(|fd| {
            std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))
                .is_ok_and(|info| survives_exec(&info))
        })
        .collect();
    fds.sort_unstable();
    fds
}

fn signal(pid: u32, sig: &str) {
    // std has no kill(2) without unsafe code; kill(1) is in every base system.
    let _ = Command::new("kill")
        .args([sig, &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// SIGTERM, 10 s to exit, then SIGKILL; the pid file goes either way.
pub fn stop(dir: &Path, name: &str) {
    if let Some(pid) = pid(dir, name) {
        signal(pid, "-TERM");
        let deadline = Instant::now() + Duration::from_secs(10);
        while is_running(pid, name) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        if is_running(pid, name) {
            crate::tools::log(
                "cluster",
                format!("{name} ({pid}) ignored SIGTERM for 10s; sending SIGKILL"),
            );
            signal(pid, "-KILL");
        }
    }
    let _ = std::fs::remove_file(pid_file(dir, name));
}

/// A loopback port nobody listens on, below the kernel's ephemeral range (so outgoing
/// connections do not grab it meanwhile), not in `taken`; added to `taken`.
pub fn free_port(taken: &mut Vec<u16>) -> Result<u16> {
    for _ in 0..200 {
        let port = 20000 + (crate::cluster::random_u64() % 12000) as u16;
        if taken.contains(&port) {
            continue;
        }
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            continue;
        }
        taken.push(port);
        return Ok(port);
    }
    cmd::fail("no free loopback port found")
}

/// Polls `ready` every 100 ms for up to `secs`; logs `<what> ready` when it is.
pub fn wait_until(secs: u64, what: &str, mut ready: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if ready() {
            crate::tools::log("cluster-up", format!("{what} ready"));
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pid_file_counts_only_for_its_own_program() {
        assert!(exe_is("etcd", Path::new("/cache/bin/etcd")));
        assert!(exe_is("registry", Path::new("/usr/bin/docker-registry")));
        // Rebuilt since it started: the old inode is still the daemon.
        assert!(exe_is(
            "kube-apiserver",
            Path::new("/cache/bin/kube-apiserver (deleted)")
        ));
        // A reused pid running something else.
        assert!(!exe_is("etcd", Path::new("/usr/bin/bash")));
        assert!(!exe_is("registry", Path::new("/usr/bin/registry-helper")));
        assert!(!exe_is("etcd", Path::new("/cache/bin/etcdctl")));
    }

    #[test]
    fn pid_files_parse_strictly() {
        assert_eq!(parse_pid("1234\n"), Some(1234));
        assert_eq!(parse_pid(""), None);
        assert_eq!(parse_pid("0"), None);
        assert_eq!(parse_pid("12 34"), None);
        assert_eq!(parse_pid("-5"), None);
    }

    #[test]
    fn a_live_pid_of_another_program_is_not_the_daemon() {
        // This test process is alive, but it is not etcd.
        assert!(!is_running(std::process::id(), "etcd"));
        let dir = std::env::temp_dir().join(format!("xtask-pid-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("etcd.pid"), format!("{}\n", std::process::id())).unwrap();
        assert_eq!(pid(&dir, "etcd"), None);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_started_daemon_is_found_by_its_pid_file_and_stopped() {
        let dir = std::env::temp_dir().join(format!("xtask-daemon-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let sleep = PathBuf::from("/bin/sleep");
        let started = start(&dir, "sleep", &sleep, &["30".to_owned()]).unwrap();
        assert_eq!(pid(&dir, "sleep"), Some(started));
        // Its own session: the daemon leads it.
        let stat = std::fs::read_to_string(format!("/proc/{started}/stat")).unwrap();
        let fields: Vec<&str> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .collect();
        assert_eq!(fields[3], started.to_string(), "session id of {stat}");
        stop(&dir, "sleep");
        assert!(!is_running(started, "sleep"));
        assert!(!dir.join("sleep.pid").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn only_descriptors_without_cloexec_survive_an_exec() {
        assert!(survives_exec("pos:\t0\nflags:\t0100002\nmnt_id:\t25\n"));
        assert!(!survives_exec("pos:\t0\nflags:\t02100002\nmnt_id:\t25\n"));
        assert!(!survives_exec("pos:\t0\n"));
    }

    /// Run by the next test inside `sh -c 'exec 7>>FILE; exec <this binary>'`: fd 7 is
    /// then open across exec in this process, as flock(1) leaves its lock.
    #[test]
    #[ignore = "run by a_daemon_does_not_hold_a_descriptor_its_caller_left_open"]
    fn start_with_fd_7_inherited() {
        let dir = PathBuf::from(std::env::var("XTASK_FD_TEST_DIR").unwrap());
        assert!(inherited_fds().contains(&7), "the wrapper left fd 7 open");
        let started = start(&dir, "sleep", Path::new("/bin/sleep"), &["30".to_owned()]).unwrap();
        let mut held: Vec<u32> = std::fs::read_dir(format!("/proc/{started}/fd"))
            .unwrap()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        held.sort_unstable();
        stop(&dir, "sleep");
        assert_eq!(held, vec![0, 1, 2], "the daemon holds more than stdio");
    }

    #[test]
    fn a_daemon_does_not_hold_a_descriptor_its_caller_left_open() {
        let dir = std::env::temp_dir().join(format!("xtask-fds-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let out = Command::new("sh")
            .arg("-c")
            .arg("exec 7>>\"$0/lock\"; exec \"$1\" --exact --ignored --test-threads=1 cluster::daemons::tests::start_with_fd_7_inherited")
            .arg(&dir)
            .arg(std::env::current_exe().unwrap())
            .env("XTASK_FD_TEST_DIR", &dir)
            .output()
            .unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{text}{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn free_ports_are_distinct_and_in_range() {
        let mut taken = Vec::new();
        let a = free_port(&mut taken).unwrap();
        let b = free_port(&mut taken).unwrap();
        assert_ne!(a, b);
        assert!((20000..32000).contains(&a) && (20000..32000).contains(&b));
        assert_eq!(taken, vec![a, b]);
    }
}
