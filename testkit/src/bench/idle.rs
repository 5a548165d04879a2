//! The idle part (issue 36, I2 I3): `--parts idle`.
//!
//! - `idle_decision_lag_s`: N simulated VM pods selected by one CocoonIdlePolicy
//!   (`idleAfter` 1m, the shortest I1 allows; `minAwake` 30s). The policy creates their
//!   Leases and CRs; once all are Active, each pod's idle instant is fixed (the latest of
//!   its Lease's `renewTime` and its CR's `wokenAt`, plus `idleAfter`: nothing reports
//!   meanwhile). The flip is the product's first CR write (the desire patch) at or after
//!   the decision's `idle-at` mark, read from the apiserver audit log. Lag = flip − idle
//!   instant; p50, p99 and max over the N pods (a negative lag would be a pod hibernated
//!   before it was idle, and is reported as the minimum). Where it goes (the log line
//!   `lag breakdown`, the detail `idle_lag.breakdown`): idle instant → start of the pass
//!   that flipped the pod (its `idle-at` mark) → the fence's take answered → the flip;
//!   and the passes' sizes and lengths. The product's log is kept as `idle-server.log`.
//! - `activity_writes_per_vm_min`: at one report a second, for a window, from each
//!   reporter: the wake proxy's activity reporter (`proxy::activity`, in process) for M
//!   VMs, and `kubectl cocoon keepalive` (the plugin's own code, in process) for a few;
//!   Lease writes that reach the apiserver (audit log), per VM per minute, for each
//!   reporter alone (the figure: the worse of the two; I2 bounds each reporter at 6) and
//!   for VMs both report for (`activity_writes_both_per_vm_min`, at most 12).

use super::audit::AuditTail;
use super::report::{Figures, Kind, pct};
use super::steps::create_sim_pods;
use super::{Opts, log, product_args};
use crate::{cluster, env};
use cocoon_hibernation::api::CocoonHibernation;
use cocoon_hibernation::api::Phase;
use cocoon_hibernation::api::activity::{idle_at, later, lease_name};
use cocoon_hibernation::idle::plan::IDLE_AT;
use cocoon_hibernation::idle::{CocoonIdlePolicy, CocoonIdlePolicySpec};
use cocoon_hibernation::proxy::activity::Reporter;
use cocoon_hibernation::proxy::metrics::ProxyMetrics;
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, MicroTime};
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, ResourceExt};
use serde_json::{Value, json};
use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

const IDLE_AFTER: Duration = Duration::from_secs(60);
const MIN_AWAKE: Duration = Duration::from_secs(30);

pub async fn idle(
    o: &Opts,
    product_user: &str,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
) {
    let n = o.idle_n;
    figs.set("idle.n", Some(n as f64), "", Kind::Info);
    let env = super::bench_env(o, "bench-idle", "900s", product_args()).await;
    let mut audit = AuditTail::new(cluster::cluster().audit_log.clone(), &env.ns);
    if n > 0 {
        lag(&env, n, product_user, &mut audit, figs, detail, &o.out).await;
    }
    if o.idle_writes_vms > 0 {
        writes(&env, o, &mut audit, figs, detail).await;
    }
}

