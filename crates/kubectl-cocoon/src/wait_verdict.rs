//! When a `--wait` is over, decided from the CR alone (pure; the watch is in `wait.rs`).

use super::view::CrView;
use cocoon_api::Phase;
use cocoon_api::conditions::{READY, REASON_CONFLICT, REASON_VM_CHANGED};
use jiff::Timestamp;

/// What the user asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Want {
    Hibernate,
    Wake,
}

impl Want {
    /// The value of `spec.desire`.
    pub fn desire(self) -> &'static str {
        match self {
            Want::Hibernate => "Hibernate",
            Want::Wake => "Wake",
        }
    }

    /// The phase a finished transition rests in.
    pub fn terminal_phase(self) -> Phase {
        match self {
            Want::Hibernate => Phase::Hibernated,
            Want::Wake => Phase::Active,
        }
    }
}

/// What a wait waits for, fixed when the desire was written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Target {
    pub want: Want,
    /// The CR written (a CR recreated under the same name is another request).
    pub uid: String,
    /// The generation the write left: a status written before it says nothing about
    /// this request.
    pub generation: Option<i64>,
    /// A `Failed` the CR already showed for this same desire before the wait began, by its
    /// Ready transition time: the controller retries it, so only a new failure ends the wait.
    pub stale_failure: Option<Option<Timestamp>>,
    /// `status.lastFailure.time` before the wait began: a newer one is a new failure,
    /// even if the `Failed` phase itself flashed past between two reads.
    pub failure_before: Option<Timestamp>,
}

impl Target {
    /// The target for a request on `cr` as the write left it.
    pub fn new(want: Want, cr: &CrView, desire_changed: bool) -> Self {
        let ready_time = cr.condition(READY).and_then(|c| c.last_transition);
        let stale_failure = (!desire_changed && cr.phase_is(Phase::Failed)).then_some(ready_time);
        Self {
            want,
            uid: cr.uid.clone(),
            generation: cr.generation,
            stale_failure,
            failure_before: cr.last_failure.as_ref().and_then(|f| f.time),
        }
    }
}

/// The verdict on one view of the CR.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Step {
    /// Not there yet.
    Waiting,
    /// At the desire's terminal phase, Ready, for this request.
    Done,
    Failed {
        reason: String,
        message: String,
    },
    /// The CR is gone, being deleted, or replaced by another of the same name.
    Gone(String),
    /// Someone else set another desire meanwhile.
    Reversed(String),
}

/// Failures the controller does not retry while their cause lasts: S2's conflict, S9's
/// changed VM.
const NOT_RETRIED: [&str; 2] = [REASON_CONFLICT, REASON_VM_CHANGED];

