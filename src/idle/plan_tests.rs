use super::*;
use Desire::{Hibernate, Wake};
use jiff::SignedDuration;

const UID: &str = "uid-idle";
const MIN: Duration = Duration::from_secs(60);

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

/// Now, and instants so many minutes before it.
fn now() -> Timestamp {
    ts("2026-06-10T12:00:00Z")
}

fn ago(mins: i64) -> Timestamp {
    now().checked_sub(SignedDuration::from_mins(mins)).unwrap()
}

fn input(pods: &[(&str, PodInput)]) -> Inputs {
    Inputs {
        now: now(),
        uid: UID.into(),
        idle_after: 30 * MIN,
        min_awake: 5 * MIN,
        suspend: false,
        strays: Vec::new(),
        deleting: false,
        pods: pods
            .iter()
            .map(|(n, p)| ((*n).to_owned(), p.clone()))
            .collect(),
    }
}

/// Our CR, awake and settled, woken `woken` minutes ago.
fn ours(woken: i64) -> CrState {
    CrState {
        desire: Wake,
        phase: Some(Phase::Active),
        conflict: false,
        mark: Some(Mark {
            uid: UID.into(),
            desire: Wake,
            at: ago(600),
        }),
        schedule_desire: None,
        override_until: None,
        woken_at: Some(ago(woken)),
        attempts: 1,
    }
}

fn active(last: i64) -> Activity {
    Activity {
        last: Some(ago(last)),
        busy_until: None,
        open_connections: 0,
    }
}

fn pod(activity: Option<Activity>, cr: Option<CrState>) -> PodInput {
    PodInput {
        driven_by: None,
        activity,
        cr,
        scheduled: false,
    }
}

fn hibernates(p: &Plan) -> Vec<&str> {
    p.actions
        .iter()
        .filter_map(|a| match a {
            Action::Hibernate { pod } => Some(pod.as_str()),
            _ => None,
        })
        .collect()
}

/// SPEC I3: idle when the latest of last activity, last wake and busy mark is idleAfter
/// or more in the past and no proxied connection is open; otherwise the next look is
/// the instant it would turn idle.
#[rstest::rstest]
#[case::i3_idle_for_exactly_idle_after(active(30), 60, true, None)]
#[case::i3_idle_for_longer(active(90), 600, true, None)]
#[case::i3_recent_activity_keeps_awake(active(10), 600, false, Some(20))]
#[case::i3_recent_wake_counts_as_activity(active(90), 10, false, Some(20))]
#[case::i3_busy_mark_counts(Activity { busy_until: Some(ago(-60)), ..active(90) }, 600, false, Some(90))]
#[case::i3_busy_mark_in_the_past_counts_from_its_end(Activity { busy_until: Some(ago(10)), ..active(90) }, 600, false, Some(20))]
#[case::i3_open_connection_keeps_awake(Activity { open_connections: 1, ..active(90) }, 600, false, None)]
#[case::i3_no_report_yet_counts_from_the_wake(Activity::default(), 45, true, None)]
#[case::i3_a_wake_restarts_the_count(active(90), 2, false, Some(28))]
fn i3_idle_decision(
    #[case] activity: Activity,
    #[case] woken_mins_ago: i64,
    #[case] idle: bool,
    #[case] next_in_mins: Option<i64>,
) {
    let i = input(&[("web-0", pod(Some(activity), Some(ours(woken_mins_ago))))]);
    let p = plan(&i);
    assert_eq!(hibernates(&p) == ["web-0"], idle, "{p:?}");
    assert_eq!(p.next, next_in_mins.map(|m| ago(-m)), "{p:?}");
    assert_eq!((p.managed, p.idle + p.awake), (1, 1));
    assert_eq!(p.idle, u32::from(idle));
}

