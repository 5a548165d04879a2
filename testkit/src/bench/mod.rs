//! System benchmark (issue 8, "Performance at scale"): the release binary against the real
//! local control plane (kube-apiserver + etcd + registry from `cargo xtask cluster-up`).
//! It measures, it never changes what the product does.
//!
//! Run: `make bench` (or `cargo xtask bench [--n 100] [--scale-n 0] ...`). Parts, in order:
//! - roundtrip: N CRs created with `Hibernate` at once, then all flipped to `Wake`, with
//!   the vk simulator: wall times, reaction latency (simulator's completion write seen by
//!   our pod watch → terminal phase seen by our CR watch), API writes per CR from the
//!   audit log (by verb/resource/subresource; events apart), 409s, registry calls;
//!   then fresh-wake writes (a new `Wake` CR on a running pod);
//! - quiet: API writes and registry calls over a settled window with the N CRs;
//! - admission: requests/s and latency at concurrency 16 and 64 straight to the webhook
//!   over TLS, and the same load against a no-op axum + rustls server (the ceiling);
//! - scale: RSS and time to /readyz with S realistic pods (3 containers, ~8 KB) and S CRs;
//! - scale50k: the same with 50k of each (`--scale-50k-n`): RSS above the empty process
//!   per pod and CR, and start-up, at the size the chart's default memory limit must hold;
//!   with `--scale-others N`, then N plain pods of other workloads beside them, the product
//!   restarted on every namespace without and with `--pod-selector` (`others.rs`);
//! - schedule: N pods of one CocoonHibernationSchedule, a boundary reached through the
//!   product's shifted clock: boundary → all Hibernated, and CR writes per pod (K2);
//! - idle: N pods of one CocoonIdlePolicy (`idleAfter` 1m): idle instant → desire
//!   flipped (p99), and the wake proxy's activity reporter's Lease writes per VM per
//!   minute at one report a second (`idle.rs`);
//! - proxy (only when asked for: `--parts proxy`): the wake proxy's warm path beside
//!   direct and nginx, and its cold path against the CR's own wake (`proxy.rs`);
//! - capacity (only when asked for: `--parts capacity`): one leader under a rising
//!   population and burst size until something saturates (`capacity/`).
//!
//! Writes `<target>/bench/system-latest.json` (and a timestamped copy) with two SVG charts
//! beside it; prints a table with ratios to `bench/baseline.json`; the last line printed
//! is the one-line summary.

mod admission;
pub mod audit;
mod capacity;
mod figures;
mod idle;
pub mod load;
pub mod metrics;
mod others;
mod overhead;
pub mod pods;
mod proxy;
pub mod report;
mod roundtrip;
mod scale;
mod schedule;
mod steps;
pub mod world;

