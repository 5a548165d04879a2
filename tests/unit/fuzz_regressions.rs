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
use cocoon_hibernation::metrics::Metrics;
use cocoon_hibernation::webhook::handler::{Reply, review};
use cocoon_hibernation::webhook::validate::{Claim, ClaimView, VmHolder};
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

/// SPEC W2 S1 C3 (target `plan`, crash 5823088705a5, invariant "a settled CR planned
/// another write"): a Waking Wake CR (being deleted, nothing recorded but the phase) whose
/// pod runs vm-a with a VMID but still asks for a hibernate. The pass ended the wake with
/// the tag delete while the pod it read asked vk for a hibernate; the same world planned
/// again then recorded `HibernateNotRecorded` for the tag just deleted. The product was
/// wrong: the wake now ends only on a pass that sees W1's patch.
#[test]
fn w2_s1_c3_a_waking_cr_whose_pod_asks_for_a_hibernate_clears_it_before_the_wake_ends() {
    let mut cr = CocoonHibernation::new(
        "other",
        CocoonHibernationSpec {
            pod_ref: PodRef {
                name: "web-1".into(),
            },
            desire: Desire::Wake,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.namespace = Some("ns".into());
    cr.metadata.uid = Some("uid-other".into());
    cr.metadata.creation_timestamp = Some(at(0));
    cr.metadata.finalizers = Some(vec![FINALIZER.into()]);
    cr.metadata.deletion_timestamp = Some(at(32_639));
    cr.status = Some(CocoonHibernationStatus {
        phase: Some(Phase::Waking),
        ..Default::default()
    });
    let asks = PodView {
        uid: Some("pod-uid".into()),
        vm_name: Some("vm-a".into()),
        hibernate_requested: true,
        lifecycle_state: Some("ready".into()),
        observed_generation: 57,
        cocoonset_generation: 57,
        vm_id: Some("id-1".into()),
        container_running: true,
    };
    let settings = Settings {
        hibernate_timeout: std::time::Duration::from_secs(32_640),
        wake_timeout: std::time::Duration::from_secs(32_640),
        ..Settings::default()
    };
    let run = |cr: &CocoonHibernation, view: &PodView| {
        plan::plan(
            cr,
            Some(view),
            &Ownership::Sole,
            &Probe::Present,
            at(32_639),
            &settings,
        )
    };
    let p = run(&cr, &asks);
    assert_eq!(
        p.pod_patch,
        Some(plan::PodPatch::ClearHibernate),
        "W1 first"
    );
    assert_eq!(p.delete_tag, None, "S1: the pod still asks for a hibernate");
    let next = p.status.expect("Progressing says what the wake waits for");
    assert_eq!(next.phase, Some(Phase::Waking), "the wake goes on");
    // W2: a request this CR holds no record of may still take the VM on id-1 away.
    assert_eq!(next.pre_hibernate_vm_id.as_deref(), Some("id-1"));
    // The world after W1's patch: still id-1, so no wake and no delete yet.
    cr.status = Some(next);
    let cleared = PodView {
        hibernate_requested: false,
        ..asks
    };
    let p = run(&cr, &cleared);
    assert_eq!(p.delete_tag, None, "W2: not on the VMID under the request");
    if let Some(waiting) = p.status {
        assert_eq!(waiting.phase, Some(Phase::Waking));
        cr.status = Some(waiting);
    }
    // vk writes a VMID after the request: the wake ends with the delete, then a fixpoint.
    let woken = PodView {
        vm_id: Some("id-2".into()),
        ..cleared
    };
    let p = run(&cr, &woken);
    assert_eq!(p.delete_tag.as_deref(), Some("vm-a"));
    assert!(p.delete_first);
    let ended = p.status.expect("the wake ends in one write");
    assert_eq!(ended.phase, Some(Phase::Active));
    cr.status = Some(ended);
    assert_eq!(run(&cr, &woken).status, None, "C3: settled");
}

/// The body of fuzz crash `admission_review` 8fefb010dd4e, byte for byte: a mangled
/// review whose request decodes, with two bytes of invalid UTF-8 (`\xff\xff`) in a string
/// under `object.metadata` that no field reads.
fn crash_8fefb010dd4e() -> Vec<u8> {
    [
        br#"{
  "apiVersion": "admission.k8s.io/v1",
  "kind": "AdmissionReview",
  "request": {
    "uid": "705ab4f5-6393-11e8-b7cc-42010a8000021",
    "kind": {
      "group": "cocoonset.cocoonstack.io",
      "version": "v1",
      "kind": "CocoonHibernation"
    },
    "resource": {
      "group": "cocoonset.cocoonstack*io",
      "version": "v1",
      "resource": "cocoonhibernations"
    },
    "name": "web-0",
    "namespace": "team-a",
    "operation": "UPDATE",
    "userInfo": {
      "username": "alice"
    },
    "object": {
      "apiVersion": "cocoonset.cocoonstack.io/v1",
      "kind": "CocoonHibernation",
      "metadata": {
     "na[,mmespa": {
      "group": "cocoonsev1",
      "resource": "cocoonhibernations"
    },
    "nmae": "web-0",
    "namesp]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]ace": "team-a",
    "operation": "UPDATE",
    "userI.fo": {
       "kind": "Ction"
    },
    "resource": {
      "group": "cocoonset.cocoonstack.io",
      "version": "v1",
      "resource": "cocoonhibernations"
    },
    "opername": "web-0",
    "namespace": "team-a",
    "operation": "UPDATE",
    "userInfo": {
      "username": "alige"
    },
    "object": {
      "apiVersion": "cocoonset."#.as_slice(),
        b"\xff\xff",
        br#"cocoonstack.io/v1",
      "kind": "v1",
      "kind": "CocoonocoonHibernation",
      "metadata": {
        "n(ame": "web",
 
      "apiVersion": "cocoonset.cocoonstack.io/v1",
      "kind": "CocoonocoonHibernation",
      "metadata": {
        "n(ame": "web",
        "namespace": "team-a"
      },
      "spec": {
        "podRef": {
          "name": "web-0"
        },
        "desire": "Hibernate"
      }
    },
    "drce": "team-a"
      },
      "spec": {
        "podRef": {
        
        "desire": "Hibernate"
      }
    },
    "drce": "team-a"
      },
      "spec": {
        "podRef": {
          "name": "web-0"
        },
      "desir": "Hibernate"
      }
    },
    "dryRun": false
  }
}"#.as_slice(),
    ]
    .concat()
}

/// A synced cache with no claims, as a fresh cluster has.
struct NoClaims;

impl ClaimView for NoClaims {
    fn synced(&self) -> bool {
        true
    }
    fn claims(&self, _namespace: &str, _pod: &str) -> Vec<Claim> {
        vec![]
    }
    fn vm_holder(&self, _namespace: &str, _pod: &str) -> Option<VmHolder> {
        None
    }
}

/// SPEC V5 (target `admission_review`, invariant "every review answer carries the
/// request's uid"): the product reads the body as serde does, skipping fields it does not
/// know without checking their strings, so invalid UTF-8 there still gets a review answer
/// with the request's uid. The target's own check re-read the body with
/// `serde_json::Value`, which checks every string, and panicked: the target was wrong,
/// not the product. Its check now reads the uid as leniently as the product does.
#[test]
fn v5_invalid_utf8_in_an_unread_field_still_gets_the_requests_uid() {
    let body = crash_8fefb010dd4e();
    assert_eq!(body.len(), 1979, "the crash input, unchanged");
    assert!(
        serde_json::from_slice::<serde_json::Value>(&body).is_err(),
        "strict JSON refuses it: why the target's old check panicked"
    );
    let Reply::Review(response) = review(&body, &NoClaims, &Metrics::new()) else {
        panic!("the request decodes, so V5 asks for a review answer");
    };
    assert_eq!(response.uid, "705ab4f5-6393-11e8-b7cc-42010a8000021");
}
