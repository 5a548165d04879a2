//! The reconcile rules as one pure function: (CR, pod view, registry probe, now) -> Plan.
//! Nothing here does I/O; `reconcile.rs` fetches the inputs and carries out the plan.

use crate::api::annotations::PodView;
use crate::api::conditions::{
    self, READY, REASON_DONE, REASON_FAILED, REASON_PENDING, SNAPSHOT_DELETED, Update,
};
use crate::api::{CocoonHibernation, CocoonHibernationStatus, Desire, Phase};
use crate::metrics::{Transition, TransitionResult};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

/// Knobs the rules depend on.
#[derive(Clone, Debug)]
pub struct Settings {
    pub hibernate_timeout: Duration,
    pub wake_timeout: Duration,
    /// R2: how often a missing pod or VM name is re-checked.
    pub pending_recheck: Duration,
    /// Longest wait between passes of an in-flight transition; the timeouts need a pass.
    pub transition_poll: Duration,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            hibernate_timeout: Duration::from_secs(180),
            wake_timeout: Duration::from_secs(300),
            pending_recheck: Duration::from_secs(5),
            transition_poll: Duration::from_secs(15),
        }
    }
}

/// What the registry said about `<vm>:hibernate`, if it was asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Probe {
    NotProbed,
    Present,
    Absent,
    Failed(String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodPatch {
    SetHibernate,
    ClearHibernate,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventKind {
    Normal,
    Warning,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedEvent {
    pub kind: EventKind,
    pub reason: &'static str,
    pub note: String,
}

/// What one pass should do, in order: pod patch, status write, events, tag delete.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// R1: add the finalizer and end the pass.
    pub add_finalizer: bool,
    /// H3: the registry must be probed and the plan made again with the answer.
    pub needs_probe: bool,
    pub pod_patch: Option<PodPatch>,
    /// The status to write; `None` when nothing changed.
    pub status: Option<CocoonHibernationStatus>,
    pub events: Vec<PlannedEvent>,
    /// Delete `<vm>:hibernate` after the status write (W2, W3).
    pub delete_tag: Option<String>,
    /// Status to write once `delete_tag` succeeded.
    pub status_after_delete: Option<CocoonHibernationStatus>,
    pub phase_metric: Option<(Transition, TransitionResult, f64)>,
    pub requeue: Option<Duration>,
    /// H4: returned from the pass after the effects, so it is logged and retried.
    pub error: Option<String>,
}

/// What to do for a CR being deleted (G1, G2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cleanup {
    pub delete_tag: Option<String>,
    pub remove_finalizer: bool,
}

pub fn plan(
    cr: &CocoonHibernation,
    pod: Option<&PodView>,
    probe: &Probe,
    now: Time,
    settings: &Settings,
) -> Plan {
    if !cr.has_finalizer() {
        return Plan {
            add_finalizer: true,
            ..Plan::default()
        };
    }
    let mut pass = Pass::new(cr, now);

    if cr.spec.desire == Desire::Unknown {
        // R3: the CRD's enum should have refused it; report rather than guess.
        pass.set_phase(
            Phase::Failed,
            READY_FAILED,
            "spec.desire must be Hibernate or Wake",
            false,
        );
        return pass.finish(None);
    }

    let pod_name = &cr.spec.pod_ref.name;
    let ns = cr.metadata.namespace.as_deref().unwrap_or_default();
    let (view, vm) = match pod {
        None => return pass.pending(&format!("pod {ns}/{pod_name} not found"), settings),
        Some(v) => match v.vm_name.clone() {
            None => {
                return pass.pending(
                    &format!("pod {ns}/{pod_name} has no vm.cocoonstack.io/name yet"),
                    settings,
                );
            }
            Some(vm) => (v, vm),
        },
    };

    let phase = pass.phase();
    // D1: an in-flight transition runs to its terminal phase before a reversal starts.
    let effective = match phase {
        Some(Phase::Hibernating) => Desire::Hibernate,
        Some(Phase::Waking) => Desire::Wake,
        _ => cr.spec.desire,
    };
    if effective == cr.spec.desire {
        pass.next.observed_generation = cr.metadata.generation;
    }
    match effective {
        Desire::Wake => pass.wake(view, &vm, settings),
        _ => pass.hibernate(view, &vm, probe, settings),
    }
}

pub fn plan_cleanup<'a>(
    cr: &CocoonHibernation,
    others: impl IntoIterator<Item = &'a CocoonHibernation>,
) -> Cleanup {
    if !cr.has_finalizer() {
        return Cleanup {
            delete_tag: None,
            remove_finalizer: false,
        };
    }
    let ns = cr.metadata.namespace.as_deref();
    let held_elsewhere = |vm: &str| {
        others.into_iter().any(|o| {
            o.metadata.namespace.as_deref() == ns
                && o.metadata.name != cr.metadata.name
                && !o.is_deleting()
                && (o.vm_name() == Some(vm) || o.spec.pod_ref.name == cr.spec.pod_ref.name)
        })
    };
    // G1: the last holder of a VM deletes its tag.
    let delete_tag = cr
        .vm_name()
        .filter(|vm| !held_elsewhere(vm))
        .map(str::to_owned);
    Cleanup {
        delete_tag,
        remove_finalizer: true,
    }
}

