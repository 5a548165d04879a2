//! The rules of a tag delete: which debt it pays, whether a fresh read still owes it
//! (S1, S7), and how its outcome shows in status (S5).

use cocoon_api::annotations::PodView;
use cocoon_api::conditions::{
    self, PROGRESSING, REASON_DELETE_FAILED, REASON_DELETING_SNAPSHOT, REASON_DONE,
    REASON_SHARED_DIGEST, REASON_SNAPSHOT_MOVED, SNAPSHOT_DELETED, Update,
};
use cocoon_api::{CocoonHibernation, CocoonHibernationStatus, Desire, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

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

/// S7, W2: the fresh pod shows the VM running again after a wake: it names `vm`, asks for
/// no hibernate, and vk reports a running container with a VMID other than
/// `pre_hibernate` (the one recorded when the hibernate was requested). Only then is the
/// snapshot not the VM's only copy.
pub fn vm_running_again(pod: Option<&PodView>, vm: &str, pre_hibernate: Option<&str>) -> bool {
    pod.is_some_and(|p| {
        p.vm_name.as_deref() == Some(vm) && !p.hibernate_requested && p.woken_since(pre_hibernate)
    })
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
