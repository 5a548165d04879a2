//! One step of the ladder: what was measured, its line and its JSON.

use super::saturation;
use serde_json::{Value, json};
use std::collections::BTreeMap;

#[derive(Default)]
pub(super) struct Step {
    pub crs: usize,
    pub burst: usize,
    /// Both halves of the burst reached their phase within the step's time.
    pub completed: bool,
    /// First flip → last `Active` (or giving up): the window CPU is averaged over.
    pub window_s: f64,
    pub wall_hibernate_s: Option<f64>,
    pub wall_wake_s: Option<f64>,
    /// Average cores over the burst, by process (`host`: the whole machine).
    pub cores: BTreeMap<&'static str, f64>,
    /// CPU seconds over the burst, by process.
    pub cpu_s: BTreeMap<&'static str, f64>,
    pub product_rss_mib: f64,
    pub product_hwm_mib: f64,
    pub apiserver_p50_ms: Option<f64>,
    pub apiserver_p99_ms: Option<f64>,
    /// Requests answered over the burst, WATCH and CONNECT left out.
    pub apiserver_requests: f64,
    pub reaction_p50_ms: Option<f64>,
    pub reaction_p99_ms: Option<f64>,
    pub reactions: usize,
    /// The controller's overhead per direction (`super::super::overhead`).
    pub overhead: Value,
}

fn num(v: Option<f64>, digits: usize) -> String {
    v.map_or("na".into(), |v| format!("{v:.digits$}"))
}

impl Step {
    pub fn core(&self, name: &str) -> Option<f64> {
        self.cores.get(name).copied()
    }

    /// The step's line: `capacity: crs=… burst=… … saturated=…`.
    pub fn line(&self) -> String {
        let sat = saturation::saturated(self);
        let sat = if sat.is_empty() {
            "none".to_owned()
        } else {
            sat.iter().map(|(r, _)| *r).collect::<Vec<_>>().join("+")
        };
        format!(
            "capacity: crs={} burst={} product_cpu={} product_rss_mib={:.0} apiserver_cpu={} \
             apiserver_p99_ms={} reaction_p50_ms={} reaction_p99_ms={} saturated={sat}",
            self.crs,
            self.burst,
            num(self.core("product"), 2),
            self.product_rss_mib,
            num(self.core("apiserver"), 2),
            num(self.apiserver_p99_ms, 0),
            num(self.reaction_p50_ms, 0),
            num(self.reaction_p99_ms, 0),
        )
    }

    pub fn json(&self) -> Value {
        let r = |v: f64| (v * 1000.0).round() / 1000.0;
        let transitions = (2 * self.burst).max(1) as f64;
        let per_transition: BTreeMap<&str, f64> = self
            .cpu_s
            .iter()
            .map(|(k, v)| (*k, r(v * 1000.0 / transitions)))
            .collect();
        json!({
            "crs": self.crs,
            "burst": self.burst,
            "completed": self.completed,
            "window_s": r(self.window_s),
            "wall_hibernate_s": self.wall_hibernate_s.map(r),
            "wall_wake_s": self.wall_wake_s.map(r),
            "cores": self.cores.iter().map(|(k, v)| (*k, r(*v))).collect::<BTreeMap<_, _>>(),
            "cpu_ms_per_transition": per_transition,
            "product_rss_mib": r(self.product_rss_mib),
            "product_hwm_mib": r(self.product_hwm_mib),
            "apiserver_p50_ms": self.apiserver_p50_ms.map(r),
            "apiserver_p99_ms": self.apiserver_p99_ms.map(r),
            "apiserver_requests": self.apiserver_requests,
            "apiserver_requests_per_transition": r(self.apiserver_requests / transitions),
            "reaction_p50_ms": self.reaction_p50_ms.map(r),
            "reaction_p99_ms": self.reaction_p99_ms.map(r),
            "reactions_measured": self.reactions,
            "overhead": self.overhead,
            "saturated": saturation::saturated(self)
                .iter()
                .map(|(k, ratio)| (k.to_string(), json!(r(*ratio))))
                .collect::<serde_json::Map<_, _>>(),
            "load": saturation::ratios(self)
                .iter()
                .map(|(k, ratio)| (k.to_string(), json!(r(*ratio))))
                .collect::<serde_json::Map<_, _>>(),
        })
    }
}
