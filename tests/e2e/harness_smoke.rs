//! Proves the local harness: a real apiserver of a supported version (v1.34 by default,
//! others under `make compat`), the audit log, the CA for webhook
//! certs, and the vk-cocoon simulator against the real registry.

use testkit::cluster;
use testkit::vk_sim;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use cluster::{audit_in_namespace, cluster};
use cocoon_hibernation::api::annotations::{
    HIBERNATE, PodView, STATE_HIBERNATED, STATE_HIBERNATING,
};
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::json;

const TIMEOUT: Duration = Duration::from_secs(30);
/// The oldest Kubernetes minor docs/install.md claims (and `make compat` runs).
const OLDEST_MINOR: u32 = 30;

/// Polls `check` every 100 ms until it yields a value or `timeout` passes.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// HEAD on the manifest, as the product's registry probe does; returns the digest.
async fn registry_tag_digest(registry: &str, repo: &str, tag: &str) -> Option<String> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let resp = reqwest::Client::new()
        .head(format!("http://{registry}/v2/{repo}/manifests/{tag}"))
        .header(
            "Accept",
            "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
        )
        .send()
        .await
        .expect("registry reachable");
    resp.status().is_success().then(|| {
        resp.headers()["Docker-Content-Digest"]
            .to_str()
            .unwrap()
            .to_owned()
    })
}

