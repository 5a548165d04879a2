//! The reconcile rules as pure functions: (CR, pod view, registry probe, now) -> Plan.
//! Nothing here does I/O; `reconcile.rs` fetches the inputs and carries out the plan.
//!
//! `plan` (this file) picks the rule for a pass; `pass.rs` holds the status edits the
//! rules share and `transitions.rs` the hibernate and wake rules; `ownership.rs` is S2,
//! `delete_rules.rs` the tag delete's rules (S1, S5, S7), `cleanup.rs` a CR's deletion (G1,
//! S6) and `settings.rs` the knobs.

mod cleanup;
mod delete_rules;
mod ownership;
mod pass;
mod settings;
mod transitions;

pub use cleanup::{Cleanup, discard_event, own_pod_holds_tag, plan_cleanup, pod_holding};
pub use delete_rules::{
    Debt, DeleteResult, after_delete, owes_tag_delete, still_owes, vm_running_again,
};
pub use ownership::{Ownership, ownership};
pub use settings::Settings;

use cocoon_api::annotations::PodView;
use cocoon_api::conditions::{
    REASON_CONFLICT, REASON_INVALID_SPEC, REASON_POD_MISSING, REASON_POD_NOT_SELECTED,
    REASON_VM_CHANGED, REASON_WAITING_FOR_VM,
};
use cocoon_api::{CocoonHibernation, CocoonHibernationStatus, Desire, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use pass::{Pass, READY_CONFLICT};
use std::time::Duration;

/// A transition, for timeouts and for what a pass reports as finished; also the
/// metrics' `transition` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Transition {
    Hibernate,
    Wake,
}

impl Transition {
    pub fn as_str(self) -> &'static str {
        match self {
            Transition::Hibernate => "hibernate",
            Transition::Wake => "wake",
        }
    }
}

/// How a transition ended; also the metrics' `result` label.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Ending {
    Done,
    TimedOut,
}

impl Ending {
    pub fn as_str(self) -> &'static str {
        match self {
            Ending::Done => "ok",
            Ending::TimedOut => "timeout",
        }
    }
}

/// A transition this pass ends; the effect layer turns it into metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finished {
    pub transition: Transition,
    pub ending: Ending,
    /// From entering Hibernating or Waking to this pass.
    pub seconds: f64,
}

/// The CR's pod as a pass knows it (R2). With `--pod-selector` the cache holds only the
/// pods inside it, so a pod it lacks may exist all the same: a fresh read tells the two
/// apart, and nothing that deletes or discards a tag acts on "missing" for such a pod.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum PodRead<'a> {
    Found(&'a PodView),
    /// Not in the cache, and (with a selector) not in the apiserver either.
    Missing,
    /// The apiserver has it, outside `--pod-selector`: this install does not act on it.
    NotSelected,
}

impl<'a> From<Option<&'a PodView>> for PodRead<'a> {
    fn from(pod: Option<&'a PodView>) -> Self {
        pod.map_or(PodRead::Missing, PodRead::Found)
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
    /// Delete `<vm>:hibernate` (W2, W3).
    pub delete_tag: Option<String>,
    /// The delete comes BEFORE the status write, which then records its outcome, so a
    /// wake ends in one write (`Active` with `SnapshotDeleted` settled). Otherwise (a W3
    /// retry on a settled CR) the delete runs after the pass's own writes.
    pub delete_first: bool,
    /// S7: the digest this pass's probe saw, which a CR that recorded none at H3 deletes.
    pub probed_digest: Option<String>,
    pub finished: Option<Finished>,
    pub requeue: Option<Duration>,
    /// H4: returned from the pass after the effects, so it is logged and retried.
    pub error: Option<String>,
}

/// Records the digest of the probe that completed a hibernate (H3) in the status to
/// write, and keeps it for a delete this pass makes (S7).
pub fn record_digest(plan: &mut Plan, digest: Option<String>) {
    if let (Some(status), Some(digest)) = (plan.status.as_mut(), &digest)
        && status.phase == Some(Phase::Hibernated)
        && plan.finished.is_some()
    {
        status.snapshot = Some(cocoon_api::SnapshotStatus {
            digest: Some(digest.clone()),
        });
    }
    plan.probed_digest = digest;
}

/// C4: a pass that may end a transition already under way, so vk's answer is acted on
/// before new transitions start.
pub fn may_end_a_transition(cr: &CocoonHibernation) -> bool {
    !cr.is_deleting()
        && matches!(
            cr.status.as_ref().and_then(|s| s.phase),
            Some(Phase::Hibernating | Phase::Waking)
        )
}

