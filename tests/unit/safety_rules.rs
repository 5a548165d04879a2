//! Table tests for the safety rules (SPEC S1, S2, S5, S6) as pure functions: who may act
//! on a pod or VM, when a fresh read still owes a delete, what status says after a
//! delete, and the loud discard on deletion.

use cocoon_hibernation::api::annotations::PodView;
use cocoon_hibernation::api::conditions::{self, READY, SNAPSHOT_DELETED};
use cocoon_hibernation::api::tenancy::ANOTHER_NAMESPACE;
use cocoon_hibernation::api::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Desire, FINALIZER, Phase,
    PodRef,
};
use cocoon_hibernation::controller::plan::{
    self, Debt, DeleteResult, EventKind, Ownership, PodPatch, Probe, Settings,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use rstest::rstest;

const T0: i64 = 1_700_000_000;

fn at(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(T0 + secs).unwrap())
}

/// A CR created `born` seconds after T0.
fn cr(ns: &str, name: &str, pod: &str, born: i64) -> CocoonHibernation {
    let mut cr = CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire: Desire::Hibernate,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.namespace = Some(ns.into());
    cr.metadata.uid = Some(format!("uid-{ns}-{name}"));
    cr.metadata.generation = Some(1);
    cr.metadata.creation_timestamp = Some(at(born));
    cr.metadata.finalizers = Some(vec![FINALIZER.into()]);
    cr
}

fn holding(mut cr: CocoonHibernation, vm: &str, phase: Phase) -> CocoonHibernation {
    cr.status = Some(CocoonHibernationStatus {
        observed_generation: Some(1),
        phase: Some(phase),
        vm_name: Some(vm.into()),
        ..Default::default()
    });
    cr
}

/// The plan of a CR that is the sole owner of its pod and VM, before any probe.
fn sole_plan(cr: &CocoonHibernation, pod: &PodView, secs: i64) -> plan::Plan {
    plan::plan(
        cr,
        Some(pod),
        &Ownership::Sole,
        &Probe::NotProbed,
        at(secs),
        &Settings::default(),
    )
}

fn pod(vm: &str) -> PodView {
    PodView {
        uid: Some("pod-uid".into()),
        vm_name: Some(vm.into()),
        lifecycle_state: Some("ready".into()),
        vm_id: Some("id-1".into()),
        container_running: true,
        ..Default::default()
    }
}

/// SPEC S2: only the oldest live CR on a pod acts; a live CR on another pod (any
/// namespace) holding the VM blocks a CR whose pod names that VM.
#[rstest]
#[case::alone(vec![], vec![], Ownership::Sole)]
#[case::younger_duplicate_on_the_pod(vec![cr("a", "new", "p", 5)], vec![], Ownership::Sole)]
#[case::older_duplicate_on_the_pod(
    vec![cr("a", "old", "p", 0)], vec![], Ownership::OlderOnPod("a/old".into()))]
#[case::older_but_terminating_does_not_count(
    vec![{ let mut o = cr("a", "old", "p", 0); o.metadata.deletion_timestamp = Some(at(1)); o }],
    vec![], Ownership::Sole)]
#[case::same_name_pod_in_another_namespace_is_another_pod(
    vec![cr("b", "old", "p", 0)], vec![], Ownership::Sole)]
#[case::s12_vm_held_in_another_namespace_unnamed(
    vec![], vec![holding(cr("b", "victim", "q", 9), "vm-x", Phase::Hibernated)],
    Ownership::VmHeldBy { vm: "vm-x".into(), holder: ANOTHER_NAMESPACE.into() })]
#[case::s12_vm_held_through_another_pod_same_namespace_named(
    vec![], vec![holding(cr("a", "other", "q", 9), "vm-x", Phase::Active)],
    Ownership::VmHeldBy { vm: "vm-x".into(), holder: "CocoonHibernation a/other".into() })]
#[case::terminating_holder_does_not_count(
    vec![], vec![{ let mut o = holding(cr("b", "victim", "q", 0), "vm-x", Phase::Active);
                   o.metadata.deletion_timestamp = Some(at(1)); o }],
    Ownership::Sole)]
#[case::a_holder_of_another_vm_does_not_count(
    vec![], vec![holding(cr("b", "victim", "q", 0), "vm-y", Phase::Active)], Ownership::Sole)]
