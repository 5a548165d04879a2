//! End-to-end tests: the real binary against a real kube-apiserver + etcd and a real OCI
//! registry, with the apiserver calling the webhook over TLS. vk-cocoon is played by the
//! test-support simulator. Every test works in a fresh namespace.

use testkit::cluster;
use testkit::env;
use testkit::product;
use testkit::registry_server;
use testkit::vk_sim;

use cocoon_hibernation::api::annotations::{HIBERNATE, VM_NAME};
use cocoon_hibernation::api::conditions::{READY, SNAPSHOT_DELETED};
use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use env::{LONG, Setup, condition_status, ready_message, setup};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use product::{Product, ProductOptions, eventually, never_phase, wait_phase};
use std::sync::Arc;
use std::time::{Duration, Instant};
use vk_sim::SimKnobs;

/// P1 H1 H2 H3 W1 W2 O1: one server process; hibernate then wake; the tag is created, then deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_p1_round_trip_hibernate_then_wake() {
    let env = setup("round-trip", Setup::default()).await;
    env.pod("web-0").await;
    let vm = env.vm("web-0");
    product::create_cr(&env.crs, "web-0", "web-0", Desire::Hibernate).await;
    let mut seen = Vec::new();
    let cr = wait_phase(&env.crs, "web-0", Phase::Hibernated, LONG, &mut seen).await;
    assert_eq!(
        cr.status.as_ref().and_then(|s| s.vm_name.clone()),
        Some(vm.clone())
    );
    assert_eq!(condition_status(&cr, READY).as_deref(), Some("True"));
    assert!(cr.has_finalizer(), "R1");
    assert!(
        env.tag_exists(&vm).await,
        "H3: the snapshot is in the registry"
    );
    let pod = env.pods.get("web-0").await.unwrap();
    assert_eq!(
        pod.metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(HIBERNATE)
            .map(String::as_str),
        Some("true")
    );

    product::set_desire(&env.crs, "web-0", Desire::Wake).await;
    let cr = wait_phase(&env.crs, "web-0", Phase::Active, LONG, &mut seen).await;
    assert_eq!(
        seen,
        vec![
            Phase::Hibernating,
            Phase::Hibernated,
            Phase::Waking,
            Phase::Active
        ]
    );
    eventually("tag deleted after wake", LONG, || async {
        (!env.tag_exists(&vm).await).then_some(())
    })
    .await;
    let pod = env.pods.get("web-0").await.unwrap();
    assert!(
        pod.metadata
            .annotations
            .as_ref()
            .unwrap()
            .get(HIBERNATE)
            .is_none(),
        "W1"
    );
    assert_eq!(condition_status(&cr, READY).as_deref(), Some("True"));
    let events = env
        .wait_events("web-0", &["Hibernated", "WokenActive"])
        .await;
    assert!(!events.iter().any(|e| e.contains("TimedOut")), "{events:?}");
    let metrics = env.product.get("/metrics").unwrap().1;
    assert!(
        metrics.contains(r#"phase_duration_seconds_count{transition="hibernate",result="ok"} 1"#),
        "{metrics}"
    );
    assert!(metrics.contains(r#"phase_duration_seconds_count{transition="wake",result="ok"} 1"#));
    assert!(metrics.contains(r#"registry_calls_total{operation="probe",outcome="present"}"#));
    // P1: the process that ran the round also answered the apiserver's admission call for
    // the CREATE (a desire flip does not reach the webhook), and serves its health endpoints.
    assert!(metrics.contains(r#"admission_decisions_total{operation="CREATE",result="allowed"}"#));
    assert_eq!(
        env.product.get("/healthz").map(|(code, _)| code).ok(),
        Some(200)
    );
    assert_eq!(
        env.product.get("/readyz").map(|(code, _)| code).ok(),
        Some(200)
    );
}

/// H3: vk has not acted yet, but stale state is in place: the CR must stay Hibernating
/// until vk really completes this round.
async fn stale_state_never_completes_hibernate(prefix: &str, stale_lifecycle: bool) {
    let env = setup(prefix, Setup::default()).await;
    env.pod("db-0").await;
    let vm = env.vm("db-0");
    env.sim.knobs.set_never_complete(true);
    env.sim.stage_stale_tag(&vm).await.unwrap();
    if stale_lifecycle {
        env.sim
            .stage_stale_lifecycle(&env.ns, "db-0")
            .await
            .unwrap();
    }
    product::create_cr(&env.crs, "db-0", "db-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "db-0", Phase::Hibernating, LONG, &mut vec![]).await;
    never_phase(&env.crs, "db-0", Phase::Hibernated, Duration::from_secs(6)).await;
    env.sim.knobs.set_never_complete(false);
    wait_phase(&env.crs, "db-0", Phase::Hibernated, LONG, &mut vec![]).await;
}

/// H3: a stale tag from an earlier cycle never completes a hibernate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_stale_tag_never_completes_hibernate() {
    stale_state_never_completes_hibernate("stale-tag", false).await;
}

/// H3: a stale lifecycle pair from an earlier round never completes a hibernate, even
/// with the tag present.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_stale_lifecycle_round_never_completes_hibernate() {
    stale_state_never_completes_hibernate("stale-round", true).await;
}

/// D1: Wake while Hibernating first drives the hibernate to its end; Hibernate while
/// Waking first drives the wake to its end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_reversal_mid_transition_both_ways() {
    let env = setup(
        "reversal",
        Setup {
            hibernate_delay: Duration::from_secs(3),
            wake_delay: Duration::from_secs(3),
            ..Setup::default()
        },
    )
    .await;
    env.pod("app-0").await;
    product::create_cr(&env.crs, "app-0", "app-0", Desire::Hibernate).await;
    let mut seen = Vec::new();
    wait_phase(&env.crs, "app-0", Phase::Hibernating, LONG, &mut seen).await;
    product::set_desire(&env.crs, "app-0", Desire::Wake).await;
    wait_phase(&env.crs, "app-0", Phase::Active, LONG, &mut seen).await;
    assert_eq!(
        seen,
        vec![
            Phase::Hibernating,
            Phase::Hibernated,
            Phase::Waking,
            Phase::Active
        ]
    );

    // Seeded with the phase just observed: the controller may write Hibernating before
    // the next watch lists, and the list below must not depend on that race.
    let mut seen = vec![Phase::Active];
    product::set_desire(&env.crs, "app-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "app-0", Phase::Hibernated, LONG, &mut seen).await;
    product::set_desire(&env.crs, "app-0", Desire::Wake).await;
    wait_phase(&env.crs, "app-0", Phase::Waking, LONG, &mut seen).await;
    product::set_desire(&env.crs, "app-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "app-0", Phase::Hibernated, LONG, &mut seen).await;
    assert_eq!(
        seen,
        vec![
            Phase::Active,
            Phase::Hibernating,
            Phase::Hibernated,
            Phase::Waking,
            Phase::Active,
            Phase::Hibernating,
            Phase::Hibernated
        ]
    );
}

/// H5 F2 F3: the hibernate times out, then recovers from Failed with a fresh budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_hibernate_timeout_then_recovery() {
    let env = setup(
        "hib-timeout",
        Setup {
            hibernate_timeout: "5s",
            ..Setup::default()
        },
    )
    .await;
    env.pod("w-0").await;
    env.sim.knobs.set_never_complete(true);
    product::create_cr(&env.crs, "w-0", "w-0", Desire::Hibernate).await;
    let cr = wait_phase(&env.crs, "w-0", Phase::Failed, LONG, &mut vec![]).await;
    assert!(
        ready_message(&cr).contains("within 5s"),
        "{}",
        ready_message(&cr)
    );
    env.wait_events("w-0", &["HibernateTimedOut"]).await;
    env.sim.knobs.set_never_complete(false);
    wait_phase(&env.crs, "w-0", Phase::Hibernated, LONG, &mut vec![]).await;
    env.wait_events(
        "w-0",
        &["HibernateTimedOut", "RetryRequested", "Hibernated"],
    )
    .await;
}

/// W4 F2 F3: the wake times out, then recovers from Failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_wake_timeout_then_recovery() {
    let env = setup(
        "wake-timeout",
        Setup {
            wake_timeout: "5s",
            ..Setup::default()
        },
    )
    .await;
    env.pod("w-1").await;
    product::create_cr(&env.crs, "w-1", "w-1", Desire::Hibernate).await;
    wait_phase(&env.crs, "w-1", Phase::Hibernated, LONG, &mut vec![]).await;
    env.sim.knobs.set_never_complete(true);
    product::set_desire(&env.crs, "w-1", Desire::Wake).await;
    let cr = wait_phase(&env.crs, "w-1", Phase::Failed, LONG, &mut vec![]).await;
    assert!(
        ready_message(&cr).contains("within 5s"),
        "{}",
        ready_message(&cr)
    );
    env.sim.knobs.set_never_complete(false);
    wait_phase(&env.crs, "w-1", Phase::Active, LONG, &mut vec![]).await;
    env.wait_events("w-1", &["WakeTimedOut", "RetryRequested", "WokenActive"])
        .await;
}

/// H2 H4 H5: the registry the product probes is down from the first pass: Hibernating is
/// still entered, probe errors count against the clock, Failed follows, and the CR
/// recovers once the registry is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_registry_down_from_first_pass_then_recovery() {
    let mut registry = registry_server::RegistryServer::launch_default();
    let host = registry.host();
    let env = setup(
        "registry-down",
        Setup {
            registry: Some(host.clone()),
            hibernate_timeout: "8s",
            ..Setup::default()
        },
    )
    .await;
    env.pod("r-0").await;
    let vm = env.vm("r-0");
    registry.stop();
    env.sim.knobs.set_never_complete(true);
    product::create_cr(&env.crs, "r-0", "r-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "r-0", Phase::Hibernating, LONG, &mut vec![]).await;
    // vk completes its side while the registry is unreachable for us: push elsewhere,
    // then report the lifecycle, so every pass now probes and fails (H4).
    let cluster = cluster::cluster();
    let sim_elsewhere = vk_sim::spawn(
        env.client.clone(),
        Some(env.ns.clone()),
        cluster.registry.clone(),
        Arc::new(SimKnobs::new(Duration::ZERO, Duration::ZERO)),
    );
    let cr = wait_phase(&env.crs, "r-0", Phase::Failed, LONG, &mut vec![]).await;
    drop(sim_elsewhere);
    assert!(ready_message(&cr).contains("within 8s"));
    let metrics = env.product.get("/metrics").unwrap().1;
    assert!(
        metrics.contains(r#"reconcile_errors_total{error="probe"}"#),
        "{metrics}"
    );
    assert!(
        metrics.contains(r#"registry_calls_total{operation="probe",outcome="error"}"#),
        "{metrics}"
    );
    // The registry comes back holding the snapshot.
    registry.start();
    vk_sim::push_snapshot(&host, &vm, "after outage")
        .await
        .unwrap();
    wait_phase(&env.crs, "r-0", Phase::Hibernated, LONG, &mut vec![]).await;
    env.wait_events(
        "r-0",
        &["HibernateTimedOut", "RetryRequested", "Hibernated"],
    )
    .await;
}

/// W3: a registry refusing the tag delete after a wake keeps the CR Active and the delete
/// owed; once the registry accepts deletes, the tag is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_registry_refusing_tag_delete_keeps_active_then_tag_gone() {
    let mut registry = registry_server::RegistryServer::launch(
        registry_server::RegistryOptions::default().with_delete(false),
    );
    let env = setup(
        "refuse-delete",
        Setup {
            registry: Some(registry.host()),
            // S5 backs refused deletes off to minutes; the test has seconds.
            extra_args: vec!["--refused-delete-backoff=2s".into()],
            ..Setup::default()
        },
    )
    .await;
    env.pod("d-0").await;
    let vm = env.vm("d-0");
    product::create_cr(&env.crs, "d-0", "d-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "d-0", Phase::Hibernated, LONG, &mut vec![]).await;
    product::set_desire(&env.crs, "d-0", Desire::Wake).await;
    wait_phase(&env.crs, "d-0", Phase::Active, LONG, &mut vec![]).await;
    // Refused deletes keep the CR Active and the tag in place.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cr = env.crs.get("d-0").await.unwrap();
    assert_eq!(product::phase(&cr), Some(Phase::Active));
    assert_eq!(
        condition_status(&cr, SNAPSHOT_DELETED).as_deref(),
        Some("False")
    );
    assert!(env.tag_exists(&vm).await);
    registry.restart_with_delete(true);
    eventually(
        "tag deleted once the registry accepts deletes",
        LONG,
        || async { (!env.tag_exists(&vm).await).then_some(()) },
    )
    .await;
    let cr = eventually("SnapshotDeleted=True", LONG, || async {
        let cr = env.crs.get("d-0").await.ok()?;
        (condition_status(&cr, SNAPSHOT_DELETED).as_deref() == Some("True")).then_some(cr)
    })
    .await;
    assert_eq!(product::phase(&cr), Some(Phase::Active));
}

/// G1: deleting the CR deletes the tag, but not while another live CR tracks the VM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_deletion_gcs_tag_and_keeps_it_while_another_cr_holds_the_vm() {
    // No webhook: it would refuse the second CR (S2), which is what this test needs.
    let env = setup(
        "deletion",
        Setup {
            webhook: false,
            ..Setup::default()
        },
    )
    .await;
    // Two pods backed by one VM: a pod recreated under a new name keeps its VM.
    let shared_vm = env.vm("shared");
    for pod in ["old-pod", "new-pod"] {
        vk_sim::create_vm_pod(&env.client, &env.ns, pod, &shared_vm)
            .await
            .unwrap();
    }
    product::create_cr(&env.crs, "old-pod", "old-pod", Desire::Hibernate).await;
    wait_phase(&env.crs, "old-pod", Phase::Hibernated, LONG, &mut vec![]).await;
    // S2: the VM has one owner; the new pod's CR waits, naming it.
    product::create_cr(&env.crs, "new-pod", "new-pod", Desire::Hibernate).await;
    wait_phase(&env.crs, "new-pod", Phase::Failed, LONG, &mut vec![]).await;
    assert!(env.tag_exists(&shared_vm).await);

    product::delete_and_wait_gone(&env.crs, "old-pod", LONG).await;
    assert!(
        env.tag_exists(&shared_vm).await,
        "G1: another live CR wants the VM"
    );
    // The waiting CR takes the VM over once the holder is gone.
    wait_phase(&env.crs, "new-pod", Phase::Hibernated, LONG, &mut vec![]).await;

    // G1: old-pod still names the VM, so it holds the tag too; once it is gone, the last
    // CR holding the VM deletes the tag.
    env.pods
        .delete("old-pod", &Default::default())
        .await
        .expect("delete old-pod");
    eventually("old-pod gone", LONG, || async {
        env.pods
            .get_opt("old-pod")
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    product::delete_and_wait_gone(&env.crs, "new-pod", LONG).await;
    assert!(
        !env.tag_exists(&shared_vm).await,
        "G1: the last holder deletes the tag"
    );
}

/// G2: deletion with the registry down still removes the finalizer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_deletion_with_registry_down_never_blocks() {
    let mut registry = registry_server::RegistryServer::launch_default();
    let env = setup(
        "delete-down",
        Setup {
            registry: Some(registry.host()),
            ..Setup::default()
        },
    )
    .await;
    env.pod("g-0").await;
    product::create_cr(&env.crs, "g-0", "g-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "g-0", Phase::Hibernated, LONG, &mut vec![]).await;
    registry.stop();
    let started = Instant::now();
    product::delete_and_wait_gone(&env.crs, "g-0", LONG).await;
    eprintln!("deleted with the registry down in {:?}", started.elapsed());
    let log = env.product.log_text();
    assert!(
        log.contains("snapshot tag cleanup failed"),
        "G2: logged at error level"
    );
}

/// V1 V2 V3 V6: the apiserver calls our webhook over TLS; a name that differs from podRef is
/// denied, and so is a duplicate for a pod that a live or terminating CR already targets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_webhook_denies_mismatched_name_and_duplicates_live_or_terminating() {
    let cluster = cluster::cluster();
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let ns = cluster.fresh_namespace(&client, "webhook").await;
    let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
    // A CR created before the webhook was installed, named unlike its pod.
    let mut legacy = product::new_cr("legacy", "web-0", Desire::Hibernate);
    legacy.metadata.finalizers = Some(vec!["e2e.cocoonstack.io/hold".into()]);
    crs.create(&Default::default(), &legacy).await.unwrap();

    let product = Product::start(cluster, &ProductOptions::new(&ns, &cluster.registry)).await;
    product::install_webhook(
        &client,
        cluster,
        &ns,
        product.webhook_port,
        "cocoonset.cocoonstack.io",
    )
    .await;

    let denied = |res: Result<CocoonHibernation, kube::Error>| match res {
        Err(kube::Error::Api(s)) => s.message,
        Ok(_) => panic!("creation was allowed"),
        Err(e) => panic!("unexpected error {e}"),
    };
    let msg = eventually("webhook answering", LONG, || async {
        let res = crs
            .create(
                &Default::default(),
                &product::new_cr("my-name", "web-0", Desire::Hibernate),
            )
            .await;
        let msg = denied(res);
        msg.contains("must equal spec.podRef.name").then_some(msg)
    })
    .await;
    assert!(
        msg.contains("\"my-name\"") && msg.contains("\"web-0\""),
        "V1 names both: {msg}"
    );

    let msg = denied(
        crs.create(
            &Default::default(),
            &product::new_cr("web-0", "web-0", Desire::Hibernate),
        )
        .await,
    );
    assert!(
        msg.contains("legacy already targets pod web-0; flip its spec.desire instead"),
        "V2 live: {msg}"
    );

    crs.delete("legacy", &DeleteParams::default())
        .await
        .unwrap();
    eventually("legacy terminating in the cache", LONG, || async {
        let res = crs
            .create(
                &Default::default(),
                &product::new_cr("web-0", "web-0", Desire::Hibernate),
            )
            .await;
        let msg = denied(res);
        msg.contains("is terminating; retry after its cleanup finishes")
            .then_some(())
    })
    .await;
    // Clean up the hold so the namespace is tidy.
    let patch = serde_json::json!({ "metadata": { "finalizers": null } });
    crs.patch("legacy", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    product::wait_gone(&crs, "legacy", LONG).await;
    // The webhook answers from its cache, which sees the delete a moment after the API.
    eventually(
        "CREATE admitted once the cache saw the delete",
        LONG,
        || async {
            crs.create(
                &Default::default(),
                &product::new_cr("web-0", "web-0", Desire::Hibernate),
            )
            .await
            .ok()
        },
    )
    .await;
    let text = product.get("/metrics").unwrap().1;
    assert!(text.contains(r#"admission_decisions_total{operation="CREATE",result="denied"}"#));
}

/// A2 V4: a podRef update is refused by the CRD's CEL rule; on a CRD without the rule,
/// the webhook alone refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_podref_update_denied_by_cel_and_by_webhook_alone() {
    let cluster = cluster::cluster();
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let ns = cluster.fresh_namespace(&client, "podref").await;
    let product = Product::start(cluster, &ProductOptions::new(&ns, &cluster.registry)).await;
    let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);

    // With CEL (no webhook installed for this namespace yet): the apiserver refuses.
    crs.create(
        &Default::default(),
        &product::new_cr("p-0", "p-0", Desire::Wake),
    )
    .await
    .unwrap();
    let change = serde_json::json!({ "spec": { "podRef": { "name": "other" } } });
    let err = crs
        .patch("p-0", &PatchParams::default(), &Patch::Merge(&change))
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("spec.podRef is immutable"),
        "CEL: {err}"
    );

    // A copy of the CRD in another group, without the rule, validated by the webhook.
    let group = "nocel.cocoonstack.io";
    let mut crd =
        serde_json::to_value(<CocoonHibernation as kube::CustomResourceExt>::crd()).unwrap();
    crd["metadata"]["name"] = format!("cocoonhibernations.{group}").into();
    crd["spec"]["group"] = group.into();
    crd["spec"]["names"]["shortNames"] = serde_json::json!(["chnocel"]);
    crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["podRef"]
        .as_object_mut()
        .unwrap()
        .remove("x-kubernetes-validations");
    let crd: k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition =
        serde_json::from_value(crd).unwrap();
    let crd_api: Api<k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition> =
        Api::all(client.clone());
    crd_api
        .patch(
            &format!("cocoonhibernations.{group}"),
            &PatchParams::apply("cocoon-e2e").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap();
    let ar = kube::core::ApiResource {
        group: group.into(),
        version: "v1".into(),
        api_version: format!("{group}/v1"),
        kind: "CocoonHibernation".into(),
        plural: "cocoonhibernations".into(),
    };
    let dyn_api: Api<kube::core::DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
    let obj: kube::core::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": format!("{group}/v1"), "kind": "CocoonHibernation",
        "metadata": { "name": "p-1" }, "spec": { "podRef": { "name": "p-1" }, "desire": "Wake" }
    }))
    .unwrap();
    eventually("no-CEL CRD served", LONG, || async {
        dyn_api.create(&Default::default(), &obj).await.ok()
    })
    .await;
    // Without the webhook, the update would pass: prove the copy lacks the rule.
    let change_to = |name: &str| serde_json::json!({ "spec": { "podRef": { "name": name } } });
    dyn_api
        .patch(
            "p-1",
            &PatchParams::default(),
            &Patch::Merge(&change_to("x")),
        )
        .await
        .unwrap();
    product::install_webhook(&client, cluster, &ns, product.webhook_port, group).await;
    let msg = eventually("webhook refuses podRef change", LONG, || async {
        match dyn_api
            .patch(
                "p-1",
                &PatchParams::default(),
                &Patch::Merge(&change_to("y")),
            )
            .await
        {
            Err(kube::Error::Api(s)) if s.message.contains("spec.podRef is immutable") => {
                Some(s.message)
            }
            _ => None,
        }
    })
    .await;
    assert!(
        msg.contains("denied the request"),
        "the webhook, not CEL: {msg}"
    );
}

/// F2 W3 G1 S1 (soak seed 252744765): a hibernate request reaches the pod of an `Active`
/// `Wake` CR that never records it, as when a pass's status write is lost to a desire
/// flipped back. The test plants the annotation while the product is down, so vk stores
/// the snapshot first. The restarted product takes the annotation off, owes the tag, and
/// deletes it once vk has woken the VM: never before, and never forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_f2_w3_g1_a_hibernate_the_cr_never_recorded_does_not_leak_its_tag() {
    let mut env = setup(
        "unrecorded",
        Setup {
            // Long enough that the debt is seen before vk's wake lets it be paid.
            wake_delay: Duration::from_secs(3),
            ..Setup::default()
        },
    )
    .await;
    env.pod("u-0").await;
    let vm = env.vm("u-0");
    product::create_cr(&env.crs, "u-0", "u-0", Desire::Wake).await;
    wait_phase(&env.crs, "u-0", Phase::Active, LONG, &mut vec![]).await;
    env.product.kill9();
    let ask = serde_json::json!({ "metadata": { "annotations": { HIBERNATE: "true" } } });
    let params = PatchParams::default();
    env.pods
        .patch("u-0", &params, &Patch::Merge(&ask))
        .await
        .unwrap();
    eventually(
        "vk hibernated the VM and stored its snapshot",
        LONG,
        || async {
            let pod = env.pods.get("u-0").await.ok()?;
            let view = cocoon_hibernation::api::annotations::PodView::of(&pod);
            (view.lifecycle_hibernated_for_round() && env.tag_exists(&vm).await).then_some(())
        },
    )
    .await;
    env.product.restart().await;
    let owed = eventually("the tag is owed", LONG, || async {
        let cr = env.crs.get("u-0").await.ok()?;
        (condition_status(&cr, SNAPSHOT_DELETED).as_deref() == Some("False")).then_some(cr)
    })
    .await;
    assert_eq!(product::phase(&owed), Some(Phase::Active));
    assert!(
        env.tag_exists(&vm).await,
        "S1: kept while the VM is hibernated"
    );
    eventually(
        "the tag is deleted once the VM runs again",
        LONG,
        || async {
            let cr = env.crs.get("u-0").await.ok()?;
            let paid = condition_status(&cr, SNAPSHOT_DELETED).as_deref() == Some("True");
            (paid && !env.tag_exists(&vm).await).then_some(())
        },
    )
    .await;
    let pod = env.pods.get("u-0").await.unwrap();
    let view = cocoon_hibernation::api::annotations::PodView::of(&pod);
    assert!(view.woken() && !view.hibernate_requested, "{view:?}");
}

/// Crash safety: `kill -9` mid-hibernate and mid-wake; after a restart the CR converges,
/// the tag is never deleted early and never leaks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_kill9_mid_transition_converges_without_leaking_or_losing_the_tag() {
    let mut env = setup(
        "crash",
        Setup {
            hibernate_delay: Duration::from_secs(3),
            wake_delay: Duration::from_secs(3),
            ..Setup::default()
        },
    )
    .await;
    env.pod("c-0").await;
    let vm = env.vm("c-0");
    product::create_cr(&env.crs, "c-0", "c-0", Desire::Hibernate).await;
    wait_phase(&env.crs, "c-0", Phase::Hibernating, LONG, &mut vec![]).await;
    // The status recording the request is written before the request itself (W2): kill
    // once the request has reached the pod, so vk has something to finish.
    eventually("the hibernate request reached the pod", LONG, || async {
        let pod = env.pods.get("c-0").await.ok()?;
        cocoon_hibernation::api::annotations::PodView::of(&pod)
            .hibernate_requested
            .then_some(())
    })
    .await;
    env.product.kill9();
    // vk finishes while we are down.
    eventually("vk pushed the snapshot", LONG, || async {
        env.tag_exists(&vm).await.then_some(())
    })
    .await;
    env.product.restart().await;
    wait_phase(&env.crs, "c-0", Phase::Hibernated, LONG, &mut vec![]).await;
    assert!(
        env.tag_exists(&vm).await,
        "the tag a Hibernated CR needs is kept"
    );

    product::set_desire(&env.crs, "c-0", Desire::Wake).await;
    wait_phase(&env.crs, "c-0", Phase::Waking, LONG, &mut vec![]).await;
    env.product.kill9();
    assert!(env.tag_exists(&vm).await, "no delete before Active");
    eventually("vk woke the VM", LONG, || async {
        let pod = env.pods.get("c-0").await.ok()?;
        cocoon_hibernation::api::annotations::PodView::of(&pod)
            .woken()
            .then_some(())
    })
    .await;
    assert!(
        env.tag_exists(&vm).await,
        "nobody deletes while we are down"
    );
    env.product.restart().await;
    wait_phase(&env.crs, "c-0", Phase::Active, LONG, &mut vec![]).await;
    eventually("tag deleted after restart", LONG, || async {
        (!env.tag_exists(&vm).await).then_some(())
    })
    .await;
}

/// C3: settled CRs cause no API writes over 30 s, and pod churn that a pass does not read
/// does not even enqueue them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_quiet_when_settled_no_api_writes_for_30s() {
    let env = setup("quiet", Setup::default()).await;
    for (pod, desire) in [("q-0", Desire::Hibernate), ("q-1", Desire::Wake)] {
        env.pod(pod).await;
        product::create_cr(&env.crs, pod, pod, desire).await;
    }
    wait_phase(&env.crs, "q-0", Phase::Hibernated, LONG, &mut vec![]).await;
    let cr = wait_phase(&env.crs, "q-1", Phase::Active, LONG, &mut vec![]).await;
    assert!(cr.status.is_some());
    // Let the last writes (tag-delete bookkeeping, events) land.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let cluster = cluster::cluster();
    let mark = cluster.audit_mark();
    let passes_before = env
        .product
        .metric("cocoon_hibernation_reconcile_passes_total");
    // Churn that no pass reads: a label, many times.
    let mut churn = 0;
    for i in 0..10 {
        let patch = serde_json::json!({ "metadata": { "labels": { "churn": i.to_string() } } });
        env.pods
            .patch("q-0", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
        churn += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    tokio::time::sleep(Duration::from_secs(27)).await;
    let writes: Vec<_> = cluster
        .audit_events_since(mark)
        .into_iter()
        .filter(|e| e["objectRef"]["namespace"].as_str() == Some(env.ns.as_str()))
        .filter(|e| {
            matches!(
                e["verb"].as_str(),
                Some("create" | "update" | "patch" | "delete")
            )
        })
        .collect();
    let pod_writes = writes
        .iter()
        .filter(|e| e["objectRef"]["resource"] == "pods")
        .count();
    let other: Vec<_> = writes
        .iter()
        .filter(|e| e["objectRef"]["resource"] != "pods")
        .collect();
    assert_eq!(
        pod_writes, churn,
        "only the test's own label patches touched pods"
    );
    assert!(other.is_empty(), "settled CRs wrote: {other:#?}");
    let passes_after = env
        .product
        .metric("cocoon_hibernation_reconcile_passes_total");
    assert_eq!(
        passes_before, passes_after,
        "label churn enqueued reconcile passes"
    );
    assert!(passes_before > 0.0);
}

/// C3: deleting a pod wakes the CRs that target it, though shared-store subscribers see
/// no Delete event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_pod_deletion_reaches_the_cr() {
    let env = setup("pod-delete", Setup::default()).await;
    env.pod("x-0").await;
    product::create_cr(&env.crs, "x-0", "x-0", Desire::Wake).await;
    wait_phase(&env.crs, "x-0", Phase::Active, LONG, &mut vec![]).await;
    env.pods
        .delete("x-0", &DeleteParams::default().grace_period(0))
        .await
        .unwrap();
    let cr = wait_phase(
        &env.crs,
        "x-0",
        Phase::Pending,
        Duration::from_secs(20),
        &mut vec![],
    )
    .await;
    assert!(
        ready_message(&cr).contains("not found"),
        "R2: {}",
        ready_message(&cr)
    );
    // The pod comes back: the CR follows without any CR change.
    env.pod("x-0").await;
    wait_phase(&env.crs, "x-0", Phase::Active, LONG, &mut vec![]).await;
    let pod = env.pods.get("x-0").await.unwrap();
    assert!(pod.metadata.annotations.unwrap().contains_key(VM_NAME));
}
