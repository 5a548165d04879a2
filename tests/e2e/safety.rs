//! End-to-end proofs of the safety rules (SPEC W2, S2, S5, S6) on the real apiserver and
//! registry: the product never deletes a snapshot that is still needed, never lets two
//! CRs fight over one pod, and says in status and Events what it did.

use testkit::cluster;
use testkit::env;
use testkit::product;
use testkit::vk_sim;

use cocoon_hibernation::api::annotations::{
    COCOONSET_GENERATION, HIBERNATE, LIFECYCLE_OBSERVED_GENERATION, LIFECYCLE_STATE, PodView, VM_ID,
};
use cocoon_hibernation::api::conditions::{self, READY, SNAPSHOT_DELETED};
use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use env::{LONG, Setup, setup};
use kube::api::{Patch, PatchParams};
use product::{eventually, never_phase, wait_phase};
use std::time::Duration;

fn condition(cr: &CocoonHibernation, type_: &str) -> Option<cocoon_hibernation::api::Condition> {
    cr.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_))
        .cloned()
}

/// W2: vk still reports `hibernated` while the pod shows a Running container with a VMID
/// (a hibernate that vk has not finished undoing). The wake must not complete, so the
/// tag (perhaps the VM's only copy) stays; once vk reports the VM ready, it completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_w2_running_with_vmid_while_vk_reports_hibernated_stays_waking_and_keeps_the_tag() {
    let env = setup("w2-lifecycle", Setup::default()).await;
    // The test plays vk for this pod; the simulator stays out of the way.
    env.sim.knobs.set_never_complete(true);
    env.pod("w2-0").await;
    let vm = env.vm("w2-0");
    product::create_cr(&env.crs, "w2-0", "w2-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "w2-0", Phase::Hibernating, LONG, &mut vec![]).await;
    vk_sim::push_snapshot(&env.registry, &vm, "w2")
        .await
        .expect("push the snapshot");
    // vk's lifecycle pair for this round, but the VM (VMID, Running container) is still there.
    let lifecycle = serde_json::json!({ "metadata": { "annotations": {
        LIFECYCLE_STATE: "hibernated",
        LIFECYCLE_OBSERVED_GENERATION: "1",
        COCOONSET_GENERATION: "1",
    }}});
    env.pods
        .patch("w2-0", &PatchParams::default(), &Patch::Merge(&lifecycle))
        .await
        .expect("patch lifecycle");
    wait_phase(&env.crs, "w2-0", Phase::Hibernated, LONG, &mut vec![]).await;

    product::set_desire(&env.crs, "w2-0", Desire::Wake).await;
    wait_phase(&env.crs, "w2-0", Phase::Waking, LONG, &mut vec![]).await;
    eventually("hibernate annotation removed (W1)", LONG, || async {
        let pod = env.pods.get("w2-0").await.ok()?;
        let ann = pod.metadata.annotations.unwrap_or_default();
        (!ann.contains_key(HIBERNATE)).then_some(())
    })
    .await;
    let pod = env.pods.get("w2-0").await.expect("get pod");
    let view = cocoon_hibernation::api::annotations::PodView::of(&pod);
    assert!(
        view.container_running && view.vm_id.is_some(),
        "the pod shows Running with a VMID: {view:?}"
    );
    never_phase(&env.crs, "w2-0", Phase::Active, Duration::from_secs(8)).await;
    assert!(
        env.tag_exists(&vm).await,
        "W2: the tag is kept while vk reports hibernated"
    );

    // vk finishes the wake: a fresh VMID and `ready`. Now the wake completes.
    let woke = serde_json::json!({ "metadata": { "annotations": {
        LIFECYCLE_STATE: "ready",
        VM_ID: "vm-id-after-wake",
    }}});
    env.pods
        .patch("w2-0", &PatchParams::default(), &Patch::Merge(&woke))
        .await
        .expect("patch ready");
    wait_phase(&env.crs, "w2-0", Phase::Active, LONG, &mut vec![]).await;
    eventually("tag deleted after the wake", LONG, || async {
        (!env.tag_exists(&vm).await).then_some(())
    })
    .await;
}