fn s2_ownership_table(
    #[case] same_pod: Vec<CocoonHibernation>,
    #[case] holders: Vec<CocoonHibernation>,
    #[case] want: Ownership,
) {
    let me = cr("a", "me", "p", 3);
    let mut same = same_pod.clone();
    same.push(me.clone()); // the cache lists the CR itself too
    assert_eq!(
        plan::ownership(&me, Some("vm-x"), same.iter(), holders.iter()),
        want
    );
}

/// SPEC S2: two holders of one VM can only predate the rule; the older keeps it.
#[test]
fn s2_of_two_holders_the_older_keeps_the_vm() {
    let old = holding(cr("b", "old", "q", 0), "vm-x", Phase::Hibernated);
    let young = holding(cr("a", "young", "p", 5), "vm-x", Phase::Hibernated);
    assert_eq!(
        plan::ownership(&old, Some("vm-x"), [&old], [&old, &young]),
        Ownership::Sole
    );
    assert_eq!(
        plan::ownership(&young, Some("vm-x"), [&young], [&old, &young]),
        Ownership::VmHeldBy {
            vm: "vm-x".into(),
            holder: ANOTHER_NAMESPACE.into()
        }
    );
}

/// SPEC S2: a blocked CR goes Failed naming the holder, never patches the pod, never
/// deletes, and a second pass writes nothing (no F2 retry, no RetryRequested) while the
/// conflict lasts; once the holder is gone it starts with a retry.
#[rstest]
#[case::older_on_pod(Ownership::OlderOnPod("a/old".into()), "a/old")]
#[case::vm_held(Ownership::VmHeldBy { vm: "vm-x".into(), holder: ANOTHER_NAMESPACE.into() }, ANOTHER_NAMESPACE)]
fn s2_blocked_cr_fails_naming_the_holder_and_then_stays_quiet(
    #[case] owner: Ownership,
    #[case] holder: &str,
) {
    let settings = Settings::default();
    for desire in [Desire::Hibernate, Desire::Wake] {
        let mut me = cr("a", "me", "p", 3);
        me.spec.desire = desire;
        let mut view = pod("vm-x");
        view.hibernate_requested = true; // a Wake CR would otherwise clear it
        let first = plan::plan(
            &me,
            Some(&view),
            &owner,
            &Probe::NotProbed,
            at(10),
            &settings,
        );
        assert_eq!(first.pod_patch, None::<PodPatch>, "never touches the pod");
        assert_eq!(first.delete_tag, None, "never deletes");
        assert!(!first.needs_probe);
        let status = first.status.clone().expect("a Failed status");
        assert_eq!(status.phase, Some(Phase::Failed));
        assert_eq!(status.vm_name, None, "a blocked CR never claims the VM");
        let ready = conditions::find(&status.conditions, READY).unwrap();
        assert_eq!(ready.reason, "Conflict");
        assert!(ready.message.contains(holder), "{}", ready.message);
        me.status = Some(status);
        let again = plan::plan(
            &me,
            Some(&view),
            &owner,
            &Probe::NotProbed,
            at(70),
            &settings,
        );
        assert_eq!(
            again.status, None,
            "no further writes while the conflict lasts"
        );
        assert!(again.events.is_empty());
        assert_eq!(again.pod_patch, None);
        // The holder is gone: the CR acts, announcing the retry (F3).
        let freed = plan::plan(
            &me,
            Some(&view),
            &Ownership::Sole,
            &Probe::NotProbed,
            at(80),
            &settings,
        );
        let phase = freed.status.as_ref().and_then(|s| s.phase);
        assert!(
            matches!(phase, Some(Phase::Hibernating | Phase::Waking)),
            "{phase:?}"
        );
        assert_eq!(
            freed.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["RetryRequested"]
        );
    }
}

