//! End-to-end: CocoonIdlePolicy (I2–I4) on the real control plane. The product runs with
//! a clock offset (testing only), so a pod is idle at once instead of after `idleAfter`
//! of real time; a heartbeat written at the product's now keeps a pod awake.

use cocoon_hibernation::api::activity::{ACTIVITY_FOR, lease_name};
use cocoon_hibernation::api::{Desire, Phase};
use cocoon_hibernation::idle::plan::IDLE_LABEL;
use cocoon_hibernation::idle::{CocoonIdlePolicy, CocoonIdlePolicySpec};
use env::{LONG, Setup, setup};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use product::eventually;
use std::time::Duration;
use testkit::{env, product};

/// How far ahead the product's clock runs: far past `idleAfter` (1m) after any wake.
const OFFSET: SignedDuration = SignedDuration::from_mins(30);

fn product_now() -> Timestamp {
    Timestamp::now().checked_add(OFFSET).unwrap()
}

/// A VM pod the policies of these tests select (`tier: dev`).
pub(crate) async fn selected_pod(env: &env::Env, name: &str) {
    env.pod(name).await;
    let patch = serde_json::json!({ "metadata": { "labels": { "tier": "dev" } } });
    env.pods
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

fn lease(pod: &str, renewed: Timestamp) -> Lease {
    Lease {
        metadata: ObjectMeta {
            name: lease_name(pod),
            labels: Some([(ACTIVITY_FOR.to_owned(), pod.to_owned())].into()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            renew_time: Some(MicroTime(renewed)),
            ..LeaseSpec::default()
        }),
    }
}

/// I3 I4 I2: of two selected pods with no CR, the policy creates both CRs (awake, marked
/// as its own); the one nobody reports for is hibernated; the one whose agent heartbeats
/// (a Lease patch at the product's now, every 5 s) stays awake through many passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_i3_i4_an_idle_pod_sleeps_and_a_heartbeat_keeps_one_awake() {
    let env = setup(
        "idle-i3",
        Setup {
            extra_args: vec![format!("--schedule-clock-offset={}s", OFFSET.as_secs())],
            ..Setup::default()
        },
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    for name in ["quiet-0", "busy-0"] {
        selected_pod(&env, name).await;
        // Last activity an hour before the product's now.
        let old = product_now() - SignedDuration::from_hours(1);
        leases
            .create(&PostParams::default(), &lease(name, old))
            .await
            .unwrap();
    }
    let heartbeat = {
        let leases = leases.clone();
        tokio::spawn(async move {
            loop {
                let patch =
                    serde_json::json!({ "spec": { "renewTime": MicroTime(product_now()) } });
                let name = lease_name("busy-0").unwrap();
                if let Err(e) = leases
                    .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await
                {
                    eprintln!("heartbeat: {e}");
                }
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        })
    };
    let policies: Api<CocoonIdlePolicy> = Api::namespaced(env.client.clone(), &env.ns);
    let policy = CocoonIdlePolicy::new(
        "sleepy",
        CocoonIdlePolicySpec {
            selector: LabelSelector {
                match_labels: Some([("tier".to_owned(), "dev".to_owned())].into()),
                ..LabelSelector::default()
            },
            idle_after: "1m".into(),
            min_awake: Some("0s".into()),
            suspend: false,
            wake_on_request: None,
        },
    );
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();

    let cr = eventually("the quiet pod hibernated", LONG * 2, || async {
        let cr = env.crs.get_opt("quiet-0").await.ok()??;
        (cr.spec.desire == Desire::Hibernate && cr.phase() == Some(Phase::Hibernated)).then_some(cr)
    })
    .await;
    assert_eq!(
        cr.labels().get(IDLE_LABEL).map(String::as_str),
        Some("sleepy")
    );
    let taken = leases.get(&lease_name("quiet-0").unwrap()).await.unwrap();
    assert!(
        taken
            .annotations()
            .contains_key(cocoon_hibernation::api::activity::IDLE_DECISION),
        "the fence was taken before the flip"
    );
    // The busy pod: several passes later, still awake.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let busy = env.crs.get("busy-0").await.unwrap();
    assert_eq!(
        busy.spec.desire,
        Desire::Wake,
        "a heartbeating pod was hibernated"
    );
    assert_eq!(
        busy.labels().get(IDLE_LABEL).map(String::as_str),
        Some("sleepy"),
        "the policy created the busy pod's CR too"
    );
    let status = policies.get("sleepy").await.unwrap().status.unwrap();
    assert_eq!((status.managed, status.idle, status.awake), (2, 1, 1));
    heartbeat.abort();
}

/// I1: the webhook refuses an idleAfter under 1m and a route naming no pod, with both
/// reasons at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_i1_admission_refuses_a_bad_policy() {
    let env = setup("idle-i1", Setup::default()).await;
    let policies: Api<CocoonIdlePolicy> = Api::namespaced(env.client.clone(), &env.ns);
    let mut bad: CocoonIdlePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1alpha1", "kind": "CocoonIdlePolicy",
        "metadata": { "name": "bad" },
        "spec": { "selector": {}, "idleAfter": "2m",
                  "wakeOnRequest": { "http": [{ "host": "ide.example.com", "port": 80 }],
                                     "tcp": [{ "listenPort": 22, "pod": "a", "port": 22 },
                                             { "listenPort": 22, "pod": "b", "port": 22 }] } },
    }))
    .unwrap();
    let err = policies
        .create(&PostParams::default(), &bad)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("http[0]") && err.contains("tcp[1].listenPort"),
        "{err}"
    );
    bad.spec.wake_on_request = None;
    policies.create(&PostParams::default(), &bad).await.unwrap();
}

