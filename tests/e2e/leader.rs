//! End-to-end tests of running several replicas (P2) and of shutdown (P4), against the
//! real apiserver and registry.

use testkit::cluster;
use testkit::lease_log;
use testkit::product;
use testkit::vk_sim;

use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use lease_log::LeaseLog;
use product::{Product, ProductOptions, eventually, wait_phase};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LONG: Duration = Duration::from_secs(60);
const REVIEW: &str = include_str!("../data/admission/update_desire_flip.json");

/// Posts a review straight to one replica's HTTPS port; true when it answers 200.
async fn webhook_answers(port: u16, ca_pem: &str) -> bool {
    let Ok(ca) = reqwest::Certificate::from_pem(ca_pem.as_bytes()) else {
        return false;
    };
    let Ok(client) = reqwest::Client::builder()
        .add_root_certificate(ca)
        .timeout(Duration::from_secs(3))
        .build()
    else {
        return false;
    };
    match client
        .post(format!(
            "https://127.0.0.1:{port}/validate-cocoonhibernation"
        ))
        .header("content-type", "application/json")
        .body(REVIEW)
        .send()
        .await
    {
        Ok(res) => res.status().is_success(),
        Err(_) => false,
    }
}

fn options(ns: &str, registry: &str, identity: &str) -> ProductOptions {
    let mut o = ProductOptions::new(ns, registry);
    o.lease = Some("cocoon-hibernation".into());
    o.lease_duration = "4s".into();
    o.identity = Some(identity.into());
    o
}

/// P2 S1: only the leader reconciles; after `kill -9` of the leader the other replica takes
/// over once the old holder's last record has expired (never earlier: the old holder's
/// fence may still be open until then); both serve the webhook throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_leader_failover_only_leader_reconciles_and_webhook_stays_up() {
    let cluster = cluster::cluster();
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let ns = cluster.fresh_namespace(&client, "leader").await;
    let lease_log = LeaseLog::start(&client, &ns, "cocoon-hibernation");
    let mut a = Product::start(cluster, &options(&ns, &cluster.registry, "replica-a")).await;
    eventually("replica-a leads", LONG, || async {
        (a.metric("cocoon_hibernation_leader") == 1.0).then_some(())
    })
    .await;
    let b = Product::start(cluster, &options(&ns, &cluster.registry, "replica-b")).await;
    product::install_webhook(
        &client,
        cluster,
        &ns,
        b.webhook_port,
        "cocoonset.cocoonstack.io",
    )
    .await;
    let _sim = vk_sim::spawn(
        client.clone(),
        Some(ns.clone()),
        cluster.registry.clone(),
        Arc::new(vk_sim::SimKnobs::new(
            Duration::from_millis(200),
            Duration::from_millis(200),
        )),
    );
    let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
    vk_sim::create_vm_pod(&client, &ns, "l-0", &format!("vm-{ns}"))
        .await
        .unwrap();
    product::create_cr(&crs, "l-0", "l-0", Desire::Hibernate).await;
    wait_phase(&crs, "l-0", Phase::Hibernated, LONG, &mut vec![]).await;
    assert!(a.metric("cocoon_hibernation_reconcile_passes_total") > 0.0);
    assert_eq!(
        b.metric("cocoon_hibernation_reconcile_passes_total"),
        0.0,
        "a follower never reconciles"
    );
    assert_eq!(b.metric("cocoon_hibernation_leader"), 0.0);
    assert!(webhook_answers(a.webhook_port, &cluster.ca_cert_pem).await);
    assert!(webhook_answers(b.webhook_port, &cluster.ca_cert_pem).await);

    a.kill9();
    let killed = Instant::now();
    let mut answered = 0;
    while b.metric("cocoon_hibernation_leader") != 1.0 {
        assert!(
            killed.elapsed() < LONG,
            "replica-b did not take over within {LONG:?}"
        );
        assert!(
            webhook_answers(b.webhook_port, &cluster.ca_cert_pem).await,
            "webhook down during failover"
        );
        answered += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let takeover = killed.elapsed();
    eprintln!(
        "leader takeover after kill -9: {takeover:?} (lease duration 4s; webhook answered {answered} times meanwhile)"
    );
    let a_last = lease_log
        .last_held_by("replica-a")
        .expect("replica-a's records");
    let b_first = eventually("replica-b's first record", LONG, || async {
        lease_log.first_held_by("replica-b")
    })
    .await;
    let (a_expiry, b_acquire) = (a_last.expiry().unwrap(), b_first.acquire.unwrap());
    eprintln!(
        "replica-a's last record expired at {a_expiry}; replica-b acquired at {b_acquire} ({:#} after)",
        b_acquire.duration_since(a_expiry)
    );
    assert!(
        b_acquire >= a_expiry,
        "S1: replica-b took the lease at {b_acquire}, before replica-a's last renewal \
         ({:?}) expired at {a_expiry}",
        a_last.renew
    );

    product::set_desire(&crs, "l-0", Desire::Wake).await;
    wait_phase(&crs, "l-0", Phase::Active, LONG, &mut vec![]).await;
    assert!(b.metric("cocoon_hibernation_reconcile_passes_total") > 0.0);
    assert!(webhook_answers(b.webhook_port, &cluster.ca_cert_pem).await);
}