/// SPEC S12: the conflict a tenant's CR reports (Ready condition, Failed event) names a
/// holder of its own namespace, but one of another namespace only as "a CR in another
/// namespace": neither that namespace nor that CR's name appears.
#[rstest]
#[case::s12_other_tenant_unnamed("team-b", "secret-db", false)]
#[case::s12_other_tenant_same_cr_name_unnamed("team-b", "me-twin", false)]
#[case::s2_same_namespace_holder_named("team-a", "db-0", true)]
fn s12_conflict_messages_never_name_another_tenant(
    #[case] holder_ns: &str,
    #[case] holder_name: &str,
    #[case] named: bool,
) {
    let me = cr("team-a", "me", "p", 3);
    let holder = holding(
        cr(holder_ns, holder_name, "q", 0),
        "vm-x",
        Phase::Hibernated,
    );
    let owner = plan::ownership(&me, Some("vm-x"), [&me], [&holder]);
    let planned = plan::plan(
        &me,
        Some(&pod("vm-x")),
        &owner,
        &Probe::NotProbed,
        at(10),
        &Settings::default(),
    );
    let status = planned.status.expect("a Failed status");
    assert_eq!(status.phase, Some(Phase::Failed));
    let mut texts: Vec<String> = status
        .conditions
        .iter()
        .map(|c| c.message.clone())
        .collect();
    texts.extend(planned.events.iter().map(|e| e.note.clone()));
    assert!(texts.iter().any(|t| t.contains("vm-x")), "{texts:?}");
    for text in texts.iter().filter(|_| !named) {
        assert!(!text.contains(holder_ns), "{text}");
        assert!(!text.contains(holder_name), "{text}");
    }
    let ready = conditions::find(&status.conditions, READY).expect("Ready");
    let want = if named {
        format!("CocoonHibernation {holder_ns}/{holder_name}")
    } else {
        ANOTHER_NAMESPACE.to_owned()
    };
    assert!(ready.message.contains(&want), "{}", ready.message);
}

fn woken(vm: &str) -> CocoonHibernation {
    let mut c = holding(cr("a", "me", "p", 0), vm, Phase::Active);
    c.spec.desire = Desire::Wake;
    let owed = conditions::Update {
        type_: SNAPSHOT_DELETED,
        status: false,
        reason: "Pending",
        message: "deleting",
        observed_generation: Some(1),
    };
    if let Some(s) = c.status.as_mut() {
        conditions::upsert(&mut s.conditions, owed, at(0), false);
    }
    c
}

/// SPEC S1: the fresh read must show the same CR (uid), the same VM and a debt still owed.
#[rstest]
#[case::still_owed(woken("vm-x"), Debt::AfterWake, true)]
#[case::recreated_with_another_uid(
    { let mut c = woken("vm-x"); c.metadata.uid = Some("other".into()); c }, Debt::AfterWake, false)]
#[case::desire_flipped_back_to_hibernate(
    { let mut c = woken("vm-x"); c.spec.desire = Desire::Hibernate; c }, Debt::AfterWake, false)]
#[case::hibernating_again(
    { let mut c = woken("vm-x"); if let Some(s) = c.status.as_mut() { s.phase = Some(Phase::Hibernating) } c },
    Debt::AfterWake, false)]
#[case::already_deleted(
    { let mut c = woken("vm-x");
      if let Some(s) = c.status.as_mut() { s.conditions[0].status = "True".into() } c },
    Debt::AfterWake, false)]
#[case::another_vm(woken("vm-y"), Debt::AfterWake, false)]
#[case::end_of_wake_while_waking(
    { let mut c = woken("vm-x"); if let Some(s) = c.status.as_mut() { s.phase = Some(Phase::Waking) } c },
    Debt::EndOfWake, true)]
#[case::end_of_wake_of_a_fresh_cr_with_no_vm_yet(
    { let mut c = cr("a", "me", "p", 0); c.spec.desire = Desire::Wake; c }, Debt::EndOfWake, true)]
#[case::end_of_wake_but_hibernating_again(
    { let mut c = woken("vm-x"); if let Some(s) = c.status.as_mut() { s.phase = Some(Phase::Hibernating) } c },
    Debt::EndOfWake, false)]
#[case::end_of_wake_but_desire_flipped(
    { let mut c = woken("vm-x"); c.spec.desire = Desire::Hibernate; c }, Debt::EndOfWake, false)]
#[case::deleting_with_finalizer(
    { let mut c = holding(cr("a", "me", "p", 0), "vm-x", Phase::Hibernated);
      c.metadata.deletion_timestamp = Some(at(1)); c }, Debt::OnDeletion, true)]
#[case::deletion_not_started(
    holding(cr("a", "me", "p", 0), "vm-x", Phase::Hibernated),
    Debt::OnDeletion,
    false
)]
#[case::finalizer_already_gone(
    { let mut c = holding(cr("a", "me", "p", 0), "vm-x", Phase::Hibernated);
      c.metadata.deletion_timestamp = Some(at(1)); c.metadata.finalizers = None; c },
    Debt::OnDeletion, false)]
