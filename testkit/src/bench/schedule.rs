//! The schedule part (issue 24, K2): N pods driven by one CocoonHibernationSchedule. The
//! product runs with `--schedule-clock-offset`, so its clock reaches a hibernate boundary
//! shortly after the schedule's CRs settled awake. Measures the wall time from the
//! boundary to all N Hibernated, and the schedule's CR writes per pod for that boundary
//! (the target is one).

use super::report::{Figures, Kind};
use super::steps::create_sim_pods;
use super::{Opts, log, product_args};
use cocoon_hibernation::api::{CocoonHibernation, Phase};
use cocoon_hibernation::schedule::spec::{
    AwakeWindow, CocoonHibernationSchedule, CocoonHibernationScheduleSpec, OnDelete,
};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// A Monday; the schedule is awake 06:00–10:00 UTC, so 10:00 hibernates every pod.
const BOUNDARY: &str = "2030-01-07T10:00:00Z";

pub async fn schedule(o: &Opts, figs: &mut Figures, detail: &mut serde_json::Map<String, Value>) {
    let n = o.n;
    figs.set("sched.n", Some(n as f64), "", Kind::Info);
    let boundary: Timestamp = BOUNDARY.parse().expect("boundary");
    // Time to create the pods and let the schedule's CRs settle awake before the boundary.
    let lead = SignedDuration::from_secs(60 + i64::try_from(n / 5).unwrap_or(i64::MAX));
    let offset = boundary.duration_since(Timestamp::now()) - lead;
    let sim_now = move || Timestamp::now().checked_add(offset).expect("clock");
    let mut args = product_args();
    args.push(format!("--schedule-clock-offset={}s", offset.as_secs()));
    let env = super::bench_env(o, "bench-sched", "900s", args).await;
    let names: Vec<String> = (0..n).map(|i| format!("s-{i:05}")).collect();
    create_sim_pods(&env, &names).await;
    super::world::for_each_concurrent(names.clone(), 32, |name| {
        let pods = env.pods.clone();
        async move {
            let patch = Patch::Merge(json!({ "metadata": { "labels": { "bench": "schedule" } } }));
            let params = PatchParams::default();
            super::world::retry(&format!("label pod {name}"), || {
                pods.patch(&name, &params, &patch)
            })
            .await;
        }
    })
    .await;
    let schedules: Api<CocoonHibernationSchedule> = Api::namespaced(env.client.clone(), &env.ns);
    let spec = CocoonHibernationScheduleSpec {
        selector: LabelSelector {
            match_labels: Some(BTreeMap::from([("bench".into(), "schedule".into())])),
            ..LabelSelector::default()
        },
        time_zone: "UTC".into(),
        awake: vec![AwakeWindow {
            days: Vec::new(),
            from: "06:00".into(),
            to: "10:00".into(),
        }],
        wake_lead: None,
        max_in_flight: None,
        suspend: false,
        on_delete: OnDelete::Orphan,
        always_asleep: false,
    };
    schedules
        .create(
            &PostParams::default(),
            &CocoonHibernationSchedule::new("bench", spec),
        )
        .await
        .expect("create the schedule");
    let settle_by = boundary - SignedDuration::from_secs(5);
    let awake = count_until(&env.crs, n, Phase::Active, || sim_now() < settle_by).await;
    if awake < n {
        log(format!(
            "schedule: only {awake} of {n} CRs awake before the boundary; figures skipped"
        ));
        return;
    }
    let before = super::metrics::scrape(&env.product);
    if let Ok(left) = Duration::try_from(boundary.duration_since(sim_now())) {
        tokio::time::sleep(left).await;
    }
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(900);
    let asleep = count_until(&env.crs, n, Phase::Hibernated, || Instant::now() < deadline).await;
    let flip_s = t0.elapsed().as_secs_f64();
    let after = super::metrics::scrape(&env.product);
    let writes = super::metrics::delta(&before, &after, "cocoon_hibernation_schedule_writes_total");
    let total: f64 = writes.values().sum();
    log(format!(
        "schedule: {asleep} of {n} hibernated {flip_s:.1}s after the boundary; writes {writes:?}"
    ));
    if asleep == n {
        figs.set("sched.flip_s", Some(flip_s), "", Kind::Time);
    }
    figs.set(
        "sched.writes_per_pod",
        Some(total / n as f64),
        "",
        Kind::Count,
    );
    detail.insert("schedule_writes".into(), json!(writes));
}

/// Polls the CRs until `n` are in `phase` or `more()` says stop; how many were.
async fn count_until(
    crs: &Api<CocoonHibernation>,
    n: usize,
    phase: Phase,
    more: impl Fn() -> bool,
) -> usize {
    loop {
        let done = crs
            .list(&ListParams::default())
            .await
            .map(|l| l.items.iter().filter(|c| c.phase() == Some(phase)).count())
            .unwrap_or(0);
        if done >= n || !more() {
            return done;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
