//! The scale50k part's step with other workloads (issue 38, `--scale-others N`): N plain
//! pods without a VM, in namespaces of their own, beside the 50k VM pods and CRs; the
//! product restarted on all namespaces, once caching every pod and once with
//! `--pod-selector` on the label CocoonSet pods carry.

use super::report::{self, Figures, Kind};
use super::steps::passes_quiet;
use super::world::{self, retry};
use super::{Opts, log, metrics};
use crate::{cluster, product};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use std::time::{Duration, Instant};

/// Plain pods per namespace: a busy cluster's workloads spread over namespaces.
const PODS_PER_NAMESPACE: usize = 10_000;
/// Replicas of each Deployment; one pod in `JOB_EVERY` is a Job's instead.
const REPLICAS: usize = 10;
const JOB_EVERY: usize = 10;
/// The label the realistic VM pod carries and the docs recommend selecting on.
pub(super) const SELECTOR: &str = "cocoonset.cocoonstack.io/name";

/// A pod of another workload, as its controller makes it: pod `i` of namespace `ns`, a
/// Deployment's replica (a ReplicaSet owner, `pod-template-hash`, app labels shared by its
/// replicas), or, one in ten, a Job's only pod (labels unique to it, as a Job's
/// controller-uid is). One app container and a metrics sidecar, about 3 KB of JSON. No VM
/// annotation, no CocoonSet label.
pub fn other_pod(ns: &str, i: usize) -> Pod {
    let job = i % JOB_EVERY == JOB_EVERY - 1;
    let app = format!("svc-{:03}", i / REPLICAS);
    let hash = format!(
        "{:010x}",
        (i / REPLICAS) as u64 * 0x9e37_79b9 % 0xff_ffff_ffff
    );
    let uid = |salt: usize| {
        let x = (i as u64 ^ (salt as u64) << 40).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        format!(
            "{:08x}-{:04x}-4{:03x}-a{:03x}-{:012x}",
            x >> 32,
            (x >> 16) & 0xffff,
            x & 0xfff,
            (x >> 20) & 0xfff,
            x & 0xffff_ffff_ffff
        )
    };
    let (name, labels, owner) = if job {
        let job_name = format!("report-{ns}-{i}");
        let job_uid = uid(1);
        (
            format!("{job_name}-x7k2p"),
            serde_json::json!({
                "app.kubernetes.io/name": "report",
                "batch.kubernetes.io/controller-uid": job_uid,
                "batch.kubernetes.io/job-name": job_name,
                "controller-uid": job_uid,
                "job-name": job_name,
            }),
            serde_json::json!({
                "apiVersion": "batch/v1", "kind": "Job", "name": job_name, "uid": job_uid,
                "controller": true, "blockOwnerDeletion": true
            }),
        )
    } else {
        let rs = format!("{app}-{hash}");
        (
            format!("{rs}-{i:05}"),
            serde_json::json!({
                "app": app,
                "app.kubernetes.io/name": app,
                "app.kubernetes.io/instance": format!("{app}-prod"),
                "app.kubernetes.io/component": "backend",
                "app.kubernetes.io/part-of": "shop",
                "pod-template-hash": hash,
            }),
            serde_json::json!({
                "apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs, "uid": uid(2),
                "controller": true, "blockOwnerDeletion": true
            }),
        )
    };
    let env: Vec<serde_json::Value> = (0..6)
        .map(|k| serde_json::json!({"name": format!("SETTING_{k:02}"), "value": format!("value-{k:02}-{ns}")}))
        .collect();
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "generateName": name.rsplit_once('-').map_or(name.as_str(), |(p, _)| p).to_owned() + "-",
            "labels": labels,
            "annotations": {
                "kubectl.kubernetes.io/restartedAt": "2026-11-30T08:00:00Z",
                "checksum/config": "5f1c0e0b9a3d7c2e4f6a8b0c1d2e3f405162738495a6b7c8d9e0f1a2b3c4d5e6",
                "prometheus.io/scrape": "true",
                "prometheus.io/port": "9090"
            },
            "ownerReferences": [owner]
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": format!("registry.example.com/shop/{app}:2.7.1"),
                    "args": ["--port=8080", "--log-format=json"],
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "env": env,
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"},
                                  "limits": {"memory": "512Mi"}},
                    "readinessProbe": {"httpGet": {"path": "/ready", "port": 8080}, "periodSeconds": 10},
                    "volumeMounts": [{"name": "config", "mountPath": "/etc/app", "readOnly": true}]
                },
                {
                    "name": "metrics",
                    "image": "registry.example.com/infra/exporter:0.12.0",
                    "ports": [{"name": "metrics", "containerPort": 9090, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "10m", "memory": "16Mi"},
                                  "limits": {"memory": "64Mi"}}
                }
            ],
            "volumes": [{"name": "config", "configMap": {"name": format!("{app}-config")}}],
            "restartPolicy": if job { "Never" } else { "Always" },
            "serviceAccountName": "default"
        }
    }))
    .expect("other pod")
}

