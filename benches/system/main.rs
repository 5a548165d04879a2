//! System benchmark (issue 8, "Performance at scale"): the release binary against the real
//! local control plane (kube-apiserver + etcd + registry from `hack/cluster-up.sh`).
//! It measures, it never changes what the product does.
//!
//! Run: `make bench` (or `bash hack/bench.sh [--n 100] [--scale-n 0] ...`). Parts, in order:
//! - roundtrip: N CRs created with `Hibernate` at once, then all flipped to `Wake`, with
//!   the vk simulator: wall times, reaction latency (simulator's completion write seen by
//!   our pod watch → terminal phase seen by our CR watch), API writes per CR from the
//!   audit log (by verb/resource/subresource; events apart), 409s, registry calls;
//!   then fresh-wake writes (a new `Wake` CR on a running pod);
//! - quiet: API writes and registry calls over a settled window with the N CRs;
//! - admission: requests/s and latency at concurrency 16 and 64 straight to the webhook
//!   over TLS, and the same load against a no-op axum + rustls server (the ceiling);
//! - scale: RSS and time to /readyz with S realistic pods (3 containers, ~8 KB) and S CRs;
//! - schedule: N pods of one CocoonHibernationSchedule, a boundary reached through the
//!   product's shifted clock: boundary → all Hibernated, and CR writes per pod (K2).
//!
//! Writes `<target>/bench/system-latest.json` (and a timestamped copy) with two SVG charts
//! beside it; prints a table with ratios to `bench/baseline.json`; the last line printed
//! is the one-line summary.

#[path = "../../tests/support/cluster.rs"]
mod cluster;
#[path = "../../tests/support/env.rs"]
mod env;
#[path = "../../tests/support/ports.rs"]
mod ports;
#[path = "../../tests/support/product.rs"]
mod product;
#[path = "../../tests/support/vk_sim.rs"]
mod vk_sim;

mod audit;
mod load;
mod report;
mod schedule;
mod world;

use cocoon_hibernation::api::{Desire, Phase};
use kube::Api;
use report::{Figures, Kind};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use world::{PodDone, Watches};

/// Settings: `--name value` / `--name=value` flags, else `BENCH_NAME` env, else default.
pub struct Opts {
    /// CRs in the round-trip run.
    n: usize,
    /// Realistic pods without a CR beside the N simulated ones (the cache's load in the
    /// short variant of `make test`).
    filler_pods: usize,
    /// New `Wake` CRs for the fresh-wake count.
    fresh_n: usize,
    /// Settled window of the quiet part, seconds.
    quiet_s: u64,
    /// Pods and CRs of the cache-memory run (0 skips it).
    scale_n: usize,
    /// Seconds per admission load run, and runs per point (the median is kept).
    admission_s: f64,
    admission_reps: usize,
    /// Restarts timed in the scale run (the median is kept).
    startup_reps: usize,
    /// The simulator's hibernate and wake delay, ms.
    sim_delay_ms: u64,
    /// The simulator writes `lifecycle-state=hibernating` before each push, as vk-cocoon
    /// does (off by default: a write more per hibernate than the baseline's runs).
    sim_hibernating_first: bool,
    /// Share of the simulator's wakes that delete the tag they restored from (vk-cocoon
    /// may; 0 by default, as in the baseline's runs).
    sim_wake_drops_tag: f64,
    /// Parts to run: roundtrip,quiet,admission,scale,schedule.
    parts: Vec<String>,
    out: PathBuf,
    baseline: PathBuf,
    /// Write this run's figures to the baseline file.
    update_baseline: bool,
    /// Exit 1 when a figure regressed against the baseline.
    fail_on_regression: bool,
    /// Leave the scale run's pods and CRs in place (for a heap profile of the product).
    keep_scale: bool,
}

impl Opts {
    pub fn parse(args: &[String]) -> Self {
        let mut flags: HashMap<String, String> = HashMap::new();
        let mut i = 0;
        while i < args.len() {
            let a = &args[i];
            if let Some(flag) = a.strip_prefix("--") {
                if let Some((k, v)) = flag.split_once('=') {
                    flags.insert(k.replace('-', "_"), v.to_owned());
                } else if i + 1 < args.len() && !args[i + 1].starts_with("--") {
                    flags.insert(flag.replace('-', "_"), args[i + 1].clone());
                    i += 1;
                } else {
                    flags.insert(flag.replace('-', "_"), "1".into());
                }
            }
            i += 1;
        }
        let get = |name: &str, default: &str| -> String {
            flags
                .get(name)
                .cloned()
                .or_else(|| std::env::var(format!("BENCH_{}", name.to_uppercase())).ok())
                .filter(|v| !v.is_empty())
                .unwrap_or_else(|| default.to_owned())
        };
        let num = |name: &str, default: &str| -> f64 {
            get(name, default).parse().unwrap_or_else(|_| {
                panic!("--{name} / BENCH_{} is not a number", name.to_uppercase())
            })
        };
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        // <target>/release/deps/system-<hash> → <target>/bench
        let default_out = std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.parent()?.parent()?.join("bench")))
            .unwrap_or_else(|| root.join("target/bench"));
        let n = num("n", "1000") as usize;
        Self {
            n,
            filler_pods: num("filler_pods", "0") as usize,
            fresh_n: num("fresh_n", &n.min(100).to_string()) as usize,
            quiet_s: num("quiet_s", "60") as u64,
            scale_n: num("scale_n", "10000") as usize,
            admission_s: num("admission_s", "3"),
            admission_reps: num("admission_reps", "3") as usize,
            startup_reps: num("startup_reps", "3") as usize,
            sim_delay_ms: num("sim_delay_ms", "50") as u64,
            sim_hibernating_first: get("sim_hibernating_first", "0") == "1",
            sim_wake_drops_tag: num("sim_wake_drops_tag", "0"),
            parts: get("parts", "roundtrip,quiet,admission,scale,schedule")
                .split(',')
                .map(|s| s.trim().to_owned())
                .collect(),
            out: PathBuf::from(get("out", &default_out.to_string_lossy())),
            baseline: PathBuf::from(get(
                "baseline",
                &root.join("bench/baseline.json").to_string_lossy(),
            )),
            update_baseline: get("update_baseline", "0") == "1",
            fail_on_regression: get("fail_on_regression", "0") == "1",
            keep_scale: get("keep_scale", "0") == "1",
        }
    }

    fn part(&self, name: &str) -> bool {
        self.parts.iter().any(|p| p == name)
    }
}