pub fn judge(target: &Target, cr: Option<&CrView>) -> Step {
    let Some(cr) = cr else {
        return Step::Gone("it was deleted".into());
    };
    if cr.deleting {
        return Step::Gone("it is being deleted".into());
    }
    if !target.uid.is_empty() && cr.uid != target.uid {
        return Step::Gone("it was deleted and created again".into());
    }
    if cr.desire != target.want.desire() {
        return Step::Reversed(cr.desire.clone());
    }
    // A status older than the write answers an earlier request.
    let current = match (target.generation, cr.observed_generation) {
        (Some(wrote), Some(seen)) => seen >= wrote,
        (Some(_), None) => false,
        (None, _) => true,
    };
    let ready = cr.condition(READY);
    if current && cr.phase_is(target.want.terminal_phase()) && ready.is_some_and(|c| c.is_true()) {
        return Step::Done;
    }
    // In Failed the CR says why itself; a failure that flashed past is in lastFailure.
    let in_failed = cr.phase_is(Phase::Failed);
    let failed = |cr: &CrView| match cr.last_failure.as_ref() {
        Some(failure) if !in_failed => Step::Failed {
            reason: failure.reason.clone(),
            message: failure.message.clone(),
        },
        _ => Step::Failed {
            reason: cr.reason().to_string(),
            message: cr.message().to_string(),
        },
    };
    if current && in_failed {
        let conflict = ready.is_some_and(|c| NOT_RETRIED.contains(&c.reason.as_str()));
        let stale = target
            .stale_failure
            .is_some_and(|t| t == ready.and_then(|c| c.last_transition));
        if conflict || !stale {
            return failed(cr);
        }
    }
    let new_failure = cr
        .last_failure
        .as_ref()
        .and_then(|f| f.time)
        .is_some_and(|t| target.failure_before.is_none_or(|before| t > before));
    if current && new_failure {
        return failed(cr);
    }
    Step::Waiting
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn cr(generation: i64, observed: i64, phase: &str, ready: (&str, &str, &str)) -> Value {
        json!({
            "metadata": {"namespace": "ns", "name": "w", "uid": "u1", "generation": generation},
            "spec": {"podRef": {"name": "w"}, "desire": "Hibernate"},
            "status": {"phase": phase, "observedGeneration": observed, "conditions": [
                {"type": "Ready", "status": ready.0, "reason": ready.1, "message": ready.2,
                 "lastTransitionTime": "2026-01-01T00:00:00Z"}
            ]}
        })
    }

    fn target(generation: i64) -> Target {
        Target {
            want: Want::Hibernate,
            uid: "u1".into(),
            generation: Some(generation),
            stale_failure: None,
            failure_before: None,
        }
    }

    fn judge_json(t: &Target, v: &Value) -> Step {
        judge(t, Some(&CrView::from_json(v)))
    }

    /// A3: done means the desire's phase with Ready True, for this request's generation.
    #[test]
    fn a3_done_needs_the_terminal_phase_ready_and_a_current_status() {
        let done = cr(2, 2, "Hibernated", ("True", "Done", "ok"));
        assert_eq!(judge_json(&target(2), &done), Step::Done);
        let older = cr(2, 1, "Hibernated", ("True", "Done", "ok"));
        assert_eq!(
            judge_json(&target(2), &older),
            Step::Waiting,
            "status of the previous request"
        );
        let not_ready = cr(2, 2, "Hibernated", ("False", "Pending", ""));
        assert_eq!(judge_json(&target(2), &not_ready), Step::Waiting);
        let moving = cr(
            2,
            2,
            "Hibernating",
            ("False", "Pending", "waiting for vk-cocoon"),
        );
        assert_eq!(judge_json(&target(2), &moving), Step::Waiting);
        let mut wake = target(2);
        wake.want = Want::Wake;
        let mut active = cr(2, 2, "Active", ("True", "Done", "ok"));
        active["spec"]["desire"] = "Wake".into();
        assert_eq!(judge_json(&wake, &active), Step::Done);
    }

    /// F1: a Failed CR ends the wait with its reason and message.
    #[test]
    fn f1_failed_ends_the_wait_with_reason_and_message() {
        let failed = cr(
            2,
            2,
            "Failed",
            ("False", "Failed", "did not complete within 5s"),
        );
        assert_eq!(
            judge_json(&target(2), &failed),
            Step::Failed {
                reason: "Failed".into(),
                message: "did not complete within 5s".into()
            }
        );
        let mut detailed = failed.clone();
        detailed["status"]["lastFailure"] =
            json!({"reason": "HibernateTimedOut", "message": "m", "time": "2026-01-01T00:00:00Z"});
        assert!(matches!(
            judge_json(&target(2), &detailed),
            Step::Failed { reason, .. } if reason == "HibernateTimedOut"
        ));
    }

    /// F2: a failure seen before the wait began is being retried; only a new one counts.
    /// S2, S9: a Conflict or a VMChanged is not retried, so it always ends the wait.
    #[test]
    fn f2_an_earlier_failure_waits_for_the_retry_but_s2_conflict_and_s9_vm_changed_do_not() {
        let failed = cr(2, 2, "Failed", ("False", "Failed", "timed out"));
        let view = CrView::from_json(&failed);
        let t = Target::new(Want::Hibernate, &view, false);
        assert!(t.stale_failure.is_some());
        assert_eq!(judge(&t, Some(&view)), Step::Waiting);
        let mut again = failed.clone();
        again["status"]["conditions"][0]["lastTransitionTime"] = "2026-01-01T00:05:00Z".into();
        assert!(matches!(judge_json(&t, &again), Step::Failed { .. }));

        for (reason, message) in [
            ("Conflict", "held by ns/other"),
            ("VMChanged", "pod names vm-b"),
        ] {
            let failed = cr(2, 2, "Failed", ("False", reason, message));
            let view = CrView::from_json(&failed);
            let t = Target::new(Want::Hibernate, &view, false);
            assert_eq!(
                judge(&t, Some(&view)),
                Step::Failed {
                    reason: reason.into(),
                    message: message.into()
                }
            );
        }
    }

    /// F1: a failure that flashed past between two events still ends the wait.
    #[test]
    fn f1_a_new_last_failure_ends_the_wait_even_after_the_retry_began() {
        let mut retrying = cr(2, 2, "Hibernating", ("False", "Pending", "retrying"));
        retrying["status"]["lastFailure"] = json!({"reason": "HibernateTimedOut", "message": "timed out", "time": "2026-01-01T00:09:00Z"});
        let mut t = target(2);
        t.failure_before = Some("2026-01-01T00:01:00Z".parse().unwrap());
        assert!(
            matches!(judge_json(&t, &retrying), Step::Failed { reason, .. } if reason == "HibernateTimedOut")
        );
        t.failure_before = Some("2026-01-01T00:09:00Z".parse().unwrap());
        assert_eq!(
            judge_json(&t, &retrying),
            Step::Waiting,
            "the failure seen at the start"
        );
    }

    #[test]
    fn deletion_replacement_and_reversal_end_the_wait() {
        let t = target(2);
        assert!(matches!(judge(&t, None), Step::Gone(_)));
        let mut deleting = cr(2, 2, "Hibernating", ("False", "Pending", ""));
        deleting["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z".into();
        assert!(matches!(judge_json(&t, &deleting), Step::Gone(_)));
        let mut replaced = cr(1, 1, "Hibernated", ("True", "Done", ""));
        replaced["metadata"]["uid"] = "u2".into();
        assert!(matches!(judge_json(&t, &replaced), Step::Gone(_)));
        let mut reversed = cr(3, 2, "Hibernating", ("False", "Pending", ""));
        reversed["spec"]["desire"] = "Wake".into();
        assert_eq!(judge_json(&t, &reversed), Step::Reversed("Wake".into()));
    }
}
