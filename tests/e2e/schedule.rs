//! End-to-end: CocoonHibernationSchedule (K1–K8) on the real control plane. The product
//! runs with `--schedule-clock-offset` (testing only), so its clock reads shortly before a
//! boundary and no test waits for a real hour.

use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use cocoon_hibernation::schedule::plan::{SCHEDULE_BOUNDARY, SCHEDULE_LABEL};
use cocoon_hibernation::schedule::spec::{
    AwakeWindow, CocoonHibernationSchedule, CocoonHibernationScheduleSpec, OnDelete,
};
use env::{Env, LONG, Setup, setup};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use product::eventually;
use std::collections::BTreeMap;
use std::time::Duration;
use testkit::{cluster, env, product};

/// The product's clock, given the offset it was started with.
struct SimClock(SignedDuration);

impl SimClock {
    /// An offset putting the product's now `lead` before `at`.
    fn before(at: Timestamp, lead: Duration) -> Self {
        let lead = SignedDuration::try_from(lead).unwrap();
        Self(at.duration_since(Timestamp::now()) - lead)
    }

    fn flag(&self) -> String {
        let secs = self.0.as_secs();
        if secs < 0 {
            format!("--schedule-clock-offset=-{}s", -secs)
        } else {
            format!("--schedule-clock-offset={secs}s")
        }
    }

    fn now(&self) -> Timestamp {
        Timestamp::now().checked_add(self.0).unwrap()
    }

    async fn sleep_until(&self, at: Timestamp) {
        let left = at.duration_since(self.now());
        if let Ok(d) = Duration::try_from(left) {
            tokio::time::sleep(d).await;
        }
    }
}

fn ts(s: &str) -> Timestamp {
    s.parse().unwrap()
}

async fn labelled_pods(env: &Env, names: &[String], tier: &str) {
    for name in names {
        env.pod(name).await;
        let patch = serde_json::json!({ "metadata": { "labels": { "tier": tier } } });
        env.pods
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
}

fn schedule(
    name: &str,
    tier: &str,
    windows: &[(&str, &str)],
    max_in_flight: Option<u32>,
) -> CocoonHibernationSchedule {
    CocoonHibernationSchedule::new(
        name,
        CocoonHibernationScheduleSpec {
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([("tier".to_owned(), tier.to_owned())])),
                ..LabelSelector::default()
            },
            time_zone: "UTC".into(),
            awake: windows
                .iter()
                .map(|(from, to)| AwakeWindow {
                    days: Vec::new(),
                    from: (*from).into(),
                    to: (*to).into(),
                })
                .collect(),
            wake_lead: None,
            max_in_flight,
            suspend: false,
            on_delete: OnDelete::Orphan,
            always_asleep: false,
        },
    )
}

fn moving(cr: &CocoonHibernation) -> bool {
    let settled = match cr.spec.desire {
        Desire::Hibernate => Phase::Hibernated,
        _ => Phase::Active,
    };
    cr.phase() != Some(settled)
}

/// Polls until every CR is settled at `desire`, asserting at each look that at most
/// `max` are in flight (K7).
async fn settle_within_budget(crs: &Api<CocoonHibernation>, n: usize, desire: Desire, max: usize) {
    eventually(
        &format!("{n} CRs settled at {desire:?}"),
        Duration::from_secs(120),
        || async {
            let list = crs.list(&ListParams::default()).await.ok()?.items;
            let in_flight = list.iter().filter(|cr| moving(cr)).count();
            assert!(
                in_flight <= max,
                "{in_flight} CRs in flight, maxInFlight {max}"
            );
            let settled = list
                .iter()
                .filter(|cr| cr.spec.desire == desire && !moving(cr))
                .count();
            (settled == n).then_some(())
        },
    )
    .await;
}

