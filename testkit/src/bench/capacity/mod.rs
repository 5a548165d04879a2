//! The capacity part (issue 23; `--parts capacity`, not in the default parts nor in
//! `make test`): one leader under a rising load until something gives.
//!
//! The ladder: for each population N of `--capacity-crs` (ascending; pods and settled
//! `Wake` CRs, grown in place), each burst B of `--capacity-bursts` up to N: B CRs
//! flipped to `Hibernate` at once, then back to `Wake` at once. Per step one
//! `capacity: …` line (CPU and RSS of the product, CPU and request latency of the
//! apiserver, reaction p50/p99, what saturated), then `capacity: first_to_saturate=…`.
//! Writes `capacity.json` (after every step, so a cut-short run keeps its steps) and
//! `capacity.svg` to the output directory.

mod apiserver;
mod burst;
mod chart;
mod population;
mod procs;
mod saturation;
mod step;

use super::world::Watches;
use super::{Opts, log, product_args};
use crate::cluster;
use procs::{Procs, daemon_pid};
use serde_json::{Value, json};
use std::time::Duration;
use step::Step;

/// The simulator's re-check of every pod: rare, so 50k pods do not cost it a core.
const SIM_RESYNC: Duration = Duration::from_secs(10);

pub(super) async fn capacity(
    o: &Opts,
    cluster: &cluster::Cluster,
    detail: &mut serde_json::Map<String, Value>,
) {
    // A saturated step is slow, not failed: the bench gives up first.
    let env = super::bench_env(o, "bench-cap", "3600s", product_args()).await;
    env.sim.knobs.set_resync(SIM_RESYNC);
    let mut named = vec![("bench", std::process::id())];
    named.extend(env.product.pid().map(|p| ("product", p)));
    for (name, daemon) in [
        ("apiserver", "kube-apiserver"),
        ("etcd", "etcd"),
        ("registry", "registry"),
    ] {
        match daemon_pid(&cluster.state_dir, daemon) {
            Some(pid) => named.push((name, pid)),
            None => log(format!(
                "capacity: no pid for {daemon} in {}",
                cluster.state_dir.display()
            )),
        }
    }
    let procs = Procs(named);
    log(format!(
        "capacity: namespace {}, processes {:?}",
        env.ns, procs.0
    ));
    let watches = Watches::start(&env.client, &env.ns, true);

    let mut ladder = o.capacity_crs.clone();
    ladder.sort_unstable();
    let mut bursts = o.capacity_bursts.clone();
    bursts.sort_unstable();
    let mut steps: Vec<Step> = Vec::new();
    let mut populations = Vec::new();
    let mut have = 0;
    'ladder: for &n in &ladder {
        let grown = population::grow(&env, &watches, &procs, have, n).await;
        have = n;
        let (rss, _) = env.product.pid().map_or((0, 0), super::metrics::memory_kib);
        populations
            .push(json!({ "crs": n, "product_rss_mib": rss as f64 / 1024.0, "build": grown }));
        for &b in &bursts {
            if b > n {
                log(format!("capacity: burst {b} skipped on {n} CRs"));
                continue;
            }
            log(format!("capacity: {n} CRs, burst of {b}"));
            let step = burst::run(&env, &watches, &procs, n, b).await;
            println!("{}", step.line());
            let completed = step.completed;
            steps.push(step);
            write(o, &steps, &populations);
            if !completed {
                log("capacity: a burst did not finish; the ladder stops here");
                break 'ladder;
            }
        }
    }
    match saturation::first(&steps) {
        Some((r, n, b)) => println!("capacity: first_to_saturate={r} at_crs={n} at_burst={b}"),
        None => println!("capacity: first_to_saturate=none at_crs=na at_burst=na"),
    }
    detail.insert("capacity".into(), report(&steps, &populations));
    // The population stays: the bench's control plane is fresh per run and stopped at
    // its end, and deleting 50k pods would take minutes.
}

fn report(steps: &[Step], populations: &[Value]) -> Value {
    let first = saturation::first(steps);
    json!({
        "bounds": {
            "cpu_cores": saturation::CPU_CORES,
            "cpu_sustained_s": saturation::SUSTAINED_S,
            "product_rss_mib": saturation::PRODUCT_RSS_MIB,
            "apiserver_p99_ms": saturation::APISERVER_P99_MS,
            "reaction_p99_ms": saturation::REACTION_P99_MS,
        },
        "first_to_saturate": first.map(|(r, n, b)| json!({ "resource": r, "crs": n, "burst": b })),
        "first_per_resource": saturation::first_per_resource(steps)
            .iter()
            .map(|(r, n, b)| json!({ "resource": r, "crs": n, "burst": b }))
            .collect::<Vec<_>>(),
        "populations": populations,
        "steps": steps.iter().map(Step::json).collect::<Vec<_>>(),
    })
}

/// capacity.json and capacity.svg, rewritten after every step.
fn write(o: &Opts, steps: &[Step], populations: &[Value]) {
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let doc = json!({
        "command": "make bench BENCH_ARGS=\"--parts capacity\"",
        "date": jiff::Timestamp::now().to_string(),
        "machine": super::machine(),
        "settings": { "capacity_crs": o.capacity_crs, "capacity_bursts": o.capacity_bursts, "sim_delay_ms": o.sim_delay_ms },
        "capacity": report(steps, populations),
    });
    let text = serde_json::to_string_pretty(&doc).expect("JSON");
    std::fs::write(o.out.join("capacity.json"), text + "\n").expect("write capacity.json");
    std::fs::write(o.out.join("capacity.svg"), chart::svg(steps, cores))
        .expect("write capacity.svg");
}
