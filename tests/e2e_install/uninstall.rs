//! Uninstall with schedules present, by docs/install.md's steps word for word (S6: the
//! documented steps never delete a hibernated VM's snapshot unless the reader chose to;
//! K4: deleting a schedule releases its CRs, never deletes them), then a reinstall that
//! wakes every kept VM from its tag.
//!
//! The commands are the docs' own text (checked below), run through bash with the
//! cluster's kubectl and helm; `<ns>` and `<name>` are filled in per CR.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use cocoon_hibernation::api::{Desire, Phase};
use cocoon_hibernation::schedule::CocoonHibernationSchedule;
use cocoon_hibernation::schedule::plan::SCHEDULE_LABEL;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::shell::sh;
use crate::steps::{fleet, leader, settle, settle_fleet};
use crate::world::{Result, World, settled, wait_for};

const DOCS: &str = include_str!("../../docs/install.md");

/// Step 1: every schedule to `onDelete: Orphan`, then deleted while the controller runs.
const SCHEDULES: &str = r#"kubectl get chs -A --no-headers -o custom-columns=NS:.metadata.namespace,NAME:.metadata.name |
  while read -r ns name; do
    kubectl -n "$ns" patch chs "$name" --type=merge -p '{"spec":{"onDelete":"Orphan"}}'
  done
kubectl delete chs --all -A --wait=true --timeout=5m"#;
/// Step 2, an `Active` CR.
const ACTIVE: &str = "kubectl -n <ns> delete ch <name> --wait=true --timeout=2m";
/// Step 2, path (a): wake, then delete.
const PATH_A: &str = r#"kubectl -n <ns> patch ch <name> --type=merge -p '{"spec":{"desire":"Wake"}}'
kubectl -n <ns> wait ch/<name> --for=jsonpath='{.status.phase}'=Active --timeout=10m
kubectl -n <ns> delete ch <name> --wait=true --timeout=2m"#;
/// Step 2, path (b): the controller stopped once, then per CR the finalizer and the CR.
const PATH_B_STOP: &str =
    "helm uninstall cocoon-hibernation -n cocoon-system --wait   # or scale the Deployment to 0";
const PATH_B_CR: &str = r#"kubectl -n <ns> patch ch <name> --type=json \
  -p '[{"op":"remove","path":"/metadata/finalizers"}]'
kubectl -n <ns> delete ch <name>"#;
/// Step 3: both CRDs.
const CRDS: &str = r#"kubectl delete crd cocoonhibernationschedules.cocoonset.cocoonstack.io \
  cocoonhibernations.cocoonset.cocoonstack.io --wait=true --timeout=2m"#;
const CRD_NAMES: [&str; 2] = [
    "cocoonhibernationschedules.cocoonset.cocoonstack.io",
    "cocoonhibernations.cocoonset.cocoonstack.io",
];

/// Pods the always-asleep schedule (`onDelete: Wake`) hibernates.
const ARCHIVE: [&str; 3] = ["sch-archive-0", "sch-archive-1", "sch-archive-2"];
/// Pods the schedule whose awake window holds now keeps awake; `-1` is hibernated by
/// hand (an override, K5).
const OFFICE: [&str; 3] = ["sch-office-0", "sch-office-1", "sch-office-2"];
/// Fleet CRs taken down path (a); the rest of the fleet goes down path (b).
const PATH_A_COUNT: usize = 3;

/// The docs' step text must still be what this test runs.
fn documented(block: &str) -> Result<()> {
    if DOCS.contains(&format!("```sh\n{block}\n")) || DOCS.contains(&format!("{block}\n```")) {
        return Ok(());
    }
    Err(format!("docs/install.md no longer holds this step; update the docs and this test together:\n{block}").into())
}

fn fill(block: &str, ns: &str, name: &str) -> String {
    block.replace("<ns>", ns).replace("<name>", name)
}

fn schedules(world: &World) -> Api<CocoonHibernationSchedule> {
    Api::namespaced(world.client.clone(), &world.vm_ns)
}

async fn labelled_pod(world: &World, name: &str, tier: &str) -> Result<()> {
    world.vm_pod(name).await?;
    let patch = json!({ "metadata": { "labels": { "tier": tier } } });
    Api::<k8s_openapi::api::core::v1::Pod>::namespaced(world.client.clone(), &world.vm_ns)
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(())
}

