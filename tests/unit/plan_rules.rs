//! Table tests for the pure reconcile rules. Each test names the SPEC rule it proves.

use cocoon_hibernation::api::annotations::PodView;
use cocoon_hibernation::api::conditions::{self, READY, SNAPSHOT_DELETED};
use cocoon_hibernation::api::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Desire, FINALIZER, Phase,
    PodRef,
};
use cocoon_hibernation::controller::plan::{
    self, Ending, EventKind, Finished, Ownership, Plan, PodPatch, Probe, Settings, Transition,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rstest::rstest;
use std::time::Duration;

const T0: i64 = 1_700_000_000;

fn at(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(T0 + secs).unwrap())
}

fn cr(desire: Desire, phase: Option<Phase>) -> CocoonHibernation {
    let mut cr = CocoonHibernation::new(
        "pod-a",
        CocoonHibernationSpec {
            pod_ref: PodRef {
                name: "pod-a".into(),
            },
            desire,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.namespace = Some("ns".into());
    cr.metadata.generation = Some(2);
    cr.metadata.finalizers = Some(vec![FINALIZER.into()]);
    if let Some(phase) = phase {
        let mut status = CocoonHibernationStatus {
            observed_generation: Some(2),
            phase: Some(phase),
            vm_name: Some("vm-a".into()),
            ..Default::default()
        };
        let (ok, reason) = match phase {
            Phase::Hibernated | Phase::Active => (true, conditions::REASON_DONE),
            Phase::Failed => (false, conditions::REASON_FAILED),
            _ => (false, conditions::REASON_PENDING),
        };
        let update = conditions::Update {
            type_: READY,
            status: ok,
            reason,
            message: "m",
            observed_generation: Some(2),
        };
        conditions::upsert(&mut status.conditions, update, at(0), true);
        // In flight, Progressing says what the transition waits for, as the product wrote it.
        let waiting = match phase {
            Phase::Hibernating => Some((
                conditions::REASON_WAITING_FOR_LIFECYCLE,
                "waiting for vk-cocoon to hibernate vm vm-a",
            )),
            Phase::Waking => Some((
                conditions::REASON_WAITING_FOR_CONTAINER,
                "waiting for vk-cocoon to wake vm vm-a: a running container with a new VMID",
            )),
            _ => None,
        };
        if let Some((reason, message)) = waiting {
            let update = conditions::Update {
                type_: conditions::PROGRESSING,
                status: true,
                reason,
                message,
                observed_generation: Some(2),
            };
            conditions::upsert(&mut status.conditions, update, at(0), true);
        }
        cr.status = Some(status);
    }
    cr
}

/// A pod after vk hibernated it this round.
fn hibernated_pod() -> PodView {
    PodView {
        uid: Some("u".into()),
        vm_name: Some("vm-a".into()),
        hibernate_requested: true,
        lifecycle_state: Some("hibernated".into()),
        observed_generation: 3,
        cocoonset_generation: 3,
        vm_id: None,
        container_running: false,
    }
}

/// A pod running normally.
fn running_pod() -> PodView {
    PodView {
        uid: Some("u".into()),
        vm_name: Some("vm-a".into()),
        hibernate_requested: false,
        lifecycle_state: Some("ready".into()),
        observed_generation: 3,
        cocoonset_generation: 3,
        vm_id: Some("id-1".into()),
        container_running: true,
    }
}

fn settings() -> Settings {
    Settings::default()
}

fn run(cr: &CocoonHibernation, pod: Option<&PodView>, probe: Probe, secs: i64) -> Plan {
    plan::plan(cr, pod, &Ownership::Sole, &probe, at(secs), &settings())
}

fn phase_of(p: &Plan) -> Option<Phase> {
    p.status.as_ref().and_then(|s| s.phase)
}

fn ready(p: &Plan) -> (String, String, String, Time) {
    let s = p.status.as_ref().expect("a status write");
    let c = conditions::find(&s.conditions, READY).expect("a Ready condition");
    (
        c.status.clone(),
        c.reason.clone(),
        c.message.clone(),
        c.last_transition_time.clone(),
    )
}

fn reasons(p: &Plan) -> Vec<&'static str> {
    p.events.iter().map(|e| e.reason).collect()
}

/// SPEC R1.
#[test]
fn r1_finalizer_first_and_the_pass_ends_there() {
    let mut c = cr(Desire::Hibernate, None);
    c.metadata.finalizers = None;
    let p = run(&c, Some(&running_pod()), Probe::NotProbed, 0);
    assert!(p.add_finalizer);
    assert_eq!(p.pod_patch, None);
    assert_eq!(p.status, None);
    assert!(p.events.is_empty());
}

/// SPEC R2.
#[rstest]
#[case::missing_pod(None, "pod ns/pod-a not found")]
#[case::no_vm_name(Some(PodView { vm_name: None, ..running_pod() }), "has no vm.cocoonstack.io/name")]
fn r2_missing_pod_or_vm_name_is_pending_and_rechecked_every_5s(
    #[case] pod: Option<PodView>,
    #[case] msg: &str,
) {
    let p = run(
        &cr(Desire::Hibernate, None),
        pod.as_ref(),
        Probe::NotProbed,
        0,
    );
    assert_eq!(phase_of(&p), Some(Phase::Pending));
    assert!(ready(&p).2.contains(msg), "{:?}", ready(&p));
    assert_eq!(ready(&p).1, "Pending");
    assert_eq!(p.requeue, Some(Duration::from_secs(5)));
    assert_eq!(p.pod_patch, None);
}

/// SPEC R2.
#[rstest]
#[case::hibernated(Phase::Hibernated, Desire::Wake)]
#[case::waking(Phase::Waking, Desire::Wake)]
fn r2_hibernated_and_waking_keep_their_phase_without_a_pod(
    #[case] phase: Phase,
    #[case] desire: Desire,
) {
    let c = cr(desire, Some(phase));
    let p = run(&c, None, Probe::NotProbed, 10);
    // The phase carries the restore intent; only Progressing says the pod is missing.
    let written = p.status.clone().expect("one write naming the missing pod");
    assert_eq!(written.phase, Some(phase));
    let progressing = conditions::find(&written.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!(progressing.reason, "PodMissing");
    assert!(!progressing.message.contains("vk-cocoon"));
    assert_eq!(p.requeue, Some(Duration::from_secs(5)));
    // Said once: the next pass writes nothing.
    let mut again = c.clone();
    again.status = Some(written);
    assert_eq!(run(&again, None, Probe::NotProbed, 20).status, None);
}

/// SPEC R2.
#[rstest]
#[case::active(Phase::Active)]
#[case::hibernating(Phase::Hibernating)]
#[case::failed(Phase::Failed)]
fn r2_other_phases_fall_back_to_pending_without_a_pod(#[case] phase: Phase) {
    let p = run(
        &cr(Desire::Hibernate, Some(phase)),
        None,
        Probe::NotProbed,
        10,
    );
    assert_eq!(phase_of(&p), Some(Phase::Pending));
}

/// SPEC R2.
#[test]
fn r2_pending_pass_that_changes_nothing_writes_nothing() {
    let first = run(&cr(Desire::Hibernate, None), None, Probe::NotProbed, 0);
    let mut c = cr(Desire::Hibernate, None);
    c.status = first.status.clone();
    let again = run(&c, None, Probe::NotProbed, 30);
    assert_eq!(again.status, None);
}

/// SPEC R3 F1.
#[test]
fn r3_unknown_desire_fails_with_a_message() {
    let p = run(
        &cr(Desire::Unknown, None),
        Some(&running_pod()),
        Probe::NotProbed,
        0,
    );
    assert_eq!(phase_of(&p), Some(Phase::Failed));
    assert!(
        ready(&p)
            .2
            .contains("spec.desire must be Hibernate or Wake")
    );
    assert_eq!(p.pod_patch, None);
}

/// SPEC H1 H2.
#[test]
fn h1_h2_first_pass_sets_annotation_and_enters_hibernating_without_probing() {
    let p = run(
        &cr(Desire::Hibernate, None),
        Some(&running_pod()),
        Probe::NotProbed,
        0,
    );
    assert!(
        !p.needs_probe,
        "H2: entering does not depend on the registry"
    );
    assert_eq!(p.pod_patch, Some(PodPatch::SetHibernate));
    assert_eq!(phase_of(&p), Some(Phase::Hibernating));
    assert_eq!(p.status.as_ref().unwrap().vm_name.as_deref(), Some("vm-a"));
    assert_eq!(p.status.as_ref().unwrap().observed_generation, Some(2));
    let (st, reason, _, ltt) = ready(&p);
    assert_eq!((st.as_str(), reason.as_str()), ("False", "Pending"));
    assert_eq!(ltt, at(0), "H2: the hibernate clock starts now");
}

/// SPEC H1.
#[test]
fn h1_no_patch_when_annotation_already_set() {
    let pod = PodView {
        hibernate_requested: true,
        ..running_pod()
    };
    let p = run(
        &cr(Desire::Hibernate, Some(Phase::Hibernating)),
        Some(&pod),
        Probe::NotProbed,
        5,
    );
    assert_eq!(p.pod_patch, None);
    assert_eq!(p.status, None, "waiting writes nothing");
}

/// SPEC H3.
#[test]
fn h3_probe_is_requested_only_once_lifecycle_covers_the_round() {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernating));
    let p = run(&c, Some(&hibernated_pod()), Probe::NotProbed, 5);
    assert!(p.needs_probe);
    let not_yet = PodView {
        lifecycle_state: Some("hibernating".into()),
        ..hibernated_pod()
    };
    assert!(!run(&c, Some(&not_yet), Probe::NotProbed, 5).needs_probe);
}

