//! The suite's steps, in the order a release lives: install, round trip, upgrade,
//! failover, uninstall and reinstall, scale.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cocoon_hibernation::api::{Desire, Phase};
use futures::{StreamExt, TryStreamExt, stream};
use kube::api::DeleteParams;

use crate::Tally;
use crate::fence;
use crate::load::{self, AdmissionLoad, Cycler, LeaseWatch};
use crate::node;
use crate::world::{LEASE_DURATION, Result, World, settled, wait_for};

const FLEET: usize = 20;
const SCALE: usize = 1000;
/// One admission request every 50 ms: 20 a second.
const ADMISSION_EVERY: Duration = Duration::from_millis(50);
const SETTLE: Duration = Duration::from_secs(180);

pub async fn step<F: Future<Output = Result<()>>>(name: &str, f: F) -> Result<()> {
    let start = Instant::now();
    println!("step: {name} ...");
    match f.await {
        Ok(()) => {
            println!("step: {name}: ok in {:.1}s", start.elapsed().as_secs_f64());
            Ok(())
        }
        Err(e) => Err(format!("step '{name}': {e}").into()),
    }
}

pub(crate) fn fleet() -> Vec<String> {
    (0..FLEET).map(|i| format!("fleet-{i:02}")).collect()
}

pub(crate) async fn leader(world: &World) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let live = names(world.live_product_pods().await?);
        if let Some(h) = world.lease().await?.0.filter(|h| live.contains(h)) {
            return Ok(h);
        }
        if Instant::now() > deadline {
            return Err("no live replica holds the Lease after 60s".into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The release just installed: two replicas Ready, one leads, the webhook answers.
pub async fn installed(world: &World) -> Result<()> {
    let ready = world.ready_replicas().await?;
    if ready != 2 {
        return Err(format!("{ready} replicas Ready after helm --wait, want 2").into());
    }
    let holder = leader(world).await?;
    println!("  leader: {holder}");
    // The apiserver reaches the webhook only through its Service's endpoints: a denial in
    // the webhook's own words proves the path.
    world.vm_pod("svc-check").await?;
    let err = match world.create_cr_named("not-svc-check", "svc-check").await {
        Ok(()) => return Err("a CR named after another pod was admitted".into()),
        Err(e) => e.to_string(),
    };
    if !err.contains("must equal spec.podRef.name") {
        return Err(format!("the webhook did not answer through its Service: {err}").into());
    }
    Ok(())
}

pub async fn security(world: &World) -> Result<()> {
    for pod in world.live_product_pods().await? {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let pid = node::container_pid(&world.containerd_sock, &pod)?;
        let e = node::enforced(pid)?;
        println!("  {name}: pid {pid} {e:?}");
        let uid_ok = e.uid.split_whitespace().all(|u| u == "65532");
        if !(uid_ok
            && e.cap_eff == "0000000000000000"
            && e.no_new_privs
            && e.seccomp == "2"
            && e.root_read_only)
        {
            return Err(format!("{name}: the securityContext is not enforced: {e:?}").into());
        }
        let restarts: i32 = pod
            .status
            .and_then(|s| s.container_statuses)
            .map(|c| c.iter().map(|c| c.restart_count).sum())
            .unwrap_or(0);
        if restarts != 0 {
            return Err(format!("{name} restarted {restarts} times").into());
        }
    }
    Ok(())
}

pub(crate) async fn settle(world: &World, pod: &str, phase: Phase) -> Result<()> {
    wait_for(
        &format!("{pod} {phase:?}"),
        Duration::from_secs(60),
        || async { Ok(world.phases().await?.get(pod).and_then(|p| p.1) == Some(phase)) },
    )
    .await?;
    Ok(())
}

pub async fn round_trip(world: &World) -> Result<()> {
    world.vm_pod("rt-0").await?;
    world.create_cr("rt-0", Desire::Hibernate, false).await?;
    settle(world, "rt-0", Phase::Hibernated).await?;
    if world.tag("rt-0").await?.is_none() {
        return Err("Hibernated without its snapshot tag".into());
    }
    world.set_desire("rt-0", Desire::Wake).await?;
    settle(world, "rt-0", Phase::Active).await?;
    wait_for(
        "the tag deleted after the wake (W2)",
        Duration::from_secs(30),
        || async { Ok(world.tag("rt-0").await?.is_none()) },
    )
    .await?;
    Ok(())
}

/// Waits until every fleet CR is settled for its desire; counts those that are not, and
/// Hibernated ones without their tag, as lost.
pub(crate) async fn settle_fleet(world: &World) -> Result<usize> {
    let names = fleet();
    let _ = wait_for("the fleet settled", SETTLE, || async {
        let phases = world.phases().await?;
        Ok(names.iter().all(|n| {
            phases
                .get(n)
                .is_some_and(|(d, p)| p.is_some() && *p == settled(*d))
        }))
    })
    .await;
    let phases = world.phases().await?;
    let mut lost = 0;
    for n in &names {
        let ok = match phases.get(n) {
            Some((d, p)) if p.is_some() && *p == settled(*d) => {
                *p != Some(Phase::Hibernated) || world.tag(n).await?.is_some()
            }
            _ => false,
        };
        if !ok {
            println!("  LOST or stuck: {n}: {:?}", phases.get(n));
            lost += 1;
        }
    }
    Ok(lost)
}

/// The fleet the load flips, and the pods admission requests name.
pub async fn start_fleet(world: &World) -> Result<()> {
    for n in fleet() {
        world.vm_pod(&n).await?;
        world.create_cr(&n, Desire::Wake, false).await?;
    }
    for i in 0..3 {
        world.vm_pod(&format!("load-{i}")).await?;
    }
    Ok(())
}

fn load_pods() -> Vec<String> {
    (0..3).map(|i| format!("load-{i}")).collect()
}

/// Runs `roll` (a helm upgrade that replaces both pods) under load: admissions, flips
/// and a watch on the Lease; adds what it saw to the tally.
pub async fn upgrade<F>(world: &Arc<World>, tally: &mut Tally, roll: F) -> Result<()>
where
    F: FnOnce() -> Result<()>,
{
    let watch = LeaseWatch::start(world.clone());
    let admissions = AdmissionLoad::start(world.clone(), load_pods(), ADMISSION_EVERY);
    let cycler = Cycler::start(world.clone());
    tokio::time::sleep(Duration::from_secs(5)).await;
    let before: Vec<String> = names(world.live_product_pods().await?);
    let t0 = Instant::now();
    roll()?;
    println!(
        "  helm upgrade --wait took {:.1}s",
        t0.elapsed().as_secs_f64()
    );
    wait_for("the old pods gone", Duration::from_secs(90), || async {
        let now = names(world.live_product_pods().await?);
        Ok(now.len() == 2 && now.iter().all(|p| !before.contains(p)))
    })
    .await?;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let completed = cycler.stop().await;
    let (sent, failed, errors) = admissions.stop().await;
    let log = watch.stop().await;
    let handover = load::longest_handover(&log).unwrap_or_default();
    println!(
        "  admissions={sent} failed={failed} transitions={completed} handover={:.1}s",
        handover.as_secs_f64()
    );
    for e in &errors {
        println!("  admission error: {e}");
    }
    let lost = settle_fleet(world).await?;
    tally.admissions += sent;
    tally.failed += failed;
    tally.transitions += completed;
    tally.lost += lost;
    tally.handover_s = tally.handover_s.max(handover.as_secs_f64());
    if completed == 0 {
        return Err("no transition completed during the upgrade".into());
    }
    Ok(())
}

fn names(pods: Vec<k8s_openapi::api::core::v1::Pod>) -> Vec<String> {
    pods.into_iter().filter_map(|p| p.metadata.name).collect()
}

/// Deletes the leading pod and times the takeover; returns (old leader, its IP, takeover).
async fn kill_leader(world: &Arc<World>, force: bool) -> Result<(String, String, Duration)> {
    let old = leader(world).await?;
    let ip = world
        .product_pods()
        .get(&old)
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .ok_or("the leader has no pod IP")?;
    let watch = LeaseWatch::start(world.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let dp = if force {
        DeleteParams::default().grace_period(0)
    } else {
        DeleteParams::default()
    };
    let t0 = Instant::now();
    world.product_pods().delete(&old, &dp).await?;
    wait_for("another replica leads", Duration::from_secs(90), || async {
        Ok(matches!(world.lease().await?.0, Some(h) if h != old))
    })
    .await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let log = watch.stop().await;
    let (new, at) = load::new_holder_after(&log, &old, t0).ok_or("no new holder seen")?;
    let takeover = at.duration_since(t0);
    println!(
        "  {} delete of {old}: {new} leads after {:.1}s",
        if force { "forced" } else { "graceful" },
        takeover.as_secs_f64()
    );
    Ok((old, ip, takeover))
}

pub async fn failover(world: &Arc<World>, tally: &mut Tally) -> Result<()> {
    let cycler = Cycler::start(world.clone());
    let admissions = AdmissionLoad::start(world.clone(), load_pods(), ADMISSION_EVERY);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (_, _, graceful) = kill_leader(world, false).await?;
    wait_for(
        "two replicas Ready again",
        Duration::from_secs(120),
        || async { Ok(world.ready_replicas().await? == 2) },
    )
    .await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let (sent, failed, errors) = admissions.stop().await;
    println!("  graceful: admissions={sent} failed={failed}");
    for e in &errors {
        println!("  admission error: {e}");
    }
    tally.admissions += sent;
    tally.failed += failed;

    // A SIGKILLed pod cannot finish what it was answering: its admissions are counted
    // apart from the summary, which holds what a rollout or a graceful stop must keep.
    let forced_load = AdmissionLoad::start(world.clone(), load_pods(), ADMISSION_EVERY);
    // The old leader's last renewal bounds its fence; watch the Lease across the kill.
    let watch = LeaseWatch::start(world.clone());
    let (old, old_ip, forced) = kill_leader(world, true).await?;
    tokio::time::sleep(LEASE_DURATION).await;
    let log = watch.stop().await;
    let completed = cycler.stop().await;
    let (sent, failed, errors) = forced_load.stop().await;
    println!("  forced: admissions={sent} failed={failed} (not in the summary)");
    for e in &errors {
        println!("  admission error: {e}");
    }
    let lost = settle_fleet(world).await?;
    let renewed =
        load::last_renewal_of(&log, &old).ok_or("the old leader's renewal was never seen")?;
    let fence_end = renewed + jiff::SignedDuration::try_from(LEASE_DURATION)?;
    let late = fence::deletes_after(&world.registry_log, &old_ip, fence_end)?;
    println!(
        "  transitions={completed} lost={lost}; fence of {old} ({old_ip}) ended {fence_end}; DELETEs after it: {}",
        late.len()
    );
    tally.transitions += completed;
    tally.lost += lost;
    tally.takeover_s = graceful.max(forced).as_secs_f64();
    if !late.is_empty() {
        return Err(format!("S1: DELETEs from {old} after its fence: {late:?}").into());
    }
    Ok(())
}

pub async fn thousand(world: &Arc<World>) -> Result<()> {
    let t0 = Instant::now();
    stream::iter(0..SCALE)
        .map(|i| async move {
            let n = format!("mem-{i:04}");
            world.vm_pod(&n).await?;
            world.create_cr(&n, Desire::Wake, false).await
        })
        .buffer_unordered(16)
        .try_collect::<Vec<()>>()
        .await?;
    println!(
        "  created {SCALE} pods and CRs in {:.0}s",
        t0.elapsed().as_secs_f64()
    );
    wait_for("all CRs Active", Duration::from_secs(300), || async {
        let phases = world.phases().await?;
        Ok(phases
            .values()
            .filter(|(_, p)| *p == Some(Phase::Active))
            .count()
            >= SCALE + FLEET)
    })
    .await?;
    let holder = leader(world).await?;
    for pod in world.live_product_pods().await? {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let pid = node::container_pid(&world.containerd_sock, &pod)?;
        let (rss, peak) = node::memory(pid)?;
        let limit = node::memory_limit(pid)?;
        let restarts: i32 = pod
            .status
            .and_then(|s| s.container_statuses)
            .map(|c| c.iter().map(|c| c.restart_count).sum())
            .unwrap_or(0);
        println!(
            "  {name}{}: rss={}MiB peak={}MiB limit={}MiB restarts={restarts}",
            if name == holder { " (leader)" } else { "" },
            rss >> 20,
            peak >> 20,
            limit >> 20
        );
        if peak >= limit || restarts != 0 {
            return Err(
                format!("{name}: peak {peak} of limit {limit}, {restarts} restarts").into(),
            );
        }
    }
    Ok(())
}
