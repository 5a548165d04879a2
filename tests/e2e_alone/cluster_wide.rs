//! SPEC S2 across namespaces: VM names are cluster-wide, so the product runs here
//! watching every namespace; alone (see `main.rs`), so no other test's CRs are
//! reconciled by it while it runs.

use testkit::cluster;
use testkit::env;
use testkit::product;
use testkit::vk_sim;

use cocoon_hibernation::api::annotations::HIBERNATE;
use cocoon_hibernation::api::conditions::{self, READY};
use cocoon_hibernation::api::{Desire, Phase};
use env::{LONG, tag_exists};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use product::{Product, ProductOptions, eventually, wait_phase};
use std::sync::Arc;
use std::time::Duration;
use vk_sim::SimKnobs;

/// S2 G1 V2 S12: a tenant in another namespace points a pod at a VM that a CR already
/// holds. Its CR (created where no webhook runs) is Failed, naming the holder only as "a
/// CR in another namespace", never annotates its pod, and deleting it leaves the holder's
/// snapshot in place. Where the webhook runs, such a CREATE is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_s2_s12_a_vm_held_in_another_namespace_is_never_touched() {
    let _alone = crate::alone().await;
    let cluster = cluster::cluster();
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let owner_ns = cluster.fresh_namespace(&client, "s2-owner").await;
    let tenant_ns = cluster.fresh_namespace(&client, "s2-tenant").await;
    let registry = cluster.registry.clone();
    // Empty namespace: watch all of them, as a cluster-wide install does.
    let product = Product::start(cluster, &ProductOptions::new("", &registry)).await;
    product::install_webhook(
        &client,
        cluster,
        &owner_ns,
        product.webhook_port,
        "cocoonset.cocoonstack.io",
    )
    .await;
    let knobs = Arc::new(SimKnobs::new(
        Duration::from_millis(300),
        Duration::from_millis(300),
    ));
    let _sim_owner = vk_sim::spawn(
        client.clone(),
        Some(owner_ns.clone()),
        registry.clone(),
        knobs.clone(),
    );
    let _sim_tenant = vk_sim::spawn(
        client.clone(),
        Some(tenant_ns.clone()),
        registry.clone(),
        knobs,
    );
    // Not derived from the owner's namespace whole: S12 is checked on the messages below.
    let suffix = owner_ns.rsplit('-').next().unwrap_or_default();
    let vm = format!("vm-shared-{suffix}");
    let owner_crs = Api::namespaced(client.clone(), &owner_ns);
    let tenant_crs = Api::namespaced(client.clone(), &tenant_ns);
    let tenant_pods: Api<Pod> = Api::namespaced(client.clone(), &tenant_ns);

    vk_sim::create_vm_pod(&client, &owner_ns, "db-0", &vm)
        .await
        .expect("owner pod");
    product::create_cr(&owner_crs, "db-0", "db-0", Desire::Hibernate).await;
    wait_phase(&owner_crs, "db-0", Phase::Hibernated, LONG, &mut vec![]).await;
    assert_eq!(tag_exists(&registry, &vm).await, Some(true));

    // The tenant's running pod names the owner's VM; its CR asks for a wake, which would
    // delete the owner's snapshot.
    vk_sim::create_vm_pod(&client, &tenant_ns, "thief-0", &vm)
        .await
        .expect("tenant pod");
    let mark = cluster.audit_mark();
    product::create_cr(&tenant_crs, "thief-0", "thief-0", Desire::Wake).await;
    let thief = eventually("the tenant's CR fails naming the holder", LONG, || async {
        let cr = tenant_crs.get("thief-0").await.ok()?;
        (product::phase(&cr) == Some(Phase::Failed)).then_some(cr)
    })
    .await;
    let ready = thief
        .status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, READY))
        .cloned()
        .expect("Ready");
    // S12: the holder is in another namespace: named only as such.
    assert!(
        ready.message.contains("a CR in another namespace"),
        "{}",
        ready.message
    );
    assert!(
        !ready.message.contains(&owner_ns) && !ready.message.contains("db-0"),
        "{}",
        ready.message
    );
    assert_eq!(
        thief.status.as_ref().and_then(|s| s.vm_name.clone()),
        None,
        "the blocked CR never claims the VM"
    );
    product::delete_and_wait_gone(&tenant_crs, "thief-0", LONG).await;
    assert_eq!(
        tag_exists(&registry, &vm).await,
        Some(true),
        "G1: deleting the blocked CR leaves the holder's snapshot"
    );
    let pod = tenant_pods.get("thief-0").await.expect("tenant pod");
    assert!(
        !pod.metadata
            .annotations
            .unwrap_or_default()
            .contains_key(HIBERNATE)
    );
    let tenant_pod_patches = cluster
        .audit_events_since(mark)
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"].as_str() == Some(tenant_ns.as_str()))
        .filter(|e| e["objectRef"]["resource"] == "pods" && e["objectRef"]["subresource"].is_null())
        .filter(|e| e["verb"] == "patch")
        .count();
    assert_eq!(tenant_pod_patches, 0, "the tenant's pod was never patched");

    // Where the webhook runs, the same attempt is refused at CREATE (S2).
    vk_sim::create_vm_pod(&client, &owner_ns, "other-0", &vm)
        .await
        .expect("second pod naming the VM");
    let refused = owner_crs
        .create(
            &Default::default(),
            &product::new_cr("other-0", "other-0", Desire::Wake),
        )
        .await
        .expect_err("the webhook refuses a CR on a pod naming a held VM");
    assert!(
        refused.to_string().contains(&format!("{owner_ns}/db-0")),
        "{refused}"
    );

    // The owner wakes normally and its own tag is cleaned up.
    product::set_desire(&owner_crs, "db-0", Desire::Wake).await;
    wait_phase(&owner_crs, "db-0", Phase::Active, LONG, &mut vec![]).await;
    eventually("owner's tag deleted after its wake", LONG, || async {
        (tag_exists(&registry, &vm).await == Some(false)).then_some(())
    })
    .await;
}
