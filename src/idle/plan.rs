//! The idle policy's decisions for one pass (I3–I5): which activity Leases to create,
//! which CRs to create, which pods to hibernate (each one fenced on its Lease by the
//! controller), and when to look again. Pure; the controller fetches and executes.
//!
//! How a pod is shared (I4), in order of precedence:
//!
//! | the pod's CR                                   | the idle policy                         |
//! |------------------------------------------------|-----------------------------------------|
//! | none                                           | creates it (desire Wake), marked ours   |
//! | none, and a schedule selects the pod           | waits for the schedule to create it     |
//! | a person's (no mark of a policy or schedule)   | never adopted: left alone (overridden)  |
//! | ours or a schedule's, `override-until` ahead   | left alone until then (overridden)      |
//! | a schedule's, the schedule last wrote Hibernate| left alone: the schedule keeps it asleep|
//! | a schedule's, the schedule last wrote Wake     | hibernates it when idle; the schedule   |
//! |                                                | sees a changed desire and leaves it     |
//! |                                                | until its next boundary (K5), then wins |
//! | ours                                           | hibernates it when idle                 |
//! | another idle policy's, or its pod driven by an | left alone (conflicting)                |
//! | older idle policy                              |                                         |
//!
//! Waking is never this plan's: a person, a schedule or the wake proxy wakes a pod.

use crate::api::{Desire, Phase};
use jiff::Timestamp;
use std::collections::BTreeMap;
use std::time::Duration;

// The marks an idle policy writes on a CR are part of the API (the wake proxy writes one).
pub use cocoon_api::idle::{IDLE_AT, IDLE_DESIRE, IDLE_LABEL, IDLE_UID};
/// I5: wakes in a row that ended `Failed` after which wake on request stops.
pub const MAX_FAILED_WAKES: u32 = 3;

/// What an idle policy wrote on a CR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Mark {
    pub uid: String,
    pub desire: Desire,
    pub at: Timestamp,
}

/// A CR as the plan reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrState {
    pub desire: Desire,
    pub phase: Option<Phase>,
    /// `Failed` with reason `Conflict` (S2): skipped.
    pub conflict: bool,
    /// The idle policy's mark, whichever policy wrote it.
    pub mark: Option<Mark>,
    /// The desire a schedule last wrote on it, when a schedule drives it (K5).
    pub schedule_desire: Option<Desire>,
    /// A person's override's end (`kubectl cocoon wake --until`).
    pub override_until: Option<Timestamp>,
    /// When the CR last reached `Active` (the pod's last wake).
    pub woken_at: Option<Timestamp>,
    /// Attempts of the current transition (1, then one per retry out of `Failed`).
    pub attempts: u32,
}

/// The activity record (I2) as the plan reads it.
pub use cocoon_api::activity::Record as Activity;

/// One selected pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodInput {
    /// `None`: the pod is driven by this policy; `Some(name)`: by that older policy.
    pub driven_by: Option<String>,
    /// `None`: the pod has no activity Lease yet.
    pub activity: Option<Activity>,
    pub cr: Option<CrState>,
    /// A live schedule of the namespace selects the pod: the CR is the schedule's to
    /// create (I4: a schedule precedes idleness).
    pub scheduled: bool,
}

#[derive(Clone, Debug)]
pub struct Inputs {
    pub now: Timestamp,
    pub uid: String,
    pub idle_after: Duration,
    pub min_awake: Duration,
    pub suspend: bool,
    /// Selected pods naming a VM, by name.
    pub pods: BTreeMap<String, PodInput>,
    /// CRs carrying our mark whose pod the policy no longer selects.
    pub strays: Vec<String>,
    /// The policy is being deleted: release every CR of ours, decide nothing.
    pub deleting: bool,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Create the pod's activity Lease, its last activity now (a pod just selected gets
    /// a whole `idleAfter` before it can be idle).
    CreateLease { pod: String },
    /// Create the pod's CR, desire Wake, marked ours (I4).
    CreateCr { pod: String },
    /// The pod is idle: take its Lease on the version read, then hibernate (I3). They
    /// come last, the longest idle first.
    Hibernate { pod: String },
    /// Remove our label and mark from the CR (never delete it, never change its desire).
    Release { cr: String },
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub actions: Vec<Action>,
    pub managed: u32,
    /// Managed pods asleep, or about to be.
    pub idle: u32,
    pub awake: u32,
    /// Pods left to a person (never adopted, or inside an override).
    pub overridden: u32,
    /// Pods driven by another idle policy.
    pub conflicting: u32,
    /// I5: pods for which wake on request stopped, with why.
    pub wake_stopped: Vec<String>,
    /// When to look again: the soonest instant a managed pod may turn idle.
    pub next: Option<Timestamp>,
}

use cocoon_api::activity::later as add;

