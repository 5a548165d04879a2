//! Structure-aware fuzzing of the pure rules (issue 9): random CRs, pod views, owners,
//! probes and clocks go through `plan()`, `plan_cleanup()` and `still_owes()`, and the
//! safety invariants are asserted on every plan. The invariants live in `check_*` below.
#![no_main]

use arbitrary::Arbitrary;
use cocoon_api::annotations::PodView;
use cocoon_api::conditions::{READY, SNAPSHOT_DELETED};
use cocoon_api::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Condition, Desire,
    FINALIZER, Phase, PodRef,
};
use cocoon_core::plan::{Debt, Ownership, Plan, Probe, Settings, plan, plan_cleanup, still_owes};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use libfuzzer_sys::fuzz_target;
use std::time::Duration;

const BASE: i64 = 1_700_000_000;

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq)]
enum DesireIn {
    Hibernate,
    Wake,
    Unknown,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq)]
enum PhaseIn {
    Pending,
    Hibernating,
    Hibernated,
    Waking,
    Active,
    Failed,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq)]
enum VmIn {
    A,
    B,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum ReasonIn {
    Done,
    Failed,
    Pending,
    Conflict,
    SharedDigest,
    DeleteFailed,
}

#[derive(Arbitrary, Debug, Clone)]
struct CondIn {
    status: bool,
    reason: ReasonIn,
    /// Seconds before "now" (negative: in the future, a skewed clock).
    age: i16,
    observed_generation: Option<i8>,
}

#[derive(Arbitrary, Debug, Clone)]
struct StatusIn {
    observed_generation: Option<i8>,
    phase: Option<PhaseIn>,
    vm: Option<VmIn>,
    ready: Option<CondIn>,
    snapshot_deleted: Option<CondIn>,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum LifecycleIn {
    Creating,
    Ready,
    Hibernating,
    Hibernated,
    Failed,
    Other,
}

#[derive(Arbitrary, Debug, Clone)]
struct PodIn {
    vm: Option<VmIn>,
    hibernate_requested: bool,
    lifecycle: Option<LifecycleIn>,
    observed_generation: i8,
    cocoonset_generation: i8,
    vm_id: bool,
    running: bool,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum OwnerIn {
    Sole,
    OlderOnPod,
    VmHeldBy,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum ProbeIn {
    NotProbed,
    Present,
    Absent,
    Failed,
}

#[derive(Arbitrary, Debug, Clone)]
struct CrIn {
    finalizer: bool,
    deleting: bool,
    other_name: bool,
    other_pod: bool,
    other_namespace: bool,
    desire: DesireIn,
    generation: Option<i8>,
    status: Option<StatusIn>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    cr: CrIn,
    pod: Option<PodIn>,
    owner: OwnerIn,
    probe: ProbeIn,
    /// Seconds after the base instant.
    now: u16,
    hibernate_timeout: u16,
    wake_timeout: u16,
    /// G1: the other CRs the cache shows while this one is deleted, and claimants.
    others: Vec<CrIn>,
    claimants: Vec<CrIn>,
    fresh_same_uid: bool,
}

fn vm(v: VmIn) -> String {
    match v {
        VmIn::A => "vm-a".into(),
        VmIn::B => "vm-b".into(),
    }
}

fn at(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(secs).expect("in range"))
}

fn condition(type_: &str, c: &CondIn, now: i64) -> Condition {
    let reason = match c.reason {
        ReasonIn::Done => "Done",
        ReasonIn::Failed => "Failed",
        ReasonIn::Pending => "Pending",
        ReasonIn::Conflict => "Conflict",
        ReasonIn::SharedDigest => "SharedDigest",
        ReasonIn::DeleteFailed => "DeleteFailed",
    };
    Condition {
        type_: type_.into(),
        status: if c.status { "True" } else { "False" }.into(),
        reason: reason.into(),
        message: String::new(),
        observed_generation: c.observed_generation.map(i64::from),
        last_transition_time: at(now - i64::from(c.age)),
    }
}

fn phase(p: PhaseIn) -> Phase {
    match p {
        PhaseIn::Pending => Phase::Pending,
        PhaseIn::Hibernating => Phase::Hibernating,
        PhaseIn::Hibernated => Phase::Hibernated,
        PhaseIn::Waking => Phase::Waking,
        PhaseIn::Active => Phase::Active,
        PhaseIn::Failed => Phase::Failed,
    }
}

fn build_cr(c: &CrIn, now: i64) -> CocoonHibernation {
    let desire = match c.desire {
        DesireIn::Hibernate => Desire::Hibernate,
        DesireIn::Wake => Desire::Wake,
        DesireIn::Unknown => Desire::Unknown,
    };
    let pod = if c.other_pod { "web-1" } else { "web-0" };
    let name = if c.other_name { "other" } else { pod };
    let mut cr = CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.namespace = Some(if c.other_namespace { "ns-2" } else { "ns" }.into());
    cr.metadata.uid = Some(format!("uid-{name}"));
    cr.metadata.generation = c.generation.map(i64::from);
    cr.metadata.creation_timestamp = Some(at(BASE));
    if c.finalizer {
        cr.metadata.finalizers = Some(vec![FINALIZER.into()]);
    }
    if c.deleting {
        cr.metadata.deletion_timestamp = Some(at(now));
    }
    cr.status = c.status.as_ref().map(|s| {
        let mut conditions = Vec::new();
        if let Some(r) = &s.ready {
            conditions.push(condition(READY, r, now));
        }
        if let Some(d) = &s.snapshot_deleted {
            conditions.push(condition(SNAPSHOT_DELETED, d, now));
        }
        CocoonHibernationStatus {
            observed_generation: s.observed_generation.map(i64::from),
            phase: s.phase.map(phase),
            vm_name: s.vm.map(vm),
            conditions,
            ..Default::default()
        }
    });
    cr
}

fn build_view(p: &PodIn) -> PodView {
    PodView {
        uid: Some("pod-uid".into()),
        vm_name: p.vm.map(vm),
        hibernate_requested: p.hibernate_requested,
        lifecycle_state: p.lifecycle.map(|l| {
            match l {
                LifecycleIn::Creating => "creating",
                LifecycleIn::Ready => "ready",
                LifecycleIn::Hibernating => "hibernating",
                LifecycleIn::Hibernated => "hibernated",
                LifecycleIn::Failed => "failed",
                LifecycleIn::Other => "x",
            }
            .into()
        }),
        observed_generation: p.observed_generation.into(),
        cocoonset_generation: p.cocoonset_generation.into(),
        vm_id: p.vm_id.then(|| "id-1".into()),
        container_running: p.running,
    }
}

fuzz_target!(|input: Input| {
    let now = BASE + i64::from(input.now);
    let cr = build_cr(&input.cr, now);
    let view = input.pod.as_ref().map(build_view);
    let owner = match input.owner {
        OwnerIn::Sole => Ownership::Sole,
        OwnerIn::OlderOnPod => Ownership::OlderOnPod("ns/older".into()),
        OwnerIn::VmHeldBy => Ownership::VmHeldBy {
            vm: "vm-a".into(),
            holder: "ns-2/x".into(),
        },
    };
    let probe = match input.probe {
        ProbeIn::NotProbed => Probe::NotProbed,
        ProbeIn::Present => Probe::Present,
        ProbeIn::Absent => Probe::Absent,
        ProbeIn::Failed => Probe::Failed("503".into()),
    };
    let settings = Settings {
        hibernate_timeout: Duration::from_secs(u64::from(input.hibernate_timeout) + 1),
        wake_timeout: Duration::from_secs(u64::from(input.wake_timeout) + 1),
        ..Settings::default()
    };
    let p = plan(&cr, view.as_ref(), &owner, &probe, at(now), &settings);
    check_plan(&cr, view.as_ref(), &owner, &probe, &p, &settings);

    // Settled outputs are fixpoints: writing the planned status and planning again with
    // the same world writes nothing more (C3).
    if let Some(next) = &p.status
        && settles(&cr, next, &owner)
    {
        let mut written = cr.clone();
        written.status = Some(next.clone());
        let again = plan(&written, view.as_ref(), &owner, &probe, at(now), &settings);
        assert_eq!(
            again.status, None,
            "a settled CR planned another write: {again:?}"
        );
    }

    let others: Vec<_> = input.others.iter().map(|o| build_cr(o, now)).collect();
    let claimants: Vec<_> = input.claimants.iter().map(|o| build_cr(o, now)).collect();
    check_cleanup(&cr, &others, &claimants);
    check_still_owes(&cr, input.fresh_same_uid);
});

/// A status that leaves the CR settled: the desire's terminal phase, a Conflict (S2) or a
/// changed VM (S9).
fn settles(cr: &CocoonHibernation, next: &CocoonHibernationStatus, owner: &Ownership) -> bool {
    let vm_changed = next
        .last_failure
        .as_ref()
        .is_some_and(|f| f.reason == "VMChanged");
    match (next.phase, cr.spec.desire) {
        (Some(Phase::Hibernated), Desire::Hibernate) | (Some(Phase::Active), Desire::Wake) => true,
        (Some(Phase::Failed), _) => *owner != Ownership::Sole || vm_changed,
        _ => false,
    }
}

fn vk_reports_hibernate(view: Option<&PodView>) -> bool {
    view.is_some_and(|v| {
        matches!(
            v.lifecycle_state.as_deref(),
            Some("hibernated" | "hibernating")
        )
    })
}

fn check_plan(
    cr: &CocoonHibernation,
    view: Option<&PodView>,
    owner: &Ownership,
    probe: &Probe,
    p: &Plan,
    settings: &Settings,
) {
    let before = cr.phase();
    let after = p.status.as_ref().map_or(before, |s| s.phase);
    let desire = cr.spec.desire;

    // R1: the pass that adds the finalizer does nothing else.
    if p.add_finalizer {
        assert!(!cr.has_finalizer());
        assert_eq!(
            *p,
            Plan {
                add_finalizer: true,
                ..Plan::default()
            }
        );
        return;
    }
    // H3: a probe is asked for only once, and a plan that asks does nothing else.
    if p.needs_probe {
        assert_eq!(*probe, Probe::NotProbed, "probe asked for again: {p:?}");
        assert_eq!(
            *p,
            Plan {
                needs_probe: true,
                ..Plan::default()
            }
        );
        return;
    }

    // Tag deletes: only W2 (a wake ending) or W3 (a woken CR's debt). G1 is plan_cleanup.
    if let Some(tag) = &p.delete_tag {
        assert_eq!(*owner, Ownership::Sole, "S2: an outranked CR deleted {tag}");
        assert_eq!(
            desire,
            Desire::Wake,
            "D1/W2: a tag wanted again was deleted: {p:?}"
        );
        let view = view.expect("a delete needs a pod view");
        if p.delete_first {
            // W2: the wake ends now.
            assert_eq!(after, Some(Phase::Active));
            assert!(
                before == Some(Phase::Waking)
                    || (matches!(before, None | Some(Phase::Pending)) && *probe == Probe::Present),
                "W2 delete from {before:?}"
            );
            assert!(view.woken(), "W2 delete while not woken: {view:?}");
            assert!(
                !view.hibernate_requested,
                "S1: W2 delete while the pod asks for a hibernate: {view:?}"
            );
            assert_eq!(Some(tag), view.vm_name.as_ref());
        } else {
            // W3: retried on the settled Active CR, which writes nothing.
            assert_eq!(before, Some(Phase::Active));
            let owed = cr
                .status
                .as_ref()
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == SNAPSHOT_DELETED))
                .is_some_and(|c| c.status != "True");
            assert!(owed, "W3 delete without a debt");
            assert!(Some(tag.as_str()) == cr.vm_name() || Some(tag) == view.vm_name.as_ref());
        }
    }
    assert!(p.delete_tag.is_some() || !p.delete_first);