/// K2 K4 K5 K7 K8: twenty pods follow the calendar: created awake, hibernated at the
/// boundary within maxInFlight with one write each, a manual wake kept until the next
/// boundary, the wake boundary passed while the product was stopped applied on its
/// return, and not one CR deleted, not even by deleting the schedule.
///
/// The product's clock jumps only while it is stopped (a restart with a new offset), so
/// no test waits on the real clock for more than a few seconds and a slow setup can never
/// race the first boundary.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_k2_k4_k5_k7_twenty_pods_follow_the_calendar() {
    // A Monday; the windows are 06:00-10:00 and 10:03-10:04 UTC.
    let (hibernate_at, wake_at) = (ts("2030-01-07T10:00:00Z"), ts("2030-01-07T10:03:00Z"));
    let clock = SimClock::before(hibernate_at, Duration::from_secs(600));
    let mut env = setup(
        "schedule",
        Setup {
            hibernate_delay: Duration::from_secs(1),
            wake_delay: Duration::from_secs(1),
            extra_args: vec![clock.flag()],
            ..Setup::default()
        },
    )
    .await;
    let names: Vec<String> = (0..20).map(|i| format!("web-{i:02}")).collect();
    labelled_pods(&env, &names, "web").await;
    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    let office = schedule(
        "office",
        "web",
        &[("06:00", "10:00"), ("10:03", "10:04")],
        Some(5),
    );
    schedules
        .create(&PostParams::default(), &office)
        .await
        .unwrap();

    // K4: one CR per pod, created awake (the window is open), within maxInFlight.
    settle_within_budget(&env.crs, 20, Desire::Wake, 5).await;
    let uids: BTreeMap<String, String> = env
        .crs
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .iter()
        .map(|cr| (cr.name_any(), cr.uid().unwrap()))
        .collect();
    assert_eq!(uids.len(), 20);
    let s = eventually("status counts 20 managed", LONG, || async {
        let s = schedules.get("office").await.ok()?.status?;
        (s.managed == 20).then_some(s)
    })
    .await;
    assert_eq!(s.window.as_deref(), Some("Awake"));
    assert_eq!(s.next_boundary.map(|t| t.0), Some(hibernate_at));

    // K2 K7: the boundary, passed while running, hibernates all twenty, at most five at a
    // time. The restart only moves the clock to just before it.
    let clock = SimClock::before(hibernate_at, Duration::from_secs(5));
    env.product.restart_with(&clock.flag()).await;
    clock.sleep_until(hibernate_at).await;
    settle_within_budget(&env.crs, 20, Desire::Hibernate, 5).await;
    let flips = env
        .product
        .metric(r#"cocoon_hibernation_schedule_writes_total{kind="flip"}"#);
    assert_eq!(flips, 20.0, "one write per pod for the boundary");

    // K5: a manual wake is kept until the next boundary.
    product::set_desire(&env.crs, "web-00", Desire::Wake).await;
    eventually("the override is counted", LONG, || async {
        let s = schedules.get("office").await.ok()?.status?;
        (s.overridden == 1 && s.managed == 19).then_some(())
    })
    .await;
    env.wait_events("office", &["ScheduledHibernate", "OverrideKept"])
        .await;
    tokio::time::sleep(Duration::from_secs(7)).await;
    assert_eq!(
        env.crs.get("web-00").await.unwrap().spec.desire,
        Desire::Wake
    );

    // K2: stopped across the wake boundary; nothing changes while down...
    assert!(
        clock.now() < wake_at - SignedDuration::from_secs(5),
        "too slow to stop before the wake boundary: {}",
        clock.now()
    );
    env.product.kill9();
    let hibernating = env.crs.list(&ListParams::default()).await.unwrap().items;
    assert_eq!(
        hibernating
            .iter()
            .filter(|cr| cr.spec.desire == Desire::Hibernate)
            .count(),
        19
    );
    // ...and the missed boundary is applied on return, once.
    let clock = SimClock::before(wake_at + SignedDuration::from_secs(5), Duration::ZERO);
    env.product.restart_with(&clock.flag()).await;
    settle_within_budget(&env.crs, 20, Desire::Wake, 5).await;
    let s = eventually("the wake boundary is recorded", LONG, || async {
        let s = schedules.get("office").await.ok()?.status?;
        (s.last_applied_boundary.as_ref().map(|t| t.0) == Some(wake_at) && s.managed == 20)
            .then_some(s)
    })
    .await;
    assert_eq!(s.overridden, 0, "the override ended at the boundary");
    let web0 = env.crs.get("web-00").await.unwrap();
    assert_eq!(
        web0.annotations().get(SCHEDULE_BOUNDARY),
        Some(&wake_at.to_string()),
        "web-00 is managed again"
    );
    env.wait_events("office", &["ScheduledWake"]).await;

    // K4: deleting the schedule releases the CRs; none is ever deleted.
    schedules
        .delete("office", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the schedule is gone", LONG, || async {
        schedules
            .get_opt("office")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let after = env.crs.list(&ListParams::default()).await.unwrap().items;
    let after_uids: BTreeMap<String, String> = after
        .iter()
        .map(|cr| (cr.name_any(), cr.uid().unwrap()))
        .collect();
    assert_eq!(
        after_uids, uids,
        "the same twenty CRs, none deleted or replaced"
    );
    for cr in &after {
        assert!(cr.metadata.deletion_timestamp.is_none());
        assert!(!cr.labels().contains_key(SCHEDULE_LABEL), "released");
    }
}

/// K6 K4 K8: of two schedules selecting the same pods, the older drives them and the
/// younger reports Conflict and writes nothing; a CR made by hand is never adopted;
/// `kubectl get chs` shows the window, the next boundary and the counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_k6_k4_overlapping_schedules_the_younger_reports_conflict() {
    let env = setup("schedule-k6", Setup::default()).await;
    let names: Vec<String> = (0..3).map(|i| format!("web-{i}")).collect();
    labelled_pods(&env, &names, "web").await;
    labelled_pods(&env, &["hand".to_owned()], "web").await;
    product::create_cr(&env.crs, "hand", "hand", Desire::Hibernate).await;
    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    // Awake except 03:00-03:01: a boundary exists, and the pods stay awake meanwhile.
    let windows = [("03:01", "03:00")];
    schedules
        .create(
            &PostParams::default(),
            &schedule("old", "web", &windows, None),
        )
        .await
        .unwrap();
    eventually("old drives the three", LONG, || async {
        let s = schedules.get("old").await.ok()?.status?;
        (s.managed == 3 && s.overridden == 1).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    schedules
        .create(
            &PostParams::default(),
            &schedule("young", "web", &windows, None),
        )
        .await
        .unwrap();
    let s = eventually("young reports the conflicts", LONG, || async {
        let s = schedules.get("young").await.ok()?.status?;
        (s.conflicting == 4).then_some(s)
    })
    .await;
    assert_eq!(s.managed, 0);
    assert!(
        s.conflicts.iter().any(|c| c == "web-0 (driven by old)"),
        "{:?}",
        s.conflicts
    );
    for name in &names {
        let cr = env.crs.get(name).await.unwrap();
        assert_eq!(
            cr.labels().get(SCHEDULE_LABEL).map(String::as_str),
            Some("old")
        );
    }
    let hand = env.crs.get("hand").await.unwrap();
    assert!(!hand.labels().contains_key(SCHEDULE_LABEL), "never adopted");
    assert_eq!(hand.spec.desire, Desire::Hibernate);

    let out = cluster::cluster().kubectl(&["-n", &env.ns, "get", "chs"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    let header = text.lines().next().unwrap_or_default();
    for column in [
        "ZONE",
        "WINDOW",
        "NEXT",
        "MANAGED",
        "OVERRIDDEN",
        "CONFLICTING",
    ] {
        assert!(header.contains(column), "{column} missing: {text}");
    }
    assert!(text.contains("Awake"), "{text}");
}

/// K1: the apiserver sends schedules to the webhook, which refuses a time zone the bundled
/// database does not know; a good one (a zone with a 30-minute shift) passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_k1_admission_refuses_an_unknown_time_zone() {
    let env = setup("schedule-k1", Setup::default()).await;
    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    let mut bad = schedule("bad", "web", &[("09:00", "17:00")], None);
    bad.spec.time_zone = "Mars/Olympus_Mons".into();
    let err = schedules
        .create(&PostParams::default(), &bad)
        .await
        .expect_err("an unknown zone must be refused");
    let text = err.to_string();
    assert!(text.contains("spec.timeZone"), "{text}");
    let mut good = schedule("good", "web", &[("09:00", "24:00")], None);
    good.spec.time_zone = "Australia/Lord_Howe".into();
    schedules
        .create(&PostParams::default(), &good)
        .await
        .expect("a valid schedule is admitted");
}

/// K9: a schedule whose `awake` is empty (with an empty selector: every VM pod of the
/// namespace, for ever) is refused by the webhook through the real apiserver, unless
/// `alwaysAsleep: true` says so; `alwaysAsleep` with a window is refused too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_k9_admission_refuses_asleep_for_ever_unless_explicit() {
    let env = setup("schedule-k9a", Setup::default()).await;
    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    let mut never = schedule("never", "web", &[], None);
    never.spec.selector = LabelSelector::default();
    let err = schedules
        .create(&PostParams::default(), &never)
        .await
        .expect_err("an empty awake without consent must be refused");
    let text = err.to_string();
    assert!(
        text.contains("spec.awake is empty") && text.contains("every VM pod of this namespace"),
        "{text}"
    );
    let mut both = schedule("both", "web", &[("09:00", "17:00")], None);
    both.spec.always_asleep = true;
    let err = schedules
        .create(&PostParams::default(), &both)
        .await
        .expect_err("alwaysAsleep with a window must be refused");
    assert!(err.to_string().contains("spec.alwaysAsleep"), "{err}");
    never.spec.always_asleep = true;
    schedules
        .create(&PostParams::default(), &never)
        .await
        .expect("an explicit alwaysAsleep is admitted");
    // Dropping the consent later is refused as well (the webhook sees spec changes).
    let patch = serde_json::json!({ "spec": { "alwaysAsleep": false } });
    let err = schedules
        .patch("never", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect_err("an UPDATE dropping the consent must be refused");
    assert!(err.to_string().contains("spec.awake is empty"), "{err}");
}

/// K9: a schedule reacts within seconds, not at its 30 s resync, to a selected pod
/// appearing (it creates the pod's CR) and to a CR appearing (a hand-made CR on a pod
/// of a suspended schedule counts as overridden). Each arrives after the schedule's
/// passes have gone quiet, so only the arrival can wake it in time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_k9_a_pod_or_cr_arriving_is_acted_on_within_seconds() {
    const BOUND: Duration = Duration::from_secs(10);
    let env = setup("schedule-k9r", Setup::default()).await;
    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    // Awake except 03:00-03:01 UTC: no boundary near enough to requeue a pass in time.
    let windows = [("03:01", "03:00")];
    let mut hands = schedule("hands", "hand", &windows, None);
    hands.spec.suspend = true;
    for s in [schedule("office", "web", &windows, None), hands] {
        schedules.create(&PostParams::default(), &s).await.unwrap();
    }
    labelled_pods(&env, &["hand-0".to_owned()], "hand").await;
    for name in ["office", "hands"] {
        eventually(&format!("{name}'s first pass"), LONG, || async {
            let s = schedules.get(name).await.ok()?.status?;
            s.window.is_some().then_some(())
        })
        .await;
    }
    // Let the passes that follow each schedule's own status write end.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let t0 = std::time::Instant::now();
    labelled_pods(&env, &["late-0".to_owned()], "web").await;
    let cr = eventually("the late pod's CR", BOUND, || async {
        env.crs.get_opt("late-0").await.ok()?
    })
    .await;
    assert_eq!(
        cr.labels().get(SCHEDULE_LABEL).map(String::as_str),
        Some("office")
    );
    eprintln!("K9: CR of a new selected pod after {:?}", t0.elapsed());

    let t0 = std::time::Instant::now();
    product::create_cr(&env.crs, "hand-0", "hand-0", Desire::Hibernate).await;
    eventually("the hand-made CR counted as overridden", BOUND, || async {
        let s = schedules.get("hands").await.ok()?.status?;
        (s.overridden == 1).then_some(())
    })
    .await;
    eprintln!("K9: a new CR counted after {:?}", t0.elapsed());
}

/// K9: a running schedule hears the cache's changes as they come, not at its 30 s
/// resync: a new pod matching its selector gets its CR within 5 s, and a person changing
/// that CR's desire is counted as an override within 5 s. Each change comes after the
/// schedule's passes have gone quiet, so a schedule that only looked at its resync (or at
/// pods and CRs appearing) would take up to 30 s and fail the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_k9_a_new_selected_pod_gets_its_cr_within_5s() {
    const BOUND: Duration = Duration::from_secs(5);
    let env = setup("schedule-k9-5s", Setup::default()).await;
    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    // Awake except 03:00-03:01 UTC: no boundary near enough to requeue a pass in time.
    let office = schedule("office", "web", &[("03:01", "03:00")], None);
    schedules
        .create(&PostParams::default(), &office)
        .await
        .unwrap();
    eventually("the schedule's first pass", LONG, || async {
        let s = schedules.get("office").await.ok()?.status?;
        s.window.is_some().then_some(())
    })
    .await;
    // Let the passes that follow the schedule's own status write end.
    tokio::time::sleep(Duration::from_secs(3)).await;

    let t0 = std::time::Instant::now();
    labelled_pods(&env, &["new-0".to_owned()], "web").await;
    let cr = eventually("the new pod's CR", Duration::from_secs(30), || async {
        env.crs.get_opt("new-0").await.ok()?
    })
    .await;
    let elapsed = t0.elapsed();
    eprintln!("K9: CR of a new selected pod after {elapsed:?}");
    assert!(elapsed < BOUND, "the new pod's CR came after {elapsed:?}");
    assert_eq!(
        cr.labels().get(SCHEDULE_LABEL).map(String::as_str),
        Some("office")
    );
    assert_eq!(cr.spec.desire, Desire::Wake);

    eventually("the CR settled", LONG, || async {
        let cr = env.crs.get("new-0").await.ok()?;
        (cr.phase() == Some(Phase::Active)).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let t0 = std::time::Instant::now();
    product::set_desire(&env.crs, "new-0", Desire::Hibernate).await;
    eventually("the override counted", Duration::from_secs(30), || async {
        let s = schedules.get("office").await.ok()?.status?;
        (s.overridden == 1).then_some(())
    })
    .await;
    let elapsed = t0.elapsed();
    eprintln!("K9: a changed CR counted after {elapsed:?}");
    assert!(
        elapsed < BOUND,
        "the override was counted after {elapsed:?}"
    );
}

/// K9 K4: where admission did not run (no webhook), a schedule changed to `awake: []`
/// without `alwaysAsleep` is not acted on: it reports `InvalidSpec` and leaves its CR's
/// desire alone; deleting it still releases the CR (its finalizer does not hang on the
/// invalid spec), and never deletes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_k9_k4_an_unconsented_empty_awake_writes_nothing_and_still_releases() {
    let env = setup(
        "schedule-k9c",
        Setup {
            webhook: false,
            ..Setup::default()
        },
    )
    .await;
    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    labelled_pods(&env, &["web-0".to_owned()], "web").await;
    schedules
        .create(
            &PostParams::default(),
            &schedule("office", "web", &[("03:01", "03:00")], None),
        )
        .await
        .unwrap();
    let cr = eventually("the schedule's CR, awake", LONG, || async {
        let cr = env.crs.get_opt("web-0").await.ok()??;
        (cr.spec.desire == Desire::Wake && cr.labels().contains_key(SCHEDULE_LABEL)).then_some(cr)
    })
    .await;
    let patch = serde_json::json!({ "spec": { "awake": [] } });
    schedules
        .patch("office", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("no webhook here: the apiserver admits it");
    let ready = eventually("InvalidSpec reported", LONG, || async {
        let s = schedules.get("office").await.ok()?.status?;
        s.conditions
            .into_iter()
            .find(|c| c.type_ == "Ready" && c.reason == "InvalidSpec")
    })
    .await;
    assert!(
        ready.message.contains("spec.alwaysAsleep"),
        "{}",
        ready.message
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        env.crs.get("web-0").await.unwrap().spec.desire,
        Desire::Wake,
        "never hibernated for ever without consent"
    );

    schedules
        .delete("office", &DeleteParams::default())
        .await
        .unwrap();
    eventually("the schedule is gone", LONG, || async {
        schedules
            .get_opt("office")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    let after = env.crs.get("web-0").await.unwrap();
    assert_eq!(after.uid(), cr.uid(), "the same CR, never deleted");
    assert!(!after.labels().contains_key(SCHEDULE_LABEL), "released");
}

/// P2 K1: a replica that does not hold the Lease writes nothing for a schedule (no
/// finalizer, no status, no CR for its selected pod); once the Lease is released it
/// takes it, and the gate's opening triggers the schedule's pass at once: the pod's CR
/// within seconds, with no poll and no 30 s resync to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_p2_k1_a_follower_writes_nothing_and_leading_triggers_a_pass() {
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use testkit::product::{Product, ProductOptions};
    const BOUND: Duration = Duration::from_secs(10);
    let cluster = cluster::cluster();
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let ns = cluster.fresh_namespace(&client, "schedule-gate").await;
    // Another replica holds the Lease for an hour.
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let mut lease = Lease::default();
    lease.metadata.name = Some("cocoon-hibernation".into());
    lease.spec = Some(LeaseSpec {
        holder_identity: Some("elsewhere".into()),
        lease_duration_seconds: Some(3600),
        acquire_time: Some(MicroTime(Timestamp::now())),
        renew_time: Some(MicroTime(Timestamp::now())),
        ..LeaseSpec::default()
    });
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let mut opts = ProductOptions::new(&ns, &cluster.registry);
    opts.lease = Some("cocoon-hibernation".into());
    opts.identity = Some("replica-a".into());
    let product = Product::start(cluster, &opts).await;

    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(client.clone(), &ns);
    let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    testkit::vk_sim::create_vm_pod(&client, &ns, "web-0", &format!("vm-{ns}-web-0"))
        .await
        .unwrap();
    let patch = serde_json::json!({ "metadata": { "labels": { "tier": "web" } } });
    pods.patch("web-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let office = schedule("office", "web", &[("03:01", "03:00")], None);
    schedules
        .create(&PostParams::default(), &office)
        .await
        .unwrap();

    // Long enough for the old 2 s poll to have written several times over.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(product.metric("cocoon_hibernation_leader"), 0.0);
    let s = schedules.get("office").await.unwrap();
    assert!(s.finalizers().is_empty(), "a follower added its finalizer");
    assert!(
        s.status.is_none(),
        "a follower wrote status: {:?}",
        s.status
    );
    assert!(
        crs.get_opt("web-0").await.unwrap().is_none(),
        "a follower created a CR"
    );

    // Released, as a replica does on SIGTERM: this one takes it within a retry period.
    let release = serde_json::json!({ "spec": {
        "holderIdentity": "", "leaseDurationSeconds": 1,
        "renewTime": MicroTime(Timestamp::now()) } });
    leases
        .patch(
            "cocoon-hibernation",
            &PatchParams::default(),
            &Patch::Merge(&release),
        )
        .await
        .unwrap();
    let t0 = std::time::Instant::now();
    let cr = eventually("the selected pod's CR, once leading", BOUND, || async {
        crs.get_opt("web-0").await.ok()?
    })
    .await;
    eprintln!(
        "P2: CR written {:?} after the Lease was released",
        t0.elapsed()
    );
    assert_eq!(product.metric("cocoon_hibernation_leader"), 1.0);
    assert_eq!(
        cr.labels().get(SCHEDULE_LABEL).map(String::as_str),
        Some("office")
    );
}