/// The product's flags on top of the test defaults: info logging (the tests log debug),
/// then `BENCH_PRODUCT_ARGS` (whitespace-separated), to compare settings.
fn product_args() -> Vec<String> {
    let extra = std::env::var("BENCH_PRODUCT_ARGS").unwrap_or_default();
    let extra: Vec<String> = extra.split_whitespace().map(str::to_string).collect();
    let default = (!extra.iter().any(|a| a.starts_with("--log-filter")))
        .then(|| "--log-filter=info".to_string());
    default.into_iter().chain(extra).collect()
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some(load::CEILING_FLAG) {
        load::ceiling_main(&args[1..]);
        return;
    }
    let opts = Opts::parse(&args);
    let _ = rustls::crypto::ring::default_provider().install_default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let code = rt.block_on(run(opts));
    drop(rt);
    std::process::exit(code);
}

fn log(msg: impl AsRef<str>) {
    eprintln!(
        "[bench {}] {}",
        jiff::Timestamp::now().strftime("%H:%M:%S"),
        msg.as_ref()
    );
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn sum(m: &BTreeMap<String, f64>) -> f64 {
    m.values().sum()
}

/// Declares every figure up front, so a part not run shows as `na`.
fn declare(figs: &mut Figures) {
    use Kind::*;
    for (key, unit, kind) in [
        ("rt.n", "CRs", Info),
        (
            "rt.wall_hibernate_s",
            "s, create N Hibernate CRs → all Hibernated",
            Time,
        ),
        ("rt.wall_wake_s", "s, flip N to Wake → all Active", Time),
        ("rt.reaction_hibernate_p50_ms", "ms", Time),
        ("rt.reaction_hibernate_p99_ms", "ms", Tail),
        ("rt.reaction_wake_p50_ms", "ms", Time),
        ("rt.reaction_wake_p99_ms", "ms", Tail),
        ("rt.reaction_p99_ms", "ms, both directions", Tail),
        ("rt.reaction_max_ms", "ms", Tail),
        (
            "rt.product_reaction_p99_ms",
            "ms, inside the product: its cache saw vk's last write → terminal write (bucket bound)",
            Info,
        ),
        (
            "rt.writes_per_round",
            "transition writes per CR: finalizer, pod patches, phase writes, events",
            Count,
        ),
        (
            "rt.all_writes_per_round",
            "every product API write per CR, events included",
            Count,
        ),
        ("rt.events_per_round", "of which events", Count),
        ("rt.pod_writes_per_round", "of which pod patches", Count),
        (
            "rt.cr_writes_per_round",
            "of which CR writes (finalizer, status)",
            Count,
        ),
        (
            "rt.phase_writes",
            "status changes moving the phase (watch)",
            Info,
        ),
        (
            "rt.reason_writes",
            "per CR: status writes that leave the phase as it was (audit)",
            Count,
        ),
        (
            "rt.same_phase_changes",
            "status changes keeping the phase, Ready reason only (watch)",
            Info,
        ),
        (
            "rt.other_status_writes",
            "other status changes (watch)",
            Count,
        ),
        (
            "rt.conflicts",
            "409s to the product in the round (audit)",
            Count,
        ),
        (
            "rt.conflict_errors_metric",
            "reconcile_errors{error=conflict}",
            Count,
        ),
        (
            "rt.non_2xx_writes",
            "product writes answered ≥ 300 (audit)",
            Count,
        ),
        ("rt.registry_calls_per_hibernate", "per CR", Count),
        (
            "rt.registry_calls_per_wake",
            "per CR, flip → settled",
            Count,
        ),
        (
            "rt.sim_writes_per_round",
            "simulator + driver writes per CR",
            Info,
        ),
        (
            "fresh.writes_per_cr",
            "product writes per new Wake CR on a running pod",
            Count,
        ),
        ("fresh.registry_calls_per_cr", "per CR", Count),
        ("quiet.window_s", "s", Info),
        ("quiet.writes", "product API writes in the window", Count),
        ("quiet.registry_calls", "in the window", Count),
        ("quiet.reconcile_passes", "in the window", Info),
        ("adm.crs_1k", "CRs in the namespace", Info),
        ("adm.rps_c16_1k", "req/s", Rate),
        ("adm.p50_c16_1k_ms", "ms", Time),
        ("adm.p99_c16_1k_ms", "ms", Tail),
        ("adm.rps_c64_1k", "req/s", Rate),
        ("adm.p50_c64_1k_ms", "ms", Time),
        ("adm.p99_c64_1k_ms", "ms", Tail),
        ("adm.ceiling_rps_c16", "req/s, no-op axum+rustls", Rate),
        ("adm.ceiling_rps_c64", "req/s, no-op axum+rustls", Rate),
        ("adm.ceiling_p99_c64_ms", "ms", Tail),
        ("adm.rps_c16_10k", "req/s", Rate),
        ("adm.rps_c64_10k", "req/s", Rate),
        ("adm.p50_c64_10k_ms", "ms", Time),
        ("adm.p99_c64_10k_ms", "ms", Tail),
        (
            "adm.ceiling_share",
            "ours c64 (10k, else 1k) / ceiling c64",
            Rate,
        ),
        ("scale.n", "pods and CRs", Info),
        ("scale.pod_json_bytes", "bytes per pod (JSON)", Info),
        ("scale.rss_empty_mib", "MiB, empty namespace", Memory),
        ("scale.startup_cold_s", "s to /readyz, first start", Time),
        ("scale.settle_s", "s, first start → all Active", Time),
        (
            "scale.rss_settled_mib",
            "MiB after the first start settled",
            Memory,
        ),
        (
            "scale.hwm_settled_mib",
            "MiB peak (VmHWM) of the first start",
            Memory,
        ),
        (
            "scale.startup_s",
            "s to /readyz, restart in a settled world (median)",
            Time,
        ),
        (
            "scale.restart_passes_s",
            "s from /readyz to the end of the initial pass over every CR (median)",
            Time,
        ),
        (
            "scale.rss_mib",
            "MiB VmRSS after the restart's initial pass",
            Memory,
        ),
        ("scale.hwm_mib", "MiB VmHWM of the restart", Memory),
        (
            "scale.bytes_per_object",
            "(RSS − empty RSS) / (pods + CRs)",
            Memory,
        ),
        ("sched.n", "pods of one schedule", Info),
        (
            "sched.flip_s",
            "s, hibernate boundary → all N Hibernated",
            Time,
        ),
        (
            "sched.writes_per_pod",
            "schedule CR writes per pod for one boundary (target 1)",
            Count,
        ),
    ] {
        figs.set(key, None, unit, kind);
    }
}

/// Every part `o` asks for; the figures and the details for the JSON.
pub async fn measure(o: &Opts) -> (Figures, serde_json::Map<String, Value>) {
    let cluster = cluster::cluster();
    log(format!(
        "kube-apiserver {} at {}; parts {:?}; n={} scale_n={} quiet_s={}",
        cluster.k8s_version, cluster.apiserver_url, o.parts, o.n, o.scale_n, o.quiet_s
    ));
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let product_user = product::product_identity(cluster).await.username.clone();
    std::fs::create_dir_all(&o.out).expect("create output dir");

    let mut figs = Figures::default();
    declare(&mut figs);
    let mut detail = serde_json::Map::new();

    // The ceiling server: certificates as the product's, from the cluster CA.
    let certs = tempfile::tempdir().expect("tempdir");
    let (cert, key) = cluster.serving_cert(&["127.0.0.1", "localhost"]);
    let (cert_path, key_path) = (certs.path().join("tls.crt"), certs.path().join("tls.key"));
    std::fs::write(&cert_path, cert).expect("write cert");
    std::fs::write(&key_path, key).expect("write key");

    if o.part("roundtrip") || o.part("quiet") || o.part("admission") {
        roundtrip(o, cluster, &product_user, &mut figs, &mut detail).await;
    }
    if o.part("admission") {
        log("admission: ceiling (no-op axum + rustls)");
        let ceiling = load::Ceiling::start(&cert_path, &key_path).await;
        let body = load::review_body("ceiling", "web-0");
        let mut runs = Vec::new();
        for c in [16, 64] {
            let (m, all) = load::median_of(
                o.admission_reps,
                ceiling.port,
                &cluster.ca_cert_pem,
                &body,
                c,
                o.admission_s,
            )
            .await;
            if c == 16 {
                figs.set("adm.ceiling_rps_c16", Some(m.rps), "", Kind::Rate);
            } else {
                figs.set("adm.ceiling_rps_c64", Some(m.rps), "", Kind::Rate);
                figs.set("adm.ceiling_p99_c64_ms", Some(m.p99_ms), "", Kind::Time);
            }
            runs.extend(all);
        }
        detail.insert("admission_ceiling_runs".into(), json!(runs));
    }
    if o.part("scale") && o.scale_n > 0 {
        scale(o, cluster, &client, &mut figs, &mut detail).await;
    }
    if o.part("schedule") && o.n > 0 {
        schedule::schedule(o, &mut figs, &mut detail).await;
    }
    let ours = figs.get("adm.rps_c64_10k").or(figs.get("adm.rps_c64_1k"));
    if let (Some(ours), Some(ceiling)) = (ours, figs.get("adm.ceiling_rps_c64")) {
        figs.set("adm.ceiling_share", Some(ours / ceiling), "", Kind::Rate);
    }
    (figs, detail)
}

async fn run(o: Opts) -> i32 {
    let started = Instant::now();
    let (figs, detail) = measure(&o).await;

    // Output.
    let machine = machine();
    let doc = json!({
        "command": "make bench",
        "date": jiff::Timestamp::now().to_string(),
        "machine": machine,
        "settings": {
            "n": o.n, "filler_pods": o.filler_pods, "fresh_n": o.fresh_n, "quiet_s": o.quiet_s, "scale_n": o.scale_n,
            "admission_s": o.admission_s, "admission_reps": o.admission_reps,
            "sim_delay_ms": o.sim_delay_ms, "sim_hibernating_first": o.sim_hibernating_first,
            "sim_wake_drops_tag": o.sim_wake_drops_tag, "parts": o.parts,
        },
        "duration_s": report::round(started.elapsed().as_secs_f64()),
        "figures": figs.to_json(),
        "detail": Value::Object(detail),
    });
    let text = serde_json::to_string_pretty(&doc).expect("JSON");
    let stamp = jiff::Timestamp::now().as_second();
    std::fs::write(o.out.join("system-latest.json"), &text).expect("write JSON");
    std::fs::write(o.out.join(format!("system-{stamp}.json")), &text).expect("write JSON");

    let baseline: Option<Value> = std::fs::read_to_string(&o.baseline)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let regressions = report::print_table(&figs, baseline.as_ref());
    println!();
    println!(
        "machine: {}; baseline: {} ({}); output: {}",
        machine,
        o.baseline.display(),
        baseline
            .as_ref()
            .and_then(|b| b["date"].as_str())
            .unwrap_or("missing"),
        o.out.join("system-latest.json").display()
    );
    println!(
        "regression thresholds: counts any increase; times ×{} (tails ×{}), and +{} s / +{} ms; memory ×{}; rates ÷{}",
        report::TIME_RATIO,
        report::TAIL_RATIO,
        report::time_slack("_s"),
        report::time_slack("_ms"),
        report::MEMORY_RATIO,
        report::TIME_RATIO
    );
    if regressions.is_empty() {
        println!("regressions: none");
    } else {
        println!("regressions: {}", regressions.join(", "));
    }
    if o.update_baseline {
        let base = json!({
            "command": "make bench",
            "date": doc["date"],
            "machine": doc["machine"],
            "settings": doc["settings"],
            "figures": doc["figures"],
        });
        std::fs::write(
            &o.baseline,
            serde_json::to_string_pretty(&base).expect("JSON") + "\n",
        )
        .expect("write baseline");
        println!("baseline written: {}", o.baseline.display());
    }
    let f = |k: &str| report::fmt(figs.get(k).map(report::round));
    let mib = |k: &str| report::fmt(figs.get(k).map(|v| v.round()));
    println!(
        "bench: writes_per_round={} floor=9 reason_writes={} conflicts={} reaction_p99_ms={} \
         registry_calls_per_wake={} fresh_wake_writes={} rss_mib_10k={} startup_s_10k={} \
         admission_rps_c64_10k={} ceiling_share={} schedule_flip_s_1000={} \
         schedule_writes_per_pod={}",
        f("rt.writes_per_round"),
        f("rt.reason_writes"),
        f("rt.conflicts"),
        mib("rt.reaction_p99_ms"),
        f("rt.registry_calls_per_wake"),
        f("fresh.writes_per_cr"),
        mib("scale.rss_mib"),
        f("scale.startup_s"),
        mib("adm.rps_c64_10k"),
        figs.get("adm.ceiling_share")
            .map_or("na".into(), |v| format!("{v:.2}")),
        f("sched.flip_s"),
        f("sched.writes_per_pod"),
    );
    if o.fail_on_regression && !regressions.is_empty() {
        1
    } else {
        0
    }
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown cpu".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    format!(
        "{cores} cores ({cpu}), {mem_gib:.0} GiB, Linux, loopback control plane ({})",
        cluster::cluster().k8s_version
    )
}

