//! The schedule's decisions for one pass (K2, K4–K7): which CocoonHibernations to create,
//! flip, mark or release. Pure; the controller fetches the inputs and executes the plan.

use cocoon_api::{Desire, Phase};
use jiff::Timestamp;
use std::collections::BTreeMap;

pub use cocoon_api::schedule::{
    OVERRIDE_UNTIL, SCHEDULE_BOUNDARY, SCHEDULE_DESIRE, SCHEDULE_LABEL, SCHEDULE_UID,
};

/// What the schedule wrote on a CR, read back from its annotations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub uid: String,
    pub desire: Desire,
    pub boundary: Timestamp,
}

/// A CR as the plan reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrState {
    pub desire: Desire,
    pub phase: Option<Phase>,
    /// `Failed` with reason `Conflict` (S2): skipped (K7).
    pub conflict: bool,
    pub mark: Option<Mark>,
    pub override_until: Option<Timestamp>,
}

/// Who drives a selected pod (K6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Driver {
    Us,
    /// The older schedule that does.
    Other(String),
}

#[derive(Clone, Debug)]
pub struct Inputs {
    pub now: Timestamp,
    /// The calendar's desire now.
    pub desire: Desire,
    /// The latest boundary at or before now (the epoch when the calendar has none).
    pub boundary: Timestamp,
    pub uid: String,
    pub suspend: bool,
    pub max_in_flight: Option<u32>,
    /// The schedule is being deleted: release everything (K4).
    pub deleting: bool,
    pub wake_on_delete: bool,
    /// Selected pods naming a VM, with their driver.
    pub pods: BTreeMap<String, Driver>,
    /// CRs by pod name: those of the selected pods and every CR marked with our uid.
    pub crs: BTreeMap<String, CrState>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    Create {
        pod: String,
        desire: Desire,
    },
    /// Write the desire and the mark in one patch.
    Flip {
        cr: String,
        desire: Desire,
    },
    /// The desire is already right: record the boundary only.
    Mark {
        cr: String,
        desire: Desire,
    },
    /// Remove the schedule's label and annotations; `wake` also sets the desire to Wake.
    Release {
        cr: String,
        wake: bool,
    },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub managed: u32,
    pub overridden: u32,
    pub conflicting: u32,
    /// `pod (driven by schedule)`, for status.
    pub conflicts: Vec<String>,
    /// CRs of ours left alone because a person changed them (K5).
    pub overrides: Vec<String>,
    /// Writes deferred by K7: look again soon.
    pub pending: bool,
}

fn in_transition(phase: Option<Phase>) -> bool {
    matches!(phase, Some(Phase::Hibernating | Phase::Waking))
}

/// K7: counts against maxInFlight: in transition, or not yet settled at its desire (a
/// flip the CR controller has not picked up yet is on its way into a transition).
fn in_flight(cr: &CrState) -> bool {
    let settled = match cr.desire {
        Desire::Hibernate => Phase::Hibernated,
        _ => Phase::Active,
    };
    !matches!(cr.phase, Some(p) if p == settled || p == Phase::Failed)
}

/// The whole pass for one schedule.
pub fn plan(input: &Inputs) -> Plan {
    let mut plan = Plan::default();
    let ours = |cr: &CrState| cr.mark.as_ref().is_some_and(|m| m.uid == input.uid);
    let mut in_flight = input
        .crs
        .values()
        .filter(|cr| ours(cr) && in_flight(cr))
        .count();
    let budget = input
        .max_in_flight
        .map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
    let mut take_slot = |plan: &mut Plan| {
        if in_flight < budget {
            in_flight += 1;
            true
        } else {
            plan.pending = true;
            false
        }
    };

    // K4: release whatever is ours and no longer driven by us (or everything, on delete).
    for (name, cr) in input.crs.iter().filter(|(_, cr)| ours(cr)) {
        let driven = !input.deleting && input.pods.get(name) == Some(&Driver::Us);
        let other = matches!(input.pods.get(name), Some(Driver::Other(_)));
        if driven || (other && !input.deleting) {
            continue;
        }
        let wake = input.deleting && input.wake_on_delete && cr.desire != Desire::Wake;
        if wake && (in_transition(cr.phase) || cr.conflict) {
            plan.pending = true;
            continue;
        }
        plan.actions.push(Action::Release {
            cr: name.clone(),
            wake,
        });
    }
    if input.deleting {
        return plan;
    }

    for (pod, driver) in &input.pods {
        if let Driver::Other(by) = driver {
            plan.conflicting += 1;
            plan.conflicts.push(format!("{pod} (driven by {by})"));
            continue;
        }
        let Some(cr) = input.crs.get(pod) else {
            if input.suspend {
                continue;
            }
            // A new CR may pass through a transition whichever its desire.
            if !take_slot(&mut plan) {
                continue;
            }
            plan.managed += 1;
            plan.actions.push(Action::Create {
                pod: pod.clone(),
                desire: input.desire,
            });
            continue;
        };
        let Some(mark) = cr.mark.as_ref().filter(|_| ours(cr)) else {
            // K4: never adopted; the pod is the person's (or another schedule's).
            plan.overridden += 1;
            continue;
        };
        let overridden = match cr.override_until {
            Some(until) => input.now < until,
            None => mark.boundary >= input.boundary && cr.desire != mark.desire,
        };
        if overridden {
            plan.overridden += 1;
            plan.overrides.push(pod.clone());
            continue;
        }
        plan.managed += 1;
        let current = mark.boundary >= input.boundary && cr.override_until.is_none();
        if input.suspend || (current && cr.desire == input.desire) {
            continue;
        }
        if cr.desire == input.desire {
            plan.actions.push(Action::Mark {
                cr: pod.clone(),
                desire: input.desire,
            });
        } else if cr.conflict {
            // K7: S2 clears it on its own; the next boundary (or pass) retries.
        } else if in_transition(cr.phase) {
            plan.pending = true;
        } else if take_slot(&mut plan) {
            plan.actions.push(Action::Flip {
                cr: pod.clone(),
                desire: input.desire,
            });
        }
    }
    plan
}

/// K6: of the schedules selecting a pod (creation time, name), the oldest drives it.
pub fn driver<'a>(selecting: impl IntoIterator<Item = (Timestamp, &'a str)>) -> Option<&'a str> {
    selecting.into_iter().min().map(|(_, name)| name)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