/// SPEC H3.
#[test]
fn h3_done_when_lifecycle_round_and_tag_all_hold() {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernating));
    let p = run(&c, Some(&hibernated_pod()), Probe::Present, 42);
    assert_eq!(phase_of(&p), Some(Phase::Hibernated));
    let (st, reason, _, _) = ready(&p);
    assert_eq!((st.as_str(), reason.as_str()), ("True", "Done"));
    assert_eq!(reasons(&p), vec!["Hibernated"]);
    assert_eq!(p.events[0].kind, EventKind::Normal);
    assert_eq!(
        p.finished,
        Some(Finished {
            transition: Transition::Hibernate,
            ending: Ending::Done,
            seconds: 42.0
        })
    );
    assert_eq!(p.requeue, None);
}

/// SPEC H3.
#[rstest]
#[case::stale_tag_lifecycle_not_hibernated(PodView { lifecycle_state: Some("ready".into()), ..hibernated_pod() })]
#[case::stale_round_lower_generation(PodView { observed_generation: 2, cocoonset_generation: 3, ..hibernated_pod() })]
#[case::junk_generation_reads_zero(PodView { observed_generation: 0, cocoonset_generation: 1, ..hibernated_pod() })]
fn h3_stale_tag_or_stale_lifecycle_round_never_completes(#[case] pod: PodView) {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernating));
    // Even with the tag present in the registry.
    let p = run(&c, Some(&pod), Probe::Present, 5);
    assert!(!p.needs_probe);
    assert_eq!(p.status, None, "still Hibernating");
    assert!(p.events.is_empty());
}

/// SPEC H3.
#[test]
fn h3_tag_absent_keeps_waiting_and_rechecks_soon() {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernating));
    let p = run(&c, Some(&hibernated_pod()), Probe::Absent, 5);
    // Still Hibernating; only Progressing changes, to say what it waits for (O2).
    assert_eq!(phase_of(&p), Some(Phase::Hibernating));
    assert_eq!(progressing(&p).1, "WaitingForSnapshot");
    assert_eq!(p.requeue, Some(Duration::from_secs(5)));
    assert_eq!(p.error, None);
}

/// SPEC H4, S5: the error is returned, the phase kept, and the error shown in Ready.
#[test]
fn h4_probe_error_is_returned_and_phase_kept() {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernating));
    let p = run(&c, Some(&hibernated_pod()), Probe::Failed("503".into()), 5);
    assert_eq!(p.error.as_deref(), Some("503"));
    assert_eq!(phase_of(&p), Some(Phase::Hibernating));
    let (status, _, message, since) = ready(&p);
    assert_eq!(status, "False");
    assert!(message.contains("503"), "{message}");
    assert_eq!(since, at(0));
}

/// SPEC H4 H5.
#[test]
fn h4_h5_probe_errors_still_count_against_the_clock() {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernating));
    let p = run(
        &c,
        Some(&hibernated_pod()),
        Probe::Failed("connection refused".into()),
        181,
    );
    assert_eq!(phase_of(&p), Some(Phase::Failed));
    assert_eq!(p.error, None, "the timeout is the answer now");
}

/// SPEC H5 F1: the failure reason is in the Ready condition, and the pass does not requeue.
#[test]
fn h5_hibernate_timeout_fails_with_the_timeout_in_the_message() {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernating));
    let pod = PodView {
        lifecycle_state: Some("hibernating".into()),
        ..hibernated_pod()
    };
    assert_eq!(run(&c, Some(&pod), Probe::NotProbed, 179).status, None);
    let p = run(&c, Some(&pod), Probe::NotProbed, 180);
    assert_eq!(phase_of(&p), Some(Phase::Failed));
    let (st, reason, msg, _) = ready(&p);
    assert_eq!((st.as_str(), reason.as_str()), ("False", "Failed"));
    assert!(msg.contains("3m"), "{msg}");
    assert_eq!(reasons(&p), vec!["HibernateTimedOut"]);
    assert_eq!(
        p.requeue, None,
        "F1: no silent requeue loop; the status write drives the retry"
    );
    assert_eq!(p.events[0].kind, EventKind::Warning);
    assert_eq!(p.finished.map(|f| f.ending), Some(Ending::TimedOut));
}

