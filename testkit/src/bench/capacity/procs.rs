//! CPU time of the processes that share the machine, from /proc: the product, the
//! control plane's daemons (pids from the cluster's state dir), this bench process (the
//! simulator, the watches, the driver), and the whole host.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

/// (busy, total) jiffies of every core, from /proc/stat.
fn host_jiffies() -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: f64 = v.iter().sum();
    let idle = v.get(3)? + v.get(4)?;
    Some((total - idle, total))
}

/// A daemon's pid from cluster-up's `<state dir>/<name>.pid`.
pub(super) fn daemon_pid(state_dir: &Path, name: &str) -> Option<u32> {
    std::fs::read_to_string(state_dir.join(format!("{name}.pid")))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The processes measured, by name.
#[derive(Clone)]
pub(super) struct Procs(pub Vec<(&'static str, u32)>);

/// CPU times at one instant.
pub(super) struct Sample {
    at: Instant,
    cpu: BTreeMap<&'static str, f64>,
    host: Option<(f64, f64)>,
}

impl Procs {
    pub(super) fn sample(&self) -> Sample {
        Sample {
            at: Instant::now(),
            cpu: self
                .0
                .iter()
                .filter_map(|(name, pid)| Some((*name, crate::bench::metrics::cpu_s(*pid)?)))
                .collect(),
            host: host_jiffies(),
        }
    }
}

/// Cores each process used on average between two samples, and `host`: the machine's
/// busy share times its cores.
pub(super) fn cores(a: &Sample, b: &Sample) -> BTreeMap<&'static str, f64> {
    let wall = b.at.saturating_duration_since(a.at).as_secs_f64().max(1e-3);
    let mut out: BTreeMap<&'static str, f64> = b
        .cpu
        .iter()
        .filter_map(|(name, after)| Some((*name, (after - a.cpu.get(name)?) / wall)))
        .collect();
    if let (Some((busy0, total0)), Some((busy1, total1))) = (a.host, b.host) {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        out.insert("host", (busy1 - busy0) / (total1 - total0).max(1.0) * n);
    }
    out
}

/// CPU seconds each process used between two samples.
pub(super) fn cpu_seconds(a: &Sample, b: &Sample) -> BTreeMap<&'static str, f64> {
    b.cpu
        .iter()
        .filter_map(|(name, after)| Some((*name, after - a.cpu.get(name)?)))
        .collect()
}