/// Creates N other pods in fresh namespaces of `PODS_PER_NAMESPACE`, no new namespace begun after `budget`; returns the
/// namespaces and the pods made. They stay `Pending` without a status write: a kubelet's
/// would double the requests of the bench's longest step, and of a pod's status the cache
/// keeps one bit (whether a container runs), so the memory measured is the same.
async fn create_others(
    cluster: &cluster::Cluster,
    client: &kube::Client,
    n: usize,
    budget: Duration,
) -> (Vec<String>, usize) {
    let mut namespaces = Vec::new();
    let t = Instant::now();
    let mut made = 0;
    while made < n {
        if t.elapsed() > budget {
            log(format!(
                "others: {made} of {n} plain pods after {:.0}s, over the {}s budget; measuring those",
                t.elapsed().as_secs_f64(),
                budget.as_secs()
            ));
            break;
        }
        let ns = cluster.fresh_namespace(client, "bench-others").await;
        let count = PODS_PER_NAMESPACE.min(n - made);
        let api: Api<Pod> = Api::namespaced(client.clone(), &ns);
        world::for_each_concurrent((0..count).collect(), 48, |i| {
            let (api, pod) = (api.clone(), other_pod(&ns, i));
            async move {
                let name = pod.metadata.name.clone().unwrap_or_default();
                let pp = PostParams::default();
                retry(&format!("create pod {name}"), || api.create(&pp, &pod)).await;
            }
        })
        .await;
        made += count;
        namespaces.push(ns);
        log(format!(
            "others: {made} of {n} plain pods in {:.0}s",
            t.elapsed().as_secs_f64()
        ));
    }
    (namespaces, made)
}

/// What one restart over the whole cluster measured.
struct Restart {
    startup_s: f64,
    cpu_s: Option<f64>,
    passes_s: f64,
    rss: u64,
    hwm: u64,
}

/// `startup_reps` restarts with `flag`; the median times, the memory of the last.
async fn restarts(o: &Opts, p: &mut product::Product, flag: &str) -> Restart {
    let (mut warms, mut cpus, mut passes) = (Vec::new(), Vec::new(), Vec::new());
    let (mut rss, mut hwm) = (0, 0);
    for rep in 0..o.startup_reps.max(1) {
        let t = Instant::now();
        if rep == 0 {
            p.restart_with(flag).await;
        } else {
            p.restart().await;
        }
        warms.push(t.elapsed().as_secs_f64());
        let pid = p.pid().expect("pid");
        cpus.extend(metrics::cpu_s(pid));
        let d = passes_quiet(p, Duration::from_secs(3), Duration::from_secs(600)).await;
        passes.push(d.as_secs_f64());
        (rss, hwm) = metrics::memory_kib(pid);
    }
    Restart {
        startup_s: report::pct(&warms, 0.5).unwrap_or(f64::NAN),
        cpu_s: report::pct(&cpus, 0.5),
        passes_s: report::pct(&passes, 0.5).unwrap_or(f64::NAN),
        rss,
        hwm,
    }
}