async fn lag(
    env: &env::Env,
    n: usize,
    product_user: &str,
    audit: &mut AuditTail,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
    out: &std::path::Path,
) {
    let names: Vec<String> = (0..n).map(|i| format!("i-{i:05}")).collect();
    create_sim_pods(env, &names).await;
    super::world::for_each_concurrent(names.clone(), 32, |name| {
        let pods = env.pods.clone();
        async move {
            let patch = Patch::Merge(json!({ "metadata": { "labels": { "bench": "idle" } } }));
            let params = PatchParams::default();
            super::world::retry(&format!("label pod {name}"), || {
                pods.patch(&name, &params, &patch)
            })
            .await;
        }
    })
    .await;
    let policies: Api<CocoonIdlePolicy> = Api::namespaced(env.client.clone(), &env.ns);
    let spec = CocoonIdlePolicySpec {
        selector: LabelSelector {
            match_labels: Some(BTreeMap::from([("bench".into(), "idle".into())])),
            ..LabelSelector::default()
        },
        idle_after: "1m".into(),
        min_awake: Some("30s".into()),
        suspend: false,
        wake_on_request: None,
    };
    let t0 = Instant::now();
    policies
        .create(
            &PostParams::default(),
            &CocoonIdlePolicy::new("bench", spec),
        )
        .await
        .expect("create the idle policy");
    // Every CR Active before the first pod can turn idle (a minute after its wake).
    let mut settled = 0;
    while t0.elapsed() < Duration::from_secs(600) {
        let crs = env.crs.list(&ListParams::default()).await;
        settled = crs.map_or(0, |l| {
            l.items
                .iter()
                .filter(|c| c.phase() == Some(Phase::Active) || is_hibernate(c))
                .count()
        });
        if settled >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    log(format!(
        "idle: {settled} of {n} CRs Active {:.1}s after the policy",
        t0.elapsed().as_secs_f64()
    ));
    // Each pod's idle instant, from what the decision reads (nothing reports meanwhile).
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let lease_list = leases
        .list(&ListParams::default())
        .await
        .expect("list Leases");
    let renew: HashMap<String, Timestamp> = lease_list
        .items
        .iter()
        .filter_map(|l| Some((l.name_any(), l.spec.as_ref()?.renew_time.as_ref()?.0)))
        .collect();
    let crs = env
        .crs
        .list(&ListParams::default())
        .await
        .expect("list CRs");
    let mut due: HashMap<String, Timestamp> = HashMap::new();
    for cr in &crs.items {
        let woken = cr
            .status
            .as_ref()
            .and_then(|s| s.woken_at.as_ref())
            .map(|t| t.0);
        let last = lease_name(&cr.name_any()).and_then(|l| renew.get(&l).copied());
        let mut at = idle_at(last, woken, None, IDLE_AFTER);
        if let Some(w) = woken {
            at = at.max(later(w, MIN_AWAKE));
        }
        due.insert(cr.name_any(), at);
    }
    let distinct: std::collections::BTreeSet<_> = due.values().collect();
    if let (Some(first), Some(last)) = (distinct.first(), distinct.last()) {
        log(format!(
            "idle: {} idle instants, {} distinct, over {:.1}s",
            due.len(),
            distinct.len(),
            last.duration_since(**first).as_secs_f64()
        ));
    }
    // Wait until every desire is Hibernate.
    let latest = due.values().max().copied().unwrap_or_else(Timestamp::now);
    let give_up = Instant::now()
        + Duration::try_from(latest.duration_since(Timestamp::now())).unwrap_or_default()
        + Duration::from_secs(300);
    let mut flipped = Vec::new();
    while Instant::now() < give_up {
        flipped = env
            .crs
            .list(&ListParams::default())
            .await
            .map(|l| l.items.into_iter().filter(is_hibernate).collect())
            .unwrap_or_default();
        if flipped.len() >= n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // The audit log lags its requests a little.
    tokio::time::sleep(Duration::from_secs(2)).await;
    audit.poll();
    let mut writes: HashMap<String, Vec<Timestamp>> = HashMap::new();
    for e in &audit.events {
        let r = &e["objectRef"];
        if super::audit::user(e) == product_user
            && e["verb"] == "patch"
            && r["resource"] == "cocoonhibernations"
            && r["subresource"].as_str().is_none_or(str::is_empty)
            && super::audit::code(e) == 200
            && let (Some(name), Some(at)) = (
                r["name"].as_str(),
                e["stageTimestamp"].as_str().and_then(|t| t.parse().ok()),
            )
        {
            writes.entry(name.to_owned()).or_default().push(at);
        }
    }
    let takes = takes(audit, product_user);
    let mut lags = Vec::new();
    let mut parts = Breakdown::default();
    for cr in &flipped {
        let name = cr.name_any();
        let (Some(idle), Some(decided)) = (
            due.get(&name),
            cr.annotations()
                .get(IDLE_AT)
                .and_then(|a| a.parse::<Timestamp>().ok()),
        ) else {
            continue;
        };
        // The flip: the first CR write at or after the decision's instant.
        let flip = writes
            .get(&name)
            .and_then(|w| w.iter().filter(|t| **t >= decided).min().copied());
        if let Some(flip) = flip {
            lags.push(flip.duration_since(*idle).as_secs_f64());
            parts.add(*idle, decided, takes.get(&name).copied(), flip);
        }
    }
    let breakdown = parts.summary();
    log(format!("idle: lag breakdown {breakdown}"));
    log(format!(
        "idle: {} of {n} flipped; {} flips found in the audit log",
        flipped.len(),
        lags.len()
    ));
    if flipped.len() == n && lags.len() == n {
        figs.set("idle.decision_lag_p50_s", pct(&lags, 0.5), "", Kind::Time);
        figs.set("idle.decision_lag_s", pct(&lags, 0.99), "", Kind::Tail);
        figs.set("idle.decision_lag_max_s", pct(&lags, 1.0), "", Kind::Tail);
        figs.set("idle.decision_lag_min_s", pct(&lags, 0.0), "", Kind::Info);
    } else {
        log("idle: not every pod flipped or was found: lag figures skipped");
    }
    detail.insert(
        "idle_lag".into(),
        json!({ "n": n, "flipped": flipped.len(), "measured": lags.len(), "breakdown": breakdown }),
    );
    // The product's log (its `idle pass` lines at debug), next to the bench's output.
    let _ = std::fs::copy(&env.product.log, out.join("idle-server.log"));
}

/// The fence's take of each pod's Lease that its flip followed (the last successful
/// take by the product), by pod: when the apiserver answered it.
fn takes(audit: &AuditTail, product_user: &str) -> HashMap<String, Timestamp> {
    let mut out = HashMap::new();
    for e in &audit.events {
        let r = &e["objectRef"];
        if super::audit::user(e) == product_user
            && e["verb"] == "patch"
            && r["resource"] == "leases"
            && super::audit::code(e) == 200
            && let (Some(pod), Some(at)) = (
                r["name"]
                    .as_str()
                    .and_then(|n| n.strip_prefix("cocoon-activity-")),
                e["stageTimestamp"].as_str().and_then(|t| t.parse().ok()),
            )
        {
            out.insert(pod.to_owned(), at);
        }
    }
    out
}

/// Where each pod's lag went: idle instant → the start of the pass that flipped it (its
/// `idle-at` mark) → the fence's take answered → the flip answered; and the passes that
/// flipped pods (how many, how many pods each, how long from start to last flip).
#[derive(Default)]
struct Breakdown {
    to_pass: Vec<f64>,
    to_take: Vec<f64>,
    to_flip: Vec<f64>,
    passes: BTreeMap<Timestamp, (usize, Timestamp)>,
}

impl Breakdown {
    fn add(&mut self, idle: Timestamp, pass: Timestamp, take: Option<Timestamp>, flip: Timestamp) {
        let s = |a: Timestamp, b: Timestamp| b.duration_since(a).as_secs_f64();
        self.to_pass.push(s(idle, pass));
        if let Some(take) = take {
            self.to_take.push(s(pass, take));
            self.to_flip.push(s(take, flip));
        }
        let p = self.passes.entry(pass).or_insert((0, flip));
        p.0 += 1;
        p.1 = p.1.max(flip);
    }

    fn summary(&self) -> Value {
        let three =
            |v: &[f64]| json!({ "p50": pct(v, 0.5), "p99": pct(v, 0.99), "max": pct(v, 1.0) });
        let sizes: Vec<f64> = self.passes.values().map(|(n, _)| *n as f64).collect();
        let long: Vec<f64> = self
            .passes
            .iter()
            .map(|(start, (_, end))| end.duration_since(*start).as_secs_f64())
            .collect();
        let starts: Vec<Timestamp> = self.passes.keys().copied().collect();
        let gaps: Vec<f64> = starts
            .windows(2)
            .map(|w| w[1].duration_since(w[0]).as_secs_f64())
            .collect();
        json!({
            "idle_to_pass_start_s": three(&self.to_pass),
            "pass_start_to_take_s": three(&self.to_take),
            "take_to_flip_s": three(&self.to_flip),
            "passes": self.passes.len(),
            "pods_per_pass": three(&sizes),
            "pass_start_to_last_flip_s": three(&long),
            "gap_between_pass_starts_s": three(&gaps),
        })
    }
}

fn is_hibernate(cr: &CocoonHibernation) -> bool {
    cr.spec.desire == cocoon_hibernation::api::Desire::Hibernate
}

/// One VM set of the writes run: the Leases' name prefix and who reports for them.
struct Set {
    prefix: &'static str,
    proxy: bool,
    keepalive: bool,
}

const SETS: [Set; 3] = [
    Set {
        prefix: "w",
        proxy: true,
        keepalive: false,
    },
    Set {
        prefix: "k",
        proxy: false,
        keepalive: true,
    },
    Set {
        prefix: "b",
        proxy: true,
        keepalive: true,
    },
];

/// `kubectl cocoon keepalive POD --for 1h`, in process (the plugin's own code path).
async fn keepalive(ns: &str, pod: &str) {
    use clap::Parser as _;
    let kubeconfig = cluster::cluster().kubeconfig.display().to_string();
    let args = [
        "kubectl-cocoon",
        "keepalive",
        pod,
        "--for",
        "1h",
        "--kubeconfig",
        &kubeconfig,
        "-n",
        ns,
    ];
    match kubectl_cocoon::Cli::try_parse_from(args) {
        Ok(cli) => {
            if let Err(e) = kubectl_cocoon::run(cli).await {
                log(format!("idle: keepalive {pod}: {e}"));
            }
        }
        Err(e) => panic!("keepalive arguments: {e}"),
    }
}

async fn writes(
    env: &env::Env,
    o: &Opts,
    audit: &mut AuditTail,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
) {
    let m = o.idle_writes_vms;
    // The plugin runs a process per report in real use: a few VMs are enough for it.
    let few = m.clamp(1, 5);
    let window = Duration::from_secs(o.idle_writes_s);
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    let names = |set: &Set| -> Vec<String> {
        let n = if set.keepalive { few } else { m };
        (0..n).map(|i| format!("{}-{i:04}", set.prefix)).collect()
    };
    // The Leases exist, as once a policy selected the pods.
    for set in &SETS {
        for name in names(set) {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: lease_name(&name),
                    ..ObjectMeta::default()
                },
                spec: Some(LeaseSpec {
                    renew_time: Some(MicroTime(Timestamp::now())),
                    ..LeaseSpec::default()
                }),
            };
            leases
                .create(&PostParams::default(), &lease)
                .await
                .expect("create a Lease");
        }
    }
    let reporter = Reporter::new(
        env.client.clone(),
        "bench-proxy".into(),
        ProxyMetrics::new(),
    );
    let flusher = tokio::spawn(reporter.clone().flush_forever());
    // A thousand "busy until" lines would bury the bench's own; failures are still logged.
    kubectl_cocoon::quiet_reports();
    let from = audit.mark();
    let t0 = Instant::now();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    while t0.elapsed() < window {
        tick.tick().await;
        let mut plugin = Vec::new();
        for set in &SETS {
            for name in names(set) {
                if set.proxy {
                    reporter.note(&(env.ns.clone(), name.clone()));
                }
                if set.keepalive {
                    let ns = env.ns.clone();
                    plugin.push(async move { keepalive(&ns, &name).await });
                }
            }
        }
        futures::future::join_all(plugin).await;
    }
    let elapsed = t0.elapsed();
    flusher.abort();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let to = audit.mark();
    let minutes = elapsed.as_secs_f64() / 60.0;
    let mut rates = serde_json::Map::new();
    for set in &SETS {
        let prefix = format!("cocoon-activity-{}-", set.prefix);
        let count = audit
            .window(from, to)
            .iter()
            .filter(|e| super::audit::is_write(e) && e["objectRef"]["resource"] == "leases")
            .filter(|e| {
                e["objectRef"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(&prefix))
            })
            .count();
        let vms = names(set).len();
        let rate = count as f64 / vms as f64 / minutes;
        log(format!(
            "idle: reporters proxy={} keepalive={}: {count} Lease writes for {vms} VMs reported once a second each for {:.0}s: {rate:.2} per VM per minute",
            set.proxy,
            set.keepalive,
            elapsed.as_secs_f64()
        ));
        rates.insert(
            set.prefix.into(),
            json!({ "proxy": set.proxy, "keepalive": set.keepalive, "vms": vms, "lease_writes": count, "per_vm_min": rate }),
        );
    }
    let rate = |k: &str| rates[k]["per_vm_min"].as_f64();
    // I2 bounds each reporter: the worse of the two alone is the figure.
    let per_reporter = rate("w").zip(rate("k")).map(|(a, b)| a.max(b));
    figs.set(
        "idle.activity_writes_per_vm_min",
        per_reporter,
        "",
        Kind::Count,
    );
    figs.set(
        "idle.activity_writes_both_per_vm_min",
        rate("b"),
        "",
        Kind::Count,
    );
    rates.insert("window_s".into(), json!(elapsed.as_secs_f64()));
    detail.insert("idle_writes".into(), Value::Object(rates));
}