const READY_FAILED: (bool, &str) = (false, REASON_FAILED);
const READY_PENDING: (bool, &str) = (false, REASON_PENDING);
const READY_DONE: (bool, &str) = (true, REASON_DONE);

/// Working state of one plan: the status as found and the status to be.
struct Pass<'a> {
    cr: &'a CocoonHibernation,
    now: Time,
    next: CocoonHibernationStatus,
    plan: Plan,
}

impl<'a> Pass<'a> {
    fn new(cr: &'a CocoonHibernation, now: Time) -> Self {
        Self {
            cr,
            now,
            next: cr.status.clone().unwrap_or_default(),
            plan: Plan::default(),
        }
    }

    fn phase(&self) -> Option<Phase> {
        self.cr.phase()
    }

    fn set_phase(&mut self, phase: Phase, ready: (bool, &str), message: &str, refresh: bool) {
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

    fn event(&mut self, kind: EventKind, reason: &'static str, note: String) {
        self.plan.events.push(PlannedEvent { kind, reason, note });
    }

    /// Seconds spent in the current transition, from the Ready condition's transition time.
    fn elapsed(&self) -> Duration {
        conditions::find(&self.next.conditions, READY)
            .map(|c| self.now.0.duration_since(c.last_transition_time.0))
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default()
    }

    fn finish(mut self, requeue: Option<Duration>) -> Plan {
        let old = self.cr.status.clone().unwrap_or_default();
        if self.next != old {
            self.plan.status = Some(self.next);
        }
        self.plan.requeue = requeue;
        self.plan
    }

    /// R2: no pod or no VM name yet.
    fn pending(mut self, message: &str, settings: &Settings) -> Plan {
        if !matches!(self.phase(), Some(Phase::Hibernated | Phase::Waking)) {
            self.set_phase(Phase::Pending, READY_PENDING, message, false);
        }
        self.finish(Some(settings.pending_recheck))
    }

    /// Enter Hibernating or Waking with a full budget (F2); a retry from Failed is announced (F3).
    fn enter(&mut self, phase: Phase, vm: &str, message: &str) {
        if self.phase() == Some(Phase::Failed) {
            self.event(
                EventKind::Normal,
                "RetryRequested",
                format!("retrying after failure: now {phase}"),
            );
        }
        self.next.vm_name = Some(vm.to_owned());
        self.set_phase(phase, READY_PENDING, message, true);
    }

    fn hibernate(mut self, view: &PodView, vm: &str, probe: &Probe, settings: &Settings) -> Plan {
        if !view.hibernate_requested {
            self.plan.pod_patch = Some(PodPatch::SetHibernate); // H1
        }
        match self.phase() {
            Some(Phase::Hibernated) => self.finish(None),
            Some(Phase::Hibernating) => {
                let elapsed = self.elapsed();
                // H3: the registry is asked only once vk reports this round hibernated.
                if view.lifecycle_hibernated_for_round() {
                    match probe {
                        Probe::NotProbed => {
                            return Plan {
                                needs_probe: true,
                                ..Plan::default()
                            };
                        }
                        Probe::Present => {
                            self.set_phase(
                                Phase::Hibernated,
                                READY_DONE,
                                &format!("vm {vm} hibernated; snapshot {vm}:hibernate stored"),
                                false,
                            );
                            self.event(
                                EventKind::Normal,
                                "Hibernated",
                                format!("vm {vm} hibernated"),
                            );
                            self.plan.phase_metric = Some((
                                Transition::hibernate,
                                TransitionResult::ok,
                                elapsed.as_secs_f64(),
                            ));
                            return self.finish(None);
                        }
                        Probe::Absent => {}
                        // H4: still counts against the clock (H5) before it is returned.
                        Probe::Failed(e) => self.plan.error = Some(e.clone()),
                    }
                }
                if elapsed >= settings.hibernate_timeout {
                    self.plan.error = None;
                    let timeout = humanize(settings.hibernate_timeout);
                    self.set_phase(
                        Phase::Failed,
                        READY_FAILED,
                        &format!("hibernate of vm {vm} did not complete within {timeout}"),
                        false,
                    );
                    self.event(
                        EventKind::Warning,
                        "HibernateTimedOut",
                        format!("hibernate of vm {vm} timed out after {timeout}"),
                    );
                    self.plan.phase_metric = Some((
                        Transition::hibernate,
                        TransitionResult::timeout,
                        elapsed.as_secs_f64(),
                    ));
                    return self.finish(None);
                }
                let remaining = settings.hibernate_timeout - elapsed;
                let poll = if view.lifecycle_hibernated_for_round() {
                    settings.pending_recheck // tag may land just after the annotations
                } else {
                    settings.transition_poll
                };
                self.finish(Some(poll.min(remaining)))
            }
            _ => {
                self.next.conditions.retain(|c| c.type_ != SNAPSHOT_DELETED); // the tag is wanted again
                self.enter(
                    Phase::Hibernating,
                    vm,
                    &format!("waiting for vk-cocoon to hibernate vm {vm}"),
                );
                self.finish(Some(
                    settings.transition_poll.min(settings.hibernate_timeout),
                ))
            }
        }
    }

    fn wake(mut self, view: &PodView, vm: &str, settings: &Settings) -> Plan {
        if view.hibernate_requested {
            self.plan.pod_patch = Some(PodPatch::ClearHibernate); // W1
        }
        match self.phase() {
            Some(Phase::Active) => {
                // W3: a tag delete still owed is retried on passes of the settled CR.
                let owed = conditions::find(&self.next.conditions, SNAPSHOT_DELETED)
                    .is_some_and(|c| c.status != "True");
                if owed {
                    let tag_vm = self.next.vm_name.clone().unwrap_or_else(|| vm.to_owned());
                    self.owe_delete(&tag_vm);
                }
                self.finish(None)
            }
            Some(Phase::Waking) => {
                let elapsed = self.elapsed();
                if view.woken() {
                    self.set_phase(
                        Phase::Active,
                        READY_DONE,
                        &format!("vm {vm} is running"),
                        false,
                    );
                    self.event(
                        EventKind::Normal,
                        "WokenActive",
                        format!("vm {vm} is running again"),
                    );
                    self.plan.phase_metric = Some((
                        Transition::wake,
                        TransitionResult::ok,
                        elapsed.as_secs_f64(),
                    ));
                    self.owe_delete(vm);
                    return self.finish(None);
                }
                if elapsed >= settings.wake_timeout {
                    let timeout = humanize(settings.wake_timeout);
                    self.set_phase(
                        Phase::Failed,
                        READY_FAILED,
                        &format!("wake of vm {vm} did not complete within {timeout}"),
                        false,
                    );
                    self.event(
                        EventKind::Warning,
                        "WakeTimedOut",
                        format!("wake of vm {vm} timed out after {timeout}"),
                    );
                    self.plan.phase_metric = Some((
                        Transition::wake,
                        TransitionResult::timeout,
                        elapsed.as_secs_f64(),
                    ));
                    return self.finish(None);
                }
                let remaining = settings.wake_timeout - elapsed;
                self.finish(Some(settings.transition_poll.min(remaining)))
            }
            _ => {
                self.enter(
                    Phase::Waking,
                    vm,
                    &format!("waiting for vk-cocoon to wake vm {vm}"),
                );
                self.finish(Some(settings.transition_poll.min(settings.wake_timeout)))
            }
        }
    }

    /// Mark the tag delete as owed in the status to write, and plan the write once it is done.
    fn owe_delete(&mut self, vm: &str) {
        let generation = self.cr.metadata.generation;
        let owed = format!("deleting snapshot {vm}:hibernate");
        let owed = Update {
            type_: SNAPSHOT_DELETED,
            status: false,
            reason: REASON_PENDING,
            message: &owed,
            observed_generation: generation,
        };
        conditions::upsert(&mut self.next.conditions, owed, self.now.clone(), false);
        let mut done = self.next.clone();
        let deleted = format!("snapshot {vm}:hibernate deleted");
        let deleted = Update {
            status: true,
            reason: REASON_DONE,
            message: &deleted,
            ..owed
        };
        conditions::upsert(&mut done.conditions, deleted, self.now.clone(), false);
        self.plan.delete_tag = Some(vm.to_owned());
        self.plan.status_after_delete = Some(done);
    }
}

fn humanize(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 60, s % 60, d.subsec_millis()) {
        (0, s, 0) => format!("{s}s"),
        (m, 0, 0) => format!("{m}m"),
        (m, s, 0) => format!("{m}m{s}s"),
        _ => format!("{}ms", d.as_millis()),
    }
}
