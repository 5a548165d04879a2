use super::*;

const UID: &str = "uid-1";

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

fn b1() -> Timestamp {
    ts("2026-06-10T09:00:00Z")
}

fn b2() -> Timestamp {
    ts("2026-06-10T17:00:00Z")
}

fn input(desire: Desire, boundary: Timestamp) -> Inputs {
    Inputs {
        now: boundary
            .checked_add(jiff::SignedDuration::from_mins(1))
            .unwrap(),
        desire,
        boundary,
        uid: UID.into(),
        suspend: false,
        max_in_flight: None,
        deleting: false,
        wake_on_delete: false,
        pods: BTreeMap::new(),
        crs: BTreeMap::new(),
    }
}

fn ours(desire: Desire, phase: Phase, wrote: Desire, boundary: Timestamp) -> CrState {
    CrState {
        desire,
        phase: Some(phase),
        conflict: false,
        mark: Some(Mark {
            uid: UID.into(),
            desire: wrote,
            boundary,
        }),
        override_until: None,
    }
}

fn with(mut i: Inputs, pods: &[(&str, Driver)], crs: &[(&str, CrState)]) -> Inputs {
    i.pods = pods
        .iter()
        .map(|(n, d)| ((*n).to_owned(), d.clone()))
        .collect();
    i.crs = crs
        .iter()
        .map(|(n, c)| ((*n).to_owned(), c.clone()))
        .collect();
    i
}

use Desire::{Hibernate, Wake};

fn flip(cr: &str, desire: Desire) -> Action {
    Action::Flip {
        cr: cr.into(),
        desire,
    }
}

/// K4: a selected pod without a CR gets one, with the desire of the moment.
#[test]
fn k4_creates_the_missing_cr() {
    let p = plan(&with(input(Hibernate, b2()), &[("a", Driver::Us)], &[]));
    assert_eq!(
        p.actions,
        vec![Action::Create {
            pod: "a".into(),
            desire: Hibernate
        }]
    );
    assert_eq!(p.managed, 1);
}

/// K4: a CR without our uid (a person's, or another schedule's) is never adopted.
#[rstest::rstest]
#[case::k4_unmarked(None)]
#[case::k4_other_schedule(Some("uid-2"))]
fn k4_never_adopts_a_cr_it_did_not_create(#[case] uid: Option<&str>) {
    let mut cr = ours(Wake, Phase::Active, Wake, b1());
    cr.mark = uid.map(|u| Mark {
        uid: u.into(),
        desire: Wake,
        boundary: b1(),
    });
    let p = plan(&with(
        input(Hibernate, b2()),
        &[("a", Driver::Us)],
        &[("a", cr)],
    ));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!((p.managed, p.overridden), (0, 1));
}

/// K4: a pod that left the selector (or a schedule being deleted) only releases its CR;
/// with onDelete: Wake the same write wakes it, but never while it is in transition.
#[rstest::rstest]
#[case::k4_left_selector(false, false, Phase::Hibernated, Some(Action::Release { cr: "a".into(), wake: false }), false)]
#[case::k4_deleted_orphan(true, false, Phase::Hibernated, Some(Action::Release { cr: "a".into(), wake: false }), false)]
#[case::k4_deleted_wake(true, true, Phase::Hibernated, Some(Action::Release { cr: "a".into(), wake: true }), false)]
#[case::k4_k7_deleted_wake_waits_for_the_transition(true, true, Phase::Hibernating, None, true)]
fn k4_release_never_deletes(
    #[case] deleting: bool,
    #[case] wake_on_delete: bool,
    #[case] phase: Phase,
    #[case] want: Option<Action>,
    #[case] pending: bool,
) {
    let mut i = with(
        input(Hibernate, b2()),
        &[],
        &[("a", ours(Hibernate, phase, Hibernate, b2()))],
    );
    if deleting {
        i.pods.insert("a".into(), Driver::Us);
    }
    i.deleting = deleting;
    i.wake_on_delete = wake_on_delete;
    let p = plan(&i);
    assert_eq!(p.actions, want.into_iter().collect::<Vec<_>>());
    assert_eq!(p.pending, pending);
}

/// K5: a desire a person changed since the schedule's write is kept until the next
/// boundary, then managed again; `--until` holds it to a stated time instead.
#[rstest::rstest]
#[case::k5_kept_within_the_boundary(b1(), None, b1(), vec![], 1)]
#[case::k5_managed_again_at_the_next(b2(), None, b1(), vec![flip("a", Hibernate)], 0)]
#[case::k5_until_outlives_the_boundary(b2(), Some("2026-06-10T20:00:00Z"), b1(), vec![], 1)]
#[case::k5_until_over(b2(), Some("2026-06-10T17:00:30Z"), b1(), vec![flip("a", Hibernate)], 0)]
fn k5_manual_override(
    #[case] boundary: Timestamp,
    #[case] until: Option<&str>,
    #[case] marked: Timestamp,
    #[case] want: Vec<Action>,
    #[case] overridden: u32,
) {
    // The schedule wrote Hibernate for `marked`; a person set Wake.
    let mut cr = ours(Wake, Phase::Active, Hibernate, marked);
    cr.override_until = until.map(ts);
    let p = plan(&with(
        input(Hibernate, boundary),
        &[("a", Driver::Us)],
        &[("a", cr)],
    ));
    assert_eq!(p.actions, want);
    assert_eq!(p.overridden, overridden);
    assert_eq!(p.overrides.len(), overridden as usize);
}