    if let Some(next) = &p.status {
        // H3: Hibernated only with the tag seen and vk done with this round.
        if next.phase == Some(Phase::Hibernated) && before != Some(Phase::Hibernated) {
            assert_eq!(*probe, Probe::Present, "Hibernated without the tag");
            assert!(view.is_some_and(PodView::lifecycle_hibernated_for_round));
        }
        // W2: never Active while vk reports hibernating or hibernated.
        if next.phase == Some(Phase::Active) && before != Some(Phase::Active) {
            assert!(
                !vk_reports_hibernate(view),
                "Active while vk reports a hibernate: {view:?}"
            );
            assert!(
                view.is_some_and(|v| !v.hibernate_requested),
                "Active while the pod asks for a hibernate: {view:?}"
            );
        }
        // The transition graph: no skipped states, reversals only on the desire.
        if after != before {
            let ok = match after {
                Some(Phase::Pending) => !matches!(before, Some(Phase::Hibernated | Phase::Waking)),
                Some(Phase::Hibernating) => {
                    desire == Desire::Hibernate
                        && matches!(
                            before,
                            None | Some(Phase::Pending | Phase::Active | Phase::Failed)
                        )
                }
                Some(Phase::Hibernated) => before == Some(Phase::Hibernating),
                Some(Phase::Waking) => {
                    desire == Desire::Wake
                        && matches!(
                            before,
                            None | Some(Phase::Pending | Phase::Hibernated | Phase::Failed)
                        )
                }
                Some(Phase::Active) => {
                    before == Some(Phase::Waking)
                        || (desire == Desire::Wake && matches!(before, None | Some(Phase::Pending)))
                }
                Some(Phase::Failed) => true,
                None => false,
            };
            assert!(
                ok,
                "transition {before:?} -> {after:?} with desire {desire:?}"
            );
        }
    }

