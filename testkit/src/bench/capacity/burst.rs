//! One burst: B CRs of the population flipped to `Hibernate` at once, then, once all are
//! `Hibernated`, flipped back to `Wake` at once; measured from the first flip to the
//! last `Active`.

use super::super::overhead::Round;
use super::super::report;
use super::super::steps::{latest, passes_quiet, reactions};
use super::super::world::{self, PodDone, Watches};
use super::super::{log, metrics};
use super::apiserver;
use super::population::name;
use super::procs::{self, Procs};
use super::step::Step;
use crate::env::Env;
use crate::vk_sim::Action;
use cocoon_hibernation::api::{Desire, Phase};
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::time::{Duration, Instant};

/// How long one half of a burst may take before the step counts as not completed.
fn half_timeout(burst: usize) -> Duration {
    Duration::from_secs(120) + Duration::from_millis(200) * burst as u32
}

/// Flips every name's desire, 64 patches in flight.
async fn flip(env: &Env, names: &[String], desire: Desire) {
    let patch = json!({ "spec": { "desire": desire } });
    world::for_each_concurrent(names.to_vec(), 64, |name| {
        let (api, patch) = (env.crs.clone(), &patch);
        async move {
            let (pp, merge) = (PatchParams::default(), Patch::Merge(patch));
            world::retry(&format!("flip {name}"), || api.patch(&name, &pp, &merge)).await;
        }
    })
    .await;
}

/// Waits until every name is in `want`; false after `timeout`.
async fn wait(watches: &Watches, names: &[String], want: Phase, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    let at = world::phase_index(Some(want));
    loop {
        if watches.counts(names)[at] == names.len() {
            return true;
        }
        if Instant::now() > deadline {
            log(format!(
                "capacity: not all {} CRs {want} after {timeout:?}",
                names.len()
            ));
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs one burst of `burst` CRs on a population of `crs`.
pub(super) async fn run(
    env: &Env,
    watches: &Watches,
    procs: &Procs,
    crs: usize,
    burst: usize,
) -> Step {
    let names: Vec<String> = (0..burst).map(name).collect();
    let timeout = half_timeout(burst);
    // The scrapes stay outside the CPU window: a /metrics answer costs the apiserver CPU.
    let a0 = apiserver::scrape(&env.client).await;
    let c0 = procs.sample();
    let t0 = Instant::now();
    flip(env, &names, Desire::Hibernate).await;
    let hibernated = wait(watches, &names, Phase::Hibernated, timeout).await;
    let t1 = Instant::now();
    let woken = if hibernated {
        flip(env, &names, Desire::Wake).await;
        wait(watches, &names, Phase::Active, timeout).await
    } else {
        false
    };
    let c1 = procs.sample();
    let a1 = apiserver::scrape(&env.client).await;

    let hib_at = watches.reached(&names, Phase::Hibernated, t0);
    let act_at = watches.reached(&names, Phase::Active, t1);
    let mut react = reactions(&names, &hib_at, &watches.pod_done(PodDone::Hibernated, t0));
    react.extend(reactions(
        &names,
        &act_at,
        &watches.pod_done(PodDone::Woken, t1),
    ));
    let timings = env.sim.knobs.timings();
    let vm = |cr: &str| env.vm(cr);
    let sim_hib = Round::measure(&hib_at, t0, &timings.since(Action::Hibernate, t0), vm);
    let sim_wake = Round::measure(&act_at, t1, &timings.since(Action::Wake, t1), vm);
    let (rss, hwm) = env.product.pid().map_or((0, 0), metrics::memory_kib);
    let step = Step {
        crs,
        burst,
        completed: hibernated && woken,
        window_s: t0.elapsed().as_secs_f64(),
        wall_hibernate_s: hibernated.then(|| latest(&hib_at, t0)),
        wall_wake_s: woken.then(|| latest(&act_at, t1)),
        cores: procs::cores(&c0, &c1),
        cpu_s: procs::cpu_seconds(&c0, &c1),
        product_rss_mib: rss as f64 / 1024.0,
        product_hwm_mib: hwm as f64 / 1024.0,
        apiserver_p50_ms: apiserver::quantile(&a0, &a1, 0.5).map(|s| s * 1000.0),
        apiserver_p99_ms: apiserver::quantile(&a0, &a1, 0.99).map(|s| s * 1000.0),
        apiserver_requests: apiserver::requests(&a0, &a1),
        reaction_p50_ms: report::pct(&react, 0.5),
        reaction_p99_ms: report::pct(&react, 0.99),
        reactions: react.len(),
        overhead: json!({ "hibernate": sim_hib.detail(), "wake": sim_wake.detail() }),
    };
    // The next step starts from a quiet product (its passes after the wakes done).
    if step.completed {
        passes_quiet(
            &env.product,
            Duration::from_secs(3),
            Duration::from_secs(300),
        )
        .await;
    }
    step
}