/// SPEC H5.
#[test]
fn h5_requeue_never_overshoots_the_deadline() {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernating));
    let p = run(&c, Some(&running_pod()), Probe::NotProbed, 175);
    assert_eq!(p.requeue, Some(Duration::from_secs(5)));
}

/// SPEC W1.
#[test]
fn w1_wake_removes_annotation_and_enters_waking() {
    let pod = PodView {
        hibernate_requested: true,
        ..hibernated_pod()
    };
    let p = run(
        &cr(Desire::Wake, Some(Phase::Hibernated)),
        Some(&pod),
        Probe::NotProbed,
        0,
    );
    assert_eq!(p.pod_patch, Some(PodPatch::ClearHibernate));
    assert_eq!(phase_of(&p), Some(Phase::Waking));
    assert_eq!(ready(&p).3, at(0));
}

/// SPEC W1.
#[test]
fn w1_no_patch_when_annotation_already_absent() {
    let pod = PodView {
        hibernate_requested: false,
        ..hibernated_pod()
    };
    let p = run(
        &cr(Desire::Wake, Some(Phase::Waking)),
        Some(&pod),
        Probe::NotProbed,
        3,
    );
    assert_eq!(p.pod_patch, None);
    assert_eq!(p.status, None);
}

/// SPEC W2.
#[test]
fn w2_running_with_fresh_vmid_is_active_then_tag_deleted() {
    let p = run(
        &cr(Desire::Wake, Some(Phase::Waking)),
        Some(&running_pod()),
        Probe::NotProbed,
        20,
    );
    assert_eq!(phase_of(&p), Some(Phase::Active));
    assert_eq!(reasons(&p), vec!["WokenActive"]);
    assert_eq!(p.delete_tag.as_deref(), Some("vm-a"));
    // One write ends the wake: the delete runs first, and the written status records it
    // (True if it went; reconcile turns it False with the reason otherwise, S5).
    assert!(p.delete_first);
    let s = p.status.as_ref().unwrap();
    assert_eq!(
        conditions::find(&s.conditions, SNAPSHOT_DELETED)
            .unwrap()
            .status,
        "True"
    );
    assert_eq!(
        p.finished,
        Some(Finished {
            transition: Transition::Wake,
            ending: Ending::Done,
            seconds: 20.0
        })
    );
}

/// SPEC W2.
#[rstest]
#[case::running_without_vmid(PodView { vm_id: None, ..running_pod() })]
#[case::vmid_not_running(PodView { container_running: false, ..running_pod() })]
#[case::vk_still_hibernating(PodView { lifecycle_state: Some("hibernating".into()), ..running_pod() })]
#[case::vk_reports_hibernated(PodView { lifecycle_state: Some("hibernated".into()), ..running_pod() })]
fn w2_running_alone_or_vmid_alone_or_vk_hibernating_is_not_woken(#[case] pod: PodView) {
    let p = run(
        &cr(Desire::Wake, Some(Phase::Waking)),
        Some(&pod),
        Probe::NotProbed,
        20,
    );
    assert_eq!(p.status, None);
    assert_eq!(p.delete_tag, None);
}

/// `c` with the VMID recorded at its hibernate request (W2).
fn recorded(mut c: CocoonHibernation, vm_id: &str) -> CocoonHibernation {
    if let Some(s) = c.status.as_mut() {
        s.pre_hibernate_vm_id = Some(vm_id.into());
    }
    c
}

fn progressing_reason(p: &Plan) -> Option<String> {
    let s = p.status.as_ref()?;
    conditions::find(&s.conditions, conditions::PROGRESSING).map(|c| c.reason.clone())
}

/// SPEC W2: a hibernate request records the VMID the pod shows then, the one vk may take
/// away; a later wake cannot end on it.
#[test]
fn w2_a_hibernate_request_records_the_vmid_it_may_take_away() {
    let p = run(
        &cr(Desire::Hibernate, Some(Phase::Active)),
        Some(&running_pod()),
        Probe::NotProbed,
        20,
    );
    assert_eq!(phase_of(&p), Some(Phase::Hibernating));
    let s = p.status.as_ref().expect("a status write");
    assert_eq!(s.pre_hibernate_vm_id.as_deref(), Some("id-1"));
}

/// SPEC W2 (issue: a slow vk): a pod Running on the VMID recorded at the hibernate request
/// proves no wake, whether the CR is Waking (after a hibernate that timed out) or a settled
/// Active that owes a delete: no Active, no tag delete, and the CR says what it waits for.
#[rstest]
#[case::waking(recorded(cr(Desire::Wake, Some(Phase::Waking)), "id-1"))]
#[case::failed_hibernate_now_wake(recorded(cr(Desire::Wake, Some(Phase::Failed)), "id-1"))]
fn w2_the_recorded_vmid_never_ends_a_wake(#[case] c: CocoonHibernation) {
    let mut c = c;
    let mut pass = run(&c, Some(&running_pod()), Probe::NotProbed, 20);
    if let Some(status) = pass.status.clone() {
        // Failed enters Waking first; the next pass sees the same pod.
        c.status = Some(status);
        pass = run(&c, Some(&running_pod()), Probe::NotProbed, 25);
    }
    assert_ne!(phase_of(&pass), Some(Phase::Active));
    assert_eq!(pass.delete_tag, None, "W2: no delete on the old VMID");
    let reason = progressing_reason(&pass).or_else(|| {
        let s = c.status.as_ref()?;
        conditions::find(&s.conditions, conditions::PROGRESSING).map(|c| c.reason.clone())
    });
    assert_eq!(
        reason.as_deref(),
        Some(conditions::REASON_WAITING_FOR_FRESH_VMID)
    );
}

/// SPEC W2: a settled Active whose hibernate request reached vk (F2's open window) owes
/// the delete, but pays it only on a VMID other than the one the pod had then.
#[test]
fn w2_an_owed_delete_waits_for_a_vmid_written_after_the_request() {
    let asked = PodView {
        hibernate_requested: true,
        ..running_pod()
    };
    let c = cr(Desire::Wake, Some(Phase::Active));
    let p = run(&c, Some(&asked), Probe::NotProbed, 20);
    let s = p.status.clone().expect("the debt is recorded");
    assert_eq!(s.pre_hibernate_vm_id.as_deref(), Some("id-1"));
    let mut owing = c.clone();
    owing.status = Some(s);
    let same = run(&owing, Some(&running_pod()), Probe::NotProbed, 25);
    assert_eq!(same.delete_tag, None, "W2: the old VMID pays nothing");
    let fresh = PodView {
        vm_id: Some("id-2".into()),
        ..running_pod()
    };
    let later = run(&owing, Some(&fresh), Probe::NotProbed, 30);
    assert_eq!(later.delete_tag.as_deref(), Some("vm-a"));
}

