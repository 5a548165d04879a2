//! Status conditions: `Ready` (A3), `Progressing` (what a transition waits for) and
//! snapshot cleanup bookkeeping (W3).

use super::Condition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

pub const READY: &str = "Ready";
/// False while a woken CR still owes the registry a tag delete (W3); True once done.
pub const SNAPSHOT_DELETED: &str = "SnapshotDeleted";

/// True while a transition runs; its reason names what it waits for. False once settled.
pub const PROGRESSING: &str = "Progressing";

pub const REASON_DONE: &str = "Done";
pub const REASON_FAILED: &str = "Failed";
pub const REASON_PENDING: &str = "Pending";
/// S2: another CR holds this CR's pod or VM; not retried while that lasts.
pub const REASON_CONFLICT: &str = "Conflict";
/// S5: the tag was kept because another tag shares its digest.
pub const REASON_SHARED_DIGEST: &str = "SharedDigest";
/// S5: the last tag delete failed; the message carries the registry's answer.
pub const REASON_DELETE_FAILED: &str = "DeleteFailed";
/// D1, W3: a wake ended after the desire flipped back to Hibernate, so the tag is kept;
/// it is still owed if the desire returns to Wake before a new hibernate starts.
pub const REASON_KEPT_FOR_HIBERNATE: &str = "KeptForHibernate";
/// F2, W3: the pod asked for a hibernate this CR never recorded (its status write was
/// lost to a flipped desire); vk may have stored a snapshot, so the tag is owed.
pub const REASON_HIBERNATE_NOT_RECORDED: &str = "HibernateNotRecorded";
/// S7: the tag now names another manifest than the one this CR confirmed: a newer
/// snapshot, which is not this CR's to delete. Settled; never retried.
pub const REASON_SNAPSHOT_MOVED: &str = "SnapshotMoved";
/// S9: the pod now names another VM than the one this CR holds; the claim is kept.
pub const REASON_VM_CHANGED: &str = "VMChanged";

// Progressing reasons: what an unfinished transition waits for.
/// vk-cocoon has not reported this round's hibernate (or wake) yet.
pub const REASON_WAITING_FOR_LIFECYCLE: &str = "WaitingForLifecycle";
/// vk-cocoon reports hibernated; the registry does not show the snapshot tag yet.
pub const REASON_WAITING_FOR_SNAPSHOT: &str = "WaitingForSnapshot";
/// The wake waits for a running container with a fresh VMID.
pub const REASON_WAITING_FOR_CONTAINER: &str = "WaitingForContainer";
/// W2: the pod runs on the VMID it had when the hibernate was requested (no wake yet).
pub const REASON_WAITING_FOR_FRESH_VMID: &str = "WaitingForFreshVMID";
/// The registry could not be asked; the message carries its error.
pub const REASON_REGISTRY_UNAVAILABLE: &str = "RegistryUnavailable";
/// The snapshot tag is still to be deleted after a wake; the message carries the last error.
pub const REASON_DELETING_SNAPSHOT: &str = "DeletingSnapshot";
/// The pod named by spec.podRef does not exist.
pub const REASON_POD_MISSING: &str = "PodMissing";
/// The pod exists but lies outside `--pod-selector`: this install does not watch it, so
/// it neither acts on it nor treats it as missing.
pub const REASON_POD_NOT_SELECTED: &str = "PodNotSelected";
/// The pod exists but has no VM name yet.
pub const REASON_WAITING_FOR_VM: &str = "WaitingForVM";
/// Failure reasons, also in `status.lastFailure.reason`.
pub const REASON_HIBERNATE_TIMED_OUT: &str = "HibernateTimedOut";
pub const REASON_WAKE_TIMED_OUT: &str = "WakeTimedOut";
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";

pub fn find<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

/// The content of one condition, without its transition time.
#[derive(Clone, Copy, Debug)]
pub struct Update<'a> {
    pub type_: &'a str,
    pub status: bool,
    pub reason: &'a str,
    pub message: &'a str,
    pub observed_generation: Option<i64>,
}

/// Upserts a condition. Like apimachinery's SetStatusCondition, the transition time is kept
/// when the status does not change, unless `refresh` asks for a new one (F2).
pub fn upsert(conditions: &mut Vec<Condition>, update: Update<'_>, now: Time, refresh: bool) {
    let Update {
        type_,
        status,
        reason,
        message,
        observed_generation,
    } = update;
    let status = if status { "True" } else { "False" }.to_owned();
    match conditions.iter_mut().find(|c| c.type_ == type_) {
        Some(existing) => {
            if existing.status != status || refresh {
                existing.last_transition_time = now;
            }
            existing.status = status;
            existing.reason = reason.to_owned();
            existing.message = message.to_owned();
            existing.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.to_owned(),
            observed_generation,
            last_transition_time: now,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).unwrap())
    }

    fn ready(
        c: &mut Vec<Condition>,
        status: bool,
        reason: &str,
        message: &str,
        now: Time,
        refresh: bool,
    ) {
        let update = Update {
            type_: READY,
            status,
            reason,
            message,
            observed_generation: Some(1),
        };
        upsert(c, update, now, refresh);
    }

    /// SPEC F2.
    #[test]
    fn f2_same_status_keeps_transition_time_unless_refreshed() {
        let mut c = Vec::new();
        ready(&mut c, false, REASON_PENDING, "a", t(10), false);
        ready(&mut c, false, REASON_FAILED, "b", t(20), false);
        assert_eq!(find(&c, READY).unwrap().last_transition_time, t(10));
        assert_eq!(find(&c, READY).unwrap().reason, REASON_FAILED);
        ready(&mut c, false, REASON_PENDING, "c", t(30), true);
        assert_eq!(find(&c, READY).unwrap().last_transition_time, t(30));
        ready(&mut c, true, REASON_DONE, "d", t(40), false);
        assert_eq!(find(&c, READY).unwrap().last_transition_time, t(40));
        assert_eq!(c.len(), 1);
    }
}