/// W2 (issue: a slow vk): a large VM's push outlasts the hibernate timeout, the CR goes
/// `Failed`, the desire flips to `Wake` and W1 removes the annotation, but vk ignores that,
/// removes the VM a while later and only then restores it from the tag. The pod shows
/// Running with its pre-hibernate VMID all along the push: that is no wake. The wake ends
/// only on the VMID vk writes after the restore, and the tag survives until then (a
/// restore that finds no tag is a VM lost for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_w2_a_timed_out_hibernate_then_wake_waits_for_a_fresh_vmid() {
    let env = setup(
        "w2-slow",
        Setup {
            hibernate_timeout: "2s",
            ..Setup::default()
        },
    )
    .await;
    // A slow vk: pushes at once, removes the VM 10 s later, never says `hibernating`.
    env.sim.knobs.set_hibernating_first(false);
    env.sim.knobs.set_removal_delay(Duration::from_secs(10));
    let pod = env.pod("slow-0").await;
    let old_id = PodView::of(&pod)
        .vm_id
        .expect("a VMID before the hibernate");
    let vm = env.vm("slow-0");
    product::create_cr(&env.crs, "slow-0", "slow-0", Desire::Hibernate).await;
    let failed = wait_phase(&env.crs, "slow-0", Phase::Failed, LONG, &mut vec![]).await;
    assert_eq!(
        failed.pre_hibernate_vm_id(),
        Some(old_id.as_str()),
        "W2: the VMID at the hibernate request is recorded: {:?}",
        failed.status
    );
    eventually("vk pushed the snapshot", LONG, || async {
        env.tag_exists(&vm).await.then_some(())
    })
    .await;
    product::set_desire(&env.crs, "slow-0", Desire::Wake).await;
    eventually("hibernate annotation removed (W1)", LONG, || async {
        let pod = env.pods.get("slow-0").await.ok()?;
        let ann = pod.metadata.annotations.unwrap_or_default();
        (!ann.contains_key(HIBERNATE)).then_some(())
    })
    .await;
    // vk still pushes/removes: the pod runs on the old VMID, which proves nothing.
    let during = PodView::of(&env.pods.get("slow-0").await.expect("get pod"));
    assert!(
        during.woken() && during.vm_id.as_deref() == Some(old_id.as_str()),
        "the world this test means to play: Running on the old VMID, {during:?}"
    );
    let waiting = eventually("the CR says it waits for a fresh VMID", LONG, || async {
        let cr = env.crs.get("slow-0").await.ok()?;
        let progressing = condition(&cr, conditions::PROGRESSING)?;
        (progressing.reason == conditions::REASON_WAITING_FOR_FRESH_VMID).then_some(cr)
    })
    .await;
    assert_eq!(product::phase(&waiting), Some(Phase::Waking));
    assert!(
        env.tag_exists(&vm).await,
        "W2: no tag delete on the old VMID"
    );

    // vk removes the VM, then restores it from the tag: now the wake ends.
    let active = wait_phase(&env.crs, "slow-0", Phase::Active, LONG, &mut vec![]).await;
    let pod = env.pods.get("slow-0").await.expect("get pod");
    let now_id = PodView::of(&pod).vm_id.expect("a VMID after the wake");
    assert_ne!(now_id, old_id, "W2: Active only on a freshly written VMID");
    assert_eq!(
        env.sim.knobs.restores_without_snapshot(),
        0,
        "W2: vk found the snapshot when it restored the VM"
    );
    assert!(env.sim.knobs.wakes() >= 1, "vk restored the VM");
    assert_eq!(
        condition(&active, SNAPSHOT_DELETED).map(|c| c.status),
        Some("True".to_owned())
    );
    assert!(
        !env.tag_exists(&vm).await,
        "the tag is deleted after the real wake"
    );
}

/// G1 (issue: a replacement pod): the CocoonSet operator deletes a hibernated pod to free
/// its node and creates a replacement naming the same VM, which vk restores from the tag.
/// Deleting the CR in that window must keep the tag: the replacement pod holds it, even
/// before the product's cache has seen that pod (G1 reads the pods fresh).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_g1_a_replacement_pod_keeps_the_tag_when_the_cr_is_deleted() {
    let env = setup(
        "g1-repl",
        Setup {
            // vk takes a while to restore the replacement: the CR is deleted before.
            wake_delay: Duration::from_secs(4),
            ..Setup::default()
        },
    )
    .await;
    env.sim.knobs.set_restore_replacements(true);
    env.pod("web-0").await;
    let vm = env.vm("web-0");
    product::create_cr(&env.crs, "web-0", "web-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "web-0", Phase::Hibernated, LONG, &mut vec![]).await;
    assert!(env.tag_exists(&vm).await);

    env.pods
        .delete("web-0", &Default::default())
        .await
        .expect("the operator frees the node");
    vk_sim::create_replacement_pod(&env.client, &env.ns, "web-0-replacement", &vm)
        .await
        .expect("the operator creates a replacement");
    product::delete_and_wait_gone(&env.crs, "web-0", LONG).await;
    assert!(
        env.tag_exists(&vm).await,
        "G1: the tag a replacement pod names is kept"
    );
    eventually("vk restores the replacement from the tag", LONG, || async {
        (env.sim.knobs.replacement_restores() == 1).then_some(())
    })
    .await;
    assert_eq!(env.sim.knobs.restores_without_snapshot(), 0);
}

