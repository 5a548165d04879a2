//! C2 end to end: a stalled registry must not stall CocoonHibernations on other VMs.
//!
//! The real binary, the real apiserver, a private real registry behind a loopback proxy
//! that holds every request while "stalled", and the vk-cocoon simulator (which pushes
//! snapshots to the registry directly, not through the proxy).
//!
//! The product is started here rather than through `product::Product`: this test needs
//! `--concurrency=2` and a registry budget long enough (`--registry-timeout=30s`) that a
//! held call cannot end on its own while the test looks, and `ProductOptions` has neither.

use testkit::cluster;
use testkit::product;
use testkit::registry_server;
use testkit::slow_proxy;
use testkit::vk_sim;

use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use kube::Api;
use registry_server::RegistryServer;
use slow_proxy::SlowProxy;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;
use vk_sim::SimKnobs;

const LONG: Duration = Duration::from_secs(90);
/// Reconcile workers of the product under test.
const WORKERS: usize = 2;
/// CRs whose registry probe hangs: more than the workers, so without a bound on registry
/// calls every worker ends up waiting on the registry.
const STALLED: usize = 6;

/// One product process with this test's flags; killed on drop.
struct StallProduct {
    child: Child,
    webhook_port: u16,
    admin_port: u16,
    _dir: tempfile::TempDir,
    log: PathBuf,
}

/// What both tests stand in: a real registry behind the stalling proxy, the product (its
/// registry calls through the proxy) with its webhook installed, and the simulator, which
/// pushes to the registry itself.
struct World {
    upstream: RegistryServer,
    proxy: SlowProxy,
    product: StallProduct,
    sim: vk_sim::SimHandle,
}

impl World {
    /// `registry_timeout`: how long a held registry call may last before it ends itself.
    async fn start(
        cluster: &cluster::Cluster,
        client: &kube::Client,
        ns: &str,
        registry_timeout: &str,
    ) -> Self {
        let upstream = RegistryServer::launch_default();
        let proxy = SlowProxy::start(&upstream.host()).await;
        let product = StallProduct::start(cluster, ns, &proxy.host(), registry_timeout).await;
        product::install_webhook(
            client,
            cluster,
            ns,
            product.webhook_port,
            "cocoonset.cocoonstack.io",
        )
        .await;
        let knobs = Arc::new(SimKnobs::new(
            Duration::from_millis(100),
            Duration::from_millis(100),
        ));
        let sim = vk_sim::spawn(client.clone(), Some(ns.to_owned()), upstream.host(), knobs);
        World {
            upstream,
            proxy,
            product,
            sim,
        }
    }
}

impl StallProduct {
    /// `registry_timeout`: how long a held registry call may last before it ends itself.
    async fn start(
        cluster: &cluster::Cluster,
        namespace: &str,
        registry: &str,
        registry_timeout: &str,
    ) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (cert, key) = cluster.serving_cert(&["127.0.0.1", "localhost"]);
        std::fs::write(dir.path().join("tls.crt"), cert).expect("write cert");
        std::fs::write(dir.path().join("tls.key"), key).expect("write key");
        let webhook_port = product::free_port();
        let admin_port = product::free_port();
        let log = dir.path().join("server.log");
        let out = std::fs::File::create(&log).expect("server log");
        let err = out.try_clone().expect("clone log handle");
        let child = Command::new(product::bin())
            .args([
                "run".to_owned(),
                format!("--webhook-addr=127.0.0.1:{webhook_port}"),
                format!("--admin-addr=127.0.0.1:{admin_port}"),
                format!("--tls-cert-file={}", dir.path().join("tls.crt").display()),
                format!("--tls-key-file={}", dir.path().join("tls.key").display()),
                format!("--registry-base={registry}"),
                "--registry-plain-http".to_owned(),
                format!("--registry-timeout={registry_timeout}"),
                format!("--concurrency={WORKERS}"),
                "--hibernate-timeout=300s".to_owned(),
                "--wake-timeout=300s".to_owned(),
                format!("--watch-namespace={namespace}"),
                "--shutdown-grace=5s".to_owned(),
                "--log-filter=info,cocoon_hibernation=debug".to_owned(),
                "--leader-election=false".to_owned(),
            ])
            .env("KUBECONFIG", &cluster.kubeconfig)
            .env_remove("COCOON_REGISTRY_BASE")
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", product::bin().display()));
        let mut p = Self {
            child,
            webhook_port,
            admin_port,
            _dir: dir,
            log,
        };
        p.wait_ready().await;
        p
    }

    async fn wait_ready(&mut self) {
        product::eventually("the product ready", LONG, || {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!("server exited with {status}; log:\n{}", self.log_text());
            }
            let ready = self.get("/readyz").is_ok_and(|(code, _)| code == 200);
            async move { ready.then_some(()) }
        })
        .await;
    }

    fn get(&self, path: &str) -> std::io::Result<(u16, String)> {
        let mut s = TcpStream::connect(("127.0.0.1", self.admin_port))?;
        s.set_read_timeout(Some(Duration::from_secs(5)))?;
        write!(s, "GET {path} HTTP/1.0\r\nhost: 127.0.0.1\r\n\r\n")?;
        let mut out = String::new();
        s.read_to_string(&mut out)?;
        let code = out
            .split_whitespace()
            .nth(1)
            .and_then(|c| c.parse().ok())
            .unwrap_or(0);
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
        Ok((code, body))
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for StallProduct {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("---- server log ----\n{}", self.log_text());
        }
    }
}

