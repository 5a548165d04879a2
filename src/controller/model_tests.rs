//! The effect layer itself under random worlds (issue 33): the real `reconcile`, with its
//! fence, fresh reads and own-write memories, against an in-memory apiserver
//! (`apiserver`), a registry that knows whether its tag is the VM's only copy, a lagging
//! cache and a hostile vk-cocoon (`world`). The invariants come from vk's truth:
//! - S1, S7, W2, G1: no tag delete while the tag is, or is about to be, the VM's only copy
//!   (pushed, the VM not yet removed, or removed), and so no VM that vk cannot restore;
//! - S1: no DELETE reaches the registry while the fence is closed;
//! - W2, on one replica's cache (which never goes back, S4): no CR `Active` while vk has
//!   removed its VM and not restored it. A cache older than what the CR's status was
//!   planned from (a failover, a restart) can still make a CR Active or Hibernated for a
//!   while on a stale round's pod (issue 33's report); the tag stays safe there.
//!
//! A user deleting the CR of a round in flight discards its snapshot (S6); the checks
//! leave that round alone.

mod apiserver;
mod registry;
mod world;

use super::plan::Settings;
use proptest::prelude::*;
use world::{Vk, World};

#[derive(Clone, Debug)]
enum Step {
    /// One pass on a cache `cr_lag` / `pod_lag` versions behind; the fence closes during
    /// the pass's `cut`th apiserver request.
    Pass {
        cr_lag: usize,
        pod_lag: usize,
        cut: Option<usize>,
    },
    /// vk-cocoon's next step; a round it starts does not report `hibernating` if set.
    Vk {
        skip_hibernating: bool,
    },
    /// vk-cocoon removes the VM it pushed (slow: this step is rarer than the others).
    VkRemoves,
    /// An hour passes: any transition in flight times out.
    Tick,
    Flip,
    /// The user flips the desire during the next pass, after its `n`th request.
    FlipDuringPass(usize),
    Delete,
    Create {
        hibernate: bool,
    },
    Fence {
        open: bool,
    },
    /// G1: a pod of another name for the hibernated VM, which vk restores from the tag.
    Replace,
}

/// Mostly a current cache; sometimes a few versions behind; sometimes far behind, as a
/// replica whose cache lagged shows after a failover.
fn lag() -> impl Strategy<Value = usize> {
    prop_oneof![6 => Just(0usize), 2 => 1..4usize, 1 => 4..16usize]
}

fn step() -> impl Strategy<Value = Step> {
    let pass = (lag(), lag(), prop::option::weighted(0.15, 1..6usize));
    prop_oneof![
        8 => pass.prop_map(|(cr_lag, pod_lag, cut)| Step::Pass { cr_lag, pod_lag, cut }),
        5 => prop::bool::weighted(0.6).prop_map(|skip_hibernating| Step::Vk { skip_hibernating }),
        2 => Just(Step::VkRemoves),
        2 => Just(Step::Tick),
        3 => Just(Step::Flip),
        1 => (1..6usize).prop_map(Step::FlipDuringPass),
        1 => Just(Step::Delete),
        1 => any::<bool>().prop_map(|hibernate| Step::Create { hibernate }),
        1 => any::<bool>().prop_map(|open| Step::Fence { open }),
        2 => Just(Step::Replace),
    ]
}

async fn apply(w: &mut World, step: &Step) {
    w.log.push(format!("{step:?}"));
    match *step {
        Step::Pass {
            cr_lag,
            pod_lag,
            cut,
        } => w.pass(cr_lag, pod_lag, cut).await,
        Step::Vk { skip_hibernating } => w.vk_step(skip_hibernating, false),
        Step::VkRemoves => w.vk_step(false, true),
        Step::Tick => w.tick(),
        Step::Flip => w.flip(),
        Step::FlipDuringPass(n) => w.flip_during_next_pass(n),
        Step::Delete => w.delete(),
        Step::Create { hibernate } => w.create(hibernate),
        Step::Fence { open } => w.fence(open),
        Step::Replace => w.replace(),
    }
    w.observe();
}

/// Runs `steps` from a CR with desire Hibernate on a running VM, then lets the world go on
/// without faults for a while, so a VM removed late is restored (or found lost). The cache
/// shows any recent version of each object.
fn run(steps: &[Step]) -> World {
    run_on(false, steps)
}

