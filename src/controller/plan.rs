//! The reconcile rules as one pure function: (CR, pod view, registry probe, now) -> Plan.
//! Nothing here does I/O; `reconcile.rs` fetches the inputs and carries out the plan.

use crate::api::annotations::PodView;
use crate::api::conditions::{
    self, PROGRESSING, READY, REASON_CONFLICT, REASON_DELETE_FAILED, REASON_DELETING_SNAPSHOT,
    REASON_DONE, REASON_FAILED, REASON_HIBERNATE_NOT_RECORDED, REASON_HIBERNATE_TIMED_OUT,
    REASON_INVALID_SPEC, REASON_KEPT_FOR_HIBERNATE, REASON_PENDING, REASON_POD_MISSING,
    REASON_REGISTRY_UNAVAILABLE, REASON_SHARED_DIGEST, REASON_SNAPSHOT_MOVED, REASON_VM_CHANGED,
    REASON_WAITING_FOR_CONTAINER, REASON_WAITING_FOR_LIFECYCLE, REASON_WAITING_FOR_SNAPSHOT,
    REASON_WAITING_FOR_VM, REASON_WAKE_TIMED_OUT, SNAPSHOT_DELETED, Update,
};
use crate::api::{CocoonHibernation, CocoonHibernationStatus, Desire, Failure, Phase};
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
    /// S2: how often a CR blocked by another CR looks again, besides the events that
    /// usually wake it. Such a pass writes nothing while the conflict lasts.
    pub conflict_recheck: Duration,
    /// C2: registry calls at once; below the worker count so a slow registry never
    /// holds every worker.
    pub registry_slots: usize,
    /// S5: first wait after a tag delete is refused for good; doubles up to 10x.
    pub refused_delete_backoff: Duration,
}

impl Settings {
    /// The CR's own timeout for `transition` (spec.hibernateTimeout / spec.wakeTimeout),
    /// else the controller's default. Err names the field whose value is not a duration.
    pub fn timeout_for(
        &self,
        cr: &CocoonHibernation,
        transition: Transition,
    ) -> Result<Duration, String> {
        let (field, value, default) = match transition {
            Transition::Hibernate => (
                "spec.hibernateTimeout",
                &cr.spec.hibernate_timeout,
                self.hibernate_timeout,
            ),
            Transition::Wake => ("spec.wakeTimeout", &cr.spec.wake_timeout, self.wake_timeout),
        };
        match value {
            None => Ok(default),
            Some(raw) => crate::api::parse_duration(raw).map_err(|e| {
                format!("{field} {raw:?} is not a duration such as 90s, 5m or 1h30m: {e}")
            }),
        }
    }
}

/// A transition, for timeouts and for what a pass reports as finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    Hibernate,
    Wake,
}

/// How a transition ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ending {
    Done,
    TimedOut,
}

/// A transition this pass ends; the effect layer turns it into metrics.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Finished {
    pub transition: Transition,
    pub ending: Ending,
    /// From entering Hibernating or Waking to this pass.
    pub seconds: f64,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            hibernate_timeout: Duration::from_secs(180),
            wake_timeout: Duration::from_secs(300),
            pending_recheck: Duration::from_secs(5),
            transition_poll: Duration::from_secs(15),
            conflict_recheck: Duration::from_secs(60),
            registry_slots: 3,
            refused_delete_backoff: Duration::from_secs(60),
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
        status.snapshot = Some(crate::api::SnapshotStatus {
            digest: Some(digest.clone()),
        });
    }
    plan.probed_digest = digest;
}

/// What to do for a CR being deleted (G1, G2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cleanup {
    pub delete_tag: Option<String>,
    pub remove_finalizer: bool,
}

/// Whether this CR may act on its pod and VM (S2), from the other CRs in the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Ownership {
    #[default]
    Sole,
    /// An older live CR targets the same pod (`namespace/name`); only the oldest acts.
    OlderOnPod(String),
    /// A live CR on another pod holds the VM this CR's pod names.
    VmHeldBy { vm: String, holder: String },
}

