//! The scale part: cache memory and start-up with S realistic pods and S CRs.

use super::admission::admission;
use super::metrics;
use super::others;
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

/// What one scale step measured.
struct Step {
    /// RSS of the product in an empty namespace (KiB).
    rss0: u64,
    /// RSS and high-water mark once the first start settled (KiB).
    rss1: u64,
    hwm1: u64,
    /// RSS and high-water mark after the last restart's initial pass (KiB).
    rss2: u64,
    hwm2: u64,
    cold: f64,
    settle_s: f64,
    warm: f64,
    cpu_s: Option<f64>,
    passes_s: f64,
    pod_json_avg: f64,
    ns: String,
}

impl Step {
    /// KiB of RSS above the empty process per pod and CR.
    fn kib_per_object(&self, rss: u64, s: usize) -> f64 {
        rss.saturating_sub(self.rss0) as f64 / (2 * s) as f64
    }
}

/// Cache memory and start-up with S realistic pods and S CRs.
pub(super) async fn scale(
    o: &Opts,
    cluster: &cluster::Cluster,
    client: &kube::Client,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
) {
    let s = o.scale_n;
    let (step, p) = measure_step(o, s, cluster, client).await;
    figs.set(
        "scale.rss_empty_mib",
        Some(step.rss0 as f64 / 1024.0),
        "",
        Kind::Memory,
    );
    figs.set("scale.n", Some(s as f64), "", Kind::Info);
    figs.set(
        "scale.pod_json_bytes",
        Some(step.pod_json_avg.round()),
        "",
        Kind::Info,
    );
    let mut mib =
        |key: &'static str, kib: u64| figs.set(key, Some(kib as f64 / 1024.0), "", Kind::Memory);
    mib("scale.rss_settled_mib", step.rss1);
    mib("scale.hwm_settled_mib", step.hwm1);
    mib("scale.rss_mib", step.rss2);
    mib("scale.hwm_mib", step.hwm2);
    figs.set("scale.startup_cold_s", Some(step.cold), "", Kind::Time);
    figs.set("scale.settle_s", Some(step.settle_s), "", Kind::Time);
    figs.set("scale.startup_s", Some(step.warm), "", Kind::Time);
    figs.set("scale.startup_cpu_s", step.cpu_s, "", Kind::Time);
    figs.set(
        "scale.restart_passes_s",
        Some(step.passes_s),
        "",
        Kind::Time,
    );
    figs.set(
        "scale.bytes_per_object",
        Some(step.kib_per_object(step.rss2, s) * 1024.0),
        "",
        Kind::Memory,
    );
    detail.insert(
        "scale".into(),
        json!({ "namespace": step.ns, "pod_json_bytes_avg": step.pod_json_avg }),
    );

    if o.part("admission") {
        admission(
            o,
            cluster,
            client,
            &step.ns,
            p.webhook_port,
            "10k",
            figs,
            detail,
        )
        .await;
    }
    drop(p);
    finish(o, client, &step.ns).await;
}

/// The same at 50k (issue 38): memory per object and start-up at the size the chart's
/// default memory limit must hold.
pub(super) async fn scale_50k(
    o: &Opts,
    cluster: &cluster::Cluster,
    client: &kube::Client,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
) {
    let s = o.scale_50k_n;
    let (step, mut p) = measure_step(o, s, cluster, client).await;
    figs.set("scale50k.n", Some(s as f64), "", Kind::Info);
    let mut mib =
        |key: &'static str, kib: u64| figs.set(key, Some(kib as f64 / 1024.0), "", Kind::Memory);
    mib("scale50k.rss_settled_mib", step.rss1);
    mib("scale50k.hwm_settled_mib", step.hwm1);
    mib("scale50k.rss_mib", step.rss2);
    mib("scale50k.hwm_mib", step.hwm2);
    figs.set(
        "scale50k.kib_per_object",
        Some(step.kib_per_object(step.rss2, s)),
        "",
        Kind::Memory,
    );
    figs.set(
        "scale50k.kib_per_object_settled",
        Some(step.kib_per_object(step.rss1, s)),
        "",
        Kind::Memory,
    );
    figs.set("scale50k.startup_cold_s", Some(step.cold), "", Kind::Time);
    figs.set("scale50k.settle_s", Some(step.settle_s), "", Kind::Time);
    figs.set("scale50k.startup_s", Some(step.warm), "", Kind::Time);
    figs.set("scale50k.startup_cpu_s", step.cpu_s, "", Kind::Time);
    detail.insert(
        "scale50k".into(),
        json!({ "namespace": step.ns, "pod_json_bytes_avg": step.pod_json_avg }),
    );
    // Logged now: the step with other pods below takes long and may not finish.
    log(format!(
        "scale50k: rss0 {} KiB, settled {} KiB, restart RSS {} KiB HWM {} KiB; {:.2} KiB per object; startup {:.2}s",
        step.rss0,
        step.rss1,
        step.rss2,
        step.hwm2,
        step.kib_per_object(step.rss2, s),
        step.warm
    ));
    if o.scale_others > 0 {
        others::others(o, cluster, client, &mut p, step.rss2, figs, detail).await;
    }
    drop(p);
    finish(o, client, &step.ns).await;
}

async fn finish(o: &Opts, client: &kube::Client, ns: &str) {
    if o.keep_scale {
        log(format!("scale: pods and CRs kept in namespace {ns}"));
        return;
    }
    // The bulk of what this run stored: gone, so runs do not pile up in etcd.
    pods::delete_pods(client, ns).await;
}

/// S realistic pods and S CRs created, the product started on them until all are
/// `Active`, then restarted `startup_reps` times; the product is returned running.
async fn measure_step(
    o: &Opts,
    s: usize,
    cluster: &cluster::Cluster,
    client: &kube::Client,
) -> (Step, product::Product) {
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
    let step = Step {
        rss0,
        rss1,
        hwm1,
        rss2,
        hwm2,
        cold,
        settle_s,
        warm,
        cpu_s,
        passes_s,
        pod_json_avg: avg,
        ns,
    };
    (step, p)
}