/// C2: while the registry holds every request, CRs whose next step needs the registry
/// wait, but a Hibernate CR on another VM still enters Hibernating (H2 needs no registry
/// call). It must get there while the calls held when it was created are all still held:
/// had those calls taken every worker, it could only move after one of them ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_c2_stalled_registry_does_not_stall_other_vms() {
    let cluster = cluster::cluster();
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let ns = cluster.fresh_namespace(&client, "c2-stall").await;
    let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
    let vm = |pod: &str| format!("vm-{ns}-{pod}");

    let World {
        upstream: _upstream,
        proxy,
        product: _product,
        sim,
    } = World::start(cluster, &client, &ns, "30s").await;

    let stalled: Vec<String> = (0..STALLED).map(|i| format!("a-{i}")).collect();
    for pod in stalled.iter().chain([&"b-0".to_owned()]) {
        vk_sim::create_vm_pod(&client, &ns, pod, &vm(pod))
            .await
            .unwrap_or_else(|e| panic!("create pod {pod}: {e}"));
    }

    proxy.stall();
    for pod in &stalled {
        product::create_cr(&crs, pod, pod, Desire::Hibernate).await;
    }
    // vk has hibernated every `a` VM, so each of those CRs now needs a registry probe
    // (H3), and the first of them hangs in the proxy.
    product::eventually("vk hibernated every stalled VM", LONG, || async {
        (sim.knobs.hibernations() >= STALLED).then_some(())
    })
    .await;
    // b-0 stays in Hibernating: were it hibernated, its own probe would hang too.
    sim.knobs.set_never_complete(true);
    let at_create = tokio::time::timeout(LONG, proxy.until(|s| s.held >= 1))
        .await
        .expect("a registry probe reaches the stalled proxy");
    eprintln!(
        "held when b-0 is created: {} (requests so far: {:?})",
        at_create.held, at_create.lines
    );

    product::create_cr(&crs, "b-0", "b-0", Desire::Hibernate).await;
    let mut seen = Vec::new();
    tokio::select! {
        _ = product::wait_phase(&crs, "b-0", Phase::Hibernating, LONG, &mut seen) => {}
        stats = proxy.until(|s| s.held_ended > at_create.held_ended) => panic!(
            "C2: b-0 did not enter Hibernating before a held registry call ended: the \
             stalled registry held every worker. Proxy: {stats:?}"
        ),
    }
    let during = proxy.stats();
    assert!(
        during.held >= 1 && during.held_ended == at_create.held_ended,
        "the stall lasted while b-0 progressed: {during:?}"
    );
    assert_eq!(
        during.count(&format!("/v2/{}/", vm("b-0"))),
        0,
        "H2: entering Hibernating asks the registry nothing"
    );

    // The stall was the only obstacle: once the registry answers, everything completes.
    proxy.resume();
    sim.knobs.set_never_complete(false);
    for pod in stalled.iter().chain([&"b-0".to_owned()]) {
        product::wait_phase(&crs, pod, Phase::Hibernated, LONG, &mut Vec::new()).await;
    }
    drop(sim);
}