/// SPEC I4: how the idle policy shares a pod with a person and with schedules (the
/// table at the top of plan.rs), for a pod idle for an hour.
#[rstest::rstest]
#[case::i4_our_cr_is_hibernated(Some(ours(600)), &["hibernate"], (1, 0, 0))]
#[case::i4_no_cr_is_created_awake(None, &["create-cr"], (1, 0, 0))]
#[case::i4_a_persons_cr_is_never_adopted(Some(CrState { mark: None, ..ours(600) }), &[], (0, 1, 0))]
#[case::i4_inside_a_persons_override(Some(CrState { override_until: Some(ago(-10)), ..ours(600) }), &[], (0, 1, 0))]
#[case::i4_an_override_that_ended(Some(CrState { override_until: Some(ago(1)), ..ours(600) }), &["hibernate"], (1, 0, 0))]
#[case::i4_schedule_awake_window_is_shortened(Some(CrState { mark: None, schedule_desire: Some(Wake), ..ours(600) }), &["hibernate"], (1, 0, 0))]
#[case::i4_schedule_sleep_is_the_schedules(Some(CrState { mark: None, schedule_desire: Some(Hibernate), ..ours(600) }), &[], (1, 0, 0))]
#[case::i4_another_policys_cr(Some(CrState { mark: Some(Mark { uid: "other".into(), desire: Wake, at: ago(600) }), ..ours(600) }), &[], (0, 0, 1))]
#[case::i4_never_in_transition_waking(Some(CrState { phase: Some(Phase::Waking), ..ours(600) }), &[], (1, 0, 0))]
#[case::i4_never_in_transition_hibernating(Some(CrState { desire: Hibernate, phase: Some(Phase::Hibernating), ..ours(600) }), &[], (1, 0, 0))]
#[case::i4_never_a_conflict(Some(CrState { conflict: true, phase: Some(Phase::Failed), ..ours(600) }), &[], (1, 0, 0))]
#[case::i4_asleep_stays_asleep(Some(CrState { desire: Hibernate, phase: Some(Phase::Hibernated), ..ours(600) }), &[], (1, 0, 0))]
fn i4_precedence(
    #[case] cr: Option<CrState>,
    #[case] want: &[&str],
    #[case] (managed, overridden, conflicting): (u32, u32, u32),
) {
    let i = input(&[("web-0", pod(Some(active(60)), cr))]);
    let p = plan(&i);
    let got: Vec<&str> = p
        .actions
        .iter()
        .map(|a| match a {
            Action::CreateLease { .. } => "create-lease",
            Action::CreateCr { .. } => "create-cr",
            Action::Hibernate { .. } => "hibernate",
            Action::Release { .. } => "release",
        })
        .collect();
    assert_eq!(got, want, "{p:?}");
    assert_eq!(
        (p.managed, p.overridden, p.conflicting),
        (managed, overridden, conflicting)
    );
}

/// SPEC I4: of two idle policies selecting a pod, the older drives it; the younger writes
/// nothing for it, not even its Lease.
#[test]
fn i4_an_older_policy_drives_the_pod() {
    let mut p = pod(None, None);
    p.driven_by = Some("older".into());
    let out = plan(&input(&[("web-0", p)]));
    assert!(out.actions.is_empty(), "{out:?}");
    assert_eq!((out.managed, out.conflicting), (0, 1));
    let at = ts("2026-01-01T00:00:00Z");
    assert_eq!(
        driver([(ago(1), "young"), (at, "old"), (at, "also-old")]),
        Some("also-old")
    );
}

/// SPEC I2 I4: a selected pod without a Lease gets one, and no decision until it exists;
/// a suspended policy creates nothing and hibernates nothing.
#[test]
fn i2_a_pod_without_a_lease_gets_one_first() {
    let out = plan(&input(&[("web-0", pod(None, Some(ours(600))))]));
    assert_eq!(
        out.actions,
        [Action::CreateLease {
            pod: "web-0".into()
        }]
    );
    let mut suspended = input(&[
        ("a", pod(None, None)),
        ("b", pod(Some(active(600)), Some(ours(600)))),
    ]);
    suspended.suspend = true;
    let out = plan(&suspended);
    assert!(out.actions.is_empty(), "{out:?}");
    assert_eq!(out.next, None);
}