/// C2 (issue 38): a pass that may make a transition's first write, the pod patch that
/// starts a hibernate (H1, after R1's finalizer on a new CR) or a wake (W1): the CR asks
/// for a phase it is not in and none is under way. Such a pass never calls the registry
/// (H2 and W1 probe nothing), so it runs in the intake lane of its own and never waits
/// for workers busy ending other VMs' transitions or paying their tag deletes. A new
/// `Wake` CR is one only on a pod that asks for a hibernate: on a running pod it may
/// probe (a fresh wake).
pub fn may_start_a_transition(cr: &CocoonHibernation, pod: Option<&PodView>) -> bool {
    let phase = cr.status.as_ref().and_then(|s| s.phase);
    !cr.is_deleting()
        && match cr.spec.desire {
            Desire::Hibernate => matches!(
                phase,
                None | Some(Phase::Pending | Phase::Active | Phase::Failed)
            ),
            Desire::Wake => match phase {
                Some(Phase::Hibernated | Phase::Failed) => true,
                None | Some(Phase::Pending) => pod.is_some_and(|p| p.hibernate_requested),
                _ => false,
            },
            Desire::Unknown => false,
        }
}

/// [`plan_read`] for a pod the cache either has or does not (no `--pod-selector`).
pub fn plan(
    cr: &CocoonHibernation,
    pod: Option<&PodView>,
    owner: &Ownership,
    probe: &Probe,
    now: Time,
    settings: &Settings,
) -> Plan {
    plan_read(cr, pod.into(), owner, probe, now, settings)
}

/// One pass's rules, in order: R1, R3, S2, R2, S9, D1, then the transition itself.
pub fn plan_read(
    cr: &CocoonHibernation,
    pod: PodRead<'_>,
    owner: &Ownership,
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
        pass.fail(REASON_INVALID_SPEC, "spec.desire must be Hibernate or Wake");
        return pass.finish(None);
    }
    // The CRD's pattern should have refused a bad timeout; report rather than guess.
    let timeouts = settings
        .timeout_for(cr, Transition::Hibernate)
        .and_then(|h| Ok((h, settings.timeout_for(cr, Transition::Wake)?)));
    let (hibernate_timeout, wake_timeout) = match timeouts {
        Ok(t) => t,
        Err(message) => {
            pass.fail(REASON_INVALID_SPEC, &message);
            return pass.finish(None);
        }
    };
    let timeouts = Timeouts {
        hibernate: hibernate_timeout,
        wake: wake_timeout,
    };
    // S2: a CR that another CR outranks never touches the pod or the VM. Failed is not
    // retried (F2) while that lasts, and an unchanged status writes nothing.
    let conflict = match owner {
        Ownership::Sole => None,
        Ownership::OlderOnPod(other) => Some(format!(
            "CocoonHibernation {other} is older and acts on pod {}; this one does nothing while it exists (one acting CocoonHibernation per pod)",
            cr.spec.pod_ref.name
        )),
        Ownership::VmHeldBy { vm, holder } => Some(format!(
            "vm {vm} is held by {holder} through another pod; this one never touches it (one owner per VM)"
        )),
    };
    if let Some(message) = conflict {
        pass.set_phase(Phase::Failed, READY_CONFLICT, &message, false);
        pass.failure(REASON_CONFLICT, &message);
        return pass.finish(Some(settings.conflict_recheck));
    }

    let pod_name = &cr.spec.pod_ref.name;
    let ns = cr.metadata.namespace.as_deref().unwrap_or_default();
    let (view, vm) = match pod {
        PodRead::Missing => {
            return pass.pending(
                REASON_POD_MISSING,
                &format!("pod {ns}/{pod_name} not found"),
                settings,
            );
        }
        PodRead::NotSelected => {
            let selector = &settings.pod_selector;
            let message = format!(
                "pod {ns}/{pod_name} exists but is outside --pod-selector={selector}: this install does not watch it, so it does nothing with it (label the pod to match, or widen the selector)"
            );
            return pass.not_selected(REASON_POD_NOT_SELECTED, &message, settings);
        }
        PodRead::Found(v) => match v.vm_name.clone() {
            None => {
                return pass.pending(
                    REASON_WAITING_FOR_VM,
                    &format!("pod {ns}/{pod_name} has no vm.cocoonstack.io/name yet"),
                    settings,
                );
            }
            Some(vm) => (v, vm),
        },
    };

    // S9: a pod that names another VM than the one this CR holds keeps the old claim: its
    // tag may be the old VM's only copy. Not retried while that lasts, and quiet (C3).
    if let Some(held) = cr.vm_name().filter(|held| *held != vm) {
        let message = format!(
            "pod {ns}/{pod_name} now names vm {vm}, but this CocoonHibernation holds vm {held}, whose snapshot {held}:hibernate may be its only copy; it keeps that claim and does nothing until the pod names {held} again (deleting this CocoonHibernation releases {held} and discards its snapshot)"
        );
        pass.set_phase(Phase::Failed, (false, REASON_VM_CHANGED), &message, false);
        pass.failure(REASON_VM_CHANGED, &message);
        return pass.finish(Some(settings.conflict_recheck));
    }

    // W2: vk was seen clearing the VMID recorded at the hibernate request, so any VMID it
    // writes from now on comes from a new clone.
    if view.vm_id.is_none() {
        pass.next.pre_hibernate_vm_id = None;
    }
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
        Desire::Wake => pass.wake(view, &vm, probe, settings, &timeouts),
        _ => pass.hibernate(view, &vm, probe, settings, &timeouts),
    }
}

/// The timeouts that apply to this CR (its own, else the controller's).
struct Timeouts {
    hibernate: Duration,
    wake: Duration,
}