/// SPEC W2: a VMID other than the recorded one ends the wake; so does the recorded one once
/// vk was seen clearing it (a runtime may write the same VMID again after a new clone).
#[test]
fn w2_a_fresh_or_rewritten_vmid_ends_the_wake() {
    let waking = recorded(cr(Desire::Wake, Some(Phase::Waking)), "id-1");
    let fresh = PodView {
        vm_id: Some("id-2".into()),
        ..running_pod()
    };
    let p = run(&waking, Some(&fresh), Probe::NotProbed, 20);
    assert_eq!(phase_of(&p), Some(Phase::Active));
    assert_eq!(p.delete_tag.as_deref(), Some("vm-a"));

    let cleared = PodView {
        vm_id: None,
        container_running: false,
        ..hibernated_pod()
    };
    let seen = run(&waking, Some(&cleared), Probe::NotProbed, 20);
    let s = seen.status.clone().expect("the record is dropped");
    assert_eq!(s.pre_hibernate_vm_id, None);
    let mut after = waking.clone();
    after.status = Some(s);
    let p = run(&after, Some(&running_pod()), Probe::NotProbed, 25);
    assert_eq!(phase_of(&p), Some(Phase::Active));
}

/// The CR of fuzz crash `plan` 5823088705a5: Waking with nothing recorded yet, no
/// generation and no conditions.
fn bare_waking() -> CocoonHibernation {
    let mut c = cr(Desire::Wake, None);
    c.metadata.generation = None;
    c.status = Some(CocoonHibernationStatus {
        phase: Some(Phase::Waking),
        ..Default::default()
    });
    c
}

/// SPEC W2 S1 (fuzz crash `plan` 5823088705a5): a Waking CR whose pod runs its VM with a
/// VMID but still asks for a hibernate does not end the wake: vk may act on the request,
/// and the delete's fresh pod read would only see this pass's own W1 patch. W1 goes
/// first; the wake ends on a pass that sees the annotation gone. Before the fix the pass
/// ended the wake with the tag delete, and the next pass, seeing the same pod, recorded
/// `HibernateNotRecorded` for a tag it had just deleted.
#[rstest]
#[case::s1_wake(cr(Desire::Wake, Some(Phase::Waking)), true)]
#[case::s1_d1_flipped_to_hibernate(cr(Desire::Hibernate, Some(Phase::Waking)), false)]
#[case::s1_fuzz_crash_bare_waking(bare_waking(), true)]
fn w2_s1_a_wake_ends_only_once_the_pod_asks_for_no_hibernate(
    #[case] c: CocoonHibernation,
    #[case] deletes: bool,
) {
    let asks = PodView {
        hibernate_requested: true,
        observed_generation: 57,
        cocoonset_generation: 57,
        ..running_pod()
    };
    for probe in [Probe::NotProbed, Probe::Present] {
        let p = run(&c, Some(&asks), probe, 20);
        assert_eq!(p.pod_patch, Some(PodPatch::ClearHibernate), "W1 first");
        assert_eq!(p.delete_tag, None, "S1: the pod still asks for a hibernate");
        assert!(!p.delete_first);
        assert_eq!(p.finished, None, "the wake goes on");
        assert!(matches!(phase_of(&p), None | Some(Phase::Waking)));
        assert!(p.events.is_empty());
    }
    // The next pass sees W1's patch: the wake ends, and only a Wake CR deletes the tag.
    let cleared = PodView {
        hibernate_requested: false,
        ..asks
    };
    let p = run(&c, Some(&cleared), Probe::Present, 21);
    assert_eq!(phase_of(&p), Some(Phase::Active));
    assert_eq!(p.pod_patch, None);
    assert_eq!(p.delete_tag.as_deref(), deletes.then_some("vm-a"));
    assert_eq!(p.delete_first, deletes);
    // C3: written, the Active Wake CR is settled in the same world.
    if deletes {
        let settled = applied(c.clone(), &p);
        let again = run(&settled, Some(&cleared), Probe::Present, 22);
        assert_eq!(again.status, None);
        assert_eq!(again.delete_tag, None);
    }
}

/// An Active CR whose wake's tag delete failed (the one write recorded the debt), and
/// the plan that ended that wake.
fn active_owing_a_delete() -> (CocoonHibernation, Plan) {
    let first = run(
        &cr(Desire::Wake, Some(Phase::Waking)),
        Some(&running_pod()),
        Probe::NotProbed,
        20,
    );
    let mut c = cr(Desire::Wake, Some(Phase::Active));
    let failed = plan::DeleteResult::Failed {
        message: "registry down".into(),
    };
    c.status = first
        .status
        .as_ref()
        .map(|s| plan::after_delete(s, "vm-a", &failed, at(20)));
    (c, first)
}

/// SPEC W3.
#[test]
fn w3_settled_active_retries_an_owed_tag_delete_without_writing() {
    let (mut c, first) = active_owing_a_delete();
    let p = run(&c, Some(&running_pod()), Probe::NotProbed, 60);
    assert_eq!(p.status, None, "the CR stays Active");
    assert_eq!(p.delete_tag.as_deref(), Some("vm-a"));
    assert!(
        !p.delete_first,
        "a retry on a settled CR writes only if the outcome changes"
    );
    // Once done, nothing is owed.
    c.status = first.status.clone();
    let settled = run(&c, Some(&running_pod()), Probe::NotProbed, 90);
    assert_eq!(settled, Plan::default());
}

/// SPEC S1 W3: a settled Active CR pays an owed delete only while its pod asks for no
/// hibernate and its VM runs: a pod patch whose status write was lost may have let vk
/// hibernate the VM, and then the tag is its only copy.
#[test]
fn s1_w3_an_owed_delete_waits_while_the_pod_asks_for_a_hibernate_or_the_vm_is_gone() {
    let (c, _) = active_owing_a_delete();
    let asks = PodView {
        hibernate_requested: true,
        ..running_pod()
    };
    let p = run(&c, Some(&asks), Probe::NotProbed, 60);
    assert_eq!(p.delete_tag, None, "the pod still asks for a hibernate");
    assert_eq!(p.pod_patch, Some(plan::PodPatch::ClearHibernate), "W1");
    let p = run(&c, Some(&hibernated_pod()), Probe::NotProbed, 60);
    assert_eq!(
        p.delete_tag, None,
        "the VM is gone: the tag may be its only copy"
    );
    let p = run(&c, Some(&running_pod()), Probe::NotProbed, 60);
    assert_eq!(
        p.delete_tag.as_deref(),
        Some("vm-a"),
        "paid once the VM runs"
    );
}

