//! The working state of one plan and the status edits every rule shares: phase, the
//! Ready and Progressing conditions, failures, events.

use super::{Ending, EventKind, Finished, Plan, PlannedEvent, Settings, Transition};
use cocoon_api::conditions::{
    self, PROGRESSING, READY, REASON_CONFLICT, REASON_DONE, REASON_FAILED, REASON_PENDING,
    REASON_POD_NOT_SELECTED, SNAPSHOT_DELETED, Update,
};
use cocoon_api::{CocoonHibernation, CocoonHibernationStatus, Desire, Failure, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

pub(super) const READY_FAILED: (bool, &str) = (false, REASON_FAILED);
pub(super) const READY_PENDING: (bool, &str) = (false, REASON_PENDING);
pub(super) const READY_DONE: (bool, &str) = (true, REASON_DONE);
pub(super) const READY_CONFLICT: (bool, &str) = (false, REASON_CONFLICT);

/// Working state of one plan: the status as found and the status to be.
pub(super) struct Pass<'a> {
    pub(super) cr: &'a CocoonHibernation,
    pub(super) now: Time,
    pub(super) next: CocoonHibernationStatus,
    pub(super) plan: Plan,
}

impl<'a> Pass<'a> {
    pub(super) fn new(cr: &'a CocoonHibernation, now: Time) -> Self {
        Self {
            cr,
            now,
            next: cr.status.clone().unwrap_or_default(),
            plan: Plan::default(),
        }
    }

    pub(super) fn phase(&self) -> Option<Phase> {
        self.cr.phase()
    }

    pub(super) fn set_phase(
        &mut self,
        phase: Phase,
        ready: (bool, &str),
        message: &str,
        refresh: bool,
    ) {
        self.next.phase = Some(phase);
        self.next.observed_generation = self.cr.metadata.generation;
        let update = Update {
            type_: READY,
            status: ready.0,
            reason: ready.1,
            message,
            observed_generation: self.cr.metadata.generation,
        };
        conditions::upsert(&mut self.next.conditions, update, self.now.clone(), refresh);
    }

    /// The Progressing condition: True with what a transition waits for, False once settled.
    pub(super) fn progress(&mut self, progressing: bool, reason: &str, message: &str) {
        let update = Update {
            type_: PROGRESSING,
            status: progressing,
            reason,
            message,
            observed_generation: self.cr.metadata.generation,
        };
        conditions::upsert(&mut self.next.conditions, update, self.now.clone(), false);
    }

    /// F1: Failed, with the reason in Ready, Progressing and lastFailure.
    pub(super) fn fail(&mut self, reason: &str, message: &str) {
        self.set_phase(Phase::Failed, READY_FAILED, message, false);
        self.failure(reason, message);
    }

    /// Records a failure in Progressing and lastFailure. The same failure seen again keeps
    /// its time, so a CR that stays failed writes nothing more (C3).
    pub(super) fn failure(&mut self, reason: &str, message: &str) {
        self.progress(false, reason, message);
        let same = self
            .next
            .last_failure
            .as_ref()
            .is_some_and(|f| f.reason == reason && f.message == message);
        if !(same && self.phase() == Some(Phase::Failed)) {
            self.next.last_failure = Some(Failure {
                reason: reason.to_owned(),
                message: message.to_owned(),
                time: self.now.clone(),
            });
        }
    }

    pub(super) fn event(&mut self, kind: EventKind, reason: &'static str, note: String) {
        self.plan.events.push(PlannedEvent { kind, reason, note });
    }

    /// Seconds spent in the current transition, from the Ready condition's transition time.
    pub(super) fn elapsed(&self) -> Duration {
        conditions::find(&self.next.conditions, READY)
            .map(|c| self.now.0.duration_since(c.last_transition_time.0))
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default()
    }

