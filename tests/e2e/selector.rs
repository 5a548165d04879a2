//! `--pod-selector` on the real apiserver and registry (R2, G1, S6): a CR whose pod exists
//! outside the selector is reported as such on its CR, and never leads to a tag delete or
//! a `SnapshotDiscarded`, also when the CR is deleted.

use testkit::env;
use testkit::product;

use cocoon_hibernation::api::annotations::HIBERNATE;
use cocoon_hibernation::api::conditions::{self, PROGRESSING, REASON_POD_NOT_SELECTED};
use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use env::{Env, LONG, Setup, setup};
use kube::api::{Patch, PatchParams};
use product::{eventually, wait_phase};
use std::time::Duration;

/// The selector the docs recommend: pods a CocoonSet made.
const LABEL: &str = "cocoonset.cocoonstack.io/name";

/// Puts `pod` inside the selector (`Some(set)`) or takes it out (`None`).
async fn label(env: &Env, pod: &str, set: Option<&str>) {
    let patch = serde_json::json!({ "metadata": { "labels": { LABEL: set } } });
    env.pods
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("label {pod}: {e}"));
}

/// The CR once its Progressing condition says PodNotSelected with `status`, naming the
/// selector.
async fn not_selected(env: &Env, name: &str, status: &str) -> CocoonHibernation {
    eventually(
        &format!("{name}: Progressing {status} PodNotSelected"),
        LONG,
        || async {
            let cr = env.crs.get(name).await.ok()?;
            let c = conditions::find(&cr.status.as_ref()?.conditions, PROGRESSING)?;
            (c.status == status
                && c.reason == REASON_POD_NOT_SELECTED
                && c.message.contains(&format!("--pod-selector={LABEL}")))
            .then_some(cr)
        },
    )
    .await
}

async fn hibernate_requested(env: &Env, pod: &str) -> bool {
    let pod = env.pods.get(pod).await.expect("get pod");
    pod.metadata
        .annotations
        .is_some_and(|a| a.contains_key(HIBERNATE))
}

/// SPEC G1 S6 R2: with `--pod-selector=cocoonset.cocoonstack.io/name`, a hibernated pod
/// that leaves the selector is not "missing": its CR says PodNotSelected naming the
/// selector, a wake asked of it touches nothing, and deleting the CR keeps the tag (the
/// VM's only copy) and sends no SnapshotDiscarded, though the CR is the VM's last holder.
/// A CR whose pod was never inside the selector is Pending with that reason and never
/// patches the pod. Without the selector guard, the deletion would discard the tag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_g1_s6_r2_a_pod_outside_the_pod_selector_keeps_its_tag() {
    let env = setup(
        "podsel",
        Setup {
            extra_args: vec![format!("--pod-selector={LABEL}")],
            ..Setup::default()
        },
    )
    .await;

    // A CocoonSet pod, inside the selector, hibernates as usual.
    env.pod("in-0").await;
    label(&env, "in-0", Some("web")).await;
    let vm = env.vm("in-0");
    product::create_cr(&env.crs, "in-0", "in-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "in-0", Phase::Hibernated, LONG, &mut vec![]).await;
    assert!(env.tag_exists(&vm).await, "H3: the snapshot is stored");

    // It leaves the selector: the cache drops it as if it were deleted.
    label(&env, "in-0", None).await;
    let cr = not_selected(&env, "in-0", "False").await;
    assert_eq!(
        product::phase(&cr),
        Some(Phase::Hibernated),
        "R2 keeps the phase"
    );

    // A wake asked of it waits and says why; the pod is not this install's to patch.
    product::set_desire(&env.crs, "in-0", Desire::Wake).await;
    not_selected(&env, "in-0", "True").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        hibernate_requested(&env, "in-0").await,
        "the unselected pod is not patched"
    );
    let cr = env.crs.get("in-0").await.expect("get CR");
    assert_eq!(product::phase(&cr), Some(Phase::Hibernated));
    assert!(env.tag_exists(&vm).await);

    // Deleting the CR, the VM's last holder, keeps the tag and discards nothing.
    product::delete_and_wait_gone(&env.crs, "in-0", LONG).await;
    assert!(
        env.tag_exists(&vm).await,
        "G1: the unselected pod holds the tag"
    );
    let events = env.events("in-0").await;
    assert!(events.contains(&"Hibernated".to_owned()), "{events:?}");
    assert!(
        !events.contains(&"SnapshotDiscarded".to_owned()),
        "S6: nothing is discarded: {events:?}"
    );

    // A pod outside the selector from the start: Pending, naming the selector.
    env.pod("out-0").await;
    product::create_cr(&env.crs, "out-0", "out-0", Desire::Hibernate).await;
    let cr = not_selected(&env, "out-0", "True").await;
    assert_eq!(product::phase(&cr), Some(Phase::Pending));
    assert!(
        env::ready_message(&cr).contains(&format!("--pod-selector={LABEL}")),
        "{}",
        env::ready_message(&cr)
    );
    assert!(!hibernate_requested(&env, "out-0").await);
    product::delete_and_wait_gone(&env.crs, "out-0", LONG).await;
    assert!(!hibernate_requested(&env, "out-0").await);
    assert!(
        !env.events("out-0")
            .await
            .contains(&"SnapshotDiscarded".to_owned())
    );
}