/// SPEC F2 W3 S1 (soak seed 252744765): a hibernate start whose status write was lost to
/// a flipped desire still reached the pod, and vk stored a snapshot for it. The Active
/// Wake CR takes the annotation off (W1) and owes the tag from then on, instead of
/// leaving it for good; it pays once the VM runs again, never while vk reports it
/// hibernated.
#[test]
fn f2_w3_s1_a_lost_hibernate_start_leaves_the_tag_owed_not_forgotten() {
    let (mut c, first) = active_owing_a_delete();
    c.status = first.status.clone();
    assert_eq!(
        run(&c, Some(&running_pod()), Probe::NotProbed, 50),
        Plan::default(),
        "settled: nothing owed"
    );
    let p = run(&c, Some(&hibernated_pod()), Probe::NotProbed, 60);
    assert_eq!(p.pod_patch, Some(plan::PodPatch::ClearHibernate), "W1");
    assert_eq!(p.delete_tag, None, "S1: the tag may be the VM's only copy");
    assert_eq!(phase_of(&p), Some(Phase::Active));
    let status = p.status.expect("the debt is written");
    let owed = conditions::find(&status.conditions, SNAPSHOT_DELETED).expect("SnapshotDeleted");
    assert_eq!(owed.status, "False");
    assert_eq!(owed.reason, conditions::REASON_HIBERNATE_NOT_RECORDED);
    c.status = Some(status);
    let hibernated = PodView {
        hibernate_requested: false,
        ..hibernated_pod()
    };
    let p = run(&c, Some(&hibernated), Probe::NotProbed, 61);
    assert_eq!(p.delete_tag, None, "vk has not woken the VM yet");
    let p = run(&c, Some(&running_pod()), Probe::NotProbed, 62);
    assert_eq!(
        p.delete_tag.as_deref(),
        Some("vm-a"),
        "paid once the VM runs"
    );
}

/// SPEC W2 (issue: writes at the floor): a new Wake CR on a pod already running its VM
/// goes straight to Active in one write; the tag is deleted only if the registry has it.
#[test]
fn w2_fresh_wake_on_a_running_pod_collapses_into_one_write() {
    let c = cr(Desire::Wake, None);
    let first = run(&c, Some(&running_pod()), Probe::NotProbed, 0);
    assert!(first.needs_probe, "the registry is asked first");
    assert_eq!(first.status, None);
    let absent = run(&c, Some(&running_pod()), Probe::Absent, 0);
    assert_eq!(phase_of(&absent), Some(Phase::Active));
    assert_eq!(absent.delete_tag, None, "no tag, no delete");
    assert_eq!(reasons(&absent), vec!["WokenActive"]);
    assert_eq!(
        absent.status.as_ref().and_then(|s| s.vm_name.as_deref()),
        Some("vm-a")
    );
    let present = run(&c, Some(&running_pod()), Probe::Present, 0);
    assert_eq!(phase_of(&present), Some(Phase::Active));
    assert_eq!(present.delete_tag.as_deref(), Some("vm-a"));
    assert!(present.delete_first);
    // A registry error takes the long way through Waking.
    let failed = run(&c, Some(&running_pod()), Probe::Failed("down".into()), 0);
    assert_eq!(phase_of(&failed), Some(Phase::Waking));
    // A pod still asked to hibernate is not collapsed: W1 comes first.
    let asked = PodView {
        hibernate_requested: true,
        ..running_pod()
    };
    let p = run(&c, Some(&asked), Probe::NotProbed, 0);
    assert_eq!(phase_of(&p), Some(Phase::Waking));
    assert_eq!(p.pod_patch, Some(PodPatch::ClearHibernate));
}

/// SPEC W4 F1.
#[test]
fn w4_wake_timeout_fails_with_the_timeout_in_the_message() {
    let pod = PodView {
        hibernate_requested: false,
        ..hibernated_pod()
    };
    let c = cr(Desire::Wake, Some(Phase::Waking));
    assert_eq!(run(&c, Some(&pod), Probe::NotProbed, 299).status, None);
    let p = run(&c, Some(&pod), Probe::NotProbed, 300);
    assert_eq!(phase_of(&p), Some(Phase::Failed));
    assert!(ready(&p).2.contains("5m"));
    assert_eq!(reasons(&p), vec!["WakeTimedOut"]);
    assert_eq!(p.events[0].kind, EventKind::Warning);
}

/// SPEC D1.
#[test]
fn d1_wake_while_hibernating_first_finishes_the_hibernate() {
    let c = cr(Desire::Wake, Some(Phase::Hibernating));
    let waiting = run(&c, Some(&running_pod()), Probe::NotProbed, 5);
    assert_eq!(
        waiting.pod_patch,
        Some(PodPatch::SetHibernate),
        "the annotation stays"
    );
    // W2: the only status change is the record of the VMID the patch tests.
    let recorded = waiting
        .status
        .as_ref()
        .map(|s| s.pre_hibernate_vm_id.as_deref());
    assert_eq!(recorded, Some(Some("id-1")));
    assert_eq!(phase_of(&waiting), Some(Phase::Hibernating));
    let done = run(&c, Some(&hibernated_pod()), Probe::Present, 9);
    assert_eq!(phase_of(&done), Some(Phase::Hibernated));
    assert_eq!(done.status.as_ref().unwrap().observed_generation, Some(2));
    // Only then does the wake start.
    let mut after = c.clone();
    after.status = done.status.clone();
    let next = run(&after, Some(&hibernated_pod()), Probe::NotProbed, 10);
    assert_eq!(phase_of(&next), Some(Phase::Waking));
    assert_eq!(next.pod_patch, Some(PodPatch::ClearHibernate));
}

/// SPEC D1.
#[test]
fn d1_hibernate_while_waking_first_finishes_the_wake() {
    let c = cr(Desire::Hibernate, Some(Phase::Waking));
    // A lagging pre-hibernate view (Running + old VMID) would read as woken without D1's
    // ordering; here the wake is what runs, so it completes the wake, not a hibernate.
    let pod = PodView {
        hibernate_requested: false,
        vm_id: None,
        container_running: false,
        ..running_pod()
    };
    let waiting = run(&c, Some(&pod), Probe::NotProbed, 5);
    assert_eq!(
        waiting.pod_patch, None,
        "no hibernate annotation while waking"
    );
    assert_eq!(waiting.status, None);
    let done = run(&c, Some(&running_pod()), Probe::NotProbed, 9);
    assert_eq!(phase_of(&done), Some(Phase::Active));
    let mut after = c.clone();
    after.status = done.status.clone();
    let next = run(&after, Some(&running_pod()), Probe::NotProbed, 10);
    assert_eq!(phase_of(&next), Some(Phase::Hibernating));
    assert_eq!(next.pod_patch, Some(PodPatch::SetHibernate));
    assert!(
        next.status
            .as_ref()
            .map(|s| conditions::find(&s.conditions, SNAPSHOT_DELETED).is_none())
            .unwrap_or(false),
        "a new hibernate wants the tag: no delete is owed"
    );
}