/// S2: one pod, one acting CR; one VM, one owner. `same_pod` and `vm_holders` may
/// include `cr` itself. Age is (creationTimestamp, name), so every replica agrees.
pub fn ownership<'a>(
    cr: &CocoonHibernation,
    pod_vm: Option<&str>,
    same_pod: impl IntoIterator<Item = &'a CocoonHibernation>,
    vm_holders: impl IntoIterator<Item = &'a CocoonHibernation>,
) -> Ownership {
    let is_self = |o: &CocoonHibernation| {
        o.metadata.namespace == cr.metadata.namespace && o.metadata.name == cr.metadata.name
    };
    let age = |o: &CocoonHibernation| {
        (
            o.metadata.creation_timestamp.clone().map(|t| t.0),
            o.metadata.name.clone(),
        )
    };
    let key = |o: &CocoonHibernation| {
        format!(
            "{}/{}",
            o.metadata.namespace.as_deref().unwrap_or_default(),
            o.metadata.name.as_deref().unwrap_or_default()
        )
    };
    let mine = age(cr);
    let older_on_pod = same_pod
        .into_iter()
        .filter(|o| !is_self(o) && !o.is_deleting() && o.spec.pod_ref == cr.spec.pod_ref)
        .filter(|o| o.metadata.namespace == cr.metadata.namespace && age(o) < mine)
        .min_by_key(|o| age(o));
    if let Some(o) = older_on_pod {
        return Ownership::OlderOnPod(key(o));
    }
    let Some(vm) = pod_vm else {
        return Ownership::Sole;
    };
    let i_hold = cr.vm_name() == Some(vm);
    let holder = vm_holders
        .into_iter()
        .filter(|o| !is_self(o) && !o.is_deleting() && o.vm_name() == Some(vm))
        .filter(|o| {
            o.metadata.namespace != cr.metadata.namespace || o.spec.pod_ref != cr.spec.pod_ref
        })
        // Two holders of one VM can only come from before this rule: the older keeps it.
        .filter(|o| !i_hold || age(o) < mine)
        .min_by_key(|o| age(o));
    match holder {
        Some(o) => Ownership::VmHeldBy {
            vm: vm.to_owned(),
            holder: key(o),
        },
        None => Ownership::Sole,
    }
}

/// Which debt a tag delete pays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Debt {
    /// W2: the wake is ending; the status write waits for the delete.
    EndOfWake,
    /// W3: the CR woke and owes the registry its old tag.
    AfterWake,
    /// G1: the CR is being deleted and is the last holder of the VM.
    OnDeletion,
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

/// S1: a fresh read from the apiserver (not the cache) still shows the same CR owing
/// this delete. Anything else (another uid, a flipped desire, a finished delete, another
/// VM) means the tag may be wanted again, so it is kept.
pub fn still_owes(fresh: &CocoonHibernation, uid: Option<&str>, vm: &str, debt: Debt) -> bool {
    let same_uid = uid.is_some() && fresh.metadata.uid.as_deref() == uid;
    // A wake that collapses into one write (a fresh Wake CR) has not recorded its VM yet.
    let same_vm =
        fresh.vm_name() == Some(vm) || (debt == Debt::EndOfWake && fresh.vm_name().is_none());
    same_uid
        && same_vm
        && match debt {
            Debt::EndOfWake => {
                !fresh.is_deleting()
                    && fresh.spec.desire == Desire::Wake
                    && !matches!(fresh.phase(), Some(Phase::Hibernating | Phase::Hibernated))
            }
            Debt::AfterWake => {
                !fresh.is_deleting()
                    && fresh.spec.desire == Desire::Wake
                    && fresh.phase() == Some(Phase::Active)
                    && owes_tag_delete(fresh)
            }
            Debt::OnDeletion => fresh.is_deleting() && fresh.has_finalizer(),
        }
}

/// W3, S5: the CR's status records a tag delete still to be done. A tag that moved to a
/// newer snapshot (S7) is settled: that snapshot is not this CR's to delete.
pub fn owes_tag_delete(cr: &CocoonHibernation) -> bool {
    cr.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, SNAPSHOT_DELETED))
        .is_some_and(|c| c.status != "True" && c.reason != REASON_SNAPSHOT_MOVED)
}

