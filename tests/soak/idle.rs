//! Idle policies in the soak (I2, I3): a share of the pods is selected by one
//! CocoonIdlePolicy (`idleAfter` 1m, `minAwake` 30s) instead of being driven by the load.
//! Each sends heartbeats (one Lease patch, as an agent does) every 5–20 s, drawn from the
//! seed, from before the policy exists: every decision the policy takes, in the warm-up
//! too, meets pods that report, so a policy that misread activity hibernates a pod with
//! a fresh heartbeat and is caught (with heartbeats only from the faults' start, such a
//! policy put every pod to sleep in the warm-up, before any heartbeat, unseen). Half of
//! them stop at a random moment in the first half of the faults, so the
//! policy puts them to sleep during the faults or just after; the others heartbeat
//! through the faults and then mark themselves busy for an hour (as `kubectl cocoon
//! keepalive` does), so they stay awake and the policy's status settles for the quiet
//! minute.
//!
//! The invariant, I3: no pod that reported activity within `idleAfter` is hibernated by
//! the policy. Judged from the harness's own record of each heartbeat it saw
//! acknowledged (the `renewTime` it wrote, and when the answer came) against the
//! decision's instant, the CR's `idle-at` mark: a heartbeat answered before the
//! decision's instant is in the Lease before the take, so either the decision read it
//! (then the pod was not idle) or the take failed (nothing flipped). A heartbeat answered
//! after that instant may have raced the take and is not judged (no false alarms). The
//! heartbeats are direct Lease patches, not coalesced, so no coalescing allowance is
//! needed; a heartbeat whose answer was lost (a fault) is not recorded, which can only
//! leave a violation unseen, never invent one.

use crate::observer::Verdict;
use cocoon_hibernation::api::activity::{ACTIVITY_FOR, BUSY_UNTIL, lease_name};
use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use cocoon_hibernation::idle::CocoonIdlePolicy;
use cocoon_hibernation::idle::plan::{IDLE_AT, IDLE_DESIRE};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The policy's `idleAfter`: the shortest I1 allows.
pub const IDLE_AFTER: Duration = Duration::from_secs(60);
/// The label the policy selects.
const LABEL: &str = "soak-idle";
/// The one idle policy the soak creates.
const POLICY: &str = "soak-idle";

pub fn pod_name(i: usize) -> String {
    format!("q-{i:04}")
}

/// How many of `crs` load pods get an idle twin: a sixth, at least two.
pub fn count(crs: usize) -> usize {
    (crs / 6).max(2)
}

/// Each heartbeat seen acknowledged: the `renewTime` written and when the answer came.
pub type Log = Arc<Mutex<HashMap<String, Vec<(Timestamp, Timestamp)>>>>;

/// Pods whose heartbeats stop (they go to sleep); the others end busy.
pub fn stops(i: usize) -> bool {
    i.is_multiple_of(2)
}

/// Labels the pod for the policy.
pub async fn label(pods: &Api<k8s_openapi::api::core::v1::Pod>, name: &str) -> kube::Result<()> {
    let patch = serde_json::json!({ "metadata": { "labels": { LABEL: "yes" } } });
    pods.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
}

pub async fn create_policy(client: &kube::Client, ns: &str) -> kube::Result<()> {
    let api: Api<CocoonIdlePolicy> = Api::namespaced(client.clone(), ns);
    let policy: CocoonIdlePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1alpha1", "kind": "CocoonIdlePolicy",
        "metadata": { "name": POLICY },
        "spec": { "selector": { "matchLabels": { LABEL: "yes" } },
                  "idleAfter": "1m", "minAwake": "30s" },
    }))
    .map_err(kube::Error::SerdeError)?;
    api.create(&PostParams::default(), &policy)
        .await
        .map(|_| ())
}

