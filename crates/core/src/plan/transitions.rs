//! The two transitions a pass drives: hibernate (H1-H5) and wake (W1-W4).

use super::delete_rules::{DeleteResult, after_delete, owes_tag_delete, vm_running_again};
use super::pass::{Pass, READY_DONE, READY_PENDING};
use super::{Ending, EventKind, Plan, PodPatch, Probe, Settings, Timeouts, Transition};
use cocoon_api::annotations::PodView;
use cocoon_api::conditions::{
    REASON_DONE, REASON_HIBERNATE_NOT_RECORDED, REASON_HIBERNATE_TIMED_OUT,
    REASON_KEPT_FOR_HIBERNATE, REASON_REGISTRY_UNAVAILABLE, REASON_WAITING_FOR_CONTAINER,
    REASON_WAITING_FOR_FRESH_VMID, REASON_WAITING_FOR_LIFECYCLE, REASON_WAITING_FOR_SNAPSHOT,
    REASON_WAKE_TIMED_OUT, SNAPSHOT_DELETED,
};
use cocoon_api::{Desire, Phase};

impl Pass<'_> {
    pub(super) fn hibernate(
        mut self,
        view: &PodView,
        vm: &str,
        probe: &Probe,
        settings: &Settings,
        timeouts: &Timeouts,
    ) -> Plan {
        if !view.hibernate_requested {
            self.plan.pod_patch = Some(PodPatch::SetHibernate); // H1
            // W2: the patch `test`s this VMID, so it is the one the request may take away;
            // a record taken from a stale view of an earlier round would prove a false wake.
            self.next.pre_hibernate_vm_id = view.vm_id.clone();
        }
        match self.phase() {
            Some(Phase::Hibernated) => {
                self.clear_not_selected();
                self.finish(None)
            }
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
                    let timeout = humantime::format_duration(timeouts.hibernate);
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
                // W2: the VMID this request may take away proves no later wake.
                self.next.pre_hibernate_vm_id = view.vm_id.clone();
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

    pub(super) fn wake(
        mut self,
        view: &PodView,
        vm: &str,
        probe: &Probe,
        settings: &Settings,
        timeouts: &Timeouts,
    ) -> Plan {
        if view.hibernate_requested {
            self.plan.pod_patch = Some(PodPatch::ClearHibernate); // W1
            // W2: a request this CR holds no record of (a deleted CR's, a status write
            // lost after the pod patch) may still take the VM on this VMID away.
            if self.next.pre_hibernate_vm_id.is_none() {
                self.next.pre_hibernate_vm_id = view.vm_id.clone();
            }
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
                    // W2: this VMID may be the one vk takes away.
                    self.next.pre_hibernate_vm_id = view.vm_id.clone();
                }
                // S1, W2: not while the pod still asks for a hibernate or the VM is not back
                // on a fresh VMID: the tag may be its only copy.
                let fresh = view.woken_since(self.next.pre_hibernate_vm_id.as_deref());
                if owed && !view.hibernate_requested && fresh {
                    self.plan.delete_tag = Some(tag_vm);
                }
                self.finish(None)
            }
            Some(Phase::Waking) => {
                let elapsed = self.elapsed();
                // W2, S1: not while the pod still asks for a hibernate: vk may act on it, so
                // W1's patch goes first and a later pass ends the wake. Ended now, the delete's
                // fresh pod read would only see this pass's own patch.
                let pre_hibernate = self.next.pre_hibernate_vm_id.clone();
                if vm_running_again(Some(view), vm, pre_hibernate.as_deref()) {
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
                    let timeout = humantime::format_duration(timeouts.wake);
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
                match pre_hibernate.filter(|_| view.woken()) {
                    // W2: running on the VMID of before the hibernate request: vk may still
                    // be pushing or removing that VM, so it proves no wake.
                    Some(old) => self.progress(
                        true,
                        REASON_WAITING_FOR_FRESH_VMID,
                        &format!(
                            "waiting for vk-cocoon to wake vm {vm}: the pod still shows VMID {old}, the one it had when the hibernate was requested, and vk-cocoon may still be hibernating that VM; a wake ends on a VMID written after it"
                        ),
                    ),
                    None => self.progress(
                        true,
                        REASON_WAITING_FOR_CONTAINER,
                        &format!(
                            "waiting for vk-cocoon to wake vm {vm}: a running container with a new VMID"
                        ),
                    ),
                }
                let remaining = timeouts.wake - elapsed;
                self.finish(Some(settings.transition_poll.min(remaining)))
            }
            // A new Wake CR whose pod already runs its VM: the wake's end already holds,
            // so it goes straight to Active in one write. A tag is deleted only when the
            // registry shows one.
            None | Some(Phase::Pending)
                if !view.hibernate_requested
                    && view.woken_since(self.next.pre_hibernate_vm_id.as_deref()) =>
            {
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