/// S2: two live CRs on one pod with opposite desires, created while the webhook was
/// absent. Only the older acts; the younger is Failed naming it and never patches the
/// pod, so over 30 s the pod is patched at most once. W2 S6: once the older is deleted
/// mid-hibernate, the younger's wake ends only on a VMID vk wrote after that request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_s2_w2_duplicates_on_one_pod_only_the_oldest_acts() {
    let env = setup(
        "dup",
        Setup {
            webhook: false,
            ..Setup::default()
        },
    )
    .await;
    // No simulator writes: every pod patch in the window is the product's.
    env.sim.knobs.set_never_complete(true);
    env.pod("dup-0").await;
    let cluster = cluster::cluster();
    let mark = cluster.audit_mark();
    product::create_cr(&env.crs, "dup-0", "dup-0", Desire::Hibernate).await;
    // creationTimestamp has one-second resolution: make the order unambiguous.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    product::create_cr(&env.crs, "dup-0-again", "dup-0", Desire::Wake).await;

    let young = eventually("the younger CR fails naming the older", LONG, || async {
        let cr = env.crs.get("dup-0-again").await.ok()?;
        (product::phase(&cr) == Some(Phase::Failed)).then_some(cr)
    })
    .await;
    let ready = condition(&young, READY).expect("Ready");
    assert_eq!(ready.reason, "Conflict");
    assert!(
        ready.message.contains(&format!("{}/dup-0", env.ns)),
        "{}",
        ready.message
    );
    wait_phase(&env.crs, "dup-0", Phase::Hibernating, LONG, &mut vec![]).await;
    tokio::time::sleep(Duration::from_secs(30)).await;

    let pod_patches = cluster
        .audit_events_since(mark)
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"].as_str() == Some(env.ns.as_str()))
        .filter(|e| e["objectRef"]["resource"] == "pods" && e["objectRef"]["name"] == "dup-0")
        .filter(|e| e["objectRef"]["subresource"].is_null())
        .filter(|e| e["verb"] == "patch")
        .count();
    assert!(
        pod_patches <= 1,
        "the pod was patched {pod_patches} times in 30 s"
    );
    let young = env.crs.get("dup-0-again").await.expect("get");
    assert_eq!(product::phase(&young), Some(Phase::Failed));
    let older = env.crs.get("dup-0").await.expect("get");
    assert_eq!(product::phase(&older), Some(Phase::Hibernating));

    // S2: the conflict clears by itself once the older CR is gone. W2 S6: the older CR's
    // hibernate request reached the pod and deleting it discarded that round, so vk may
    // still be taking the VM on this VMID away: the younger CR's wake removes the request
    // and waits for a VMID written after it, naming the one it will not take.
    let old_id = PodView::of(&env.pods.get("dup-0").await.expect("get pod"))
        .vm_id
        .expect("the pod runs its VM");
    product::delete_and_wait_gone(&env.crs, "dup-0", LONG).await;
    let waiting = eventually("the younger CR waits for a fresh VMID", LONG, || async {
        let cr = env.crs.get("dup-0-again").await.ok()?;
        let progressing = condition(&cr, conditions::PROGRESSING)?;
        (progressing.reason == conditions::REASON_WAITING_FOR_FRESH_VMID).then_some(cr)
    })
    .await;
    assert_eq!(product::phase(&waiting), Some(Phase::Waking));
    let progressing = condition(&waiting, conditions::PROGRESSING).expect("Progressing");
    assert!(
        progressing.message.contains(&old_id),
        "{}",
        progressing.message
    );
    never_phase(
        &env.crs,
        "dup-0-again",
        Phase::Active,
        Duration::from_secs(5),
    )
    .await;
    // vk writes a VMID after the request (it restored the VM): now the wake ends.
    let restored = serde_json::json!({ "metadata": { "annotations": {
        LIFECYCLE_STATE: "ready",
        VM_ID: "vm-id-after-the-discarded-round",
    }}});
    env.pods
        .patch("dup-0", &PatchParams::default(), &Patch::Merge(&restored))
        .await
        .expect("patch the VMID");
    wait_phase(&env.crs, "dup-0-again", Phase::Active, LONG, &mut vec![]).await;
}