/// SPEC F1 F2 F3.
#[rstest]
#[case::hibernate(Desire::Hibernate, Phase::Hibernating)]
#[case::wake(Desire::Wake, Phase::Waking)]
fn f1_f2_f3_failed_is_retried_with_a_fresh_budget_and_an_event(
    #[case] desire: Desire,
    #[case] next: Phase,
) {
    let mut c = cr(desire, Some(Phase::Failed));
    let pod = if desire == Desire::Wake {
        hibernated_pod()
    } else {
        running_pod()
    };
    c.metadata.generation = Some(2);
    let p = run(&c, Some(&pod), Probe::NotProbed, 500);
    assert_eq!(phase_of(&p), Some(next));
    assert_eq!(
        ready(&p).3,
        at(500),
        "F2: lastTransitionTime refreshed though Ready stays False"
    );
    assert_eq!(reasons(&p), vec!["RetryRequested"]);
    assert_eq!(p.events[0].kind, EventKind::Normal);
}

/// SPEC F2.
#[test]
fn f2_a_transition_that_cannot_complete_cycles_once_per_timeout() {
    let s = settings();
    let mut c = cr(Desire::Hibernate, Some(Phase::Failed));
    let pod = running_pod(); // vk never acts
    let mut t = 0;
    let mut failures = 0;
    let mut writes = 0;
    // Simulate passes every 5 s for 10 minutes.
    while t <= 600 {
        let p = plan::plan(
            &c,
            Some(&pod),
            &Ownership::Sole,
            &Probe::NotProbed,
            at(t),
            &s,
        );
        if let Some(st) = &p.status {
            writes += 1;
            if st.phase == Some(Phase::Failed) {
                failures += 1;
            }
            c.status = Some(st.clone());
        }
        t += 5;
    }
    assert_eq!(failures, 3, "one failure per 180 s budget in 600 s");
    assert!(writes <= 8, "no spinning: {writes} writes");
}

/// SPEC G1.
#[test]
fn g1_deleting_last_holder_deletes_the_tag() {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernated));
    let cleanup = plan::plan_cleanup(&c, std::iter::empty(), std::iter::empty());
    assert_eq!(cleanup.delete_tag.as_deref(), Some("vm-a"));
    assert!(cleanup.remove_finalizer);
}

/// SPEC G1.
#[rstest]
#[case::same_vm_name("other", Some("vm-a"), "pod-x", false, None)]
#[case::fresh_duplicate_same_pod("dup", None, "pod-a", false, None)]
#[case::terminating_holder_does_not_count("other", Some("vm-a"), "pod-x", true, Some("vm-a"))]
#[case::unrelated_vm("other", Some("vm-b"), "pod-b", false, Some("vm-a"))]
fn g1_tag_kept_while_another_live_cr_tracks_the_vm(
    #[case] name: &str,
    #[case] vm: Option<&str>,
    #[case] pod: &str,
    #[case] terminating: bool,
    #[case] expect: Option<&str>,
) {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernated));
    let mut other = cr(Desire::Hibernate, None);
    other.metadata.name = Some(name.into());
    other.spec.pod_ref.name = pod.into();
    other.status = vm.map(|v| CocoonHibernationStatus {
        vm_name: Some(v.into()),
        ..Default::default()
    });
    if terminating {
        other.metadata.deletion_timestamp = Some(at(0));
    }
    let cleanup = plan::plan_cleanup(&c, [&other], std::iter::empty());
    assert_eq!(cleanup.delete_tag.as_deref(), expect);
    assert!(cleanup.remove_finalizer);
}

/// SPEC G1, S2: no VM name means nothing to delete; VM names are cluster-wide, so a live
/// holder of the VM in another namespace keeps the tag, while a same-named pod in
/// another namespace does not.
#[test]
fn g1_s2_no_vm_name_nothing_to_delete_and_holders_count_in_every_namespace() {
    let c = cr(Desire::Hibernate, None);
    assert_eq!(
        plan::plan_cleanup(&c, std::iter::empty(), std::iter::empty()).delete_tag,
        None
    );
    let held = cr(Desire::Hibernate, Some(Phase::Hibernated));
    let mut elsewhere = cr(Desire::Hibernate, Some(Phase::Hibernated));
    elsewhere.metadata.namespace = Some("other-ns".into());
    elsewhere.metadata.name = Some("x".into());
    assert_eq!(
        plan::plan_cleanup(&held, [&elsewhere], std::iter::empty()).delete_tag,
        None
    );
    let mut same_pod_name_elsewhere = cr(Desire::Hibernate, None);
    same_pod_name_elsewhere.metadata.namespace = Some("other-ns".into());
    assert_eq!(
        plan::plan_cleanup(&held, [&same_pod_name_elsewhere], std::iter::empty())
            .delete_tag
            .as_deref(),
        Some("vm-a")
    );
}

/// SPEC G1: a pod other than the CR's own that names the VM (a replacement vk restores
/// from the tag) holds it; the CR's own pod, a same-named pod elsewhere naming another
/// VM, or a pod naming another VM do not.
#[rstest]
#[case::replacement_in_same_ns("ns", "pod-a-2", Some("vm-a"), true)]
#[case::replacement_elsewhere("other", "pod-a", Some("vm-a"), true)]
#[case::own_pod("ns", "pod-a", Some("vm-a"), false)]
#[case::another_vm("ns", "pod-b", Some("vm-b"), false)]
#[case::no_vm("ns", "pod-c", None, false)]
fn g1_a_replacement_pod_holds_the_tag(
    #[case] ns: &str,
    #[case] name: &str,
    #[case] vm: Option<&str>,
    #[case] holds: bool,
) {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernated));
    let holder = plan::pod_holding(&c, "vm-a", [(ns, name, vm)]);
    assert_eq!(holder.is_some(), holds, "{ns}/{name} {vm:?}");
}

/// SPEC G2.
#[test]
fn g2_cleanup_without_our_finalizer_does_nothing() {
    let mut c = cr(Desire::Hibernate, Some(Phase::Hibernated));
    c.metadata.finalizers = Some(vec!["someone/else".into()]);
    let cleanup = plan::plan_cleanup(&c, std::iter::empty(), std::iter::empty());
    assert_eq!(cleanup.delete_tag, None);
    assert!(!cleanup.remove_finalizer);
}

/// SPEC C3.
#[rstest]
#[case::hibernated(Desire::Hibernate, Phase::Hibernated, hibernated_pod())]
#[case::active(Desire::Wake, Phase::Active, running_pod())]
fn c3_settled_crs_plan_no_writes_and_no_requeue(
    #[case] desire: Desire,
    #[case] phase: Phase,
    #[case] pod: PodView,
) {
    let p = run(&cr(desire, Some(phase)), Some(&pod), Probe::NotProbed, 1000);
    assert_eq!(p, Plan::default());
}

#[test]
fn observed_generation_follows_a_desire_flip_on_a_settled_cr() {
    let mut c = cr(Desire::Hibernate, Some(Phase::Hibernated));
    c.metadata.generation = Some(4);
    let p = run(&c, Some(&hibernated_pod()), Probe::NotProbed, 10);
    assert_eq!(
        p.status.as_ref().and_then(|s| s.observed_generation),
        Some(4)
    );
}