/// Starts in the burst below: more than a few workers' worth, as in issue 38's wake burst.
const BURST: usize = 1000;
/// Stalled CRs beside the burst: enough that their ending passes, each holding a worker
/// for a registry slot's wait before it is deferred, always keep the free worker busy.
const STALLED_BESIDE: usize = 12;
/// The burst's bound: about 2,000 passes (R1's finalizer, then H1) on the busy shared
/// control plane (47.6 s in the first run). Without the intake lane they would get about
/// one turn of the free worker in every `STALLED_BESIDE` (C4 lets ending passes past
/// them), each of those held 250 ms: far longer.
const BURST_BOUND: Duration = Duration::from_secs(300);

/// SPEC C2 (issue 38): one slow registry call never stalls other CRs, under a burst of
/// 1,000. While a held probe keeps one worker and the other stalled CRs' ending passes
/// (C4 puts them first) keep asking for the one registry slot, 1,000 new Hibernate CRs on
/// other VMs all get their pod patch, the write that starts the transition, before any
/// held call ends: a start never queues behind other VMs' registry work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_c2_a_burst_of_1000_starts_never_waits_for_a_stalled_registry() {
    use futures::StreamExt;
    let cluster = cluster::cluster();
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let ns = cluster.fresh_namespace(&client, "c2-burst").await;
    let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), &ns);
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), &ns);
    let vm = |pod: &str| format!("vm-{ns}-{pod}");

    // The held calls must outlast the burst: only the test's resume ends them.
    let World {
        upstream: _upstream,
        proxy,
        product: _product,
        sim,
    } = World::start(cluster, &client, &ns, "900s").await;

    let stalled: Vec<String> = (0..STALLED_BESIDE).map(|i| format!("a-{i}")).collect();
    let burst: Vec<String> = (0..BURST).map(|i| format!("b-{i:04}")).collect();
    futures::stream::iter(stalled.iter().chain(&burst))
        .for_each_concurrent(32, |pod| {
            let (client, ns, vm) = (client.clone(), ns.clone(), vm(pod));
            async move {
                vk_sim::create_vm_pod(&client, &ns, pod, &vm)
                    .await
                    .unwrap_or_else(|e| panic!("create pod {pod}: {e}"));
            }
        })
        .await;

    proxy.stall();
    for pod in &stalled {
        product::create_cr(&crs, pod, pod, Desire::Hibernate).await;
    }
    product::eventually("vk hibernated every stalled VM", LONG, || async {
        (sim.knobs.hibernations() >= STALLED_BESIDE).then_some(())
    })
    .await;
    // The burst's VMs stay in Hibernating: were they hibernated, their probes would hang too.
    sim.knobs.set_never_complete(true);
    let at_burst = tokio::time::timeout(LONG, proxy.until(|s| s.held >= 1))
        .await
        .expect("a registry probe reaches the stalled proxy");

    let started = std::time::Instant::now();
    let create = futures::stream::iter(&burst).for_each_concurrent(32, |pod| {
        let crs = crs.clone();
        async move {
            product::create_cr(&crs, pod, pod, Desire::Hibernate).await;
        }
    });
    let patched = async {
        create.await;
        loop {
            let list = pods
                .list(&kube::api::ListParams::default())
                .await
                .expect("list pods");
            let asked = list
                .items
                .iter()
                .filter(|p| {
                    p.metadata
                        .name
                        .as_deref()
                        .is_some_and(|n| n.starts_with("b-"))
                        && p.metadata.annotations.as_ref().is_some_and(|a| {
                            a.contains_key(cocoon_hibernation::api::annotations::HIBERNATE)
                        })
                })
                .count();
            if asked == BURST {
                return;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    };
    tokio::select! {
        _ = patched => {}
        stats = proxy.until(|s| s.held_ended > at_burst.held_ended) => panic!(
            "C2: the burst's starts were not all patched before a held registry call \
             ended: starts queued behind the stalled registry's passes. Proxy: {stats:?}"
        ),
        _ = tokio::time::sleep(BURST_BOUND) => panic!(
            "C2: the burst's starts were not all patched within {BURST_BOUND:?}: they \
             queued behind the stalled registry's passes"
        ),
    }
    eprintln!(
        "{BURST} starts patched {:.1}s after the burst began",
        started.elapsed().as_secs_f64()
    );
    let during = proxy.stats();
    assert!(
        during.held >= 1 && during.held_ended == at_burst.held_ended,
        "the stall lasted through the burst: {during:?}"
    );
    proxy.resume();
    drop(sim);
}