    // C3: a settled CR (terminal phase of its desire, pod agreeing) writes nothing.
    let settled = *owner == Ownership::Sole
        && desire != Desire::Unknown
        && cr.status.as_ref().and_then(|s| s.observed_generation) == cr.metadata.generation
        && view.is_some_and(|v| {
            v.vm_name.is_some()
                // S9: a pod naming another VM than the one held is not settled.
                && cr.vm_name().is_none_or(|held| v.vm_name.as_deref() == Some(held))
                && match (before, desire) {
                    (Some(Phase::Hibernated), Desire::Hibernate) => v.hibernate_requested,
                    (Some(Phase::Active), Desire::Wake) => !v.hibernate_requested,
                    _ => false,
                }
        });
    if settled {
        assert_eq!(p.status, None, "status write on a settled CR");
        assert_eq!(p.pod_patch, None, "pod patch on a settled CR");
        assert!(p.events.is_empty(), "events on a settled CR");
    }

    // In-flight transitions always come back for their timeout.
    if matches!(after, Some(Phase::Hibernating | Phase::Waking)) && p.status.is_some() {
        let poll = p.requeue.expect("an in-flight transition is requeued");
        assert!(poll <= settings.transition_poll.max(settings.pending_recheck));
    }
}

/// G1, S2, S6 on a CR being deleted.
fn check_cleanup(
    cr: &CocoonHibernation,
    others: &[CocoonHibernation],
    claimants: &[CocoonHibernation],
) {
    let c = plan_cleanup(cr, others, claimants);
    assert_eq!(c.remove_finalizer, cr.has_finalizer());
    let Some(tag) = &c.delete_tag else {
        return;
    };
    assert_eq!(Some(tag.as_str()), cr.vm_name());
    let same_cr = |o: &CocoonHibernation| {
        o.metadata.namespace == cr.metadata.namespace && o.metadata.name == cr.metadata.name
    };
    let live = |o: &&CocoonHibernation| !same_cr(o) && !o.is_deleting();
    for o in others.iter().filter(live) {
        let same_pod =
            o.metadata.namespace == cr.metadata.namespace && o.spec.pod_ref == cr.spec.pod_ref;
        assert!(
            o.vm_name() != Some(tag) && !same_pod,
            "G1: deleted {tag} held by {o:?}"
        );
    }
    assert!(
        !claimants.iter().any(|o| live(&o)),
        "G1: deleted {tag} a claimant waits for"
    );
}

/// S1: a fresh read never lets a wake's delete through for a CR that wants the tag.
fn check_still_owes(fresh: &CocoonHibernation, same_uid: bool) {
    let uid = if same_uid {
        fresh.metadata.uid.clone()
    } else {
        Some("uid-else".into())
    };
    for vm in ["vm-a", "vm-b"] {
        for debt in [Debt::EndOfWake, Debt::AfterWake] {
            if still_owes(fresh, uid.as_deref(), vm, debt) {
                assert!(same_uid && !fresh.is_deleting());
                assert_eq!(fresh.spec.desire, Desire::Wake);
                assert!(!matches!(
                    fresh.phase(),
                    Some(Phase::Hibernating | Phase::Hibernated)
                ));
            }
        }
        if still_owes(fresh, uid.as_deref(), vm, Debt::OnDeletion) {
            assert!(same_uid && fresh.is_deleting() && fresh.vm_name() == Some(vm));
        }
    }
}