#[tokio::test]
async fn e2e_harness_apiserver_version_is_real() {
    let c = cluster();
    let client = c.client().await;
    let info = client.apiserver_version().await.expect("GET /version");
    println!(
        "kube-apiserver {} (env file says {}) at {}",
        info.git_version, c.k8s_version, c.apiserver_url
    );
    // A version the build stamped (not v0.0.0), of a minor docs/install.md supports:
    // `make test` runs v1.34, `make compat` the oldest minor claimed too.
    let minor: u32 = info.minor.parse().unwrap_or_else(|_| panic!("{info:?}"));
    assert_eq!(info.major, "1", "{info:?}");
    assert!(
        minor >= OLDEST_MINOR,
        "v1.{minor} is older than v1.{OLDEST_MINOR}"
    );
    assert!(
        info.git_version.starts_with(&format!("v1.{minor}.")),
        "{info:?}"
    );
    assert_eq!(info.git_version, c.k8s_version);

    let out = c.kubectl(&["version", "-o", "json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["serverVersion"]["gitVersion"], info.git_version.as_str());
}

#[tokio::test]
async fn e2e_harness_audit_log_counts_writes_per_namespace() {
    let c = cluster();
    let client = c.client().await;
    let ns = c.fresh_namespace(&client, "audit").await;
    let mark = c.audit_mark();
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("one".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    api.create(&PostParams::default(), &cm).await.unwrap();
    let patch = json!({ "data": { "k": "v" } });
    api.patch("one", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    api.get("one").await.unwrap(); // reads are not logged

    let in_ns = audit_in_namespace(&ns);
    eventually("two audited writes", TIMEOUT, || async {
        (c.count_audit_writes(mark, &in_ns) == 2).then_some(())
    })
    .await;
    let patches = c.count_audit_writes(mark, |e| in_ns(e) && e["verb"] == "patch");
    assert_eq!(patches, 1);
    assert_eq!(c.count_audit_writes(c.audit_mark(), &in_ns), 0);
}

#[tokio::test]
async fn e2e_harness_serving_cert_chains_to_cluster_ca() {
    use rustls::client::danger::ServerCertVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, ServerName, UnixTime};

    let c = cluster();
    let (cert_pem, key_pem) = c.serving_cert(&["127.0.0.1", "localhost"]);
    assert!(key_pem.contains("PRIVATE KEY"));

    // webpki compares issuer and subject names byte for byte, as Go's verifier does.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(c.ca_cert_pem.as_bytes()).unwrap())
        .unwrap();
    let verifier = rustls::client::WebPkiServerVerifier::builder(Arc::new(roots))
        .build()
        .unwrap();
    let leaf = CertificateDer::from_pem_slice(cert_pem.as_bytes()).unwrap();
    for name in ["127.0.0.1", "localhost"] {
        verifier
            .verify_server_cert(
                &leaf,
                &[],
                &ServerName::try_from(name).unwrap(),
                &[],
                UnixTime::now(),
            )
            .unwrap_or_else(|e| panic!("leaf does not verify for {name}: {e}"));
    }
}

/// The real apiserver calls a webhook served with `serving_cert` and trusts it through a
/// `caBundle` of the cluster CA: the path the product's admission tests take.
#[tokio::test]
async fn e2e_harness_apiserver_calls_a_webhook_with_a_cluster_ca_cert() {
    use axum::{Json, Router, routing::post};
    use base64::Engine;
    use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;

    let c = cluster();
    let client = c.client().await;
    let ns = c.fresh_namespace(&client, "webhook").await;
    let (cert, key) = c.serving_cert(&["127.0.0.1"]);
    let tls = axum_server::tls_rustls::RustlsConfig::from_pem(cert.into_bytes(), key.into_bytes())
        .await
        .unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = Router::new().route(
        "/validate",
        post(|Json(review): Json<serde_json::Value>| async move {
            Json(json!({
                "apiVersion": "admission.k8s.io/v1",
                "kind": "AdmissionReview",
                "response": {
                    "uid": review["request"]["uid"],
                    "allowed": false,
                    "status": { "code": 403, "message": "denied by the harness webhook" },
                },
            }))
        }),
    );
    let server = tokio::spawn(
        axum_server::from_tcp_rustls(listener, tls)
            .unwrap()
            .serve(app.into_make_service()),
    );

    // Scoped to this test's namespace, so other tests never meet it.
    let name = format!("harness-{ns}");
    let config: ValidatingWebhookConfiguration = serde_json::from_value(json!({
        "metadata": { "name": name },
        "webhooks": [{
            "name": "deny.harness.cocoonstack.io",
            "clientConfig": {
                "url": format!("https://127.0.0.1:{port}/validate"),
                "caBundle": base64::engine::general_purpose::STANDARD.encode(&c.ca_cert_pem),
            },
            "rules": [{ "apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                        "resources": ["configmaps"] }],
            "namespaceSelector": { "matchLabels": { "kubernetes.io/metadata.name": ns } },
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "admissionReviewVersions": ["v1"],
            "timeoutSeconds": 5,
        }],
    }))
    .unwrap();
    let hooks: Api<ValidatingWebhookConfiguration> = Api::all(client.clone());
    hooks.create(&PostParams::default(), &config).await.unwrap();

    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some("probe".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    // The apiserver picks the configuration up asynchronously; until then creates pass.
    let message = eventually("the webhook's deny", TIMEOUT, || async {
        match cms.create(&PostParams::default(), &cm).await {
            Ok(_) => {
                cms.delete("probe", &Default::default()).await.unwrap();
                None
            }
            Err(e) => Some(e.to_string()),
        }
    })
    .await;
    hooks.delete(&name, &Default::default()).await.unwrap();
    server.abort();
    assert!(
        message.contains("denied by the harness webhook"),
        "expected the webhook's own deny (TLS trusted), got: {message}"
    );
}

#[tokio::test]
async fn e2e_harness_vk_sim_hibernates_and_wakes_a_pod() {
    let c = cluster();
    let client = c.client().await;
    let ns = c.fresh_namespace(&client, "vksim").await;
    let knobs = Arc::new(vk_sim::SimKnobs::new(
        Duration::from_millis(200),
        Duration::from_millis(200),
    ));
    let _sim = vk_sim::spawn(
        client.clone(),
        Some(ns.clone()),
        c.registry.clone(),
        knobs.clone(),
    );
    let vm = format!("vm-{ns}");
    let created = vk_sim::create_vm_pod(&client, &ns, "pod-a", &vm)
        .await
        .unwrap();
    let before = PodView::of(&created);
    assert!(before.container_running && before.vm_id.is_some());
    assert_eq!(
        registry_tag_digest(&c.registry, &vm, "hibernate").await,
        None
    );

    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ask = json!({ "metadata": { "annotations": { HIBERNATE: "true" } } });
    pods.patch("pod-a", &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();

    let hibernated = eventually("pod hibernated", TIMEOUT, || async {
        let v = PodView::of(&pods.get("pod-a").await.unwrap());
        (v.lifecycle_hibernated_for_round() && !v.container_running).then_some(v)
    })
    .await;
    assert_eq!(
        hibernated.lifecycle_state.as_deref(),
        Some(STATE_HIBERNATED)
    );
    assert_eq!(hibernated.observed_generation, 1);
    assert_eq!(hibernated.vm_id, None, "VMID cleared on hibernate");
    let digest = registry_tag_digest(&c.registry, &vm, "hibernate")
        .await
        .expect("snapshot tag pushed");
    println!("{vm}:hibernate = {digest}");

    let wake = json!({ "metadata": { "annotations": { HIBERNATE: null } } });
    pods.patch("pod-a", &PatchParams::default(), &Patch::Merge(&wake))
        .await
        .unwrap();
    let woken = eventually("pod woken", TIMEOUT, || async {
        let v = PodView::of(&pods.get("pod-a").await.unwrap());
        v.woken().then_some(v)
    })
    .await;
    assert_ne!(woken.vm_id, before.vm_id, "a fresh VMID after the wake");
    assert_eq!(woken.lifecycle_state.as_deref(), Some("ready"));
    assert_eq!(
        registry_tag_digest(&c.registry, &vm, "hibernate").await,
        Some(digest),
        "vk never deletes the tag"
    );
    assert_eq!((knobs.hibernations(), knobs.wakes()), (1, 1));
}

#[tokio::test]
async fn e2e_harness_vk_sim_knobs_and_stale_state() {
    let c = cluster();
    let client = c.client().await;
    let ns = c.fresh_namespace(&client, "vksim-knobs").await;
    let knobs = Arc::new(vk_sim::SimKnobs::new(
        Duration::from_millis(100),
        Duration::from_millis(100),
    ));
    let sim = vk_sim::spawn(
        client.clone(),
        Some(ns.clone()),
        c.registry.clone(),
        knobs.clone(),
    );
    let vm = format!("vm-{ns}");
    vk_sim::create_vm_pod(&client, &ns, "pod-b", &vm)
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);

    // Stale state: a tag from an earlier cycle and a lifecycle pair from an earlier round.
    sim.stage_stale_tag(&vm).await.unwrap();
    let stale_digest = registry_tag_digest(&c.registry, &vm, "hibernate")
        .await
        .expect("stale tag staged");
    sim.stage_stale_lifecycle(&ns, "pod-b").await.unwrap();
    let staged = PodView::of(&pods.get("pod-b").await.unwrap());
    assert_eq!(staged.lifecycle_state.as_deref(), Some(STATE_HIBERNATED));
    assert_eq!(staged.observed_generation, 0);
    assert!(!staged.lifecycle_hibernated_for_round());

    // A failing push writes nothing; once it recovers the hibernation completes.
    knobs.set_fail_push(true);
    let ask = json!({ "metadata": { "annotations": { HIBERNATE: "true" } } });
    pods.patch("pod-b", &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    let during = PodView::of(&pods.get("pod-b").await.unwrap());
    assert!(!during.lifecycle_hibernated_for_round() && during.vm_id.is_some());
    assert_eq!(knobs.hibernations(), 0);
    knobs.set_fail_push(false);
    eventually("hibernated after push recovers", TIMEOUT, || async {
        let v = PodView::of(&pods.get("pod-b").await.unwrap());
        (v.lifecycle_hibernated_for_round() && !v.container_running).then_some(())
    })
    .await;
    let fresh = registry_tag_digest(&c.registry, &vm, "hibernate")
        .await
        .unwrap();
    assert_ne!(fresh, stale_digest, "a new snapshot replaced the stale tag");

    // A stuck vk ignores the wake until it is unstuck.
    knobs.set_never_complete(true);
    let wake = json!({ "metadata": { "annotations": { HIBERNATE: null } } });
    pods.patch("pod-b", &PatchParams::default(), &Patch::Merge(&wake))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert!(!PodView::of(&pods.get("pod-b").await.unwrap()).woken());
    knobs.set_never_complete(false);
    eventually("woken after unstuck", TIMEOUT, || async {
        PodView::of(&pods.get("pod-b").await.unwrap())
            .woken()
            .then_some(())
    })
    .await;

    // Deleting and recreating the pod mid-request: no panic, the new pod is served.
    knobs.set_hibernate_delay(Duration::from_millis(500));
    pods.patch("pod-b", &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();
    pods.delete("pod-b", &Default::default()).await.unwrap();
    vk_sim::create_vm_pod(&client, &ns, "pod-b", &vm)
        .await
        .unwrap();
    pods.patch("pod-b", &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();
    eventually("recreated pod hibernated", TIMEOUT, || async {
        let v = PodView::of(&pods.get("pod-b").await.unwrap());
        (v.lifecycle_hibernated_for_round() && !v.container_running).then_some(())
    })
    .await;
}

/// The simulator's vk-cocoon README behaviours, on request: `hibernating` is written in a
/// patch of its own before the push (and a hibernate withdrawn then goes back to
/// `ready` with its VMID), and a wake may delete the manifest it restored from (per pod
/// through the annotation, or for a share of wakes).
#[tokio::test]
async fn e2e_harness_vk_sim_hibernating_first_and_wake_drops_tag() {
    let c = cluster();
    let client = c.client().await;
    let ns = c.fresh_namespace(&client, "vksim-readme").await;
    let knobs = Arc::new(vk_sim::SimKnobs::new(
        Duration::from_millis(100),
        Duration::from_millis(100),
    ));
    knobs.set_hibernating_first(true);
    let _sim = vk_sim::spawn(
        client.clone(),
        Some(ns.clone()),
        c.registry.clone(),
        knobs.clone(),
    );
    let vm = format!("vm-{ns}");
    let created = vk_sim::create_vm_pod(&client, &ns, "pod-c", &vm)
        .await
        .unwrap();
    let first_vmid = PodView::of(&created).vm_id;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let ask = json!({ "metadata": { "annotations": { HIBERNATE: "true" } } });
    let withdraw = json!({ "metadata": { "annotations": { HIBERNATE: null } } });

    // `hibernating` shows while the push fails; withdrawn, the VM is kept and ready again.
    knobs.set_fail_push(true);
    pods.patch("pod-c", &PatchParams::default(), &Patch::Merge(&ask))
        .await
        .unwrap();
    let during = eventually("lifecycle-state=hibernating", TIMEOUT, || async {
        let v = PodView::of(&pods.get("pod-c").await.unwrap());
        (v.lifecycle_state.as_deref() == Some(STATE_HIBERNATING)).then_some(v)
    })
    .await;
    assert_eq!(during.vm_id, first_vmid, "the VM is still there");
    assert!(!during.woken(), "a hibernating VM is not woken");
    pods.patch("pod-c", &PatchParams::default(), &Patch::Merge(&withdraw))
        .await
        .unwrap();
    let back = eventually("ready again after the withdrawal", TIMEOUT, || async {
        let v = PodView::of(&pods.get("pod-c").await.unwrap());
        v.woken().then_some(v)
    })
    .await;
    assert_eq!(back.vm_id, first_vmid, "a withdrawn hibernate keeps the VM");
    assert_eq!(knobs.hibernations(), 0);
    knobs.set_fail_push(false);

    // A wake of a pod that asks for it drops the tag once the new VMID is written.
    let drop_tag = |on: &str| json!({ "metadata": { "annotations": { vk_sim::WAKE_DROPS_TAG_ANNOTATION: on } } });
    let cycle = |annotation: Option<&'static str>| {
        let (pods, ask, withdraw) = (pods.clone(), ask.clone(), withdraw.clone());
        let patch = annotation.map(drop_tag);
        async move {
            if let Some(p) = patch {
                pods.patch("pod-c", &PatchParams::default(), &Patch::Merge(&p))
                    .await
                    .unwrap();
            }
            pods.patch("pod-c", &PatchParams::default(), &Patch::Merge(&ask))
                .await
                .unwrap();
            eventually("pod hibernated", TIMEOUT, || async {
                let v = PodView::of(&pods.get("pod-c").await.unwrap());
                (v.lifecycle_hibernated_for_round() && !v.container_running).then_some(())
            })
            .await;
            pods.patch("pod-c", &PatchParams::default(), &Patch::Merge(&withdraw))
                .await
                .unwrap();
            eventually("pod woken", TIMEOUT, || async {
                PodView::of(&pods.get("pod-c").await.unwrap())
                    .woken()
                    .then_some(())
            })
            .await;
        }
    };
    cycle(Some("true")).await;
    eventually("tag dropped by the wake", TIMEOUT, || async {
        registry_tag_digest(&c.registry, &vm, "hibernate")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!(
        (knobs.hibernations(), knobs.wakes(), knobs.tag_drops()),
        (1, 1, 1)
    );

    // The pod's "false" beats a share of 1; without the annotation the share decides.
    knobs.set_wake_drops_tag(1.0);
    cycle(Some("false")).await;
    assert!(
        registry_tag_digest(&c.registry, &vm, "hibernate")
            .await
            .is_some(),
        "the pod said keep"
    );
    let remove =
        json!({ "metadata": { "annotations": { vk_sim::WAKE_DROPS_TAG_ANNOTATION: null } } });
    pods.patch("pod-c", &PatchParams::default(), &Patch::Merge(&remove))
        .await
        .unwrap();
    cycle(None).await;
    eventually("tag dropped by a share of 1", TIMEOUT, || async {
        registry_tag_digest(&c.registry, &vm, "hibernate")
            .await
            .is_none()
            .then_some(())
    })
    .await;
    assert_eq!((knobs.wakes(), knobs.tag_drops()), (3, 2));
}