/// Waits until the product made no write in the namespace for `quiet` and owes no tag
/// delete; returns how long that took.
async fn settle(
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
async fn passes_quiet(product: &product::Product, quiet: Duration, max: Duration) -> Duration {
    let start = Instant::now();
    let mut last = product.metric(world::RECONCILE_PASSES);
    let mut last_change = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = product.metric(world::RECONCILE_PASSES);
        if now != last {
            last = now;
            last_change = Instant::now();
        }
        if last_change.elapsed() >= quiet || start.elapsed() > max {
            return last_change.saturating_duration_since(start);
        }
    }
}

async fn create_crs(
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

async fn create_sim_pods(env: &env::Env, names: &[String]) {
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

fn reactions(
    names: &[String],
    cr_at: &HashMap<String, Instant>,
    pod_at: &HashMap<String, Instant>,
) -> Vec<f64> {
    names
        .iter()
        .filter_map(|n| Some(ms(cr_at.get(n)?.saturating_duration_since(*pod_at.get(n)?))))
        .collect()
}

fn latest(at: &HashMap<String, Instant>, since: Instant) -> f64 {
    at.values()
        .map(|t| t.saturating_duration_since(since).as_secs_f64())
        .fold(0.0, f64::max)
}

/// Round trip, fresh wake, quiet window and admission with N CRs: one product, one
/// namespace, the simulator.
async fn roundtrip(
    o: &Opts,
    cluster: &cluster::Cluster,
    user: &str,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
) {
    let n = o.n;
    let delay = Duration::from_millis(o.sim_delay_ms);
    let env = env::setup(
        "bench-rt",
        env::Setup {
            hibernate_delay: delay,
            wake_delay: delay,
            hibernate_timeout: "900s",
            wake_timeout: "900s",
            extra_args: product_args(),
            ..Default::default()
        },
    )
    .await;
    env.sim.knobs.set_hibernating_first(o.sim_hibernating_first);
    env.sim.knobs.set_wake_drops_tag(o.sim_wake_drops_tag);
    let ns = env.ns.clone();
    log(format!(
        "roundtrip: namespace {ns}, product pid {:?}",
        env.product.pid()
    ));
    let watches = Watches::start(&env.client, &ns, true);
    let mut tail = audit::AuditTail::new(cluster.audit_log.clone(), &ns);
    let names: Vec<String> = (0..n).map(|i| format!("p-{i:05}")).collect();
    let t = Instant::now();
    create_sim_pods(&env, &names).await;
    log(format!(
        "{n} running pods created in {:.1}s",
        t.elapsed().as_secs_f64()
    ));
    if o.filler_pods > 0 {
        let t = Instant::now();
        let fillers: Vec<String> = (0..o.filler_pods).map(|i| format!("fill-{i:05}")).collect();
        // Created without the status write: the cache holds them all the same.
        world::for_each_concurrent(fillers, 32, |name| {
            let (pods, vm) = (env.pods.clone(), format!("vm-{ns}-{name}"));
            async move {
                let pod = world::realistic_pod(&name, &vm);
                let pp = kube::api::PostParams::default();
                world::retry(&format!("create pod {name}"), || pods.create(&pp, &pod)).await;
            }
        })
        .await;
        log(format!(
            "{} realistic pods without a CR created in {:.1}s",
            o.filler_pods,
            t.elapsed().as_secs_f64()
        ));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let timeout = Duration::from_secs(900);
    let every = Duration::from_millis(100);
    let mut scratch = Vec::new(); // wait_all samples; the chart uses the sampler

    if o.part("roundtrip") {
        // Hibernate: N new CRs at once.
        let m0 = world::scrape(&env.product);
        let a0 = tail.mark();
        let t0 = Instant::now();
        let sampler = watches.sampler(names.clone(), t0, every);
        create_crs(&env.crs, &names, Desire::Hibernate).await;
        let created = t0.elapsed();
        log(format!(
            "{n} Hibernate CRs created in {:.1}s",
            created.as_secs_f64()
        ));
        watches
            .wait_all(&names, Phase::Hibernated, timeout, t0, every, &mut scratch)
            .await;
        let hib_at = watches.reached(&names, Phase::Hibernated, t0);
        let wall_hib = latest(&hib_at, t0);
        log(format!("all Hibernated after {wall_hib:.1}s"));
        let m1 = world::scrape(&env.product);

        // Wake: flip all at once.
        let t1 = Instant::now();
        world::for_each_concurrent(names.clone(), 64, |name| {
            let api = env.crs.clone();
            async move { product::set_desire(&api, &name, Desire::Wake).await }
        })
        .await;
        watches
            .wait_all(&names, Phase::Active, timeout, t0, every, &mut scratch)
            .await;
        let act_at = watches.reached(&names, Phase::Active, t1);
        let wall_wake = latest(&act_at, t1);
        log(format!("all Active after {wall_wake:.1}s; settling"));
        let settled = settle(
            &mut tail,
            &env.product,
            user,
            Duration::from_secs(3),
            Duration::from_secs(180),
        )
        .await;
        let timeline = sampler.finish();
        let a2 = tail.mark();
        let t2 = Instant::now();
        let m2 = world::scrape(&env.product);

        let pod_hib = watches.pod_done(PodDone::Hibernated, t0);
        let pod_woken = watches.pod_done(PodDone::Woken, t1);
        let react_hib = reactions(&names, &hib_at, &pod_hib);
        let react_wake = reactions(&names, &act_at, &pod_woken);
        // Per CR, ms after the round began: vk's completion write, then the terminal
        // phase; with the product's log, to follow a slow reaction.
        let at = |m: &HashMap<String, Instant>, n: &String| {
            m.get(n).map(|t| ms(t.saturating_duration_since(t0)))
        };
        let per_cr: serde_json::Map<String, Value> = names
            .iter()
            .map(|n| {
                let v = json!([
                    at(&pod_hib, n),
                    at(&hib_at, n),
                    at(&pod_woken, n),
                    at(&act_at, n)
                ]);
                (n.clone(), v)
            })
            .collect();
        std::fs::write(
            o.out.join("roundtrip-per-cr.json"),
            Value::Object(per_cr).to_string(),
        )
        .expect("write per-CR JSON");
        std::fs::write(o.out.join("roundtrip-server.log"), env.product.log_text())
            .expect("write server log");
        let both: Vec<f64> = react_hib.iter().chain(&react_wake).copied().collect();
        let window = tail.window(a0, a2);
        let prod = audit::tally(window, |u| u == user);
        let others = audit::tally(window, |u| u != user);
        let changes = watches.status_changes(&names, t0, t2);
        let same_phase = audit::same_phase_status_writes(&tail.events, a0, a2, |u| u == user);
        if same_phase.is_none() {
            log(
                "the audit log holds no status bodies: rt.reason_writes is na (restart the control plane: hack/cluster-down.sh)",
            );
        }
        let reg_hib = world::delta(&m0, &m1, world::REGISTRY_CALLS);
        let reg_wake = world::delta(&m1, &m2, world::REGISTRY_CALLS);
        let errors = world::delta(&m0, &m2, world::RECONCILE_ERRORS);
        log(format!(
            "deferred passes: {:?}",
            world::delta(&m0, &m2, "cocoon_hibernation_pass_deferrals_total")
        ));
        let nf = n as f64;
        let pod_writes: usize = prod
            .by_key
            .iter()
            .filter(|(k, _)| k.contains(" pods"))
            .map(|(_, v)| v)
            .sum();
        let cr_writes: usize = prod
            .by_key
            .iter()
            .filter(|(k, _)| k.contains(" cocoonhibernations"))
            .map(|(_, v)| v)
            .sum();
        let non_2xx: usize = prod
            .codes
            .iter()
            .filter(|(c, _)| **c >= 300)
            .map(|(_, v)| v)
            .sum();
        figs.set("rt.n", Some(nf), "", Kind::Info);
        figs.set("rt.wall_hibernate_s", Some(wall_hib), "", Kind::Time);
        figs.set("rt.wall_wake_s", Some(wall_wake), "", Kind::Time);
        figs.set(
            "rt.reaction_hibernate_p50_ms",
            report::pct(&react_hib, 0.5),
            "",
            Kind::Time,
        );
        figs.set(
            "rt.reaction_hibernate_p99_ms",
            report::pct(&react_hib, 0.99),
            "",
            Kind::Time,
        );
        figs.set(
            "rt.reaction_wake_p50_ms",
            report::pct(&react_wake, 0.5),
            "",
            Kind::Time,
        );
        figs.set(
            "rt.reaction_wake_p99_ms",
            report::pct(&react_wake, 0.99),
            "",
            Kind::Time,
        );
        figs.set(
            "rt.reaction_p99_ms",
            report::pct(&both, 0.99),
            "",
            Kind::Time,
        );
        figs.set(
            "rt.reaction_max_ms",
            report::pct(&both, 1.0),
            "",
            Kind::Time,
        );
        // The product's own share of the reaction: what is left is the watch delivering
        // vk's write to the product and the status write to the observer.
        figs.set(
            "rt.product_reaction_p99_ms",
            world::histogram_quantile(
                &world::delta(&m0, &m2, "cocoon_hibernation_reaction_seconds_bucket"),
                0.99,
            )
            .map(|s| s * 1000.0),
            "",
            Kind::Info,
        );
        // The transition writes: a status write that leaves the phase as it was is counted
        // apart (rt.reason_writes).
        figs.set(
            "rt.writes_per_round",
            Some((prod.total - same_phase.unwrap_or(0)) as f64 / nf),
            "",
            Kind::Count,
        );
        figs.set(
            "rt.all_writes_per_round",
            Some(prod.total as f64 / nf),
            "",
            Kind::Count,
        );
        figs.set(
            "rt.events_per_round",
            Some(prod.events as f64 / nf),
            "",
            Kind::Count,
        );
        figs.set(
            "rt.pod_writes_per_round",
            Some(pod_writes as f64 / nf),
            "",
            Kind::Count,
        );
        figs.set(
            "rt.cr_writes_per_round",
            Some(cr_writes as f64 / nf),
            "",
            Kind::Count,
        );
        figs.set("rt.phase_writes", Some(changes[0] as f64), "", Kind::Info);
        figs.set(
            "rt.reason_writes",
            same_phase.map(|c| c as f64 / nf),
            "",
            Kind::Count,
        );
        figs.set(
            "rt.same_phase_changes",
            Some(changes[1] as f64),
            "",
            Kind::Info,
        );
        figs.set(
            "rt.other_status_writes",
            Some(changes[2] as f64),
            "",
            Kind::Count,
        );
        figs.set("rt.conflicts", Some(prod.conflicts as f64), "", Kind::Count);
        figs.set(
            "rt.conflict_errors_metric",
            Some(errors.get("{error=\"conflict\"}").copied().unwrap_or(0.0)),
            "",
            Kind::Count,
        );
        figs.set("rt.non_2xx_writes", Some(non_2xx as f64), "", Kind::Count);
        figs.set(
            "rt.registry_calls_per_hibernate",
            Some(sum(&reg_hib) / nf),
            "",
            Kind::Count,
        );
        figs.set(
            "rt.registry_calls_per_wake",
            Some(sum(&reg_wake) / nf),
            "",
            Kind::Count,
        );
        figs.set(
            "rt.sim_writes_per_round",
            Some(others.total as f64 / nf),
            "",
            Kind::Info,
        );
        detail.insert(
            "roundtrip".into(),
            json!({
                "namespace": ns,
                "create_crs_s": report::round(created.as_secs_f64()),
                "settle_after_active_s": report::round(settled.as_secs_f64()),
                "product_writes": prod,
                "simulator_and_driver_writes": others,
                "registry_calls_hibernate": reg_hib,
                "registry_calls_wake": reg_wake,
                "reconcile_errors": errors,
                "reconcile_passes": world::delta(&m0, &m2, world::RECONCILE_PASSES),
                "status_changes": { "phase": changes[0], "reason": changes[1], "other": changes[2] },
                "same_phase_status_writes": same_phase,
                "reactions_measured": { "hibernate": react_hib.len(), "wake": react_wake.len() },
                "timeline_ms": timeline.iter().map(|(t, c)| json!([report::round(*t), c])).collect::<Vec<_>>(),
            }),
        );
        let flip_ms = ms(t1.duration_since(t0));
        std::fs::write(
            o.out.join("roundtrip-phases.svg"),
            report::phases_svg(
                &format!("{n} CRs: Hibernate at once, then Wake at once (phase counts)"),
                &timeline,
                &[(flip_ms, "flip to Wake")],
            ),
        )
        .expect("write SVG");
        std::fs::write(
            o.out.join("reaction-latency.svg"),
            report::histogram_svg(
                "Reaction: vk completion write → CR terminal phase",
                &[
                    ("hibernate", "#3f51b5", &react_hib),
                    ("wake", "#4caf50", &react_wake),
                ],
            ),
        )
        .expect("write SVG");

        // Fresh wake: a new Wake CR on a running pod.
        if o.fresh_n > 0 {
            let fresh: Vec<String> = (0..o.fresh_n).map(|i| format!("f-{i:05}")).collect();
            create_sim_pods(&env, &fresh).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            let m3 = world::scrape(&env.product);
            let a3 = tail.mark();
            let t3 = Instant::now();
            create_crs(&env.crs, &fresh, Desire::Wake).await;
            let mut tl = Vec::new();
            watches
                .wait_all(&fresh, Phase::Active, timeout, t3, every, &mut tl)
                .await;
            settle(
                &mut tail,
                &env.product,
                user,
                Duration::from_secs(3),
                Duration::from_secs(120),
            )
            .await;
            let a4 = tail.mark();
            let m4 = world::scrape(&env.product);
            let t = audit::tally(tail.window(a3, a4), |u| u == user);
            let reg = world::delta(&m3, &m4, world::REGISTRY_CALLS);
            let k = o.fresh_n as f64;
            figs.set(
                "fresh.writes_per_cr",
                Some(t.total as f64 / k),
                "",
                Kind::Count,
            );
            figs.set(
                "fresh.registry_calls_per_cr",
                Some(sum(&reg) / k),
                "",
                Kind::Count,
            );
            detail.insert(
                "fresh_wake".into(),
                json!({ "n": o.fresh_n, "product_writes": t, "registry_calls": reg }),
            );
            log(format!(
                "fresh wake: {:.2} writes per CR",
                t.total as f64 / k
            ));
        }
    } else {
        // Quiet or admission alone still wants N settled CRs.
        create_crs(&env.crs, &names, Desire::Wake).await;
        watches
            .wait_all(
                &names,
                Phase::Active,
                timeout,
                Instant::now(),
                every,
                &mut scratch,
            )
            .await;
        settle(
            &mut tail,
            &env.product,
            user,
            Duration::from_secs(3),
            Duration::from_secs(120),
        )
        .await;
    }

    if o.part("quiet") {
        log(format!("quiet: {} s with {} settled CRs", o.quiet_s, n));
        let m5 = world::scrape(&env.product);
        let a5 = tail.mark();
        tokio::time::sleep(Duration::from_secs(o.quiet_s)).await;
        let a6 = tail.mark();
        let m6 = world::scrape(&env.product);
        let t = audit::tally(tail.window(a5, a6), |u| u == user);
        let reg = world::delta(&m5, &m6, world::REGISTRY_CALLS);
        let passes = world::delta(&m5, &m6, world::RECONCILE_PASSES);
        figs.set("quiet.window_s", Some(o.quiet_s as f64), "", Kind::Info);
        figs.set("quiet.writes", Some(t.total as f64), "", Kind::Count);
        figs.set("quiet.registry_calls", Some(sum(&reg)), "", Kind::Count);
        figs.set("quiet.reconcile_passes", Some(sum(&passes)), "", Kind::Info);
        detail.insert(
            "quiet".into(),
            json!({ "product_writes": t, "registry_calls": reg }),
        );
    }

    // The load generator shares this process: stop the simulator's resync loop and the
    // watches first.
    drop(watches);
    let env::Env {
        client,
        crs,
        product,
        sim,
        ..
    } = env;
    drop(sim);
    if o.part("admission") {
        let crs = world::count_crs(&crs).await;
        log(format!(
            "admission: webhook with {crs} CRs in the namespace"
        ));
        admission(
            o,
            cluster,
            &client,
            &ns,
            product.webhook_port,
            "1k",
            figs,
            detail,
        )
        .await;
        figs.set("adm.crs_1k", Some(crs as f64), "", Kind::Info);
    }
    drop(product);
    world::delete_pods(&client, &ns).await;
}

/// Admission load at concurrency 16 and 64 against the product's webhook, for a CREATE of
/// a CR on a pod that exists and has none (the full V1–V4 path, allowed).
#[allow(clippy::too_many_arguments)]
async fn admission(
    o: &Opts,
    cluster: &cluster::Cluster,
    client: &kube::Client,
    ns: &str,
    port: u16,
    tag: &str,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let vm = format!("vm-{ns}-adm-0");
    world::create_realistic_pod(&pods, "adm-0", &vm).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let body = load::review_body(ns, "adm-0");
    let answer = load::probe(port, &cluster.ca_cert_pem, &body).await;
    assert_eq!(
        answer["response"]["allowed"], true,
        "the benchmark's review must be allowed: {answer}"
    );
    let mut runs = Vec::new();
    for c in [16usize, 64] {
        let (m, all) = load::median_of(
            o.admission_reps,
            port,
            &cluster.ca_cert_pem,
            &body,
            c,
            o.admission_s,
        )
        .await;
        log(format!(
            "admission {tag} c{c}: {:.0} req/s p50 {:.2} ms p99 {:.2} ms",
            m.rps, m.p50_ms, m.p99_ms
        ));
        let key = |what: &str| -> &'static str {
            match (what, c, tag) {
                ("rps", 16, "1k") => "adm.rps_c16_1k",
                ("p50", 16, "1k") => "adm.p50_c16_1k_ms",
                ("p99", 16, "1k") => "adm.p99_c16_1k_ms",
                ("rps", 64, "1k") => "adm.rps_c64_1k",
                ("p50", 64, "1k") => "adm.p50_c64_1k_ms",
                ("p99", 64, "1k") => "adm.p99_c64_1k_ms",
                ("rps", 16, _) => "adm.rps_c16_10k",
                ("rps", 64, _) => "adm.rps_c64_10k",
                ("p50", 64, _) => "adm.p50_c64_10k_ms",
                ("p99", 64, _) => "adm.p99_c64_10k_ms",
                _ => "",
            }
        };
        for (what, v) in [("rps", m.rps), ("p50", m.p50_ms), ("p99", m.p99_ms)] {
            let k = key(what);
            if !k.is_empty() {
                let kind = if what == "rps" {
                    Kind::Rate
                } else {
                    Kind::Time
                };
                figs.set(k, Some(v), "", kind);
            }
        }
        runs.extend(all);
    }
    detail.insert(format!("admission_{tag}_runs"), json!(runs));
}

/// Cache memory and start-up with S realistic pods and S CRs.
async fn scale(
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
    let (rss0, _) = world::memory_kib(empty.pid().expect("pid"));
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
            let size = world::create_realistic_pod(&pods, &name, &vm).await;
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
    let (rss1, hwm1) = world::memory_kib(pid);
    drop(watches);

    // Restarts in the settled world (the figure that matters for a rollout): the median
    // time of `startup_reps`, memory from the last.
    let mut warms = Vec::new();
    let mut passes = Vec::new();
    let (mut rss2, mut hwm2) = (0, 0);
    for _ in 0..o.startup_reps.max(1) {
        let t = Instant::now();
        p.restart().await;
        warms.push(t.elapsed().as_secs_f64());
        let pid = p.pid().expect("pid");
        // RSS and admission load once the initial pass over every CR is done.
        let d = passes_quiet(&p, Duration::from_secs(3), Duration::from_secs(600)).await;
        passes.push(d.as_secs_f64());
        (rss2, hwm2) = world::memory_kib(pid);
    }
    let warm = report::pct(&warms, 0.5).unwrap_or(f64::NAN);
    let passes_s = report::pct(&passes, 0.5).unwrap_or(f64::NAN);
    log(format!(
        "restart ready in {warm:.1}s; RSS {} MiB, HWM {} MiB",
        rss2 / 1024,
        hwm2 / 1024
    ));
    figs.set("scale.startup_cold_s", Some(cold), "", Kind::Time);
    figs.set("scale.settle_s", Some(settle_s), "", Kind::Time);
    figs.set(
        "scale.rss_settled_mib",
        Some(rss1 as f64 / 1024.0),
        "",
        Kind::Memory,
    );
    figs.set(
        "scale.hwm_settled_mib",
        Some(hwm1 as f64 / 1024.0),
        "",
        Kind::Memory,
    );
    figs.set("scale.startup_s", Some(warm), "", Kind::Time);
    figs.set("scale.restart_passes_s", Some(passes_s), "", Kind::Time);
    figs.set(
        "scale.rss_mib",
        Some(rss2 as f64 / 1024.0),
        "",
        Kind::Memory,
    );
    figs.set(
        "scale.hwm_mib",
        Some(hwm2 as f64 / 1024.0),
        "",
        Kind::Memory,
    );
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
    world::delete_pods(client, &ns).await;
}