    pub(super) fn finish(mut self, requeue: Option<Duration>) -> Plan {
        let old = self.cr.status.clone().unwrap_or_default();
        if self.next != old {
            self.plan.status = Some(self.next);
        }
        self.plan.requeue = requeue;
        self.plan
    }

    /// R2: no pod or no VM name yet. Hibernated and Waking keep their phase; a wake
    /// that cannot go on says why in Progressing, and a settled Hibernated writes nothing.
    pub(super) fn pending(mut self, reason: &str, message: &str, settings: &Settings) -> Plan {
        match self.phase() {
            Some(Phase::Waking) => self.progress(true, reason, message),
            Some(Phase::Hibernated) if self.cr.spec.desire == Desire::Wake => {
                self.progress(true, reason, message)
            }
            Some(Phase::Hibernated) => self.clear_not_selected(),
            _ => {
                self.set_phase(Phase::Pending, READY_PENDING, message, false);
                self.progress(true, reason, message);
            }
        }
        self.finish(Some(settings.pending_recheck))
    }

    /// R2 with `--pod-selector`: the pod exists outside it. As for a missing pod, except
    /// that a settled Hibernated CR says so too (in Progressing, False: nothing is under
    /// way), since its deletion keeps the tag (G1). A pod entering the selector arrives
    /// through the watch, which wakes the CR, so the recheck is the slow one.
    pub(super) fn not_selected(mut self, reason: &str, message: &str, settings: &Settings) -> Plan {
        if self.phase() == Some(Phase::Hibernated) && self.cr.spec.desire == Desire::Hibernate {
            self.progress(false, reason, message);
            return self.finish(Some(settings.conflict_recheck));
        }
        let mut plan = self.pending(reason, message, settings);
        plan.requeue = Some(settings.conflict_recheck);
        plan
    }

    /// R2: a settled Hibernated CR whose Progressing said PodNotSelected says Done again
    /// once its pod is back inside the selector, or gone (no news to a hibernated VM).
    pub(super) fn clear_not_selected(&mut self) {
        let stale = conditions::find(&self.next.conditions, PROGRESSING)
            .is_some_and(|c| c.reason == REASON_POD_NOT_SELECTED);
        if let (true, Some(vm)) = (stale, self.next.vm_name.clone()) {
            let message = format!("vm {vm} hibernated; snapshot {vm}:hibernate stored");
            self.progress(false, REASON_DONE, &message);
        }
    }

    /// Enter Hibernating or Waking with a full budget (F2); a retry from Failed is announced (F3).
    pub(super) fn enter(&mut self, phase: Phase, vm: &str, reason: &str, message: &str) {
        let old = self.cr.status.as_ref();
        let retry = self.phase() == Some(Phase::Failed);
        if retry {
            self.event(
                EventKind::Normal,
                "RetryRequested",
                format!("retrying after failure: now {phase}"),
            );
        }
        // Attempts count retries of one spec; a new spec (a flipped desire) starts at 1.
        let same_spec = old.and_then(|s| s.observed_generation) == self.cr.metadata.generation;
        self.next.attempts = Some(match old.and_then(|s| s.attempts) {
            Some(n) if retry && same_spec => n.saturating_add(1),
            _ => 1,
        });
        self.next.vm_name = Some(vm.to_owned());
        self.set_phase(phase, READY_PENDING, message, true);
        self.progress(true, reason, message);
    }
    /// delete it once its pod asks for no hibernate and its VM runs (S1).
    pub(super) fn owe_tag(&mut self, reason: &str, message: &str) {
        let update = Update {
            type_: SNAPSHOT_DELETED,
            status: false,
            reason,
            message,
            observed_generation: self.next.observed_generation,
        };
        conditions::upsert(&mut self.next.conditions, update, self.now.clone(), false);
    }

    pub(super) fn finished(&mut self, transition: Transition, ending: Ending, elapsed: Duration) {
        self.plan.finished = Some(Finished {
            transition,
            ending,
            seconds: elapsed.as_secs_f64(),
        });
    }
}