/// P4: SIGTERM drains, releases the lease and exits 0; the waiting replica takes the
/// released lease within about a retry period: before the old holder's last record
/// (renewTime + leaseDurationSeconds, as read from the API) would have expired.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_sigterm_releases_the_lease_and_exits_zero() {
    let cluster = cluster::cluster();
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let ns = cluster.fresh_namespace(&client, "sigterm").await;
    let lease_log = LeaseLog::start(&client, &ns, "cocoon-hibernation");
    let mut a = Product::start(cluster, &options(&ns, &cluster.registry, "replica-a")).await;
    eventually("replica-a leads", LONG, || async {
        (a.metric("cocoon_hibernation_leader") == 1.0).then_some(())
    })
    .await;
    let b = Product::start(cluster, &options(&ns, &cluster.registry, "replica-b")).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let holder = |l: Lease| l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    assert_eq!(
        holder(leases.get("cocoon-hibernation").await.unwrap()),
        "replica-a"
    );

    let term = Instant::now();
    let status = a.sigterm();
    assert!(status.success(), "exit status {status}");
    let log = a.log_text();
    assert!(log.contains("lease released"), "{log}");
    eventually("replica-b leads", LONG, || async {
        (b.metric("cocoon_hibernation_leader") == 1.0).then_some(())
    })
    .await;
    let handover = term.elapsed();
    assert_eq!(
        holder(leases.get("cocoon-hibernation").await.unwrap()),
        "replica-b"
    );
    let b_first = eventually("replica-b's first record", LONG, || async {
        lease_log.first_held_by("replica-b")
    })
    .await;
    let records = lease_log.records();
    let a_last = lease_log
        .last_held_by("replica-a")
        .expect("replica-a's records");
    // The release, as client-go's ReleaseOnCancel writes it: holder cleared, 1 s.
    let release = records
        .iter()
        .find(|r| r.holder.is_empty())
        .unwrap_or_else(|| panic!("no released record in {records:#?}"));
    assert_eq!(release.duration, Duration::from_secs(1), "{release:?}");
    let (a_expiry, b_acquire) = (a_last.expiry().unwrap(), b_first.acquire.unwrap());
    eprintln!(
        "handover after SIGTERM: {handover:?} (SIGTERM to replica-b leading); released at {:?}, \
         replica-b acquired at {b_acquire}, {:#} after the release and {:#} before replica-a's \
         last record would have expired ({a_expiry})",
        release.renew,
        b_acquire.duration_since(release.renew.unwrap()),
        a_expiry.duration_since(b_acquire),
    );
    assert!(
        b_acquire < a_expiry,
        "P4: the released lease was taken at {b_acquire}, not before the old record's \
         expiry {a_expiry}: the follower waited for expiry instead of seeing the release"
    );
}