fn s1_fresh_read_must_still_owe_the_delete(
    #[case] fresh: CocoonHibernation,
    #[case] debt: Debt,
    #[case] want: bool,
) {
    assert_eq!(
        plan::still_owes(&fresh, Some("uid-a-me"), "vm-x", debt),
        want
    );
}

/// SPEC S5: SnapshotDeleted is True only once the tag is gone; a kept or failed delete
/// says why in its message.
#[rstest]
#[case::gone(DeleteResult::Gone, "True", "Done", "deleted")]
#[case::shared_digest(
    DeleteResult::SharedDigest(vec!["vm-x:keep".into()]), "False", "SharedDigest", "vm-x:keep")]
#[case::failed(
    DeleteResult::Failed { message: "HTTP 503: down".into() }, "False", "DeleteFailed", "HTTP 503: down")]
#[case::s7_moved_names_both_digests(
    DeleteResult::Moved { confirmed: "sha256:old".into(), found: "sha256:new".into() },
    "False", "SnapshotMoved", "sha256:new now, a newer snapshot than sha256:old")]
fn s5_snapshot_deleted_tells_the_truth(
    #[case] result: DeleteResult,
    #[case] status: &str,
    #[case] reason: &str,
    #[case] in_message: &str,
) {
    let written = woken("vm-x").status.unwrap();
    let next = plan::after_delete(&written, "vm-x", &result, at(5));
    let c = conditions::find(&next.conditions, SNAPSHOT_DELETED).unwrap();
    assert_eq!((c.status.as_str(), c.reason.as_str()), (status, reason));
    assert!(c.message.contains(in_message), "{}", c.message);
    assert_eq!(next.phase, Some(Phase::Active), "the CR stays Active (W3)");
}

/// SPEC S7 W3: a tag that moved to a newer snapshot settles the debt: the Active CR
/// neither retries the delete nor counts as owing one, until a new hibernate request
/// reaches its pod (which may store a snapshot this CR owes again).
#[test]
fn s7_a_moved_tag_settles_the_debt_without_a_retry() {
    let mut c = woken("vm-x");
    let moved = DeleteResult::Moved {
        confirmed: "sha256:old".into(),
        found: "sha256:new".into(),
    };
    c.status = Some(plan::after_delete(
        c.status.as_ref().unwrap(),
        "vm-x",
        &moved,
        at(5),
    ));
    assert!(!plan::owes_tag_delete(&c));
    assert!(!plan::still_owes(
        &c,
        Some("uid-a-me"),
        "vm-x",
        Debt::AfterWake
    ));
    let settled = sole_plan(&c, &pod("vm-x"), 9);
    assert_eq!((settled.status, settled.delete_tag), (None, None));
    let asked = PodView {
        hibernate_requested: true,
        ..pod("vm-x")
    };
    let again = sole_plan(&c, &asked, 9);
    let status = again.status.expect("the debt is recorded again");
    let owed = conditions::find(&status.conditions, SNAPSHOT_DELETED).unwrap();
    assert_eq!(owed.reason, "HibernateNotRecorded");
}

/// SPEC S9: a CR holding a VM whose pod now names another VM fails with VMChanged, keeps
/// its claim (status.vmName), never touches the pod, and stays quiet while that lasts;
/// once the pod names its VM again it acts as before.
#[rstest]
#[case::hibernated(Phase::Hibernated, Desire::Hibernate)]
#[case::hibernating(Phase::Hibernating, Desire::Hibernate)]
#[case::waking(Phase::Waking, Desire::Wake)]
#[case::active(Phase::Active, Desire::Wake)]
fn s9_a_vm_changed_under_the_cr_keeps_the_old_claim(#[case] phase: Phase, #[case] desire: Desire) {
    let mut c = holding(cr("a", "me", "p", 0), "vm-old", phase);
    c.spec.desire = desire;
    let p = sole_plan(&c, &pod("vm-new"), 9);
    assert_eq!(
        (p.pod_patch, p.delete_tag.clone(), p.needs_probe),
        (None, None, false)
    );
    let status = p.status.expect("Failed is written");
    assert_eq!(status.phase, Some(Phase::Failed));
    assert_eq!(
        status.vm_name.as_deref(),
        Some("vm-old"),
        "the claim is kept"
    );
    let failure = status.last_failure.clone().unwrap();
    assert_eq!(failure.reason, "VMChanged");
    assert!(failure.message.contains("vm-new") && failure.message.contains("vm-old"));
    // The next pass, with the failure recorded, writes nothing more.
    let mut failed = c.clone();
    failed.status = Some(status);
    let quiet = sole_plan(&failed, &pod("vm-new"), 19);
    assert_eq!((quiet.status, quiet.pod_patch), (None, None));
    // The pod names the old VM again: the CR acts on it (F2 retry).
    let back = sole_plan(&failed, &pod("vm-old"), 29);
    let back_status = back.status.expect("retried");
    assert_ne!(back_status.phase, Some(Phase::Failed));
    assert_eq!(back_status.vm_name.as_deref(), Some("vm-old"));
}

