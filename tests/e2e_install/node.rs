//! What the kubelet and containerd made of the product's pod, read from the host: the
//! container's process (through containerd's task list) and its /proc and cgroup files.

use std::process::Command;

use k8s_openapi::api::core::v1::Pod;

use crate::world::Result;

/// Host pid of the pod's first container.
pub fn container_pid(sock: &str, pod: &Pod) -> Result<u32> {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.container_id.clone())
        .ok_or("the pod reports no container id")?;
    let id = id.trim_start_matches("containerd://").to_owned();
    let out = Command::new("ctr")
        .args(["--address", sock, "--namespace", "k8s.io", "tasks", "ls"])
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            Some((f.next()?, f.next()?))
        })
        .find(|(task, _)| *task == id)
        .and_then(|(_, pid)| pid.parse().ok())
        .ok_or_else(|| format!("containerd has no task {id}").into())
}

/// The enforced security context of a running process.
#[derive(Debug, PartialEq, Eq)]
pub struct Enforced {
    pub uid: String,
    pub cap_eff: String,
    pub no_new_privs: bool,
    /// 2: a seccomp filter is installed (RuntimeDefault).
    pub seccomp: String,
    pub root_read_only: bool,
}

fn status_field(status: &str, key: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .map(|v| v.trim().to_owned())
        .unwrap_or_default()
}

pub fn enforced(pid: u32) -> Result<Enforced> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo"))?;
    // mountinfo: id parent major:minor root mountpoint options ...
    let root_read_only = mounts.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() > 5 && f[4] == "/" && f[5].split(',').any(|o| o == "ro")
    });
    Ok(Enforced {
        uid: status_field(&status, "Uid:"),
        cap_eff: status_field(&status, "CapEff:"),
        no_new_privs: status_field(&status, "NoNewPrivs:") == "1",
        seccomp: status_field(&status, "Seccomp:"),
        root_read_only,
    })
}

/// (current RSS, peak memory of its cgroup) in bytes. The peak comes from the memory
/// controller the container runs under (cgroup v1 or v2).
pub fn memory(pid: u32) -> Result<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let rss_kb: u64 = status_field(&status, "VmRSS:")
        .trim_end_matches("kB")
        .trim()
        .parse()?;
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    let v1 = cgroups.lines().find_map(|l| {
        let mut f = l.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then(|| format!("/sys/fs/cgroup/memory{path}/memory.max_usage_in_bytes"))
    });
    let v2 = cgroups
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .map(|path| format!("/sys/fs/cgroup{path}/memory.peak"));
    let peak = [v1, v2]
        .into_iter()
        .flatten()
        .find_map(|file| std::fs::read_to_string(file).ok())
        .ok_or("no memory cgroup file for the container")?
        .trim()
        .parse()?;
    Ok((rss_kb * 1024, peak))
}

/// The container's memory limit as its cgroup enforces it.
pub fn memory_limit(pid: u32) -> Result<u64> {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup"))?;
    for l in cgroups.lines() {
        let mut f = l.splitn(3, ':');
        let (Some(_), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        let file = if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else {
            continue;
        };
        if let Ok(v) = std::fs::read_to_string(file) {
            return Ok(v.trim().parse()?);
        }
    }
    Err("no memory limit file for the container".into())
}
