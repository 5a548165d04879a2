//! Steps the benchmark's parts share: waiting for quiet, creating CRs and pods,
//! reaction times.

use super::metrics;
use super::world;
use super::{audit, log, ms};
use crate::{env, product, vk_sim};
use cocoon_hibernation::api::Desire;
use kube::Api;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Waits until the product made no write in the namespace for `quiet` and owes no tag
/// delete; returns how long that took.
pub(super) async fn settle(
    tail: &mut audit::AuditTail,
    product: &product::Product,
    user: &str,
    quiet: Duration,
    max: Duration,
) -> Duration {
    let start = Instant::now();
    let count = |t: &audit::AuditTail| {
        t.events
            .iter()
            .filter(|e| audit::is_write(e) && audit::user(e) == user)
            .count()
    };
    let mut last = count(tail);
    let mut last_change = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(250)).await;
        tail.poll();
        let now = count(tail);
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        let owed = product.metric("cocoon_hibernation_snapshot_deletes_owed");
        if last_change.elapsed() >= quiet && owed == 0.0 {
            return start.elapsed();
        }
        if start.elapsed() > max {
            log(format!("not settled after {max:?} (owed {owed}); going on"));
            return start.elapsed();
        }
    }
}

/// Waits until the product's reconcile pass counter stopped growing for `quiet` (its
/// initial pass over every CR is done); returns how long that took.
pub(super) async fn passes_quiet(
    product: &product::Product,
    quiet: Duration,
    max: Duration,
) -> Duration {
    let start = Instant::now();
    let mut last = product.metric(metrics::RECONCILE_PASSES);
    let mut last_change = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = product.metric(metrics::RECONCILE_PASSES);
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        if last_change.elapsed() >= quiet || start.elapsed() > max {
            return last_change.saturating_duration_since(start);
        }
    }
}

pub(super) async fn create_crs(
    api: &Api<cocoon_hibernation::api::CocoonHibernation>,
    names: &[String],
    desire: Desire,
) {
    world::for_each_concurrent(names.to_vec(), 64, |name| {
        let api = api.clone();
        async move {
            let cr = product::new_cr(&name, &name, desire);
            let pp = kube::api::PostParams::default();
            world::retry(&format!("create CR {name}"), || api.create(&pp, &cr)).await;
        }
    })
    .await;
}

pub(super) async fn create_sim_pods(env: &env::Env, names: &[String]) {
    world::for_each_concurrent(names.to_vec(), 32, |name| {
        let (client, ns, vm) = (env.client.clone(), env.ns.clone(), env.vm(&name));
        async move {
            let mut tries = 0;
            while let Err(e) = vk_sim::create_vm_pod(&client, &ns, &name, &vm).await {
                tries += 1;
                assert!(tries < 5, "create pod {name}: {e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    })
    .await;
}

pub(super) fn reactions(
    names: &[String],
    cr_at: &HashMap<String, Instant>,
    pod_at: &HashMap<String, Instant>,
) -> Vec<f64> {
    names
        .iter()
        .filter_map(|n| Some(ms(cr_at.get(n)?.saturating_duration_since(*pod_at.get(n)?))))
        .collect()
}

pub(super) fn latest(at: &HashMap<String, Instant>, since: Instant) -> f64 {
    at.values()
        .map(|t| t.saturating_duration_since(since).as_secs_f64())
        .fold(0.0, f64::max)
}