/// As `run`, on one replica's `monotone` cache, which also checks the CR's phase.
fn run_on(monotone: bool, steps: &[Step]) -> World {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let mut w = World::new(Settings::default(), monotone);
        w.create(true);
        w.observe();
        let calm = [
            Step::Fence { open: true },
            Step::Pass {
                cr_lag: 0,
                pod_lag: 0,
                cut: None,
            },
            Step::Vk {
                skip_hibernating: false,
            },
            Step::VkRemoves,
        ];
        for step in steps.iter().chain(calm.iter().cycle().take(4 * 8)) {
            apply(&mut w, step).await;
            if !w.violations.is_empty() {
                break;
            }
        }
        w
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// SPEC S1 W2 S7 G1: the real effect layer, under a hostile vk, a cache showing any
    /// recent version (a failover, a restart), a fence that closes mid-pass, timeouts,
    /// flips, deletions and replacement pods, never deletes a tag that is the VM's only copy
    /// (no VM is lost), nor sends a DELETE with the fence closed.
    #[test]
    fn s1_w2_s7_g1_reconcile_keeps_the_only_copy_under_a_hostile_vk(
        steps in prop::collection::vec(step(), 1..90)
    ) {
        let w = run(&steps);
        prop_assert!(w.violations.is_empty(), "{:?}\n{}", w.violations, w.log.join("\n"));
    }

    /// SPEC W2 S1 S7 G1: the same on one replica's lagging cache (S4: never going back),
    /// where besides no CR is ever Active while vk has removed its VM.
    #[test]
    fn w2_s1_s7_g1_no_active_on_a_removed_vm_under_a_hostile_vk(
        steps in prop::collection::vec(step(), 1..90)
    ) {
        let w = run_on(true, &steps);
        prop_assert!(w.violations.is_empty(), "{:?}\n{}", w.violations, w.log.join("\n"));
    }
}

/// SPEC W2 S7: a pass on a pod cache that lags a hibernate request already made (no
/// annotation, the VMID of an earlier round) never replaces the VMID recorded for it; else
/// a later wake ends on the VMID that request takes away (found by the property test in a
/// CI rehearsal; its shrunk steps).
#[test]
fn w2_s7_a_lagging_pod_cache_never_replaces_a_recorded_request() {
    use Step::{Flip, Tick};
    let w = run(&[
        PASS,
        Flip,
        Flip,
        PASS,
        Tick,
        VK,
        Flip,
        PASS,
        PASS,
        Flip,
        Flip,
        VK,
        PASS,
        Flip,
        RM,
        Flip,
        PASS,
        VK,
        Flip,
        pod_lag(5),
        PASS,
        pod_lag(3),
        Flip,
        Tick,
        PASS,
        SKIP,
        PASS,
    ]);
    assert_clean(&w);
}

const PASS: Step = Step::Pass {
    cr_lag: 0,
    pod_lag: 0,
    cut: None,
};
const VK: Step = Step::Vk {
    skip_hibernating: false,
};
const RM: Step = Step::VkRemoves;
/// A vk step whose round does not report `hibernating`.
const SKIP: Step = Step::Vk {
    skip_hibernating: true,
};

/// One pass on a pod cache `lag` versions behind.
fn pod_lag(lag: usize) -> Step {
    Step::Pass {
        cr_lag: 0,
        pod_lag: lag,
        cut: None,
    }
}

/// No violation, else the violations and the run's log.
fn assert_clean(w: &World) {
    assert!(
        w.violations.is_empty(),
        "{:?}\n{}",
        w.violations,
        w.log.join("\n")
    );
}

fn phase(w: &World) -> Option<crate::api::Phase> {
    w.cr().and_then(|cr| cr.phase())
}

/// SPEC H3 W2: the harness is sound: through the in-memory apiserver the real reconcile
/// hibernates (the VM only in its tag) and wakes (the tag deleted once the VM runs again).
#[test]
fn h3_w2_the_model_hibernates_and_wakes_through_reconcile() {
    let w = run(&[PASS, PASS, VK, VK, RM, PASS]);
    assert_eq!(
        (phase(&w), w.vk),
        (Some(crate::api::Phase::Hibernated), Vk::Removed),
        "{}",
        w.log.join("\n")
    );
    assert!(w.registry.0.lock().tag.is_some());

    let w = run(&[PASS, PASS, VK, VK, RM, PASS, Step::Flip, PASS, VK, PASS]);
    assert!(w.violations.is_empty(), "{:?}", w.violations);
    assert_eq!(
        (phase(&w), w.vk),
        (Some(crate::api::Phase::Active), Vk::Running),
        "{}",
        w.log.join("\n")
    );
    assert_eq!(w.registry.0.lock().deletes, 1, "W2: the tag deleted");
}

