//! The schedule's status (K5, K8), built from a pass's plan.

use super::calendar::Boundary;
use super::plan::Plan;
use super::spec::{CocoonHibernationSchedule, CocoonHibernationScheduleStatus};
use crate::api::{Condition, Desire, Time};
use jiff::Timestamp;

// The schedule's Ready reasons (K8) are part of its API.
pub use crate::api::schedule::{
    REASON_APPLIED, REASON_APPLYING, REASON_INVALID_SPEC, REASON_SUSPENDED,
};

/// At most this many conflicts are listed; `conflicting` counts them all.
const CONFLICTS_LISTED: usize = 20;

pub fn of(
    s: &CocoonHibernationSchedule,
    plan: &Plan,
    desire: Desire,
    next: Option<Boundary>,
    last_applied: Option<Timestamp>,
) -> CocoonHibernationScheduleStatus {
    let (reason, message) = if s.spec.suspend {
        (
            REASON_SUSPENDED,
            "spec.suspend is set: nothing is written".to_owned(),
        )
    } else if plan.pending {
        (
            REASON_APPLYING,
            "some writes wait for a transition to end or for maxInFlight".to_owned(),
        )
    } else {
        (
            REASON_APPLIED,
            "every managed pod has the desire of the calendar".to_owned(),
        )
    };
    CocoonHibernationScheduleStatus {
        observed_generation: s.metadata.generation,
        window: Some(
            if desire == Desire::Wake {
                "Awake"
            } else {
                "Asleep"
            }
            .into(),
        ),
        next_boundary: next.map(|b| Time(b.at)),
        last_applied_boundary: last_applied.map(Time),
        managed: plan.managed,
        overridden: plan.overridden,
        conflicting: plan.conflicting,
        conflicts: plan
            .conflicts
            .iter()
            .take(CONFLICTS_LISTED)
            .cloned()
            .collect(),
        conditions: vec![ready(s, !s.spec.suspend, reason, message)],
    }
}

/// A spec the calendar cannot read (admission was bypassed or the webhook was down).
pub fn invalid(s: &CocoonHibernationSchedule, message: &str) -> CocoonHibernationScheduleStatus {
    let mut st = s.status.clone().unwrap_or_default();
    st.observed_generation = s.metadata.generation;
    st.conditions = vec![ready(s, false, REASON_INVALID_SPEC, message.to_owned())];
    st
}

fn ready(s: &CocoonHibernationSchedule, ok: bool, reason: &str, message: String) -> Condition {
    let status = if ok { "True" } else { "False" };
    let previous = s
        .status
        .as_ref()
        .and_then(|st| st.conditions.iter().find(|c| c.type_ == "Ready"));
    // The transition time moves only when the status does.
    let since = previous.filter(|c| c.status == status).map_or_else(
        || Time(Timestamp::now()),
        |c| c.last_transition_time.clone(),
    );
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message,
        observed_generation: s.metadata.generation,
        last_transition_time: since,
    }
}
