//! Growing the population: realistic pods (as the scale part's) and one settled `Wake`
//! CR per pod, added to what the earlier steps built, with the product running.

use super::super::steps::{create_crs, passes_quiet};
use super::super::world::{self, Watches};
use super::super::{log, pods};
use super::procs::{self, Procs};
use crate::env::Env;
use cocoon_hibernation::api::{Desire, Phase};
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// The pod and CR name of population member `i`.
pub(super) fn name(i: usize) -> String {
    format!("c-{i:05}")
}

/// Adds pods and CRs `from..to`, waits until every new CR is `Active` and the product's
/// passes went quiet; returns what it cost.
pub(super) async fn grow(
    env: &Env,
    watches: &Watches,
    procs: &Procs,
    from: usize,
    to: usize,
) -> Value {
    let names: Vec<String> = (from..to).map(name).collect();
    // The pods are created running (their status written here): the simulator has
    // nothing to do until a burst.
    env.sim.knobs.set_never_complete(true);
    let t = Instant::now();
    world::for_each_concurrent(names.clone(), 48, |name| {
        let (api, vm) = (env.pods.clone(), env.vm(&name));
        async move {
            pods::create_realistic_pod(&api, &name, &vm).await;
        }
    })
    .await;
    let pods_s = t.elapsed().as_secs_f64();
    log(format!(
        "capacity: {} pods in {pods_s:.0}s (now {to})",
        names.len()
    ));

    let c0 = procs.sample();
    let t = Instant::now();
    create_crs(&env.crs, &names, Desire::Wake).await;
    let create_s = t.elapsed().as_secs_f64();
    // Minutes at 50k on two cores: the product settles each new CR with three writes.
    let mut scratch = Vec::new();
    watches
        .wait_all(
            &names,
            Phase::Active,
            Duration::from_secs(3600),
            t,
            Duration::from_secs(2),
            &mut scratch,
        )
        .await;
    let active_s = t.elapsed().as_secs_f64();
    passes_quiet(
        &env.product,
        Duration::from_secs(3),
        Duration::from_secs(600),
    )
    .await;
    let c1 = procs.sample();
    env.sim.knobs.set_never_complete(false);
    log(format!(
        "capacity: {} CRs created in {create_s:.0}s, all Active after {active_s:.0}s",
        names.len()
    ));
    let cpu_s = procs::cpu_seconds(&c0, &c1);
    let added = names.len().max(1) as f64;
    json!({
        "added": names.len(),
        "pods_s": pods_s,
        "crs_created_s": create_s,
        "crs_active_s": active_s,
        "cores_while_settling": procs::cores(&c0, &c1),
        "cpu_ms_per_new_cr": cpu_s
            .iter()
            .map(|(k, v)| (k.to_string(), json!(v * 1000.0 / added)))
            .collect::<serde_json::Map<_, _>>(),
    })
}