/// SPEC S5: the owed-deletes gauge is computed from the CRs (every replica, any
/// failover): settled Wake CRs whose delete is owed count; a moved tag does not.
#[test]
fn s5_the_owed_gauge_counts_from_the_crs() {
    use cocoon_hibernation::controller::census::census;
    let owed = woken("vm-x");
    let mut moved = woken("vm-y");
    moved.status = Some(plan::after_delete(
        moved.status.as_ref().unwrap(),
        "vm-y",
        &DeleteResult::Moved {
            confirmed: "sha256:a".into(),
            found: "sha256:b".into(),
        },
        at(5),
    ));
    let mut deleting = woken("vm-z");
    deleting.metadata.deletion_timestamp = Some(at(3));
    let hibernated = holding(cr("a", "h", "h", 0), "vm-h", Phase::Hibernated);
    let c = census(
        [&owed, &moved, &deleting, &hibernated],
        &at(10),
        &Settings::default(),
    );
    assert_eq!(c.deletes_owed, 1);
}

/// SPEC S5 W3: a recorded failure is not overwritten by the retry's plan, so a retry
/// that fails the same way writes nothing.
#[test]
fn s5_owed_retry_keeps_the_last_error_message() {
    let mut c = woken("vm-x");
    let failed = DeleteResult::Failed {
        message: "refused".into(),
    };
    c.status = Some(plan::after_delete(
        c.status.as_ref().unwrap(),
        "vm-x",
        &failed,
        at(5),
    ));
    let p = sole_plan(&c, &pod("vm-x"), 9);
    assert_eq!(p.status, None);
    assert_eq!(p.delete_tag.as_deref(), Some("vm-x"));
}

/// SPEC S5 H4: a probe error shows in the Ready message, and the clock keeps running.
#[test]
fn s5_probe_error_appears_in_the_ready_condition() {
    let mut c = holding(cr("a", "me", "p", 0), "vm-x", Phase::Hibernating);
    let pending = conditions::Update {
        type_: READY,
        status: false,
        reason: "Pending",
        message: "waiting",
        observed_generation: Some(1),
    };
    if let Some(s) = c.status.as_mut() {
        conditions::upsert(&mut s.conditions, pending, at(0), false);
    }
    let view = PodView {
        hibernate_requested: true,
        lifecycle_state: Some("hibernated".into()),
        vm_id: None,
        container_running: false,
        ..pod("vm-x")
    };
    let failed = Probe::Failed("registry probe failed (HTTP 503): down".into());
    let p = plan::plan(
        &c,
        Some(&view),
        &Ownership::Sole,
        &failed,
        at(30),
        &Settings::default(),
    );
    assert!(
        p.error.is_some(),
        "H4: returned so it is retried with backoff"
    );
    let s = p.status.expect("the error is written");
    assert_eq!(s.phase, Some(Phase::Hibernating));
    let ready = conditions::find(&s.conditions, READY).unwrap();
    assert!(ready.message.contains("HTTP 503"), "{}", ready.message);
    assert_eq!(
        ready.last_transition_time,
        at(0),
        "H5: the clock is not reset"
    );
}

/// How the pod looks, as the apiserver shows it right before a G1 delete.
#[derive(Clone, Copy, Debug)]
enum PodNow {
    Gone,
    RunningTheVm,
    AskedToHibernate,
    VkHibernated,
    RestoringNoVmid,
    NamesAnotherVm,
}

