//! Inputs with which the fuzz targets in `fuzz/` (`make fuzz`) found a fault, replayed
//! through the same public entry points so the fault stays fixed. Each test names the
//! rule the fault broke and the target that found it.

use cocoon_hibernation::api::annotations::PodView;
use cocoon_hibernation::api::conditions::{self, READY, SNAPSHOT_DELETED};
use cocoon_hibernation::api::{
    CocoonHibernation, CocoonHibernationSpec, CocoonHibernationStatus, Desire, FINALIZER, Phase,
    PodRef,
};
use cocoon_hibernation::controller::plan::{self, Ownership, Probe, Settings};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

fn at(secs: i64) -> Time {
    Time(jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap())
}

/// SPEC D1, W2, W3 (target `plan`, invariant "a tag delete only for W2, W3 or G1"): a CR
/// whose desire flipped back to Hibernate while it was Waking ends the wake, but the tag
/// is wanted again, so the plan must not ask for its delete. It records the tag as owed
/// all the same, so a flip back to Wake before the hibernate starts does not leak it. Before the fix the plan asked
/// for it and only S1's fresh read in reconcile kept the tag.
#[test]
fn d1_w2_w3_a_wake_ending_after_a_flip_to_hibernate_keeps_the_tag_as_owed() {
    let mut cr = CocoonHibernation::new(
        "web-0",
        CocoonHibernationSpec {
            pod_ref: PodRef {
                name: "web-0".into(),
            },
            desire: Desire::Hibernate,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.namespace = Some("ns".into());
    cr.metadata.generation = Some(2);
    cr.metadata.finalizers = Some(vec![FINALIZER.into()]);
    let mut status = CocoonHibernationStatus {
        observed_generation: Some(1),
        phase: Some(Phase::Waking),
        vm_name: Some("vm-a".into()),
        ..Default::default()
    };
    let pending = conditions::Update {
        type_: READY,
        status: false,
        reason: conditions::REASON_PENDING,
        message: "waking",
        observed_generation: Some(1),
    };
    conditions::upsert(&mut status.conditions, pending, at(0), true);
    cr.status = Some(status);
    let woken = PodView {
        uid: Some("u".into()),
        vm_name: Some("vm-a".into()),
        hibernate_requested: false,
        lifecycle_state: Some("ready".into()),
        observed_generation: 0,
        cocoonset_generation: 0,
        vm_id: Some("id-2".into()),
        container_running: true,
    };
    let p = plan::plan(
        &cr,
        Some(&woken),
        &Ownership::Sole,
        &Probe::NotProbed,
        at(10),
        &Settings::default(),
    );
    let next = p.status.expect("the wake ends");
    assert_eq!(next.phase, Some(Phase::Active), "D1: the wake still ends");
    assert_eq!(p.delete_tag, None, "D1: the tag is wanted again");
    assert!(!p.delete_first);
    // W3: kept, but still owed should the desire return to Wake before a hibernate.
    let kept = conditions::find(&next.conditions, SNAPSHOT_DELETED).expect("recorded");
    assert_eq!(kept.status, "False");
    assert_eq!(kept.reason, conditions::REASON_KEPT_FOR_HIBERNATE);
}