/// I3, the fence: the policy decides a pod is idle, and while its take of the Lease is
/// held on the way to the apiserver, a heartbeat lands. The take then fails (409) and
/// nothing is flipped: the CR stays `Wake`, and the passes after it see the heartbeat.
/// With the fence removed (the flip made whatever the take's answer), this test fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_i3_a_heartbeat_between_the_read_and_the_take_flips_nothing() {
    use crate::partition::{fresh_namespace, product_tap, quick_sim, via};
    use testkit::api_tap::Kind;
    let (cluster, client, ns) = fresh_namespace("idle-fence").await;
    let tap = product_tap(cluster).await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = product::ProductOptions::new(&ns, &cluster.registry);
    opts.extra_args
        .push(format!("--schedule-clock-offset={}s", OFFSET.as_secs()));
    let opts = via(cluster, opts, &tap.url(), dir.path()).await;
    let _sim = quick_sim(cluster, &client, &ns);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let crs: Api<cocoon_hibernation::api::CocoonHibernation> = Api::namespaced(client.clone(), &ns);
    testkit::vk_sim::create_vm_pod(&client, &ns, "agent-0", &format!("vm-{ns}-agent-0"))
        .await
        .unwrap();
    let patch = serde_json::json!({ "metadata": { "labels": { "tier": "dev" } } });
    pods.patch("agent-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let old = product_now() - SignedDuration::from_hours(1);
    leases
        .create(&PostParams::default(), &lease("agent-0", old))
        .await
        .unwrap();
    tap.hold_activity_takes(true);
    let _product = product::Product::start(cluster, &opts).await;
    let policies: Api<CocoonIdlePolicy> = Api::namespaced(client.clone(), &ns);
    let mut policy: CocoonIdlePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1alpha1", "kind": "CocoonIdlePolicy",
        "metadata": { "name": "sleepy" },
        "spec": { "selector": { "matchLabels": { "tier": "dev" } }, "idleAfter": "1m",
                  "minAwake": "0s" },
    }))
    .unwrap();
    policy.metadata.namespace = Some(ns.clone());
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();

    // The decision is made and its take is on its way: held.
    eventually("the idle decision's take", LONG, || async {
        (tap.takes_held() >= 1).then_some(())
    })
    .await;
    // The heartbeat, straight to the apiserver, then the take goes on.
    let beat = serde_json::json!({ "spec": { "renewTime": MicroTime(product_now()) } });
    leases
        .patch(
            &lease_name("agent-0").unwrap(),
            &PatchParams::default(),
            &Patch::Merge(&beat),
        )
        .await
        .unwrap();
    tap.hold_activity_takes(false);

    eventually("the take answered 409", Duration::from_secs(10), || async {
        tap.calls()
            .iter()
            .any(|c| {
                c.kind == Kind::LeaseWrite && c.path.contains("cocoon-activity-") && c.status == 409
            })
            .then_some(())
    })
    .await;
    // Passes after it see the heartbeat; nothing was flipped.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let cr = crs.get("agent-0").await.unwrap();
    assert_eq!(
        cr.spec.desire,
        Desire::Wake,
        "the pod was hibernated after a heartbeat"
    );
    let taken = tap
        .calls()
        .iter()
        .filter(|c| {
            c.kind == Kind::LeaseWrite && c.path.contains("cocoon-activity-") && c.status == 200
        })
        .count();
    assert_eq!(taken, 0, "no take succeeded");
}