/// Waits, at most `within`, until the apiserver serves the policy again: for a while
/// after its restart it may answer 503 for it, and the product's status write for the
/// policy is then still owed.
pub async fn wait_policy_served(client: &kube::Client, ns: &str, within: Duration) {
    let api: Api<CocoonIdlePolicy> = Api::namespaced(client.clone(), ns);
    let deadline = Instant::now() + within;
    while api.get_status(POLICY).await.is_err() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// One heartbeat (or, with `busy`, the busy mark too); creates the Lease, labelled as the
/// policy labels it (its watch sees only those), when the policy has not yet. `Ok` with
/// the `renewTime` written once the apiserver answered.
async fn beat(leases: &Api<Lease>, pod: &str, busy: Option<Timestamp>) -> kube::Result<Timestamp> {
    let name = lease_name(pod).unwrap_or_default();
    let now = Timestamp::now();
    let mut patch = serde_json::json!({ "spec": { "renewTime": MicroTime(now), "holderIdentity": "soak-agent" } });
    if let Some(until) = busy {
        patch["metadata"] = serde_json::json!({ "annotations": { BUSY_UNTIL: until.to_string() } });
    }
    match leases
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Err(kube::Error::Api(e)) if e.code == 404 => {
            let mut lease: Lease =
                serde_json::from_value(patch).map_err(kube::Error::SerdeError)?;
            lease.metadata.name = Some(name);
            lease.metadata.labels = Some([(ACTIVITY_FOR.to_owned(), pod.to_owned())].into());
            leases.create(&PostParams::default(), &lease).await?;
        }
        other => {
            other?;
        }
    }
    Ok(now)
}

