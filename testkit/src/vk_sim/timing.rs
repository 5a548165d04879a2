//! When the simulator saw each request and when it finished its own work (snapshot push,
//! container restart), per VM: the bench subtracts the simulator's own time from a
//! round's wall to get the controller's overhead.

use super::Action;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Spans kept per VM: a bench round makes two (hibernate, wake); a soak makes many, so
/// only the latest are kept.
const KEEP: usize = 8;

/// One request the simulator carried out for a VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    pub action: Action,
    /// The simulator saw the request (the pod event that started its worker, or the
    /// worker's re-read that found it).
    pub seen: Instant,
    /// Its last write for the request returned (the container status report).
    pub done: Instant,
}

impl Span {
    /// The simulator's own time for the request.
    pub fn took(&self) -> Duration {
        self.done.saturating_duration_since(self.seen)
    }
}

#[derive(Debug, Default)]
pub struct Timings {
    by_vm: Mutex<HashMap<String, Vec<Span>>>,
}

impl Timings {
    pub(super) fn record(&self, vm: &str, span: Span) {
        let Ok(mut by_vm) = self.by_vm.lock() else {
            return;
        };
        let spans = by_vm.entry(vm.to_owned()).or_default();
        if spans.len() == KEEP {
            spans.remove(0);
        }
        spans.push(span);
    }

    /// Per VM, the first span of `action` seen at or after `since`.
    pub fn since(&self, action: Action, since: Instant) -> HashMap<String, Span> {
        let Ok(by_vm) = self.by_vm.lock() else {
            return HashMap::new();
        };
        by_vm
            .iter()
            .filter_map(|(vm, spans)| {
                let s = spans
                    .iter()
                    .find(|s| s.action == action && s.seen >= since)?;
                Some((vm.clone(), *s))
            })
            .collect()
    }
}