use crate::{cluster, product};
use figures::declare;
use report::{Figures, Kind};
use roundtrip::roundtrip;
use scale::scale;
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Settings: `--name value` / `--name=value` flags, else `BENCH_NAME` env, else default.
pub struct Opts {
    /// CRs in the round-trip run.
    n: usize,
    /// Seconds of each warm load of the proxy part.
    proxy_s: f64,
    /// Realistic pods without a CR beside the N simulated ones (the cache's load in the
    /// short variant of `make test`).
    filler_pods: usize,
    /// New `Wake` CRs for the fresh-wake count.
    fresh_n: usize,
    /// Settled window of the quiet part, seconds.
    quiet_s: u64,
    /// Pods and CRs of the cache-memory run (0 skips it).
    scale_n: usize,
    /// Pods and CRs of the `scale50k` part.
    scale_50k_n: usize,
    /// Plain pods of other workloads beside them (0 skips that step), and the seconds
    /// after which no more are created (the step measures what it made).
    scale_others: usize,
    scale_others_max_s: u64,
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
    /// Pods of the idle part's policy (its lag run; 0 skips it).
    idle_n: usize,
    /// VMs the idle part's activity reporter is told of once a second, and for how long.
    idle_writes_vms: usize,
    idle_writes_s: u64,
    /// Parts to run: roundtrip,quiet,admission,scale,schedule,idle (the default), proxy,
    /// capacity.
    parts: Vec<String>,
    /// The capacity part's ladder: populations (pods and settled CRs) and burst sizes.
    capacity_crs: Vec<usize>,
    capacity_bursts: Vec<usize>,
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
        let list = |name: &str, default: &str| -> Vec<usize> {
            get(name, default)
                .split(',')
                .map(|v| {
                    v.trim().parse().unwrap_or_else(|_| {
                        panic!(
                            "--{name} / BENCH_{}: {v} is not a count",
                            name.to_uppercase()
                        )
                    })
                })
                .collect()
        };
        let root = crate::repo_root();
        // <target>/release/deps/system-<hash> → <target>/bench
        let default_out = std::env::current_exe()
            .ok()
            .and_then(|e| Some(e.parent()?.parent()?.parent()?.join("bench")))
            .unwrap_or_else(|| root.join("target/bench"));
        let n = num("n", "1000") as usize;
        Self {
            n,
            proxy_s: num("proxy_s", "5"),
            filler_pods: num("filler_pods", "0") as usize,
            fresh_n: num("fresh_n", &n.min(100).to_string()) as usize,
            quiet_s: num("quiet_s", "60") as u64,
            scale_n: num("scale_n", "10000") as usize,
            scale_50k_n: num("scale_50k_n", "50000") as usize,
            scale_others: num("scale_others", "0") as usize,
            scale_others_max_s: num("scale_others_max_s", "2400") as u64,
            admission_s: num("admission_s", "3"),
            admission_reps: num("admission_reps", "3") as usize,
            startup_reps: num("startup_reps", "3") as usize,
            sim_delay_ms: num("sim_delay_ms", "50") as u64,
            sim_hibernating_first: get("sim_hibernating_first", "0") == "1",
            sim_wake_drops_tag: num("sim_wake_drops_tag", "0"),
            idle_n: num("idle_n", &n.to_string()) as usize,
            idle_writes_vms: num("idle_writes_vms", "50") as usize,
            idle_writes_s: num("idle_writes_s", "120") as u64,
            parts: get(
                "parts",
                "roundtrip,quiet,admission,scale,scale50k,schedule,idle",
            )
            .split(',')
            .map(|s| s.trim().to_owned())
            .collect(),
            capacity_crs: list("capacity_crs", "1000,10000,50000"),
            capacity_bursts: list("capacity_bursts", "100,1000,5000"),
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

/// A part's world: the simulator answering after `--sim-delay-ms`, the product with
/// `extra_args` and transition timeouts of `timeout`, long enough that a slow step is
/// measured, not failed.
async fn bench_env(
    o: &Opts,
    prefix: &str,
    timeout: &'static str,
    extra_args: Vec<String>,
) -> crate::env::Env {
    let delay = Duration::from_millis(o.sim_delay_ms);
    crate::env::setup(
        prefix,
        crate::env::Setup {
            hibernate_delay: delay,
            wake_delay: delay,
            hibernate_timeout: timeout,
            wake_timeout: timeout,
            extra_args,
            ..Default::default()
        },
    )
    .await
}

/// The `make bench` binary's `main` (`benches/system.rs`): flags from the command line.
pub fn main() {
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
    if o.part("scale50k") && o.scale_50k_n > 0 {
        scale::scale_50k(o, cluster, &client, &mut figs, &mut detail).await;
    }
    if o.part("schedule") && o.n > 0 {
        schedule::schedule(o, &mut figs, &mut detail).await;
    }
    if o.part("idle") {
        idle::idle(o, &product_user, &mut figs, &mut detail).await;
    }
    if o.part("proxy") {
        proxy::proxy(o, &mut figs, &mut detail).await;
    }
    if o.part("capacity") {
        capacity::capacity(o, cluster, &mut detail).await;
    }
    let ours = figs.get("adm.rps_c64_10k").or(figs.get("adm.rps_c64_1k"));
    if let (Some(ours), Some(ceiling)) = (ours, figs.get("adm.ceiling_rps_c64")) {
        figs.set("adm.ceiling_share", Some(ours / ceiling), "", Kind::Rate);
    }
    (figs, detail)
}

async fn run(o: Opts) -> i32 {
    let started = Instant::now();
    let product = crate::product::bin();
    if std::env::var_os(crate::product::PRODUCT_BIN_ENV).is_some() {
        log(format!("measuring another build: {}", product.display()));
    }
    let (figs, detail) = measure(&o).await;

    // Output.
    let machine = machine();
    let doc = json!({
        "command": "make bench",
        "date": jiff::Timestamp::now().to_string(),
        "machine": machine,
        "settings": {
            "n": o.n, "filler_pods": o.filler_pods, "fresh_n": o.fresh_n, "quiet_s": o.quiet_s, "scale_n": o.scale_n,
            "scale_50k_n": o.scale_50k_n, "scale_others": o.scale_others,
            "admission_s": o.admission_s, "admission_reps": o.admission_reps,
            "sim_delay_ms": o.sim_delay_ms, "sim_hibernating_first": o.sim_hibernating_first,
            "sim_wake_drops_tag": o.sim_wake_drops_tag, "parts": o.parts,
            "idle_n": o.idle_n, "idle_writes_vms": o.idle_writes_vms, "idle_writes_s": o.idle_writes_s,
            "capacity_crs": o.capacity_crs, "capacity_bursts": o.capacity_bursts,
        },
        "product": product.display().to_string(),
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
    if o.scale_others > 0 {
        println!(
            "scale50k others: n={} rss_mib={} startup_s={} selector_rss_mib={} selector_startup_s={} kib_per_other_pod={}",
            f("scale50k.others_n"),
            mib("scale50k.others_rss_mib"),
            f("scale50k.others_startup_s"),
            mib("scale50k.others_selector_rss_mib"),
            f("scale50k.others_selector_startup_s"),
            f("scale50k.others_kib_per_pod"),
        );
    }
    println!(
        "bench: writes_per_round={} floor=9 reason_writes={} conflicts={} reaction_p99_ms={} \
         registry_calls_per_wake={} fresh_wake_writes={} rss_mib_10k={} startup_s_10k={} \
         rss_kib_per_object_50k={} rss_mib_50k={} startup_s_50k={} \
         admission_rps_c64_10k={} ceiling_share={} schedule_flip_s_1000={} \
         schedule_writes_per_pod={} overhead_wake_s={} overhead_hibernate_s={} \
         intake_hibernate_p99_ms={} intake_wake_p99_ms={} \
         idle_decision_lag_s={} activity_writes_per_vm_min={}",
        f("rt.writes_per_round"),
        f("rt.reason_writes"),
        f("rt.conflicts"),
        mib("rt.reaction_p99_ms"),
        f("rt.registry_calls_per_wake"),
        f("fresh.writes_per_cr"),
        mib("scale.rss_mib"),
        f("scale.startup_s"),
        f("scale50k.kib_per_object"),
        mib("scale50k.rss_mib"),
        f("scale50k.startup_s"),
        mib("adm.rps_c64_10k"),
        figs.get("adm.ceiling_share")
            .map_or("na".into(), |v| format!("{v:.2}")),
        f("sched.flip_s"),
        f("sched.writes_per_pod"),
        f("rt.overhead_wake_s"),
        f("rt.overhead_hibernate_s"),
        mib("rt.intake_hibernate_p99_ms"),
        mib("rt.intake_wake_p99_ms"),
        f("idle.decision_lag_s"),
        f("idle.activity_writes_per_vm_min"),
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
