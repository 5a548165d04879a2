//! The wake proxy through the chart (issue 37): `proxy.enabled=true` on the installed
//! release, one hibernated VM pod behind an idle policy's HTTP route, and one request to
//! the proxy pod held while the VM wakes, then served by the woken VM. The VM's server
//! runs in a simulator of its own (serving on the bridge's VM range, which the proxy pod
//! reaches; hack/node.sh), in a namespace of its own so the suite's fleet serves nothing.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use cocoon_hibernation::idle::CocoonIdlePolicy;
use cocoon_hibernation::idle::spec::{CocoonIdlePolicySpec, HttpRoute, WakeOnRequest};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use testkit::vk_sim;

use crate::world::{RELEASE, RELEASE_NS, Result, World, wait_for};

const POD: &str = "web-0";
const DOMAIN: &str = "proxy.install.test";
const VM_HTTP: u16 = 8080;
const VM_ECHO: u16 = 2222;
/// The chart's default `proxy.httpPort`.
const PROXY_HTTP: u16 = 8000;
const SELECTOR: &str = "app.kubernetes.io/component=wake-proxy";

/// The bridge's VM range (its top /26, hack/node.sh) from the registry's address, which
/// is the bridge's own.
fn vm_range(registry: &str) -> Result<(Ipv4Addr, u8)> {
    let host = registry.rsplit_once(':').map_or(registry, |(h, _)| h);
    let ip: Ipv4Addr = host
        .parse()
        .map_err(|e| format!("registry host {host}: {e}"))?;
    let [a, b, c, _] = ip.octets();
    Ok((Ipv4Addr::new(a, b, c, 192), 26))
}

/// SPEC Q1, Q2: through the chart, a request to a hibernated VM wakes it once and is
/// served by the woken VM; the proxy is turned off again afterwards.
pub async fn q1_q2_held_request_served_after_wake(world: &World) -> Result<()> {
    let ns = format!("proxy-{}", std::process::id());
    Api::<Namespace>::all(world.client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({ "metadata": { "name": ns } }))?,
        )
        .await?;
    let knobs = Arc::new(vk_sim::SimKnobs::new(
        Duration::from_millis(500),
        Duration::from_millis(500),
    ));
    knobs.set_serve(Some((VM_HTTP, VM_ECHO)));
    knobs.set_serve_net(Some(vm_range(&world.registry)?));
    let _sim = vk_sim::spawn(
        world.client.clone(),
        Some(ns.clone()),
        world.registry.clone(),
        knobs.clone(),
    );
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &ns);
    let crs: Api<CocoonHibernation> = Api::namespaced(world.client.clone(), &ns);

    Api::<CocoonIdlePolicy>::namespaced(world.client.clone(), &ns)
        .create(&PostParams::default(), &policy())
        .await?;
    vk_sim::create_vm_pod_on(
        &world.client,
        &ns,
        POD,
        &format!("{ns}-{POD}"),
        Some(&world.virtual_node),
    )
    .await?;
    // The CR before the pod is selected: a person's, which the idle policy leaves alone.
    let cr: CocoonHibernation = serde_json::from_value(json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonHibernation",
        "metadata": { "name": POD },
        "spec": { "podRef": { "name": POD }, "desire": "Wake" },
    }))?;
    crs.create(&PostParams::default(), &cr).await?;
    let labels = json!({ "metadata": { "labels": { "app": "vm" } } });
    pods.patch(POD, &PatchParams::default(), &Patch::Merge(&labels))
        .await?;
    wait_for("the VM serving", Duration::from_secs(60), || async {
        Ok(pods.get(POD).await?.status.and_then(|s| s.pod_ip).is_some())
    })
    .await?;
    let desire = json!({ "spec": { "desire": "Hibernate" } });
    crs.patch(POD, &PatchParams::default(), &Patch::Merge(&desire))
        .await?;
    wait_for("the VM Hibernated", Duration::from_secs(90), || async {
        Ok(phase(&crs).await? == Some(Phase::Hibernated))
    })
    .await?;

    let chart = world.chart.to_string_lossy().into_owned();
    let namespaces = format!("proxy.namespaces={{{ns}}}");
    world.helm(&[
        "upgrade",
        RELEASE,
        &chart,
        "-n",
        RELEASE_NS,
        "--reuse-values",
        "--set",
        "proxy.enabled=true",
        "--set",
        &namespaces,
        "--wait",
        "--timeout",
        "180s",
    ])?;
    let proxy_ip = proxy_pod_ip(world).await?;

    let wakes_before = knobs.wakes();
    let started = Instant::now();
    let resp = reqwest::Client::new()
        .post(format!("http://{proxy_ip}:{PROXY_HTTP}/hello"))
        .header("host", format!("{POD}.{DOMAIN}"))
        .body("hello")
        .timeout(Duration::from_secs(120))
        .send()
        .await?;
    let status = resp.status().as_u16();
    let answer = resp
        .headers()
        .get("x-cocoon-wake-proxy")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = resp.text().await?;
    let held = started.elapsed();
    let woken = pods.get(POD).await?;
    let vm_id = cocoon_hibernation::api::annotations::PodView::of(&woken)
        .vm_id
        .unwrap_or_default();
    let want = format!("vm={vm_id} pod={POD} path=/hello body=5");
    if status != 200 || answer.is_some() || !body.starts_with(&want) {
        return Err(format!(
            "the held request got {status} ({answer:?}) {body:?}, want 200 from the woken VM: {want}"
        )
        .into());
    }
    let cr = crs.get(POD).await?;
    let wakes = knobs.wakes() - wakes_before;
    if cr.spec.desire != Desire::Wake || wakes != 1 {
        return Err(format!(
            "after the request: desire {:?}, {wakes} wakes by the simulator, want Wake and 1",
            cr.spec.desire
        )
        .into());
    }
    println!(
        "  proxy: held request served by the woken VM {vm_id} after {:.1}s",
        held.as_secs_f64()
    );

    // Leave nothing the documented uninstall does not know of: the policy first (it
    // would make a CR for a selected pod without one), then the CR, while the product
    // still runs to release its finalizer.
    Api::<CocoonIdlePolicy>::namespaced(world.client.clone(), &ns)
        .delete("idle", &Default::default())
        .await?;
    crs.delete(POD, &Default::default()).await?;
    wait_for(
        "the proxy test's CR gone",
        Duration::from_secs(120),
        || async { Ok(crs.get_opt(POD).await?.is_none()) },
    )
    .await?;
    world.helm(&[
        "upgrade",
        RELEASE,
        &chart,
        "-n",
        RELEASE_NS,
        "--reuse-values",
        "--set",
        "proxy.enabled=false",
        "--wait",
        "--timeout",
        "180s",
    ])?;
    Ok(())
}