// --- Status an operator reads: Progressing, lastFailure, attempts, timestamps, timeouts.

fn progressing(p: &Plan) -> (String, String, String) {
    let s = p.status.as_ref().expect("a status write");
    let c = conditions::find(&s.conditions, conditions::PROGRESSING).expect("Progressing");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// Applies a plan's status write to the CR, as the apiserver would.
fn applied(mut c: CocoonHibernation, p: &Plan) -> CocoonHibernation {
    if let Some(s) = &p.status {
        c.status = Some(s.clone());
    }
    c
}

/// O2: Progressing names what each step of a hibernate waits for, in the same writes as
/// the phase where it can; only a changed reason costs a write of its own.
#[test]
fn o2_progressing_reason_follows_a_hibernate() {
    let c = cr(Desire::Hibernate, None);
    let enter = run(&c, Some(&running_pod()), Probe::NotProbed, 0);
    assert_eq!(phase_of(&enter), Some(Phase::Hibernating));
    assert_eq!(progressing(&enter).0, "True");
    assert_eq!(progressing(&enter).1, "WaitingForLifecycle");
    let c = applied(c, &enter);

    // vk has not finished, but cleared the VMID: W2's record of it is dropped (the only
    // change written), then nothing new to say, nothing written.
    let pod = PodView {
        lifecycle_state: Some("hibernating".into()),
        ..hibernated_pod()
    };
    let cleared = run(&c, Some(&pod), Probe::NotProbed, 5);
    let mut expected = c.status.clone().expect("status");
    expected.pre_hibernate_vm_id = None;
    assert_eq!(cleared.status, Some(expected));
    let c = applied(c, &cleared);
    assert_eq!(run(&c, Some(&pod), Probe::NotProbed, 5).status, None);

    // vk done, tag not there yet: one reason write.
    let waiting = run(&c, Some(&hibernated_pod()), Probe::Absent, 6);
    assert_eq!(phase_of(&waiting), Some(Phase::Hibernating));
    assert_eq!(progressing(&waiting).1, "WaitingForSnapshot");
    let c2 = applied(c.clone(), &waiting);
    assert_eq!(
        run(&c2, Some(&hibernated_pod()), Probe::Absent, 7).status,
        None,
        "the same wait again writes nothing"
    );

    // The registry fails: the reason and its error show.
    let down = run(
        &c2,
        Some(&hibernated_pod()),
        Probe::Failed("HTTP 503".into()),
        8,
    );
    assert_eq!(progressing(&down).1, "RegistryUnavailable");
    assert!(progressing(&down).2.contains("HTTP 503"));
    assert!(down.error.is_some(), "H4: still returned as an error");

    // Done: Progressing False, hibernatedAt set, in the phase's own write.
    let done = run(&c2, Some(&hibernated_pod()), Probe::Present, 9);
    assert_eq!(phase_of(&done), Some(Phase::Hibernated));
    assert_eq!(
        (progressing(&done).0.as_str(), progressing(&done).1.as_str()),
        ("False", "Done")
    );
    assert_eq!(done.status.as_ref().unwrap().hibernated_at, Some(at(9)));
    assert_eq!(done.status.as_ref().unwrap().attempts, Some(1));
}

/// O2 H3: the digest of the probe that completed the hibernate goes into status.
#[test]
fn o2_h3_snapshot_digest_recorded_only_by_the_completing_probe() {
    let c = cr(Desire::Hibernate, Some(Phase::Hibernating));
    let mut done = run(&c, Some(&hibernated_pod()), Probe::Present, 9);
    plan::record_digest(&mut done, Some("sha256:abc".into()));
    let snapshot = done.status.as_ref().unwrap().snapshot.clone().unwrap();
    assert_eq!(snapshot.digest.as_deref(), Some("sha256:abc"));

    let mut waiting = run(&c, Some(&hibernated_pod()), Probe::Absent, 9);
    plan::record_digest(&mut waiting, Some("sha256:abc".into()));
    assert_eq!(waiting.status.as_ref().unwrap().snapshot, None);
}

/// O2 W2: a wake says it waits for the container; a missing pod says PodMissing, not
/// "waiting for vk-cocoon"; Active sets wokenAt and drops the deleted snapshot's digest.
#[test]
fn o2_w2_progressing_reason_follows_a_wake() {
    let mut c = cr(Desire::Wake, Some(Phase::Hibernated));
    c.status.as_mut().unwrap().snapshot = Some(cocoon_hibernation::api::SnapshotStatus {
        digest: Some("sha256:abc".into()),
    });
    c.metadata.generation = Some(3); // the desire was flipped
    let enter = run(&c, Some(&hibernated_pod()), Probe::NotProbed, 0);
    assert_eq!(phase_of(&enter), Some(Phase::Waking));
    assert_eq!(progressing(&enter).1, "WaitingForContainer");
    assert_eq!(enter.status.as_ref().unwrap().attempts, Some(1));
    let c = applied(c, &enter);

    let gone = run(&c, None, Probe::NotProbed, 5);
    assert_eq!(phase_of(&gone), Some(Phase::Waking));
    assert_eq!(progressing(&gone).1, "PodMissing");
    assert!(!progressing(&gone).2.contains("vk-cocoon"));
    let c_gone = applied(c.clone(), &gone);
    let back = run(&c_gone, Some(&hibernated_pod()), Probe::NotProbed, 6);
    assert_eq!(
        progressing(&back).1,
        "WaitingForContainer",
        "the pod is back"
    );

    let woken = run(&c, Some(&running_pod()), Probe::NotProbed, 20);
    let s = woken.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Active));
    assert_eq!(s.woken_at, Some(at(20)));
    assert_eq!(s.snapshot, None, "the tag is deleted in the same pass");
    assert_eq!(progressing(&woken).1, "Done");
}

/// O2 W3 S5: a failed tag delete keeps the CR Progressing (DeletingSnapshot) with the
/// registry's answer; a kept shared-digest tag is settled, not progressing.
#[rstest]
#[case::failed(plan::DeleteResult::Failed { message: "HTTP 503".into() }, "True", "DeletingSnapshot")]
#[case::shared(plan::DeleteResult::SharedDigest(vec!["other".into()]), "False", "SharedDigest")]
#[case::gone(plan::DeleteResult::Gone, "False", "Done")]
fn o2_w3_s5_delete_outcome_shows_in_progressing(
    #[case] result: plan::DeleteResult,
    #[case] status: &str,
    #[case] reason: &str,
) {
    let c = cr(Desire::Wake, Some(Phase::Active));
    let next = plan::after_delete(c.status.as_ref().unwrap(), "vm-a", &result, at(1));
    let p = conditions::find(&next.conditions, conditions::PROGRESSING).unwrap();
    assert_eq!((p.status.as_str(), p.reason.as_str()), (status, reason));
}