/// The step: N other pods created, the product (running on the VM pods' namespace)
/// restarted on every namespace without, then with, the selector; the other pods and
/// their namespaces deleted at the end. `rss_50k` is the 50k step's RSS (KiB), for the
/// cost per other pod.
pub(super) async fn others(
    o: &Opts,
    cluster: &cluster::Cluster,
    client: &kube::Client,
    p: &mut product::Product,
    rss_50k: u64,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, serde_json::Value>,
) {
    log(format!(
        "others: {} plain pods beside the VM pods",
        o.scale_others
    ));
    let budget = Duration::from_secs(o.scale_others_max_s);
    let (namespaces, n) = create_others(cluster, client, o.scale_others, budget).await;
    if n == 0 {
        return;
    }
    let json_bytes = serde_json::to_vec(&other_pod(&namespaces[0], 0)).map_or(0, |v| v.len());

    // Every namespace, every pod cached.
    let all = restarts(o, p, "--watch-namespace=").await;
    log(format!(
        "others, no selector: ready in {:.1}s; RSS {} MiB",
        all.startup_s,
        all.rss / 1024
    ));
    // Every namespace, only the CocoonSet pods cached.
    let sel = restarts(o, p, &format!("--pod-selector={SELECTOR}")).await;
    log(format!(
        "others, --pod-selector={SELECTOR}: ready in {:.1}s; RSS {} MiB",
        sel.startup_s,
        sel.rss / 1024
    ));

    figs.set("scale50k.others_n", Some(n as f64), "", Kind::Info);
    let keys = [
        (
            &all,
            [
                "scale50k.others_rss_mib",
                "scale50k.others_hwm_mib",
                "scale50k.others_startup_s",
                "scale50k.others_startup_cpu_s",
                "scale50k.others_passes_s",
            ],
        ),
        (
            &sel,
            [
                "scale50k.others_selector_rss_mib",
                "scale50k.others_selector_hwm_mib",
                "scale50k.others_selector_startup_s",
                "scale50k.others_selector_startup_cpu_s",
                "scale50k.others_selector_passes_s",
            ],
        ),
    ];
    for (r, [rss, hwm, startup, cpu, passes]) in keys {
        figs.set(rss, Some(r.rss as f64 / 1024.0), "", Kind::Memory);
        figs.set(hwm, Some(r.hwm as f64 / 1024.0), "", Kind::Memory);
        figs.set(startup, Some(r.startup_s), "", Kind::Time);
        figs.set(cpu, r.cpu_s, "", Kind::Time);
        figs.set(passes, Some(r.passes_s), "", Kind::Time);
    }
    figs.set(
        "scale50k.others_kib_per_pod",
        Some(all.rss.saturating_sub(rss_50k) as f64 / n.max(1) as f64),
        "",
        Kind::Memory,
    );
    detail.insert(
        "scale50k_others".into(),
        serde_json::json!({ "namespaces": namespaces, "pod_json_bytes": json_bytes,
                            "selector": SELECTOR }),
    );
    delete_others(client, &namespaces).await;
}

/// The other pods, then their namespaces: what the step created, gone.
async fn delete_others(client: &kube::Client, namespaces: &[String]) {
    let t = Instant::now();
    let nss: Api<Namespace> = Api::all(client.clone());
    for ns in namespaces {
        let api: Api<Pod> = Api::namespaced(client.clone(), ns);
        let dp = DeleteParams::default().grace_period(0);
        // A loaded apiserver answers a collection of 10k with a 504 before it is done:
        // again until the namespace lists no pod.
        for _ in 0..20 {
            let _ = api.delete_collection(&dp, &ListParams::default()).await;
            let left = api.list_metadata(&ListParams::default().limit(1)).await;
            if left.is_ok_and(|l| l.items.is_empty()) {
                break;
            }
        }
        let _ = nss.delete(ns, &DeleteParams::default()).await;
    }
    log(format!(
        "others: {} namespaces deleted in {:.0}s",
        namespaces.len(),
        t.elapsed().as_secs_f64()
    ));
}