/// The heartbeats of `n` idle pods, from now (the first at once) until their stop, drawn
/// from `seed` and counted from the faults' start (`faults`, set when they start).
pub fn spawn_heartbeats(
    client: kube::Client,
    ns: String,
    n: usize,
    faults: Arc<OnceLock<Instant>>,
    chaos: Duration,
    seed: u64,
    log: Log,
) -> tokio::task::JoinSet<()> {
    let mut tasks = tokio::task::JoinSet::new();
    let mut rng = StdRng::seed_from_u64(seed);
    for i in 0..n {
        let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
        let stop = if stops(i) {
            chaos.mul_f64(rng.random_range(0.05..0.5))
        } else {
            chaos
        };
        let mut rng = StdRng::seed_from_u64(rng.random());
        let log = log.clone();
        let faults = faults.clone();
        tasks.spawn(async move {
            let pod = pod_name(i);
            let mut gap = Duration::ZERO;
            loop {
                tokio::time::sleep(gap).await;
                gap = Duration::from_millis(rng.random_range(5_000..20_000));
                if faults.get().is_some_and(|start| start.elapsed() >= stop) {
                    break;
                }
                if let Ok(renew) = beat(&leases, &pod, None).await {
                    log.lock()
                        .unwrap()
                        .entry(pod.clone())
                        .or_default()
                        .push((renew, Timestamp::now()));
                }
            }
            if stops(i) {
                return;
            }
            // The others end busy for an hour, retried through a fault.
            let until = Timestamp::now() + SignedDuration::from_hours(1);
            for _ in 0..30 {
                if let Ok(renew) = beat(&leases, &pod, Some(until)).await {
                    log.lock()
                        .unwrap()
                        .entry(pod.clone())
                        .or_default()
                        .push((renew, Timestamp::now()));
                    return;
                }
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        });
    }
    tasks
}

/// Waits until every pod whose heartbeats stopped is Hibernated by the policy (they
/// turn idle at most `idleAfter` after their last heartbeat); how many are not.
pub async fn wait_asleep(crs: &Api<CocoonHibernation>, n: usize, within: Duration) -> Vec<String> {
    let until = Instant::now() + within;
    loop {
        let mut pending = Vec::new();
        for i in (0..n).filter(|i| stops(*i)) {
            let name = pod_name(i);
            let asleep = crs.get_opt(&name).await.ok().flatten().is_some_and(|cr| {
                cr.spec.desire == Desire::Hibernate && cr.phase() == Some(Phase::Hibernated)
            });
            if !asleep {
                pending.push(name);
            }
        }
        if pending.is_empty() || Instant::now() > until {
            return pending;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// I3 over the idle pods' CRs and the heartbeat log (pure).
pub fn judge(
    crs: &[CocoonHibernation],
    log: &HashMap<String, Vec<(Timestamp, Timestamp)>>,
) -> Verdict {
    let mut v = Verdict::new(
        "I3",
        "no pod that reported activity within idleAfter (a heartbeat answered before the decision) is hibernated by its idle policy",
    );
    let idle_after = SignedDuration::try_from(IDLE_AFTER).unwrap_or(SignedDuration::MAX);
    for cr in crs {
        let name = cr.name_any();
        v.checked += 1;
        let ann = cr.annotations();
        if ann.get(IDLE_DESIRE).map(String::as_str) != Some("Hibernate") {
            if cr.spec.desire == Desire::Hibernate {
                v.violations
                    .push(format!("{name}: Hibernate without the idle policy's mark"));
            }
            continue;
        }
        let Some(decided) = ann.get(IDLE_AT).and_then(|a| a.parse::<Timestamp>().ok()) else {
            v.violations.push(format!(
                "{name}: the idle policy's mark has no readable instant"
            ));
            continue;
        };
        let fresh =
            log.get(&name).into_iter().flatten().find(|(renew, acked)| {
                *acked < decided && decided.duration_since(*renew) < idle_after
            });
        if let Some((renew, acked)) = fresh {
            v.violations.push(format!(
                "{name}: hibernated by the policy at {decided}, though a heartbeat of {renew} was answered at {acked}, within idleAfter"
            ));
        }
    }
    v
}

/// For the log: how many pods the policy hibernated, and the heartbeats recorded.
pub fn summary(
    crs: &[CocoonHibernation],
    log: &HashMap<String, Vec<(Timestamp, Timestamp)>>,
) -> String {
    let hibernated = crs
        .iter()
        .filter(|cr| cr.annotations().get(IDLE_DESIRE).map(String::as_str) == Some("Hibernate"))
        .count();
    let beats: usize = log.values().map(Vec::len).sum();
    format!(
        "idle policy: {hibernated} of {} pods hibernated; {beats} heartbeats answered",
        crs.len()
    )
}

/// The judge on hand-made cases, before any cluster starts.
pub fn self_check() -> Vec<String> {
    let t = |s: &str| s.parse::<Timestamp>().unwrap();
    let cr = |name: &str, at: Option<&str>| -> CocoonHibernation {
        let desire = if at.is_some() {
            Desire::Hibernate
        } else {
            Desire::Wake
        };
        let mut c = testkit::product::new_cr(name, name, desire);
        if let Some(at) = at {
            c.metadata.annotations = Some(
                [
                    (IDLE_DESIRE.to_owned(), "Hibernate".to_owned()),
                    (IDLE_AT.to_owned(), at.to_owned()),
                ]
                .into(),
            );
        }
        c
    };
    let log = HashMap::from([
        // Answered before the decision, 30 s before it: a violation.
        (
            "a".to_owned(),
            vec![(t("2026-01-01T00:00:30Z"), t("2026-01-01T00:00:31Z"))],
        ),
        // Answered after the decision began: may have raced the take, not judged.
        (
            "b".to_owned(),
            vec![(t("2026-01-01T00:00:59Z"), t("2026-01-01T00:01:00.5Z"))],
        ),
        // Old enough: idle.
        (
            "c".to_owned(),
            vec![(t("2025-12-31T23:59:00Z"), t("2025-12-31T23:59:01Z"))],
        ),
    ]);
    let at = Some("2026-01-01T00:01:00Z");
    let v = judge(
        &[cr("a", at), cr("b", at), cr("c", at), cr("d", None)],
        &log,
    );
    let mut failures = Vec::new();
    if v.checked != 4 {
        failures.push(format!("I3 self-check: checked {} of 4", v.checked));
    }
    if v.violations.len() != 1 || !v.violations[0].starts_with("a:") {
        failures.push(format!(
            "I3 self-check: want one violation for a, got {:?}",
            v.violations
        ));
    }
    failures
}
