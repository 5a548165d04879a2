//! The scale part: cache memory and start-up with S realistic pods and S CRs.

use super::admission::admission;
use super::metrics;
use super::pods;
use super::report::{self, Figures, Kind};
use super::steps::{create_crs, passes_quiet};
use super::world::{self, Watches};
use super::{Opts, log, product_args};
use crate::{cluster, product};
use cocoon_hibernation::api::{Desire, Phase};
use kube::Api;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

/// Cache memory and start-up with S realistic pods and S CRs.
pub(super) async fn scale(
    o: &Opts,
    cluster: &cluster::Cluster,
    client: &kube::Client,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
) {
    let s = o.scale_n;
    let registry = cluster.registry.clone();
    let opts_for = |ns: &str| {
        let mut p = product::ProductOptions::new(ns, &registry);
        p.extra_args = product_args();
        p
    };
    // The empty baseline.
    let empty_ns = cluster.fresh_namespace(client, "bench-empty").await;
    let empty = product::Product::start(cluster, &opts_for(&empty_ns)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (rss0, _) = metrics::memory_kib(empty.pid().expect("pid"));
    drop(empty);
    figs.set(
        "scale.rss_empty_mib",
        Some(rss0 as f64 / 1024.0),
        "",
        Kind::Memory,
    );

    let ns = cluster.fresh_namespace(client, "bench-scale").await;
    log(format!("scale: {s} realistic pods and {s} CRs in {ns}"));
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let crs: Api<cocoon_hibernation::api::CocoonHibernation> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..s).map(|i| format!("s-{i:05}")).collect();
    let sizes = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let t = Instant::now();
    world::for_each_concurrent(names.clone(), 48, |name| {
        let (pods, sizes, vm) = (pods.clone(), sizes.clone(), format!("vm-{ns}-{name}"));
        async move {
            let size = pods::create_realistic_pod(&pods, &name, &vm).await;
            sizes.lock().expect("sizes").push(size);
        }
    })
    .await;
    log(format!("{s} pods in {:.1}s", t.elapsed().as_secs_f64()));
    let t = Instant::now();
    create_crs(&crs, &names, Desire::Wake).await;
    log(format!("{s} CRs in {:.1}s", t.elapsed().as_secs_f64()));
    let sizes = sizes.lock().expect("sizes").clone();
    let avg = sizes.iter().sum::<usize>() as f64 / sizes.len().max(1) as f64;
    figs.set("scale.n", Some(s as f64), "", Kind::Info);
    figs.set("scale.pod_json_bytes", Some(avg.round()), "", Kind::Info);

    // First start: every CR is new to the controller.
    let watches = Watches::start(client, &ns, false);
    let t = Instant::now();
    let mut p = product::Product::start(cluster, &opts_for(&ns)).await;
    let cold = t.elapsed().as_secs_f64();
    let pid = p.pid().expect("pid");
    log(format!(
        "first start ready in {cold:.1}s; waiting for {s} CRs Active"
    ));
    let mut tl = Vec::new();
    watches
        .wait_all(
            &names,
            Phase::Active,
            Duration::from_secs(1800),
            t,
            Duration::from_secs(1),
            &mut tl,
        )
        .await;
    let settle_s = t.elapsed().as_secs_f64();
    passes_quiet(&p, Duration::from_secs(3), Duration::from_secs(600)).await;
    let (rss1, hwm1) = metrics::memory_kib(pid);
    drop(watches);

    // Restarts in the settled world (the figure that matters for a rollout): the median
    // time of `startup_reps`, memory from the last.
    let mut warms = Vec::new();
    let mut passes = Vec::new();
    let mut cpus = Vec::new();
    let (mut rss2, mut hwm2) = (0, 0);
    for _ in 0..o.startup_reps.max(1) {
        let t = Instant::now();
        p.restart().await;
        warms.push(t.elapsed().as_secs_f64());
        let pid = p.pid().expect("pid");
        cpus.extend(metrics::cpu_s(pid));
        // RSS and admission load once the initial pass over every CR is done.
        let d = passes_quiet(&p, Duration::from_secs(3), Duration::from_secs(600)).await;
        passes.push(d.as_secs_f64());
        (rss2, hwm2) = metrics::memory_kib(pid);
    }
    let warm = report::pct(&warms, 0.5).unwrap_or(f64::NAN);
    let passes_s = report::pct(&passes, 0.5).unwrap_or(f64::NAN);
    let cpu_s = report::pct(&cpus, 0.5);
    log(format!(
        "restart ready in {warm:.1}s; RSS {} MiB, HWM {} MiB",
        rss2 / 1024,
        hwm2 / 1024
    ));
    let mut mib =
        |key: &'static str, kib: u64| figs.set(key, Some(kib as f64 / 1024.0), "", Kind::Memory);
    mib("scale.rss_settled_mib", rss1);
    mib("scale.hwm_settled_mib", hwm1);
    mib("scale.rss_mib", rss2);
    mib("scale.hwm_mib", hwm2);
    figs.set("scale.startup_cold_s", Some(cold), "", Kind::Time);
    figs.set("scale.settle_s", Some(settle_s), "", Kind::Time);
    figs.set("scale.startup_s", Some(warm), "", Kind::Time);
    figs.set("scale.startup_cpu_s", cpu_s, "", Kind::Time);
    figs.set("scale.restart_passes_s", Some(passes_s), "", Kind::Time);
    figs.set(
        "scale.bytes_per_object",
        Some((rss2.saturating_sub(rss0) as f64 * 1024.0) / (2 * s) as f64),
        "",
        Kind::Memory,
    );
    detail.insert(
        "scale".into(),
        json!({ "namespace": ns, "pod_json_bytes_avg": avg }),
    );

    if o.part("admission") {
        admission(o, cluster, client, &ns, p.webhook_port, "10k", figs, detail).await;
    }
    drop(p);
    if o.keep_scale {
        log(format!("scale: {s} pods and CRs kept in namespace {ns}"));
        return;
    }
    // The bulk of what this run stored: gone, so runs do not pile up in etcd.
    pods::delete_pods(client, &ns).await;
}