/// SPEC I5: one idle hibernate per pod per minAwake, even when the pod was woken and went
/// idle at once; after 3 wakes in a row ended Failed, wake on request stops and says why.
#[test]
fn i5_churn_is_bounded() {
    let mut cr = ours(600);
    cr.mark = Some(Mark {
        uid: UID.into(),
        desire: Hibernate,
        at: ago(2),
    });
    let mut i = input(&[("web-0", pod(Some(active(600)), Some(cr)))]);
    i.idle_after = MIN;
    let out = plan(&i);
    assert!(hibernates(&out).is_empty(), "{out:?}");
    assert_eq!(out.next, Some(ago(-3)));

    // minAwake outlasts a short idleAfter after a wake.
    let mut i = input(&[("web-0", pod(Some(active(600)), Some(ours(2))))]);
    i.idle_after = MIN;
    let out = plan(&i);
    assert!(hibernates(&out).is_empty(), "{out:?}");
    assert_eq!(out.next, Some(ago(-3)));

    let failed = |attempts| CrState {
        phase: Some(Phase::Failed),
        attempts,
        ..ours(600)
    };
    let out = plan(&input(&[
        ("two", pod(Some(active(0)), Some(failed(2)))),
        ("three", pod(Some(active(0)), Some(failed(3)))),
    ]));
    assert_eq!(out.wake_stopped, ["three: 3 wakes in a row ended Failed"]);
}

/// SPEC I3: the next look is the soonest of the pods' idle instants, never in the past.
#[test]
fn i3_next_look_is_the_soonest_idle_instant() {
    let out = plan(&input(&[
        ("a", pod(Some(active(5)), Some(ours(600)))),
        ("b", pod(Some(active(20)), Some(ours(600)))),
        (
            "c",
            pod(
                Some(active(600)),
                Some(CrState {
                    phase: Some(Phase::Waking),
                    ..ours(600)
                }),
            ),
        ),
    ]));
    assert!(out.actions.is_empty());
    assert_eq!(out.next, Some(now()), "c is due once its wake ends");
    let out = plan(&input(&[
        ("a", pod(Some(active(5)), Some(ours(600)))),
        ("b", pod(Some(active(20)), Some(ours(600)))),
    ]));
    assert_eq!(out.next, Some(ago(-10)));
}

/// SPEC I3: a pass with many due pods flips the longest idle first (names do not
/// order them); pods not yet idle are not flipped.
#[rstest::rstest]
#[case::i3_oldest_first(&[("a", 31), ("b", 90), ("c", 45)], &["b", "c", "a"])]
#[case::i3_names_do_not_order(&[("z", 600), ("m", 30), ("a", 31)], &["z", "a", "m"])]
#[case::i3_not_yet_idle_is_left(&[("a", 29), ("b", 40)], &["b"])]
fn i3_due_pods_longest_idle_first(#[case] pods: &[(&str, i64)], #[case] order: &[&str]) {
    let mut pods: Vec<(&str, PodInput)> = pods
        .iter()
        .map(|(n, last)| (*n, pod(Some(active(*last)), Some(ours(600)))))
        .collect();
    pods.push(("new", pod(None, None)));
    let out = plan(&input(&pods));
    assert_eq!(hibernates(&out), order, "{out:?}");
}

/// SPEC I4: a pod a schedule selects gets its CR from the schedule, not from the idle
/// policy, so the schedule drives it (the policy only shortens its awake windows).
#[test]
fn i4_a_scheduled_pod_waits_for_the_schedules_cr() {
    let mut p = pod(Some(active(60)), None);
    p.scheduled = true;
    let out = plan(&input(&[("web-0", p)]));
    assert!(out.actions.is_empty(), "{out:?}");
}

/// SPEC I4: CRs of ours whose pod left the selector are released, and a deleted policy
/// releases all of its CRs and decides nothing; nothing is ever deleted or flipped by it.
#[test]
fn i4_release_strays_and_on_delete() {
    let mut i = input(&[
        ("mine", pod(Some(active(600)), Some(ours(600)))),
        (
            "persons",
            pod(
                Some(active(600)),
                Some(CrState {
                    mark: None,
                    ..ours(600)
                }),
            ),
        ),
    ]);
    i.strays = vec!["left".into()];
    let out = plan(&i);
    assert_eq!(
        out.actions,
        [
            Action::Release { cr: "left".into() },
            Action::Hibernate { pod: "mine".into() }
        ]
    );
    i.deleting = true;
    let out = plan(&i);
    assert_eq!(
        out.actions,
        [
            Action::Release { cr: "left".into() },
            Action::Release { cr: "mine".into() }
        ]
    );
}