/// S7: the fresh pod shows the VM running again after a wake: it names `vm`, asks for no
/// hibernate, and vk reports a running container with a fresh VMID. Only then is the
/// snapshot not the VM's only copy.
pub fn vm_running_again(pod: Option<&PodView>, vm: &str) -> bool {
    pod.is_some_and(|p| p.vm_name.as_deref() == Some(vm) && !p.hibernate_requested && p.woken())
}

/// How a tag delete ended, in the terms status needs (S5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeleteResult {
    /// Deleted now, or already absent.
    Gone,
    /// Kept: deleting by digest would take these tags too.
    SharedDigest(Vec<String>),
    Failed {
        message: String,
    },
    /// S7: kept: the tag names `found`, a newer snapshot than the `confirmed` one.
    Moved {
        confirmed: String,
        found: String,
    },
}

/// S5: the SnapshotDeleted condition after a delete attempt; True only once the tag is gone.
pub fn after_delete(
    written: &CocoonHibernationStatus,
    vm: &str,
    result: &DeleteResult,
    now: Time,
) -> CocoonHibernationStatus {
    let mut next = written.clone();
    let generation = conditions::find(&next.conditions, SNAPSHOT_DELETED)
        .and_then(|c| c.observed_generation)
        .or(next.observed_generation);
    let (status, reason, message) = match result {
        DeleteResult::Gone => (
            true,
            REASON_DONE,
            format!("snapshot {vm}:hibernate deleted"),
        ),
        DeleteResult::SharedDigest(others) => (
            false,
            REASON_SHARED_DIGEST,
            format!(
                "snapshot {vm}:hibernate kept: tags {} share its digest, and a delete by digest would remove them too",
                others.join(", ")
            ),
        ),
        DeleteResult::Failed { message } => (
            false,
            REASON_DELETE_FAILED,
            format!("deleting snapshot {vm}:hibernate failed: {message}"),
        ),
        DeleteResult::Moved { confirmed, found } => (
            false,
            REASON_SNAPSHOT_MOVED,
            format!(
                "snapshot {vm}:hibernate kept: it names {found} now, a newer snapshot than {confirmed}, the one this CocoonHibernation confirmed"
            ),
        ),
    };
    let update = Update {
        type_: SNAPSHOT_DELETED,
        status,
        reason,
        message: &message,
        observed_generation: generation,
    };
    conditions::upsert(&mut next.conditions, update, now.clone(), false);
    // What the CR still does about it shows in Progressing; a gone tag has no digest.
    let (progressing, reason, message) = match result {
        DeleteResult::Gone => {
            next.snapshot = None;
            (false, REASON_DONE, format!("vm {vm} is running"))
        }
        DeleteResult::SharedDigest(_) => (false, REASON_SHARED_DIGEST, message),
        DeleteResult::Moved { .. } => {
            next.snapshot = None;
            (false, REASON_SNAPSHOT_MOVED, message)
        }
        DeleteResult::Failed { .. } => (true, REASON_DELETING_SNAPSHOT, message),
    };
    let update = Update {
        type_: PROGRESSING,
        status: progressing,
        reason,
        message: &message,
        observed_generation: generation,
    };
    conditions::upsert(&mut next.conditions, update, now, false);
    next
}

