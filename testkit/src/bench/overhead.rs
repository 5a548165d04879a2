//! The controller's overhead in a round (issue 23): the round's wall minus the time the
//! simulator itself needed on the critical path.
//!
//! The critical path is the chain of the CR that reached the round's terminal phase
//! last: the product's request on its pod, the simulator's own work for its VM (from
//! seeing the request to its last write returning, [`vk_sim::Span`]), then the product
//! seeing that and writing the terminal phase. What is left once the simulator's part
//! is taken out is the controller's (and the apiserver's) share of the wall.

use super::report::{self, Figures, Kind};
use crate::vk_sim::{Action, Span};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Instant;

/// One direction of a round.
pub(super) struct Round {
    /// Round start → the last CR in its terminal phase.
    wall_s: f64,
    /// The simulator's own time for the VM of that last CR.
    sim_s: Option<f64>,
    /// The simulator's own time per VM, every CR of the round.
    sim_all_s: Vec<f64>,
}

impl Round {
    /// `reached`: when each CR reached the terminal phase; `spans`: the simulator's work
    /// per VM in the round; `vm`: a CR's VM (the bench names a CR after its pod).
    pub(super) fn measure(
        reached: &HashMap<String, Instant>,
        since: Instant,
        spans: &HashMap<String, Span>,
        vm: impl Fn(&str) -> String,
    ) -> Self {
        let last = reached.iter().max_by_key(|(_, t)| **t);
        let wall_s = last.map_or(0.0, |(_, t)| {
            t.saturating_duration_since(since).as_secs_f64()
        });
        let sim = |cr: &str| spans.get(&vm(cr)).map(|s| s.took().as_secs_f64());
        Self {
            wall_s,
            sim_s: last.and_then(|(cr, _)| sim(cr)),
            sim_all_s: reached.keys().filter_map(|cr| sim(cr)).collect(),
        }
    }

    pub(super) fn overhead_s(&self) -> Option<f64> {
        self.sim_s.map(|s| (self.wall_s - s).max(0.0))
    }

    /// Sets `rt.sim_<dir>_s` and `rt.overhead_<dir>_s`; returns the detail for the JSON.
    pub(super) fn record(&self, action: Action, figs: &mut Figures) -> Value {
        let (sim, overhead) = match action {
            Action::Hibernate => ("rt.sim_hibernate_s", "rt.overhead_hibernate_s"),
            Action::Wake => ("rt.sim_wake_s", "rt.overhead_wake_s"),
        };
        figs.set(sim, self.sim_s, "", Kind::Info);
        figs.set(overhead, self.overhead_s(), "", Kind::Time);
        self.detail()
    }

    pub(super) fn detail(&self) -> Value {
        let p = |q| report::pct(&self.sim_all_s, q).map(report::round);
        json!({
            "wall_s": report::round(self.wall_s),
            "sim_on_critical_path_s": self.sim_s.map(report::round),
            "overhead_s": self.overhead_s().map(report::round),
            "sim_per_vm_s": { "n": self.sim_all_s.len(), "p50": p(0.5), "p99": p(0.99), "max": p(1.0) },
        })
    }
}
