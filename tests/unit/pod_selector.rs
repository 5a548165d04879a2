//! Tables for `--pod-selector` (R2, G1, S6): a CR whose pod exists outside the selector
//! is not a CR whose pod is missing. It says so on its status, and no rule that deletes
//! or discards a tag acts on it, whatever its phase.

use cocoon_hibernation::api::annotations::PodView;
use cocoon_hibernation::api::conditions::{
    self, PROGRESSING, READY, REASON_POD_MISSING, REASON_POD_NOT_SELECTED, SNAPSHOT_DELETED,
};
use cocoon_hibernation::api::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Desire, FINALIZER, Phase,
    PodRef,
};
use cocoon_hibernation::controller::plan::{self, Ownership, Plan, PodRead, Probe, Settings};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rstest::rstest;
use std::time::Duration;

const SELECTOR: &str = "cocoonset.cocoonstack.io/name";

fn at(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap())
}

fn settings() -> Settings {
    Settings {
        pod_selector: SELECTOR.into(),
        ..Settings::default()
    }
}

/// A CR on pod `web-0` in `phase`, holding vm `vm-a` once it has a phase. An Active CR
/// still owes its tag delete (W3), the case where a missing pod would matter most.
fn cr(desire: Desire, phase: Option<Phase>) -> CocoonHibernation {
    let mut cr = CocoonHibernation::new(
        "web-0",
        CocoonHibernationSpec {
            pod_ref: PodRef {
                name: "web-0".into(),
            },
            desire,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.namespace = Some("apps".into());
    cr.metadata.generation = Some(1);
    cr.metadata.uid = Some("uid-1".into());
    cr.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let Some(phase) = phase else { return cr };
    let mut status = CocoonHibernationStatus {
        observed_generation: Some(1),
        phase: Some(phase),
        vm_name: Some("vm-a".into()),
        ..Default::default()
    };
    let done = matches!(phase, Phase::Hibernated | Phase::Active);
    let update = conditions::Update {
        type_: READY,
        status: done,
        reason: if done { "Done" } else { "Pending" },
        message: "m",
        observed_generation: Some(1),
    };
    conditions::upsert(&mut status.conditions, update, at(0), true);
    if phase == Phase::Active {
        let owed = conditions::Update {
            type_: SNAPSHOT_DELETED,
            status: false,
            reason: "DeleteFailed",
            message: "deleting snapshot vm-a:hibernate failed: 503",
            observed_generation: Some(1),
        };
        conditions::upsert(&mut status.conditions, owed, at(0), false);
    }
    cr.status = Some(status);
    cr
}

fn run(cr: &CocoonHibernation, pod: PodRead<'_>, secs: i64) -> Plan {
    let probe = Probe::Present;
    plan::plan_read(cr, pod, &Ownership::Sole, &probe, at(secs), &settings())
}

/// One condition of the status a plan writes.
#[derive(Debug)]
struct Seen {
    status: String,
    reason: String,
    message: String,
}

fn condition(p: &Plan, type_: &str) -> Seen {
    let s = p.status.as_ref().expect("a status write");
    let c = conditions::find(&s.conditions, type_).expect("the condition");
    Seen {
        status: c.status.clone(),
        reason: c.reason.clone(),
        message: c.message.clone(),
    }
}

/// SPEC R2 G1 S6: a pod outside `--pod-selector` is reported as such, in every phase:
/// `Pending` naming the selector (Hibernated and Waking keep their phase, R2, with the
/// reason in Progressing). The pass patches no pod, deletes no tag, sends no event (no
/// `SnapshotDiscarded`), probes nothing, and the next pass writes nothing.
#[rstest]
#[case::new_hibernate(None, Desire::Hibernate, Phase::Pending, "True")]
#[case::new_wake(None, Desire::Wake, Phase::Pending, "True")]
#[case::pending(Some(Phase::Pending), Desire::Hibernate, Phase::Pending, "True")]
#[case::hibernating(Some(Phase::Hibernating), Desire::Hibernate, Phase::Pending, "True")]
#[case::hibernated(Some(Phase::Hibernated), Desire::Hibernate, Phase::Hibernated, "False")]
#[case::hibernated_asked_to_wake(Some(Phase::Hibernated), Desire::Wake, Phase::Hibernated, "True")]
#[case::waking(Some(Phase::Waking), Desire::Wake, Phase::Waking, "True")]
#[case::active_owing_its_delete(Some(Phase::Active), Desire::Wake, Phase::Pending, "True")]
#[case::failed(Some(Phase::Failed), Desire::Hibernate, Phase::Pending, "True")]
fn r2_g1_s6_an_unselected_pod_is_reported_and_never_acted_on(
    #[case] phase: Option<Phase>,
    #[case] desire: Desire,
    #[case] want: Phase,
    #[case] progressing: &str,
) {
    let c = cr(desire, phase);
    let p = run(&c, PodRead::NotSelected, 10);
    assert_eq!(p.pod_patch, None, "an unselected pod is never patched");
    assert_eq!(
        p.delete_tag, None,
        "no tag delete acts on an unselected pod"
    );
    assert!(
        p.events.is_empty(),
        "no event (no SnapshotDiscarded): {:?}",
        p.events
    );
    assert!(!p.needs_probe && p.finished.is_none() && p.error.is_none());
    assert_eq!(p.status.as_ref().and_then(|s| s.phase), Some(want));
    let seen = condition(&p, PROGRESSING);
    assert_eq!(
        (seen.status.as_str(), seen.reason.as_str()),
        (progressing, REASON_POD_NOT_SELECTED)
    );
    assert!(
        seen.message.contains(&format!("--pod-selector={SELECTOR}"))
            && seen.message.contains("apps/web-0 exists"),
        "{seen:?}"
    );
    if want == Phase::Pending {
        let ready = condition(&p, READY);
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Pending")
        );
        assert!(
            ready
                .message
                .contains(&format!("--pod-selector={SELECTOR}")),
            "{ready:?}"
        );
    }
    // W3's debt is kept, not settled: the tag is still owed once the pod is back.
    if phase == Some(Phase::Active) {
        let owed = condition(&p, SNAPSHOT_DELETED);
        assert_eq!(owed.status, "False");
    }
    // The pod entering the selector arrives through the watch; the recheck is the slow one.
    assert_eq!(p.requeue, Some(Duration::from_secs(60)));
    // Said once: the next pass writes nothing (C3).
    let mut again = c.clone();
    again.status = p.status.clone();
    let next = run(&again, PodRead::NotSelected, 20);
    assert_eq!(next.status, None);
    assert_eq!((next.pod_patch, next.delete_tag), (None, None));
}

/// SPEC R2: the same CR whose pod is really gone still says PodMissing: the distinction
/// comes from the fresh read, not from the selector being set.
#[test]
fn r2_a_missing_pod_is_still_missing_with_a_selector() {
    let p = run(&cr(Desire::Hibernate, None), PodRead::Missing, 0);
    let seen = condition(&p, PROGRESSING);
    assert_eq!(seen.reason, REASON_POD_MISSING);
    assert!(!seen.message.contains("--pod-selector"), "{seen:?}");
    assert_eq!(p.requeue, Some(Duration::from_secs(5)));
}

/// SPEC R2: a Hibernated CR whose pod comes back inside the selector, or is deleted,
/// says Done again, once, and asks nothing of the pod or the registry.
#[rstest]
#[case::pod_back(true)]
#[case::pod_gone(false)]
fn r2_a_hibernated_cr_whose_pod_returns_or_goes_says_done_again(#[case] back: bool) {
    let mut c = cr(Desire::Hibernate, Some(Phase::Hibernated));
    c.status = run(&c, PodRead::NotSelected, 10).status;
    let pod = PodView {
        uid: Some("u".into()),
        vm_name: Some("vm-a".into()),
        hibernate_requested: true,
        lifecycle_state: Some("hibernated".into()),
        observed_generation: 1,
        cocoonset_generation: 1,
        vm_id: None,
        container_running: false,
    };
    let read = || {
        if back {
            PodRead::Found(&pod)
        } else {
            PodRead::Missing
        }
    };
    let p = run(&c, read(), 20);
    let seen = condition(&p, PROGRESSING);
    assert_eq!(
        (seen.status.as_str(), seen.reason.as_str()),
        ("False", "Done")
    );
    assert_eq!(
        p.status.as_ref().and_then(|s| s.phase),
        Some(Phase::Hibernated)
    );
    assert_eq!(
        (p.pod_patch, p.delete_tag, p.needs_probe),
        (None, None, false)
    );
    c.status = p.status;
    assert_eq!(run(&c, read(), 30).status, None);
}

/// SPEC G1 S6: a CR being deleted whose own pod, read fresh, exists outside the selector
/// keeps its tag in every phase, though it is the VM's last holder (`plan_cleanup` alone
/// would delete it): no delete, hence no `SnapshotDiscarded`. A pod inside the selector
/// or a missing one leaves the decision to G1 and S6 as before.
#[rstest]
#[case::pending(Phase::Pending)]
#[case::hibernating(Phase::Hibernating)]
#[case::hibernated(Phase::Hibernated)]
#[case::waking(Phase::Waking)]
#[case::active(Phase::Active)]
#[case::failed(Phase::Failed)]
fn g1_s6_a_deleting_cr_keeps_the_tag_of_an_unselected_pod(#[case] phase: Phase) {
    let mut c = cr(Desire::Hibernate, Some(phase));
    c.metadata.deletion_timestamp = Some(at(5));
    let cleanup = plan::plan_cleanup(&c, std::iter::empty(), std::iter::empty());
    assert_eq!(
        cleanup.delete_tag.as_deref(),
        Some("vm-a"),
        "G1 alone would delete"
    );
    assert!(cleanup.remove_finalizer, "G2: the finalizer still goes");
    assert!(plan::own_pod_holds_tag(PodRead::NotSelected));
    let pod = PodView {
        vm_name: Some("vm-a".into()),
        ..PodView::default()
    };
    assert!(!plan::own_pod_holds_tag(PodRead::Found(&pod)));
    assert!(!plan::own_pod_holds_tag(PodRead::Missing));
}
