//! The round-trip part: N CRs hibernated and woken at once, a fresh wake, the quiet
//! window.

use super::admission::admission;
use super::metrics;
use super::overhead::Round;
use super::pods;
use super::report::{self, Figures, Kind};
use super::steps::{create_crs, create_sim_pods, latest, reactions, settle};
use super::world::{self, PodDone, Watches};
use super::{Opts, audit, log, ms, product_args, sum};
use crate::vk_sim::Action;
use crate::{cluster, env, product};
use cocoon_hibernation::api::{Desire, Phase};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// Round trip, fresh wake, quiet window and admission with N CRs: one product, one
/// namespace, the simulator.
pub(super) async fn roundtrip(
    o: &Opts,
    cluster: &cluster::Cluster,
    user: &str,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
) {
    let n = o.n;
    let env = super::bench_env(o, "bench-rt", "900s", product_args()).await;
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
                let pod = pods::realistic_pod(&name, &vm);
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
        let m0 = metrics::scrape(&env.product);
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
        let m1 = metrics::scrape(&env.product);

        // Wake: flip all at once.
        let a1 = tail.mark();
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
        let m2 = metrics::scrape(&env.product);

        let pod_hib = watches.pod_done(PodDone::Hibernated, t0);
        let pod_woken = watches.pod_done(PodDone::Woken, t1);
        let timings = env.sim.knobs.timings();
        let vm = |cr: &str| env.vm(cr);
        let sim_hib = Round::measure(&hib_at, t0, &timings.since(Action::Hibernate, t0), vm);
        let sim_wake = Round::measure(&act_at, t1, &timings.since(Action::Wake, t1), vm);
        // As the bench's own watches saw them: shown, not compared, since the CR watch
        // also carries the bench's 1,000 flips and lags behind them.
        let seen_hib = reactions(&names, &hib_at, &pod_hib);
        let seen_wake = reactions(&names, &act_at, &pod_woken);
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
        let mine = |u: &str| u == user;
        let react_hib = audit::reactions(tail.window(a0, a1), mine, Phase::Hibernated.as_str());
        let react_wake = audit::reactions(tail.window(a1, a2), mine, Phase::Active.as_str());
        let both: Vec<f64> = react_hib.iter().chain(&react_wake).copied().collect();
        // Issue 38: flip → the product's pod patch, from the audit log.
        let intake_hib = audit::intakes(tail.window(a0, a1), mine);
        let intake_wake = audit::intakes(tail.window(a1, a2), mine);
        let intake_both: Vec<f64> = intake_hib.iter().chain(&intake_wake).copied().collect();
        let window = tail.window(a0, a2);
        let prod = audit::tally(window, mine);
        let others = audit::tally(window, |u| u != user);
        let changes = watches.status_changes(&names, t0, t2);
        let same_phase = audit::same_phase_status_writes(&tail.events, a0, a2, mine);
        if same_phase.is_none() {
            log(
                "the audit log holds no status bodies: rt.reason_writes is na (restart the control plane: cargo xtask cluster-down)",
            );
        }
        let reg_hib = metrics::delta(&m0, &m1, metrics::REGISTRY_CALLS);
        let reg_wake = metrics::delta(&m1, &m2, metrics::REGISTRY_CALLS);
        let errors = metrics::delta(&m0, &m2, metrics::RECONCILE_ERRORS);
        log(format!(
            "deferred passes: {:?}",
            metrics::delta(&m0, &m2, "cocoon_hibernation_pass_deferrals_total")
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
        for (key, v) in [
            ("rt.reaction_hibernate_p50_ms", report::pct(&react_hib, 0.5)),
            (
                "rt.reaction_hibernate_p99_ms",
                report::pct(&react_hib, 0.99),
            ),
            ("rt.reaction_wake_p50_ms", report::pct(&react_wake, 0.5)),
            ("rt.reaction_wake_p99_ms", report::pct(&react_wake, 0.99)),
            ("rt.reaction_p99_ms", report::pct(&both, 0.99)),
            ("rt.reaction_max_ms", report::pct(&both, 1.0)),
            (
                "rt.seen_reaction_hibernate_p50_ms",
                report::pct(&seen_hib, 0.5),
            ),
            (
                "rt.seen_reaction_hibernate_p99_ms",
                report::pct(&seen_hib, 0.99),
            ),
            ("rt.seen_reaction_wake_p50_ms", report::pct(&seen_wake, 0.5)),
            (
                "rt.seen_reaction_wake_p99_ms",
                report::pct(&seen_wake, 0.99),
            ),
            ("rt.intake_hibernate_p50_ms", report::pct(&intake_hib, 0.5)),
            ("rt.intake_hibernate_p99_ms", report::pct(&intake_hib, 0.99)),
            ("rt.intake_wake_p50_ms", report::pct(&intake_wake, 0.5)),
            ("rt.intake_wake_p99_ms", report::pct(&intake_wake, 0.99)),
            ("rt.intake_p99_ms", report::pct(&intake_both, 0.99)),
        ] {
            figs.set(key, v, "", Kind::Time);
        }
        // The product's own share of the reaction: what is left is the watch delivering
        // vk's write to the product and the status write to the observer.
        figs.set(
            "rt.product_reaction_p99_ms",
            metrics::histogram_quantile(
                &metrics::delta(&m0, &m2, "cocoon_hibernation_reaction_seconds_bucket"),
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
                "reconcile_passes": metrics::delta(&m0, &m2, metrics::RECONCILE_PASSES),
                "status_changes": { "phase": changes[0], "reason": changes[1], "other": changes[2] },
                "same_phase_status_writes": same_phase,
                "reactions_measured": { "hibernate": react_hib.len(), "wake": react_wake.len() },
                "intakes_measured": { "hibernate": intake_hib.len(), "wake": intake_wake.len() },
                "overhead": {
                    "hibernate": sim_hib.record(Action::Hibernate, figs),
                    "wake": sim_wake.record(Action::Wake, figs),
                },
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
            let m3 = metrics::scrape(&env.product);
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
            let m4 = metrics::scrape(&env.product);
            let t = audit::tally(tail.window(a3, a4), |u| u == user);
            let reg = metrics::delta(&m3, &m4, metrics::REGISTRY_CALLS);
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
        let m5 = metrics::scrape(&env.product);
        let a5 = tail.mark();
        tokio::time::sleep(Duration::from_secs(o.quiet_s)).await;
        let a6 = tail.mark();
        let m6 = metrics::scrape(&env.product);
        let t = audit::tally(tail.window(a5, a6), |u| u == user);
        let reg = metrics::delta(&m5, &m6, metrics::REGISTRY_CALLS);
        let passes = metrics::delta(&m5, &m6, metrics::RECONCILE_PASSES);
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
        let crs = metrics::count_crs(&crs).await;
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
    pods::delete_pods(&client, &ns).await;
}