/// O2 F1 F2: lastFailure records a timeout and survives the retry that clears Failed;
/// attempts counts the retries of one spec and starts again when the desire flips.
#[test]
fn o2_f2_last_failure_survives_the_retry_and_attempts_count() {
    let c = cr(Desire::Hibernate, None);
    let c = applied(
        c.clone(),
        &run(&c, Some(&running_pod()), Probe::NotProbed, 0),
    );
    let stuck = PodView {
        lifecycle_state: Some("hibernating".into()),
        ..hibernated_pod()
    };
    let failed = run(&c, Some(&stuck), Probe::NotProbed, 180);
    assert_eq!(phase_of(&failed), Some(Phase::Failed));
    assert_eq!(progressing(&failed).1, "HibernateTimedOut");
    let failure = failed
        .status
        .as_ref()
        .unwrap()
        .last_failure
        .clone()
        .unwrap();
    assert_eq!(failure.reason, "HibernateTimedOut");
    assert_eq!(failure.time, at(180));
    let c = applied(c, &failed);

    let retry = run(&c, Some(&stuck), Probe::NotProbed, 181);
    let s = retry.status.as_ref().unwrap();
    assert_eq!(s.phase, Some(Phase::Hibernating));
    assert_eq!(s.attempts, Some(2));
    assert_eq!(s.last_failure, Some(failure), "kept after the retry");

    // A flipped desire is a new spec: attempts start again.
    let mut flipped = applied(c, &retry);
    flipped.spec.desire = Desire::Wake;
    flipped.metadata.generation = Some(3);
    // D1: the in-flight hibernate finishes first...
    let done = run(&flipped, Some(&hibernated_pod()), Probe::Present, 190);
    let flipped = applied(flipped, &done);
    // ...then the wake starts with attempt 1.
    let wake = run(&flipped, Some(&hibernated_pod()), Probe::NotProbed, 191);
    assert_eq!(phase_of(&wake), Some(Phase::Waking));
    assert_eq!(wake.status.as_ref().unwrap().attempts, Some(1));
}

/// O3 H5 W4: a CR's own timeout replaces the flag's, for either transition.
#[rstest]
#[case::hibernate(Desire::Hibernate, Phase::Hibernating, "30s", "HibernateTimedOut")]
#[case::wake(Desire::Wake, Phase::Waking, "30s", "WakeTimedOut")]
fn o3_h5_w4_per_cr_timeout_trips_before_the_flag(
    #[case] desire: Desire,
    #[case] phase: Phase,
    #[case] timeout: &str,
    #[case] reason: &str,
) {
    let mut c = cr(desire, Some(phase));
    match desire {
        Desire::Hibernate => c.spec.hibernate_timeout = Some(timeout.into()),
        _ => c.spec.wake_timeout = Some(timeout.into()),
    }
    let stuck = PodView {
        lifecycle_state: Some("hibernating".into()),
        ..hibernated_pod()
    };
    let before = run(&c, Some(&stuck), Probe::NotProbed, 29);
    assert_ne!(phase_of(&before), Some(Phase::Failed));
    let p = run(&c, Some(&stuck), Probe::NotProbed, 30);
    assert_eq!(phase_of(&p), Some(Phase::Failed));
    assert_eq!(progressing(&p).1, reason);
    assert!(ready(&p).2.contains("30s"), "{:?}", ready(&p));
}

/// O3 R3: a timeout the CRD should have refused fails the CR with a message, never a guess.
#[test]
fn o3_r3_unparsable_timeout_fails_with_a_message() {
    let mut c = cr(Desire::Hibernate, None);
    c.spec.wake_timeout = Some("soon".into());
    let p = run(&c, Some(&running_pod()), Probe::NotProbed, 0);
    assert_eq!(phase_of(&p), Some(Phase::Failed));
    assert_eq!(progressing(&p).1, "InvalidSpec");
    assert!(ready(&p).2.contains("spec.wakeTimeout"), "{:?}", ready(&p));
    assert_eq!(p.pod_patch, None);
}

/// O3: the duration forms the CRD's pattern admits all parse.
#[rstest]
#[case("90s", 90)]
#[case("5m", 300)]
#[case("1h30m", 5400)]
#[case("24h", 86_400)]
fn o3_crd_duration_forms_parse(#[case] raw: &str, #[case] secs: u64) {
    assert_eq!(
        cocoon_hibernation::api::parse_duration(raw),
        Ok(Duration::from_secs(secs))
    );
}

/// SPEC C2 (issue 38): a pass in the intake lane never asks the registry (no probe, no
/// tag delete), so it never waits for a registry slot; and every pass that starts a
/// transition from outside one (the pod patch, entering Hibernating or Waking) is such a
/// pass, so no start waits behind another VM's registry work.
#[test]
fn c2_intake_passes_never_ask_the_registry_and_every_start_is_one() {
    let phases = [
        None,
        Some(Phase::Pending),
        Some(Phase::Hibernating),
        Some(Phase::Hibernated),
        Some(Phase::Waking),
        Some(Phase::Active),
        Some(Phase::Failed),
    ];
    let mut woken = running_pod();
    woken.vm_id = Some("id-2".into());
    let pods = [
        None,
        Some(hibernated_pod()),
        Some(running_pod()),
        Some(woken),
    ];
    let (mut starts, mut intakes) = (0, 0);
    for desire in [Desire::Hibernate, Desire::Wake] {
        for phase in phases {
            for pod in &pods {
                for finalizer in [true, false] {
                    let mut c = cr(desire, phase);
                    if !finalizer {
                        c.metadata.finalizers = None;
                    }
                    let case = format!("{desire:?} {phase:?} {pod:?} finalizer={finalizer}");
                    let p = run(&c, pod.as_ref(), Probe::NotProbed, 1);
                    let intake = plan::may_start_a_transition(&c, pod.as_ref());
                    if intake {
                        intakes += 1;
                        assert!(!p.needs_probe, "an intake pass probes: {case}");
                        assert_eq!(p.delete_tag, None, "an intake pass deletes: {case}");
                        assert!(!plan::may_end_a_transition(&c), "{case}");
                    }
                    let entered = matches!(phase_of(&p), Some(Phase::Hibernating | Phase::Waking))
                        && phase_of(&p) != phase;
                    if p.pod_patch.is_some() && entered {
                        starts += 1;
                        assert!(intake, "a start outside the intake lane: {case}");
                    }
                }
            }
        }
    }
    assert!(
        starts >= 4 && intakes > starts,
        "{starts} starts, {intakes} intakes"
    );
}

/// SPEC C2: a CR being deleted (G1 may delete its tag) is never an intake pass.
#[test]
fn c2_a_deleting_cr_is_never_an_intake_pass() {
    let mut c = cr(Desire::Hibernate, Some(Phase::Active));
    let pod = Some(running_pod());
    assert!(plan::may_start_a_transition(&c, pod.as_ref()));
    c.metadata.deletion_timestamp = Some(at(0));
    assert!(!plan::may_start_a_transition(&c, pod.as_ref()));
}
