//! The install suite (`make install-test`): the chart as it ships, installed with helm on
//! a real node (kubelet, containerd, CNI; `cargo xtask cluster-up --node`) from the image
//! `make image` built, then upgraded, failed over and uninstalled under load. The release
//! first installed is the previous one (`cargo xtask old-release`: its chart and image), which
//! the suite upgrades to this tree by the documented command and by `--reuse-values`
//! (upgrade.rs); the wake proxy is turned on once (proxy.rs). VM pods run on the vk-cocoon
//! simulator's virtual node. Steps run in order and stop at the first failure; the last
//! line sums up:
//! `install: image_mb=.. upgrade_from=.. reuse_values=ok admissions=.. failed=.. transitions=.. lost=.. handover_s=.. takeover_s=..`

mod fence;
mod load;
mod node;
mod proxy;
mod rbac;
mod shell;
mod steps;
mod uninstall;
mod upgrade;
mod world;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Instant;

use testkit::{virtual_node, vk_sim};
use world::World;

/// What the summary line reports.
#[derive(Default, Debug)]
pub struct Tally {
    /// The previous release's commit the suite upgraded from.
    pub upgrade_from: String,
    /// "ok" once the `--reuse-values` upgrade kept every default of the new chart.
    pub reuse_values: &'static str,
    pub admissions: usize,
    pub failed: usize,
    pub transitions: usize,
    pub lost: usize,
    pub handover_s: f64,
    pub takeover_s: f64,
}

#[tokio::main]
async fn main() -> ExitCode {
    // kube and reqwest are built without a default crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let started = Instant::now();
    let mut tally = Tally {
        upgrade_from: "-".into(),
        reuse_values: "-",
        ..Tally::default()
    };
    let result = run(&mut tally).await;
    let image_mb = std::env::var("COCOON_IMAGE_MB").unwrap_or_default();
    let line = format!(
        "install: image_mb={image_mb} upgrade_from={} reuse_values={} admissions={} failed={} transitions={} lost={} handover_s={:.1} takeover_s={:.1}",
        tally.upgrade_from,
        tally.reuse_values,
        tally.admissions,
        tally.failed,
        tally.transitions,
        tally.lost,
        tally.handover_s,
        tally.takeover_s
    );
    match result {
        Ok(()) if tally.failed == 0 && tally.lost == 0 => {
            println!(
                "install suite passed in {:.0}s",
                started.elapsed().as_secs_f64()
            );
            println!("{line}");
            ExitCode::SUCCESS
        }
        Ok(()) => {
            println!("install suite FAILED: failed admissions or lost transitions");
            println!("{line}");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("install suite FAILED: {e}");
            println!("{line}");
            ExitCode::FAILURE
        }
    }
}

async fn run(tally: &mut Tally) -> world::Result<()> {
    let world = Arc::new(World::new().await?);
    world.create_namespace().await?;
    let _node = virtual_node::register(world.client.clone(), &world.virtual_node).await?;
    let knobs = Arc::new(vk_sim::SimKnobs::new(
        std::time::Duration::from_millis(1000),
        std::time::Duration::from_millis(1000),
    ));
    let _sim = vk_sim::spawn(
        world.client.clone(),
        Some(world.vm_ns.clone()),
        world.registry.clone(),
        knobs,
    );
    let old = upgrade::OldRelease::from_env(&world)?;
    tally.upgrade_from = old.commit.clone();
    steps::step(
        &format!(
            "install the previous release ({}): two replicas Ready, one leads (P2), webhook through its Service",
            old.commit
        ),
        async {
            old.install(&world)?;
            steps::installed(&world).await
        },
    )
    .await?;
    steps::step(
        "securityContext enforced by the kubelet and runc",
        steps::security(&world),
    )
    .await?;
    steps::step(
        "hibernate -> wake round trip (H, W2)",
        steps::round_trip(&world),
    )
    .await?;
    steps::step("the fleet and the load's pods", steps::start_fleet(&world)).await?;
    steps::step(
        "--reuse-values from the previous release renders every new default (S11)",
        async { upgrade::reuse_values_from_old_renders_defaults(&world) },
    )
    .await?;
    steps::step(
        "documented upgrade from the previous release under load: CRDs Helm owns, then --reset-then-reuse-values (S11)",
        steps::upgrade(&world, tally, || {
            let doc = upgrade::Documented::read()?;
            upgrade::crd_upgrade(&world, &doc)?;
            upgrade::documented_upgrade(&world, &doc)
        }),
    )
    .await?;
    steps::step(
        "documented upgrade: every default of the new chart in force (S11)",
        async { upgrade::defaults_in_force(&world, "the documented upgrade") },
    )
    .await?;
    let rolled = format!(
        "podAnnotations.rolled=r{}",
        jiff::Timestamp::now().as_second()
    );
    steps::step(
        "helm upgrade --reuse-values under load (S11)",
        steps::upgrade(&world, tally, || {
            upgrade::reuse_values_upgrade(&world, &["--set", &rolled])
        }),
    )
    .await?;
    steps::step(
        "--reuse-values: every default of the new chart in force (S11)",
        async { upgrade::defaults_in_force(&world, "helm upgrade --reuse-values") },
    )
    .await?;
    tally.reuse_values = "ok";
    steps::step(
        "a namespace editor and viewer run the plugin through the aggregated roles (P5)",
        rbac::p5_users(&world),
    )
    .await?;
    steps::step(
        "leader deleted, graceful then forced: takeover, no DELETE after its fence (S1)",
        steps::failover(&world, tally),
    )
    .await?;
    steps::step(
        "the wake proxy through the chart: a held request served after the wake (Q1, Q2)",
        proxy::q1_q2_held_request_served_after_wake(&world),
    )
    .await?;
    steps::step(
        "uninstall with schedules by the documented steps keeps every snapshot; reinstall wakes them (S6, K4, V7)",
        uninstall::s6_k4_uninstall_with_schedules(&world),
    )
    .await?;
    steps::step(
        "1,000 CRs under the chart's memory limit",
        steps::thousand(&world),
    )
    .await?;
    Ok(())
}