/// I3: the instant the pod turns idle: `idleAfter` past the latest of its last activity,
/// its last wake and its busy mark.
pub fn idle_at(
    activity: &Activity,
    woken_at: Option<Timestamp>,
    idle_after: Duration,
) -> Timestamp {
    cocoon_api::activity::idle_at(activity.last, woken_at, activity.busy_until, idle_after)
}

/// I3 I5: the earliest instant this pod may be hibernated by the policy, or `None` while
/// a proxied connection is open (no instant: the proxy's report ends it).
pub fn sleep_at(
    input: &Inputs,
    activity: &Activity,
    cr: &CrState,
    ours: bool,
) -> Option<Timestamp> {
    if activity.open_connections > 0 {
        return None;
    }
    let mut at = idle_at(activity, cr.woken_at, input.idle_after);
    if let Some(woken) = cr.woken_at {
        at = at.max(add(woken, input.min_awake));
    }
    // I5: one idle hibernate per pod per minAwake.
    if let Some(mark) = cr
        .mark
        .as_ref()
        .filter(|m| ours && m.desire == Desire::Hibernate)
    {
        at = at.max(add(mark.at, input.min_awake));
    }
    Some(at)
}

/// I5: the wake of this CR failed this many times in a row.
fn failed_wakes(cr: &CrState) -> u32 {
    if cr.desire == Desire::Wake && cr.phase == Some(Phase::Failed) {
        cr.attempts
    } else {
        0
    }
}

/// The whole pass for one policy.
pub fn plan(input: &Inputs) -> Plan {
    let mut plan = Plan::default();
    let ours_now = |pod: &String| {
        let p = input.pods.get(pod);
        let cr = p.and_then(|p| p.cr.as_ref());
        cr.and_then(|c| c.mark.as_ref())
            .is_some_and(|m| m.uid == input.uid)
    };
    let releases = input.strays.iter().cloned().chain(
        input
            .pods
            .keys()
            .filter(|pod| input.deleting && ours_now(pod))
            .cloned(),
    );
    plan.actions
        .extend(releases.map(|cr| Action::Release { cr }));
    if input.deleting {
        return plan;
    }
    // I3: due pods, by the instant each turned idle.
    let mut due: Vec<(Timestamp, &String)> = Vec::new();
    for (pod, p) in &input.pods {
        if p.driven_by.is_some() {
            plan.conflicting += 1;
            continue;
        }
        if p.activity.is_none() && !input.suspend {
            plan.actions.push(Action::CreateLease { pod: pod.clone() });
        }
        let Some(cr) = &p.cr else {
            if !input.suspend && !p.scheduled {
                plan.managed += 1;
                plan.awake += 1;
                plan.actions.push(Action::CreateCr { pod: pod.clone() });
            }
            continue;
        };
        let ours = cr.mark.as_ref().is_some_and(|m| m.uid == input.uid);
        let other_policy = cr.mark.is_some() && !ours;
        if other_policy {
            plan.conflicting += 1;
            continue;
        }
        if !ours && cr.schedule_desire.is_none() {
            // I4: a person's CR is never adopted.
            plan.overridden += 1;
            continue;
        }
        if cr.override_until.is_some_and(|until| input.now < until) {
            plan.overridden += 1;
            continue;
        }
        plan.managed += 1;
        if failed_wakes(cr) >= MAX_FAILED_WAKES {
            plan.wake_stopped.push(format!(
                "{pod}: {} wakes in a row ended Failed",
                failed_wakes(cr)
            ));
        }
        let asleep = cr.desire == Desire::Hibernate;
        if asleep {
            plan.idle += 1;
            continue;
        }
        // I4: a schedule's sleep is the schedule's; its wake window is ours to shorten.
        let schedule_allows = cr.schedule_desire.is_none_or(|d| d == Desire::Wake);
        // I4: never a CR in transition (nor Pending, nor Failed).
        let settled = cr.phase == Some(Phase::Active);
        let at = p
            .activity
            .as_ref()
            .filter(|_| !input.suspend && schedule_allows && !cr.conflict)
            .and_then(|activity| sleep_at(input, activity, cr, ours));
        match at {
            Some(at) if at <= input.now && settled => {
                due.push((at, pod));
                plan.idle += 1;
            }
            Some(at) => {
                // Not yet, or not settled: look again then (a transition ending is
                // seen by the CR watch).
                let at = at.max(input.now);
                plan.next = Some(plan.next.map_or(at, |n| n.min(at)));
                plan.awake += 1;
            }
            None => plan.awake += 1,
        }
    }
    // I3: the longest idle first, so a pass with many due pods flips the ones that
    // waited longest before the ones that just turned idle.
    due.sort();
    plan.actions.extend(
        due.into_iter()
            .map(|(_, pod)| Action::Hibernate { pod: pod.clone() }),
    );
    plan
}

/// Of the idle policies selecting a pod (creation time, name), the oldest drives it.
pub fn driver<'a>(selecting: impl IntoIterator<Item = (Timestamp, &'a str)>) -> Option<&'a str> {
    selecting.into_iter().min().map(|(_, name)| name)
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