/// K2: one write per pod per boundary: a flip, or a mark when the desire is already
/// right; nothing once the boundary is recorded on the CR.
#[rstest::rstest]
#[case::k2_flip(Wake, b1(), vec![flip("a", Hibernate)])]
#[case::k2_mark_only(Hibernate, b1(), vec![Action::Mark { cr: "a".into(), desire: Hibernate }])]
#[case::k2_already_applied(Hibernate, b2(), vec![])]
fn k2_one_write_per_boundary(
    #[case] desire: Desire,
    #[case] marked: Timestamp,
    #[case] want: Vec<Action>,
) {
    let cr = ours(desire, Phase::Active, desire, marked);
    let p = plan(&with(
        input(Hibernate, b2()),
        &[("a", Driver::Us)],
        &[("a", cr)],
    ));
    assert_eq!(p.actions, want);
}

/// K6: a pod an older schedule drives is counted and left alone, even a CR we made.
#[test]
fn k6_the_younger_schedule_writes_nothing() {
    let other = Driver::Other("office".into());
    let p = plan(&with(
        input(Hibernate, b2()),
        &[("a", other.clone()), ("b", other)],
        &[("a", ours(Wake, Phase::Active, Wake, b1()))],
    ));
    assert!(p.actions.is_empty(), "{:?}", p.actions);
    assert_eq!(p.conflicting, 2);
    assert_eq!(p.conflicts[0], "a (driven by office)");
    assert_eq!(
        driver([(b2(), "young"), (b1(), "old"), (b1(), "older-by-name")]),
        Some("old")
    );
}

/// K7: no desire changes while in transition; Failed with Conflict is skipped; at most
/// maxInFlight of the schedule's CRs in transition (those already moving count, and so
/// does a flip not yet picked up).
#[test]
fn k7_transitions_are_left_to_finish_and_bounded() {
    let mut i = input(Hibernate, b2());
    i.max_in_flight = Some(4);
    let mut pods = vec![
        ("moving", Driver::Us),
        ("flipped", Driver::Us),
        ("conflict", Driver::Us),
    ];
    let mut crs = vec![
        ("moving", ours(Wake, Phase::Waking, Wake, b1())),
        ("flipped", ours(Hibernate, Phase::Active, Hibernate, b2())),
        ("conflict", {
            let mut c = ours(Wake, Phase::Failed, Wake, b1());
            c.conflict = true;
            c
        }),
    ];
    let names: Vec<String> = (0..5).map(|n| format!("p{n}")).collect();
    for n in &names {
        pods.push((n, Driver::Us));
        crs.push((n, ours(Wake, Phase::Active, Wake, b1())));
    }
    pods.push(("new", Driver::Us));
    let p = plan(&with(i, &pods, &crs));
    let create = Action::Create {
        pod: "new".into(),
        desire: Hibernate,
    };
    assert_eq!(p.actions, vec![create, flip("p0", Hibernate)]);
    assert!(p.pending);
    assert_eq!(p.managed, 9);
}

/// K1: a suspended schedule writes nothing but still counts.
#[test]
fn k1_suspend_writes_nothing() {
    let mut i = with(
        input(Hibernate, b2()),
        &[("a", Driver::Us), ("b", Driver::Us)],
        &[("a", ours(Wake, Phase::Active, Wake, b1()))],
    );
    i.suspend = true;
    let p = plan(&i);
    assert!(p.actions.is_empty());
    assert_eq!(p.managed, 1);
}

/// K2 K7: twenty pods over six boundaries, three passes each, phases settling between
/// passes and maxInFlight 4: every pod is written exactly once per boundary.
#[test]
fn k2_k7_twenty_pods_one_write_per_boundary() {
    let mut crs: BTreeMap<String, CrState> = BTreeMap::new();
    let pods: BTreeMap<String, Driver> =
        (0..20).map(|n| (format!("p{n:02}"), Driver::Us)).collect();
    let mut writes: BTreeMap<(String, Timestamp), u32> = BTreeMap::new();
    for k in 0..6i64 {
        let boundary = b1()
            .checked_add(jiff::SignedDuration::from_hours(8 * k))
            .unwrap();
        let desire = if k % 2 == 0 { Wake } else { Hibernate };
        for _pass in 0..8 {
            // What was in transition settles before the next pass.
            for cr in crs.values_mut() {
                cr.phase = Some(match cr.desire {
                    Wake => Phase::Active,
                    _ => Phase::Hibernated,
                });
            }
            let mut i = input(desire, boundary);
            i.max_in_flight = Some(4);
            i.pods = pods.clone();
            i.crs = crs.clone();
            let p = plan(&i);
            for a in p.actions {
                let (name, desire) = match a {
                    Action::Create { pod, desire } => (pod, desire),
                    Action::Flip { cr, desire } | Action::Mark { cr, desire } => (cr, desire),
                    Action::Release { .. } => panic!("nothing leaves"),
                };
                *writes.entry((name.clone(), boundary)).or_default() += 1;
                let moving = match desire {
                    Wake => Phase::Waking,
                    _ => Phase::Hibernating,
                };
                crs.insert(name, ours(desire, moving, desire, boundary));
            }
            let moving = crs.values().filter(|c| in_transition(c.phase)).count();
            assert!(moving <= 4, "{moving} in flight");
        }
        for pod in pods.keys() {
            assert_eq!(
                writes.get(&(pod.clone(), boundary)),
                Some(&1),
                "{pod} at {k}"
            );
            assert_eq!(crs[pod].desire, desire);
        }
    }
}