async fn create_schedule(world: &World, name: &str, spec: serde_json::Value) -> Result<()> {
    let s: CocoonHibernationSchedule = serde_json::from_value(json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1alpha1", "kind": "CocoonHibernationSchedule",
        "metadata": { "name": name }, "spec": spec,
    }))?;
    schedules(world).create(&PostParams::default(), &s).await?;
    Ok(())
}

/// An awake window of every day, from an hour ago to two hours ahead (UTC): awake now.
fn window_around_now() -> (String, String) {
    let minute = (jiff::Timestamp::now().as_second() / 60).rem_euclid(24 * 60);
    let hhmm = |m: i64| {
        let m = m.rem_euclid(24 * 60);
        format!("{:02}:{:02}", m / 60, m % 60)
    };
    (hhmm(minute - 60), hhmm(minute + 120))
}

/// The CR the schedule `by` created for `pod`, once it is in `phase`.
async fn scheduled(world: &World, pod: &str, by: &str, phase: Phase) -> Result<()> {
    wait_for(
        &format!("{pod}: a CR from schedule {by}, {phase:?}"),
        Duration::from_secs(90),
        || async {
            let Some(cr) = world.crs().get_opt(pod).await? else {
                return Ok(false);
            };
            let ours = cr.labels().get(SCHEDULE_LABEL).map(String::as_str) == Some(by);
            Ok(ours && cr.status.and_then(|s| s.phase) == Some(phase))
        },
    )
    .await?;
    Ok(())
}

async fn digest(world: &World, pod: &str) -> Result<String> {
    Ok(world
        .tag(pod)
        .await?
        .ok_or_else(|| format!("{pod}: Hibernated without a tag"))?)
}