/// SPEC W2 S7 (issue 33, a slow vk): vk never reports `hibernating`, the hibernate times out,
/// the desire flips to Wake while vk has pushed but not removed the VM. The pod still shows
/// the old VMID, running: no delete, no Active, until vk removed and restored the VM.
#[test]
fn w2_a_timed_out_hibernate_woken_before_vk_removes_the_vm_keeps_the_tag() {
    let w = run_on(
        true,
        &[
            PASS,
            PASS,
            SKIP,
            PASS,
            Step::Tick,
            PASS,
            Step::Flip,
            PASS,
            VK,
            PASS,
            PASS,
        ],
    );
    assert_clean(&w);
    assert_eq!(w.vk, Vk::Running, "{}", w.log.join("\n"));
    assert_eq!(phase(&w), Some(crate::api::Phase::Active));
}

/// SPEC S7 W2: a pass on a far-lagging pod cache (a failover to a replica whose cache still
/// shows the VM running from before its hibernate) plans the end of the wake; the fresh pod
/// read shows vk has not restored the VM, so nothing is deleted and the wake goes on.
#[test]
fn s7_a_pod_cache_from_before_the_hibernate_deletes_nothing() {
    let far_behind = pod_lag(15);
    let w = run(&[PASS, PASS, VK, VK, RM, PASS, Step::Flip, PASS, far_behind]);
    assert_clean(&w);
    assert_eq!(
        w.registry.0.lock().deletes,
        1,
        "W2: deleted once the VM ran again"
    );
}

/// SPEC H3 W2 S7 (found by the any-version property): a pod cache from the previous round
/// (vk `hibernated`, the old tag there) must not complete this round's hibernate, nor
/// drop the VMID recorded for it, so the next wake cannot end before vk acted. Before
/// transitions ended on the fresh pod, the CR went Hibernated on the old view and then
/// Active while vk had removed the VM.
#[test]
fn h3_w2_s7_a_pod_cache_from_the_previous_round_ends_no_transition() {
    let w = run(&[
        PASS,
        PASS,
        VK,
        VK,
        RM,
        PASS,
        Step::Flip,
        PASS,
        Step::Tick,
        PASS,
        VK,
        Step::Flip,
        PASS,
        SKIP,
        pod_lag(2),
        Step::Flip,
        PASS,
        PASS,
        VK,
        RM,
    ]);
    assert_clean(&w);
}

/// SPEC D1 W2 S7 (found by the any-version property): a wake that ends while the desire
/// is Hibernate again keeps the tag, so it makes no delete and no fresh read for one; it
/// must still not end on a stale pod view that shows the VM running.
#[test]
fn d1_w2_s7_a_wake_kept_for_hibernate_ends_only_on_the_fresh_pod() {
    let w = run(&[
        PASS,
        PASS,
        SKIP,
        VK,
        RM,
        PASS,
        Step::Flip,
        PASS,
        Step::Flip,
        pod_lag(3),
    ]);
    assert_clean(&w);
}

/// SPEC G1 S6 (issue 33, a replacement pod): the operator recreates a hibernated VM's pod
/// under another name, which vk restores from the tag; the CR is deleted while the cache
/// has not seen that pod yet. The fresh pod list finds it: the tag stays, and vk restores
/// the VM from it.
#[test]
fn g1_deleting_the_cr_keeps_a_tag_a_replacement_pod_restores_from() {
    let before_the_replacement = pod_lag(1);
    let w = run(&[
        PASS,
        PASS,
        VK,
        VK,
        RM,
        PASS,
        Step::Replace,
        Step::Delete,
        before_the_replacement,
    ]);
    assert_clean(&w);
    assert!(
        w.cr().is_none(),
        "G2: the finalizer went: {}",
        w.log.join("\n")
    );
    assert_eq!(w.vk, Vk::Running, "restored in the replacement pod");
    assert_eq!(w.registry.0.lock().deletes, 0);
}