/// Copies `<vm>:hibernate` to `<vm>:<tag>` on the plain-http registry: same manifest,
/// same digest.
async fn tag_same_manifest(registry: &str, vm: &str, tag: &str) {
    let http = reqwest::Client::new();
    let accept = "application/vnd.oci.image.manifest.v1+json";
    let got = http
        .get(format!("http://{registry}/v2/{vm}/manifests/hibernate"))
        .header("accept", accept)
        .send()
        .await
        .expect("GET manifest");
    assert!(got.status().is_success(), "GET manifest: {}", got.status());
    let media = got
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or(accept)
        .to_owned();
    let body = got.bytes().await.expect("manifest body");
    let put = http
        .put(format!("http://{registry}/v2/{vm}/manifests/{tag}"))
        .header("content-type", media)
        .body(body)
        .send()
        .await
        .expect("PUT manifest");
    assert!(put.status().is_success(), "PUT manifest: {}", put.status());
}

/// S5: a tag kept because another tag shares its digest stays SnapshotDeleted=False with
/// reason SharedDigest, the message names the other tag, and the owed-deletes gauge
/// counts it; the snapshot is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_s5_shared_digest_keeps_the_tag_and_status_says_so() {
    let env = setup("shared-digest", Setup::default()).await;
    env.pod("sd-0").await;
    let vm = env.vm("sd-0");
    product::create_cr(&env.crs, "sd-0", "sd-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "sd-0", Phase::Hibernated, LONG, &mut vec![]).await;
    tag_same_manifest(&env.registry, &vm, "keep").await;

    product::set_desire(&env.crs, "sd-0", Desire::Wake).await;
    wait_phase(&env.crs, "sd-0", Phase::Active, LONG, &mut vec![]).await;
    let cr = eventually("SnapshotDeleted=False/SharedDigest", LONG, || async {
        let cr = env.crs.get("sd-0").await.ok()?;
        let c = condition(&cr, SNAPSHOT_DELETED)?;
        (c.reason == "SharedDigest").then_some(cr)
    })
    .await;
    let c = condition(&cr, SNAPSHOT_DELETED).expect("SnapshotDeleted");
    assert_eq!(c.status, "False");
    assert!(c.message.contains("keep"), "{}", c.message);
    assert!(env.tag_exists(&vm).await, "the shared tag is kept");
    // The gauge is counted from the cache every 10 s (on every replica).
    eventually("the owed-deletes gauge counts it", LONG, || async {
        let owed = env
            .product
            .metric("cocoon_hibernation_snapshot_deletes_owed");
        (owed == 1.0).then_some(())
    })
    .await;
}

/// S6 G1: deleting a Hibernated CR emits a Warning Event SnapshotDiscarded naming the VM
/// before its tag is deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_s6_deleting_a_hibernated_cr_is_loud() {
    let env = setup("discard", Setup::default()).await;
    env.pod("dc-0").await;
    let vm = env.vm("dc-0");
    product::create_cr(&env.crs, "dc-0", "dc-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "dc-0", Phase::Hibernated, LONG, &mut vec![]).await;
    product::delete_and_wait_gone(&env.crs, "dc-0", LONG).await;
    let events = env.wait_events("dc-0", &["SnapshotDiscarded"]).await;
    assert!(events.contains(&"Hibernated".to_owned()), "{events:?}");
    let api: kube::Api<k8s_openapi::api::events::v1::Event> =
        kube::Api::namespaced(env.client.clone(), &env.ns);
    let discard = api
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .find(|e| e.reason.as_deref() == Some("SnapshotDiscarded"))
        .expect("SnapshotDiscarded event");
    assert_eq!(discard.type_.as_deref(), Some("Warning"));
    assert!(
        discard.note.unwrap_or_default().contains(&vm),
        "the event names the VM"
    );
    eventually("G1: tag deleted", LONG, || async {
        (!env.tag_exists(&vm).await).then_some(())
    })
    .await;
}