async fn phase(crs: &Api<CocoonHibernation>) -> Result<Option<Phase>> {
    Ok(crs.get(POD).await?.status.and_then(|s| s.phase))
}

/// The proxy pod's address once it is Ready (the host reaches pods on the bridge).
async fn proxy_pod_ip(world: &World) -> Result<String> {
    let api: Api<Pod> = Api::namespaced(world.client.clone(), RELEASE_NS);
    let ip = std::sync::Mutex::new(String::new());
    wait_for(
        "the wake proxy pod Ready",
        Duration::from_secs(120),
        || async {
            let pods = api.list(&ListParams::default().labels(SELECTOR)).await?;
            let ready = pods.items.into_iter().find(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
            });
            match ready.and_then(|p| p.status?.pod_ip) {
                Some(found) => {
                    *ip.lock().map_err(|_| "lock poisoned")? = found;
                    Ok(true)
                }
                None => Ok(false),
            }
        },
    )
    .await?;
    let ip = ip.into_inner().map_err(|_| "lock poisoned")?;
    Ok(ip)
}

fn policy() -> CocoonIdlePolicy {
    CocoonIdlePolicy::new(
        "idle",
        CocoonIdlePolicySpec {
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([("app".into(), "vm".into())])),
                ..LabelSelector::default()
            },
            idle_after: "1h".into(),
            min_awake: None,
            suspend: false,
            wake_on_request: Some(WakeOnRequest {
                http: vec![HttpRoute {
                    host: format!("{{pod}}.{DOMAIN}"),
                    path_prefix: None,
                    pod: None,
                    port: VM_HTTP,
                }],
                tcp: vec![],
                max_wait: Some("90s".into()),
                max_pending: Some(10),
                probe_paths: vec![],
                wake_during_scheduled_sleep: false,
            }),
        },
    )
}