/// SPEC W2 S7 (found by the any-version property): a pass on a pod cache from the last
/// round (its hibernate annotation still there, the old VMID) enters Hibernating and
/// records that old VMID; the next pass sets the annotation on the VM vk restored since.
/// The record must follow the VMID that patch tested, or a later wake ends at once on the
/// restored VM "with a fresh VMID" while vk is still taking it away.
#[test]
fn w2_s7_the_recorded_vmid_is_the_one_the_hibernate_annotation_was_set_on() {
    use Step::{Flip, Tick};
    // Round 1: a hibernate that times out, woken while vk pushes; vk removes the VM and
    // restores it on VMID id-2 while the desire is Hibernate again.
    let round_1 = [
        Flip, Flip, Flip, Flip, PASS, PASS, Flip, Tick, VK, PASS, PASS, VK, Flip,
    ];
    let restored = [RM, VK, PASS];
    // Entered on a pod cache from round 1 (annotation set, VMID id-1); the next pass sets
    // the annotation on id-2. A timeout, a wake while vk pushes, and vk removes the VM.
    let stale_round = pod_lag(3);
    let round_2 = [
        stale_round,
        Flip,
        PASS,
        Flip,
        Flip,
        Flip,
        Flip,
        Tick,
        PASS,
        SKIP,
        PASS,
    ];
    let steps: Vec<Step> = [&round_1[..], &restored, &round_2, &[PASS, VK, RM]].concat();
    let w = run(&steps);
    assert_clean(&w);
}

/// SPEC W2 S7 (found by the any-version property): a pass on a pod cache from before vk
/// restored the VM (no VMID, no annotation) enters Hibernating with nothing recorded and
/// sends the hibernate request; with no VMID to test, it must not land on the restored
/// VM, or a later wake ends at once on that VM while vk is still taking it away.
#[test]
fn w2_s7_a_request_from_a_view_without_a_vmid_never_lands_on_a_restored_vm() {
    use Step::{Flip, Tick};
    let before_the_restore = pod_lag(1);
    let round_1 = [
        Flip, Flip, PASS, PASS, Flip, VK, PASS, VK, Flip, Flip, RM, PASS, PASS,
    ];
    let restored = [VK, Flip, PASS];
    let round_2 = [
        before_the_restore,
        Flip,
        Tick,
        PASS,
        Flip,
        Flip,
        Flip,
        SKIP,
        Flip,
        PASS,
    ];
    let steps: Vec<Step> = [&round_1[..], &restored, &round_2, &[PASS, PASS, VK, RM]].concat();
    let w = run(&steps);
    assert_clean(&w);
}

/// SPEC W2 F2 (found by the any-version property, with a user racing the pass): the desire
/// flips back while the first hibernate pass is in flight. The hibernate request must not
/// reach the pod unless the status recording it (and the VMID it tests) was written: a
/// lost status write left vk hibernating a VM whose CR then went Active on that VMID.
#[test]
fn w2_f2_a_desire_flipped_during_the_pass_leaves_no_unrecorded_request() {
    use Step::{Flip, FlipDuringPass};
    let flipped_back_mid_pass = [Flip, FlipDuringPass(1), PASS];
    let steps: Vec<Step> = [
        &[Flip, Flip, Flip, PASS, PASS][..],
        &flipped_back_mid_pass,
        &[VK],
    ]
    .concat();
    let w = run_on(true, &steps);
    assert_clean(&w);
}

/// SPEC W2 G1 S6 (found by the any-version property): a CR deleted while its hibernate is
/// in flight leaves the request on the pod (the user discarded that round); a new Wake CR
/// must treat the VMID under that request as one vk may take away, not as a fresh one.
#[test]
fn w2_s6_a_new_wake_cr_on_a_pod_left_asking_for_a_hibernate_records_its_vmid() {
    use Step::{Delete, Flip, Tick};
    let discarded_round = [PASS, PASS, Delete, PASS, SKIP];
    let new_cr = [
        Step::Create { hibernate: false },
        Flip,
        Flip,
        Flip,
        Flip,
        PASS,
        PASS,
        Tick,
    ];
    let steps: Vec<Step> = [
        &discarded_round[..],
        &new_cr,
        &[PASS, VK, RM, Step::Replace],
    ]
    .concat();
    let w = run(&steps);
    assert_clean(&w);
}