fn pod_now(state: PodNow) -> Option<PodView> {
    let running = pod("vm-x");
    match state {
        PodNow::Gone => None,
        PodNow::RunningTheVm => Some(running),
        PodNow::AskedToHibernate => Some(PodView {
            hibernate_requested: true,
            ..running
        }),
        PodNow::VkHibernated => Some(PodView {
            lifecycle_state: Some("hibernated".into()),
            vm_id: None,
            container_running: false,
            ..running
        }),
        PodNow::RestoringNoVmid => Some(PodView {
            vm_id: None,
            ..running
        }),
        PodNow::NamesAnotherVm => Some(pod("vm-y")),
    }
}

/// SPEC S6 (any phase): deleting a CR whose tag exists warns first unless the pod shows
/// its VM running again; the phase alone decides nothing. No tag, no warning.
#[rstest]
#[case::hibernated_pod_gone(Phase::Hibernated, PodNow::Gone, true, true)]
#[case::hibernating_vk_done(Phase::Hibernating, PodNow::VkHibernated, true, true)]
#[case::waking_restore_not_confirmed(Phase::Waking, PodNow::RestoringNoVmid, true, true)]
#[case::failed_hibernate_vk_finished(Phase::Failed, PodNow::VkHibernated, true, true)]
#[case::active_hibernate_not_recorded(Phase::Active, PodNow::AskedToHibernate, true, true)]
#[case::active_pod_names_another_vm(Phase::Active, PodNow::NamesAnotherVm, true, true)]
#[case::hibernated_but_the_vm_runs(Phase::Hibernated, PodNow::RunningTheVm, true, false)]
#[case::active_and_running(Phase::Active, PodNow::RunningTheVm, true, false)]
#[case::no_tag_in_the_registry(Phase::Hibernated, PodNow::Gone, false, false)]
fn s6_discarding_a_possible_only_copy_is_loud_in_any_phase(
    #[case] phase: Phase,
    #[case] state: PodNow,
    #[case] tag_present: bool,
    #[case] warns: bool,
) {
    let mut me = holding(cr("a", "me", "p", 0), "vm-x", phase);
    me.metadata.deletion_timestamp = Some(at(1));
    let view = pod_now(state);
    match plan::discard_event(&me, "vm-x", view.as_ref(), tag_present) {
        Some(ev) => {
            assert!(warns, "unexpected {ev:?}");
            assert_eq!(
                (ev.kind, ev.reason),
                (EventKind::Warning, "SnapshotDiscarded")
            );
            assert!(ev.note.contains("vm-x"), "{}", ev.note);
        }
        None => assert!(!warns, "SnapshotDiscarded missing"),
    }
}

/// SPEC G1: the last live holder deletes the tag; another holder keeps it.
#[rstest]
#[case::last_holder(false)]
#[case::kept_because_another_cr_holds_it(true)]
fn g1_the_last_holder_deletes_the_tag(#[case] held_elsewhere: bool) {
    let mut me = holding(cr("a", "me", "p", 0), "vm-x", Phase::Hibernated);
    me.metadata.deletion_timestamp = Some(at(1));
    let other = holding(cr("b", "other", "q", 0), "vm-x", Phase::Hibernated);
    let others: Vec<&CocoonHibernation> = if held_elsewhere { vec![&other] } else { vec![] };
    let cleanup = plan::plan_cleanup(&me, others, std::iter::empty());
    assert_eq!(cleanup.delete_tag.is_some(), !held_elsewhere);
    assert!(cleanup.remove_finalizer);
}

/// SPEC G1 S2: a live CR whose pod names the VM, blocked while this CR held it, wants the
/// snapshot next: deleting this CR keeps the tag (and discards nothing).
#[test]
fn g1_s2_a_blocked_claimant_keeps_the_tag_when_the_holder_goes() {
    let mut holder = holding(cr("a", "old-pod", "old-pod", 0), "vm-x", Phase::Hibernated);
    holder.metadata.deletion_timestamp = Some(at(9));
    let blocked = cr("a", "new-pod", "new-pod", 5);
    let cleanup = plan::plan_cleanup(&holder, std::iter::empty(), [&blocked]);
    assert_eq!(cleanup.delete_tag, None);
    assert!(cleanup.remove_finalizer);
    // The holder itself is listed among the pod's claimants; it does not count.
    let alone = plan::plan_cleanup(&holder, std::iter::empty(), [&holder]);
    assert_eq!(alone.delete_tag.as_deref(), Some("vm-x"));
}