pub async fn s6_k4_uninstall_with_schedules(world: &Arc<World>) -> Result<()> {
    for block in [SCHEDULES, ACTIVE, PATH_A, CRDS] {
        documented(block)?;
    }
    documented(&format!("{PATH_B_STOP}\n{PATH_B_CR}"))?;
    let ns = world.vm_ns.clone();

    // The world before: the fleet hibernated by hand, two schedules and their CRs.
    let fleet = fleet();
    for n in &fleet {
        world.set_desire(n, Desire::Hibernate).await?;
    }
    if settle_fleet(world).await? != 0 {
        return Err("the fleet did not hibernate".into());
    }
    for p in ARCHIVE {
        labelled_pod(world, p, "archive").await?;
    }
    for p in OFFICE {
        labelled_pod(world, p, "office").await?;
    }
    let selector = |tier: &str| json!({ "matchLabels": { "tier": tier } });
    create_schedule(
        world,
        "archive",
        json!({ "selector": selector("archive"), "timeZone": "UTC", "awake": [],
                "alwaysAsleep": true, "onDelete": "Wake" }),
    )
    .await?;
    let (from, to) = window_around_now();
    create_schedule(
        world,
        "office",
        json!({ "selector": selector("office"), "timeZone": "UTC",
                "awake": [{ "from": from, "to": to }], "onDelete": "Orphan" }),
    )
    .await?;
    for p in ARCHIVE {
        scheduled(world, p, "archive", Phase::Hibernated).await?;
    }
    for p in OFFICE {
        scheduled(world, p, "office", Phase::Active).await?;
    }
    world.set_desire(OFFICE[1], Desire::Hibernate).await?;
    settle(world, OFFICE[1], Phase::Hibernated).await?;
    // Why schedules go first: a CR deleted under a schedule comes back (K4).
    let uid = world.crs().get(OFFICE[0]).await?.uid();
    world
        .crs()
        .delete(OFFICE[0], &DeleteParams::default())
        .await?;
    wait_for(
        "the office schedule recreates the CR deleted under it",
        Duration::from_secs(60),
        || async {
            let cr = world.crs().get_opt(OFFICE[0]).await?;
            Ok(cr.is_some_and(|cr| cr.uid() != uid && cr.metadata.deletion_timestamp.is_none()))
        },
    )
    .await?;
    scheduled(world, OFFICE[0], "office", Phase::Active).await?;

    // Every CR of the namespace as the docs' list shows it, settled: earlier steps left
    // some of their own (the round trip's, the RBAC step's), which the steps cover too.
    wait_for("every CR settled", Duration::from_secs(180), || async {
        let phases = world.phases().await?;
        Ok(phases
            .values()
            .all(|(d, p)| p.is_some() && *p == settled(*d)))
    })
    .await?;
    let phases = world.phases().await?;
    let every: Vec<String> = phases.keys().cloned().collect();
    let path_a: Vec<String> = fleet[..PATH_A_COUNT].to_vec();
    let mut active = Vec::new();
    // Every tag that must survive: each Hibernated CR's but path (a)'s.
    let mut kept: BTreeMap<String, String> = BTreeMap::new();
    for (n, (_, phase)) in &phases {
        if path_a.contains(n) {
            continue;
        }
        match phase {
            Some(Phase::Active) => active.push(n.clone()),
            _ => {
                kept.insert(n.clone(), digest(world, n).await?);
            }
        }
    }
    for n in fleet[PATH_A_COUNT..]
        .iter()
        .map(String::as_str)
        .chain(ARCHIVE)
        .chain([OFFICE[1]])
    {
        if !kept.contains_key(n) {
            return Err(format!("{n}: not Hibernated before the uninstall").into());
        }
    }

    // 1. Schedules, with the controller running.
    sh(world, SCHEDULES, Duration::from_secs(330)).await?;
    let left = schedules(world).list(&ListParams::default()).await?.items;
    if !left.is_empty() {
        return Err(format!("{} schedules left after step 1", left.len()).into());
    }
    for n in ARCHIVE.iter().chain(&OFFICE) {
        let cr = world.crs().get(n).await?;
        if cr.labels().contains_key(SCHEDULE_LABEL) {
            return Err(format!("{n}: still labelled by its schedule after step 1").into());
        }
    }
    for p in ARCHIVE {
        // onDelete: Orphan, set by step 1, kept the desire (no wake, tag kept).
        let cr = world.crs().get(p).await?;
        if cr.spec.desire != Desire::Hibernate {
            return Err(format!("{p}: desire {:?} after step 1", cr.spec.desire).into());
        }
    }

    // 2. The CRs: Active ones, path (a) for a few, path (b) for the rest.
    for n in &active {
        sh(world, &fill(ACTIVE, &ns, n), Duration::from_secs(150)).await?;
    }
    for n in &path_a {
        sh(world, &fill(PATH_A, &ns, n), Duration::from_secs(780)).await?;
        if world.tag(n).await?.is_some() {
            return Err(format!("{n}: tag left after path (a) (W2)").into());
        }
    }
    sh(world, PATH_B_STOP, Duration::from_secs(180)).await?;
    for n in kept.keys() {
        sh(world, &fill(PATH_B_CR, &ns, n), Duration::from_secs(60)).await?;
    }

    // 3. Both CRDs (the release went in path (b)).
    sh(world, "kubectl get chs,ch -A", Duration::from_secs(30)).await?;
    sh(world, CRDS, Duration::from_secs(150)).await?;
    let crds: Api<CustomResourceDefinition> = Api::all(world.client.clone());
    wait_for(
        "both CRDs gone, nothing in Terminating",
        Duration::from_secs(30),
        || async {
            for name in CRD_NAMES {
                if crds.get_opt(name).await?.is_some() {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await?;
    for (n, want) in &kept {
        match world.tag(n).await? {
            Some(d) if &d == want => {}
            other => return Err(format!("{n}: tag {other:?} after uninstall, want {want}").into()),
        }
    }
    println!(
        "  all {} tags kept with their digests; {} CRs Active, {PATH_A_COUNT} woken by path (a)",
        kept.len(),
        active.len()
    );

    // Reinstall: the CRDs come back with the chart; a Wake CR wakes each kept VM.
    world.helm_install(&[])?;
    leader(world).await?;
    for n in &every {
        world.create_cr(n, Desire::Wake, false).await?;
    }
    for n in &every {
        settle(world, n, Phase::Active).await?;
    }
    wait_for(
        "every kept tag deleted after its wake (W2)",
        Duration::from_secs(60),
        || async {
            for n in kept.keys() {
                if world.tag(n).await?.is_some() {
                    return Ok(false);
                }
            }
            Ok(true)
        },
    )
    .await?;
    Ok(())
}