pub fn plan(
    cr: &CocoonHibernation,
    pod: Option<&PodView>,
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
            "vm {vm} is held by CocoonHibernation {holder} through another pod; this one never touches it (one owner per VM)"
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
        None => {
            return pass.pending(
                REASON_POD_MISSING,
                &format!("pod {ns}/{pod_name} not found"),
                settings,
            );
        }
        Some(v) => match v.vm_name.clone() {
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

/// G1, S6. `others` are the CRs that may still hold the VM: those on the same pod and
/// those whose status.vmName is the VM, in any namespace (S2). `claimants` are CRs whose
/// pod names the VM: one blocked by this CR (S2) wants the snapshot as soon as this CR is
/// gone, so the tag is kept for it. `cr` itself is skipped.
pub fn plan_cleanup<'a>(
    cr: &CocoonHibernation,
    others: impl IntoIterator<Item = &'a CocoonHibernation>,
    claimants: impl IntoIterator<Item = &'a CocoonHibernation>,
) -> Cleanup {
    if !cr.has_finalizer() {
        return Cleanup {
            delete_tag: None,
            remove_finalizer: false,
        };
    }
    let other_live = |o: &CocoonHibernation| {
        let same_cr =
            o.metadata.namespace == cr.metadata.namespace && o.metadata.name == cr.metadata.name;
        !same_cr && !o.is_deleting()
    };
    let held_elsewhere = |vm: &str| {
        others.into_iter().any(|o| {
            let same_pod = o.metadata.namespace == cr.metadata.namespace
                && o.spec.pod_ref.name == cr.spec.pod_ref.name;
            other_live(o) && (o.vm_name() == Some(vm) || same_pod)
        }) || claimants.into_iter().any(other_live)
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

/// S6: the Warning a G1 delete sends first when the tag exists and may be the VM's only
/// copy. That is decided from the pod as the apiserver shows it right before the delete,
/// not from the phase: only a pod running the VM again after a wake holds another copy.
pub fn discard_event(
    cr: &CocoonHibernation,
    vm: &str,
    pod: Option<&PodView>,
    tag_present: bool,
) -> Option<PlannedEvent> {
    if !tag_present || vm_running_again(pod, vm) {
        return None;
    }
    let phase = cr.phase().map_or("new", Phase::as_str);
    Some(PlannedEvent {
        kind: EventKind::Warning,
        reason: "SnapshotDiscarded",
        note: format!(
            "deleting this {phase} CocoonHibernation discards snapshot {vm}:hibernate, which may be the only copy of vm {vm}: its pod does not show the VM running"
        ),
    })
}

const READY_FAILED: (bool, &str) = (false, REASON_FAILED);
const READY_PENDING: (bool, &str) = (false, REASON_PENDING);
const READY_DONE: (bool, &str) = (true, REASON_DONE);
const READY_CONFLICT: (bool, &str) = (false, REASON_CONFLICT);

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

    /// The Progressing condition: True with what a transition waits for, False once settled.
    fn progress(&mut self, progressing: bool, reason: &str, message: &str) {
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
    fn fail(&mut self, reason: &str, message: &str) {
        self.set_phase(Phase::Failed, READY_FAILED, message, false);
        self.failure(reason, message);
    }

    /// Records a failure in Progressing and lastFailure. The same failure seen again keeps
    /// its time, so a CR that stays failed writes nothing more (C3).
    fn failure(&mut self, reason: &str, message: &str) {
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

    /// R2: no pod or no VM name yet. Hibernated and Waking keep their phase; a wake
    /// that cannot go on says why in Progressing, and a settled Hibernated writes nothing.
    fn pending(mut self, reason: &str, message: &str, settings: &Settings) -> Plan {
        match self.phase() {
            Some(Phase::Waking) => self.progress(true, reason, message),
            Some(Phase::Hibernated) if self.cr.spec.desire == Desire::Wake => {
                self.progress(true, reason, message)
            }
            Some(Phase::Hibernated) => {}
            _ => {
                self.set_phase(Phase::Pending, READY_PENDING, message, false);
                self.progress(true, reason, message);
            }
        }
        self.finish(Some(settings.pending_recheck))
    }

    /// Enter Hibernating or Waking with a full budget (F2); a retry from Failed is announced (F3).
    fn enter(&mut self, phase: Phase, vm: &str, reason: &str, message: &str) {
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

    fn hibernate(
        mut self,
        view: &PodView,
        vm: &str,
        probe: &Probe,
        settings: &Settings,
        timeouts: &Timeouts,
    ) -> Plan {
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
                            let message =
                                format!("vm {vm} hibernated; snapshot {vm}:hibernate stored");
                            self.set_phase(Phase::Hibernated, READY_DONE, &message, false);
                            self.progress(false, REASON_DONE, &message);
                            self.next.hibernated_at = Some(self.now.clone());
                            self.event(
                                EventKind::Normal,
                                "Hibernated",
                                format!("vm {vm} hibernated"),
                            );
                            self.finished(Transition::Hibernate, Ending::Done, elapsed);
                            return self.finish(None);
                        }
                        Probe::Absent => self.progress(
                            true,
                            REASON_WAITING_FOR_SNAPSHOT,
                            &format!(
                                "vk-cocoon reports vm {vm} hibernated; waiting for snapshot {vm}:hibernate in the registry"
                            ),
                        ),
                        // H4: still counts against the clock (H5) before it is returned.
                        // S5: the error shows in Ready and Progressing, not only in the logs.
                        Probe::Failed(e) => {
                            let message = format!(
                                "vk-cocoon reports vm {vm} hibernated; probing snapshot {vm}:hibernate failed: {e}"
                            );
                            self.set_phase(Phase::Hibernating, READY_PENDING, &message, false);
                            self.progress(true, REASON_REGISTRY_UNAVAILABLE, &message);
                            self.plan.error = Some(e.clone());
                        }
                    }
                }
                if elapsed >= timeouts.hibernate {
                    self.plan.error = None;
                    let timeout = humanize(timeouts.hibernate);
                    self.fail(
                        REASON_HIBERNATE_TIMED_OUT,
                        &format!("hibernate of vm {vm} did not complete within {timeout}"),
                    );
                    self.event(
                        EventKind::Warning,
                        "HibernateTimedOut",
                        format!("hibernate of vm {vm} timed out after {timeout}"),
                    );
                    self.finished(Transition::Hibernate, Ending::TimedOut, elapsed);
                    return self.finish(None);
                }
                let remaining = timeouts.hibernate - elapsed;
                let poll = if view.lifecycle_hibernated_for_round() {
                    settings.pending_recheck // tag may land just after the annotations
                } else {
                    settings.transition_poll
                };
                self.finish(Some(poll.min(remaining)))
            }
            _ => {
                self.next.conditions.retain(|c| c.type_ != SNAPSHOT_DELETED); // the tag is wanted again
                self.next.snapshot = None; // the next probe records the new one
                self.enter(
                    Phase::Hibernating,
                    vm,
                    REASON_WAITING_FOR_LIFECYCLE,
                    &format!("waiting for vk-cocoon to hibernate vm {vm}"),
                );
                self.finish(Some(settings.transition_poll.min(timeouts.hibernate)))
            }
        }
    }

    fn wake(
        mut self,
        view: &PodView,
        vm: &str,
        probe: &Probe,
        settings: &Settings,
        timeouts: &Timeouts,
    ) -> Plan {
        if view.hibernate_requested {
            self.plan.pod_patch = Some(PodPatch::ClearHibernate); // W1
        }
        match self.phase() {
            Some(Phase::Active) => {
                let tag_vm = self.next.vm_name.clone().unwrap_or_else(|| vm.to_owned());
                // W3: a tag delete still owed is retried on passes of the settled CR.
                let owed = owes_tag_delete(self.cr);
                // F2's open window: a hibernate start whose status write was lost (the desire
                // flipped back) still reached the pod, and vk may store a snapshot for it.
                if view.hibernate_requested && !owed {
                    let message = format!(
                        "the pod asked vk-cocoon to hibernate vm {tag_vm} while this CR stayed Active; snapshot {tag_vm}:hibernate, if stored, is deleted once the VM runs again"
                    );
                    self.owe_tag(REASON_HIBERNATE_NOT_RECORDED, &message);
                }
                // S1: not while the pod still asks for a hibernate or the VM is not back:
                // the tag may be its only copy.
                if owed && !view.hibernate_requested && view.woken() {
                    self.plan.delete_tag = Some(tag_vm);
                }
                self.finish(None)
            }
            Some(Phase::Waking) => {
                let elapsed = self.elapsed();
                if view.woken() {
                    self.finished(Transition::Wake, Ending::Done, elapsed);
                    // D1: a desire flipped back to Hibernate wants the tag again.
                    let tag = if self.cr.spec.desire == Desire::Wake {
                        WakeTag::Delete
                    } else {
                        WakeTag::KeepForHibernate
                    };
                    self.complete_wake(vm, tag);
                    return self.finish(None);
                }
                if elapsed >= timeouts.wake {
                    let timeout = humanize(timeouts.wake);
                    self.fail(
                        REASON_WAKE_TIMED_OUT,
                        &format!("wake of vm {vm} did not complete within {timeout}"),
                    );
                    self.event(
                        EventKind::Warning,
                        "WakeTimedOut",
                        format!("wake of vm {vm} timed out after {timeout}"),
                    );
                    self.finished(Transition::Wake, Ending::TimedOut, elapsed);
                    return self.finish(None);
                }
                // The pod is back (R2 may have said PodMissing): say what the wake waits for.
                self.progress(
                    true,
                    REASON_WAITING_FOR_CONTAINER,
                    &format!(
                        "waiting for vk-cocoon to wake vm {vm}: a running container with a new VMID"
                    ),
                );
                let remaining = timeouts.wake - elapsed;
                self.finish(Some(settings.transition_poll.min(remaining)))
            }
            // A new Wake CR whose pod already runs its VM: the wake's end already holds,
            // so it goes straight to Active in one write. A tag is deleted only when the
            // registry shows one.
            None | Some(Phase::Pending) if !view.hibernate_requested && view.woken() => {
                match probe {
                    Probe::NotProbed => Plan {
                        needs_probe: true,
                        ..Plan::default()
                    },
                    Probe::Present => {
                        self.complete_wake(vm, WakeTag::Delete);
                        self.finish(None)
                    }
                    Probe::Absent => {
                        self.complete_wake(vm, WakeTag::Absent);
                        self.finish(None)
                    }
                    // The registry cannot say: take the long way, which records the debt.
                    Probe::Failed(_) => self.start_waking(vm, settings, timeouts),
                }
            }
            _ => self.start_waking(vm, settings, timeouts),
        }
    }

    fn start_waking(mut self, vm: &str, settings: &Settings, timeouts: &Timeouts) -> Plan {
        self.enter(
            Phase::Waking,
            vm,
            REASON_WAITING_FOR_CONTAINER,
            &format!("waiting for vk-cocoon to wake vm {vm}: a running container with a new VMID"),
        );
        self.finish(Some(settings.transition_poll.min(timeouts.wake)))
    }

    /// W3: records the tag as owed (`SnapshotDeleted=False`): the settled CR's passes
    /// delete it once its pod asks for no hibernate and its VM runs (S1).
    fn owe_tag(&mut self, reason: &str, message: &str) {
        let update = Update {
            type_: SNAPSHOT_DELETED,
            status: false,
            reason,
            message,
            observed_generation: self.next.observed_generation,
        };
        conditions::upsert(&mut self.next.conditions, update, self.now.clone(), false);
    }

    fn finished(&mut self, transition: Transition, ending: Ending, elapsed: Duration) {
        self.plan.finished = Some(Finished {
            transition,
            ending,
            seconds: elapsed.as_secs_f64(),
        });
    }

    /// W2: Active, with the tag delete (if any) done before the one status write, which
    /// then records its outcome (S5).
    fn complete_wake(&mut self, vm: &str, tag: WakeTag) {
        self.next.vm_name = Some(vm.to_owned());
        let message = format!("vm {vm} is running");
        self.set_phase(Phase::Active, READY_DONE, &message, false);
        self.progress(false, REASON_DONE, &message);
        self.next.woken_at = Some(self.now.clone());
        if self.next.attempts.is_none() {
            self.next.attempts = Some(1); // a fresh Wake CR that found its pod running
        }
        self.event(
            EventKind::Normal,
            "WokenActive",
            format!("vm {vm} is running again"),
        );
        match tag {
            WakeTag::Delete => {
                self.next = after_delete(&self.next, vm, &DeleteResult::Gone, self.now.clone());
                self.plan.delete_tag = Some(vm.to_owned());
                self.plan.delete_first = true;
            }
            WakeTag::KeepForHibernate => {
                // D1: owed should the desire return to Wake before a hibernate starts
                // (which drops the condition).
                let message = format!(
                    "snapshot {vm}:hibernate kept: the desire is Hibernate again; deleted if the CR stays awake"
                );
                self.owe_tag(REASON_KEPT_FOR_HIBERNATE, &message);
            }
            WakeTag::Absent => {}
        }
    }
}

/// What the end of a wake does with the snapshot tag.
enum WakeTag {
    Delete,
    /// D1: the desire is Hibernate again.
    KeepForHibernate,
    /// A HEAD showed there is none.
    Absent,
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