/// S11: a build that knows a newer safety rule stamps its safety epoch on the Lease, and a
/// build pretending to be older (`--pretend-safety-epoch`, hidden) that finds the stamp
/// never takes the Lease: not while it is free after the newer build's release, and not
/// while another newer replica holds it. It says so in its log and keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_s11_an_older_build_never_takes_a_lease_a_newer_one_stamped() {
    use cocoon_hibernation::leader::decide::{SAFETY_EPOCH, SAFETY_EPOCH_ANNOTATION};
    let cluster = cluster::cluster();
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let ns = cluster.fresh_namespace(&client, "epoch").await;
    let lease_log = LeaseLog::start(&client, &ns, "cocoon-hibernation");
    let leases: Api<Lease> = Api::namespaced(client.clone(), &ns);
    let stamp = |l: &Lease| {
        l.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(SAFETY_EPOCH_ANNOTATION).cloned())
    };

    // The newer build leads and stamps its epoch, then releases the Lease on SIGTERM.
    let mut newer = Product::start(cluster, &options(&ns, &cluster.registry, "newer-a")).await;
    eventually("newer-a leads", LONG, || async {
        (newer.metric("cocoon_hibernation_leader") == 1.0).then_some(())
    })
    .await;
    let lease = leases.get("cocoon-hibernation").await.unwrap();
    assert_eq!(stamp(&lease), Some(SAFETY_EPOCH.to_string()), "{lease:?}");
    assert!(newer.sigterm().success());
    let lease = leases.get("cocoon-hibernation").await.unwrap();
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
    assert_eq!(holder.as_deref(), Some(""), "released: {lease:?}");
    assert_eq!(
        stamp(&lease),
        Some(SAFETY_EPOCH.to_string()),
        "the release keeps it"
    );

    // An older build on the free, stamped Lease: it says why and stays a follower.
    let mut o = options(&ns, &cluster.registry, "older");
    o.extra_args = vec![
        "--pretend-safety-epoch".into(),
        (SAFETY_EPOCH - 1).to_string(),
    ];
    let mut older = Product::start(cluster, &o).await;
    older.wait_ready().await;
    // A dozen retry periods (lease 4 s: every 0.8 s) on a Lease free for the taking.
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        lease_log.first_held_by("older").is_none(),
        "S11: the older build took the free lease: {:#?}",
        lease_log.records()
    );
    assert_eq!(older.metric("cocoon_hibernation_leader"), 0.0);
    let lease = leases.get("cocoon-hibernation").await.unwrap();
    let holder = lease.spec.as_ref().and_then(|s| s.holder_identity.clone());
    assert_eq!(holder.as_deref(), Some(""), "still free: {lease:?}");
    let log = older.log_text();
    assert!(log.contains("a newer build has led"), "it says why: {log}");

    // A second replica of the newer build takes it at once; the older one still never does.
    let newer_b = Product::start(cluster, &options(&ns, &cluster.registry, "newer-b")).await;
    eventually("newer-b leads", LONG, || async {
        (newer_b.metric("cocoon_hibernation_leader") == 1.0).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(older.metric("cocoon_hibernation_leader"), 0.0);
    assert_eq!(
        older.metric("cocoon_hibernation_reconcile_passes_total"),
        0.0
    );
    assert!(
        lease_log.first_held_by("older").is_none(),
        "S11: the older build took the lease: {:#?}",
        lease_log.records()
    );
    let lease = leases.get("cocoon-hibernation").await.unwrap();
    assert_eq!(stamp(&lease), Some(SAFETY_EPOCH.to_string()));
    let log = older.log_text();
    assert!(
        log.contains(&format!("safety epoch {SAFETY_EPOCH}")),
        "the error names the stamp: {log}"
    );
}