/// I4 with a schedule and a person on the same pods: the pod a schedule selects gets its
/// CR from the schedule (the idle policy waits for it), and inside the schedule's awake
/// window the idle policy hibernates it when idle, which the schedule then counts as an
/// override; a person's CR on a selected pod is never touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_i4_k5_a_schedule_and_a_person_share_pods_with_an_idle_policy() {
    use cocoon_hibernation::schedule::CocoonHibernationSchedule;
    use cocoon_hibernation::schedule::plan::SCHEDULE_LABEL;
    let env = setup(
        "idle-i4",
        Setup {
            extra_args: vec![format!("--schedule-clock-offset={}s", OFFSET.as_secs())],
            ..Setup::default()
        },
    )
    .await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    for (name, tier) in [("sched-0", "office"), ("hand-0", "dev")] {
        env.pod(name).await;
        let patch =
            serde_json::json!({ "metadata": { "labels": { "tier": tier, "idle": "yes" } } });
        env.pods
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        let old = product_now() - SignedDuration::from_hours(1);
        leases
            .create(&PostParams::default(), &lease(name, old))
            .await
            .unwrap();
    }
    product::create_cr(&env.crs, "hand-0", "hand-0", Desire::Wake).await;
    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    let office: CocoonHibernationSchedule = serde_json::from_value(serde_json::json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1alpha1", "kind": "CocoonHibernationSchedule",
        "metadata": { "name": "office" },
        "spec": { "selector": { "matchLabels": { "tier": "office" } }, "timeZone": "UTC",
                  "awake": [{ "from": "00:00", "to": "24:00" }] },
    }))
    .unwrap();
    schedules
        .create(&PostParams::default(), &office)
        .await
        .unwrap();
    let policies: Api<CocoonIdlePolicy> = Api::namespaced(env.client.clone(), &env.ns);
    let policy: CocoonIdlePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1alpha1", "kind": "CocoonIdlePolicy",
        "metadata": { "name": "sleepy" },
        "spec": { "selector": { "matchLabels": { "idle": "yes" } }, "idleAfter": "1m",
                  "minAwake": "0s" },
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();

    let cr = eventually("the scheduled pod idle-hibernated", LONG * 2, || async {
        let cr = env.crs.get_opt("sched-0").await.ok()??;
        (cr.spec.desire == Desire::Hibernate).then_some(cr)
    })
    .await;
    assert_eq!(
        cr.labels().get(SCHEDULE_LABEL).map(String::as_str),
        Some("office"),
        "the schedule made the CR"
    );
    assert_eq!(
        cr.labels().get(IDLE_LABEL).map(String::as_str),
        Some("sleepy"),
        "the idle policy flipped it"
    );
    eventually(
        "the schedule counts the idle flip as an override",
        LONG,
        || async {
            let s = schedules.get("office").await.ok()?.status?;
            (s.overridden == 1).then_some(())
        },
    )
    .await;
    // A few passes later, the person's CR is as the person left it.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let hand = env.crs.get("hand-0").await.unwrap();
    assert_eq!(hand.spec.desire, Desire::Wake);
    assert!(
        !hand.labels().contains_key(IDLE_LABEL),
        "a person's CR was adopted"
    );
    let status = policies.get("sleepy").await.unwrap().status.unwrap();
    assert_eq!((status.managed, status.idle), (1, 1));
}
