//! Test support: one e2e test's world — a fresh namespace, the real product binary with
//! its webhook configured, and the vk-cocoon simulator — plus small status readers.

use crate::cluster;
use crate::product::{self, Product, ProductOptions, eventually};
use crate::vk_sim::{self, SimHandle, SimKnobs};
use cocoon_hibernation::api::CocoonHibernation;
use cocoon_hibernation::api::conditions::{self, READY};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use std::sync::Arc;
use std::time::Duration;

pub const LONG: Duration = Duration::from_secs(60);

pub struct Env {
    pub client: kube::Client,
    pub ns: String,
    pub crs: Api<CocoonHibernation>,
    pub pods: Api<Pod>,
    pub product: Product,
    pub sim: SimHandle,
    /// host:port the product and simulator use.
    pub registry: String,
}

pub struct Setup {
    pub registry: Option<String>,
    pub hibernate_timeout: &'static str,
    pub wake_timeout: &'static str,
    pub hibernate_delay: Duration,
    pub wake_delay: Duration,
    /// Further product flags.
    pub extra_args: Vec<String>,
    /// Install the ValidatingWebhookConfiguration; off plays an install whose webhook is
    /// absent, where duplicates can be created.
    pub webhook: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Self {
            registry: None,
            hibernate_timeout: "60s",
            wake_timeout: "60s",
            hibernate_delay: Duration::from_millis(300),
            wake_delay: Duration::from_millis(300),
            webhook: true,
            extra_args: Vec::new(),
        }
    }
}

pub async fn setup(prefix: &str, s: Setup) -> Env {
    let cluster = cluster::cluster();
    eprintln!(
        "kube-apiserver {} at {}",
        cluster.k8s_version, cluster.apiserver_url
    );
    let client = cluster.client().await;
    product::ensure_crd(&client).await;
    let ns = cluster.fresh_namespace(&client, prefix).await;
    let registry = s.registry.unwrap_or_else(|| cluster.registry.clone());
    let mut opts = ProductOptions::new(&ns, &registry);
    opts.hibernate_timeout = s.hibernate_timeout.into();
    opts.wake_timeout = s.wake_timeout.into();
    opts.extra_args = s.extra_args;
    let product = Product::start(cluster, &opts).await;
    if s.webhook {
        product::install_webhook(
            &client,
            cluster,
            &ns,
            product.webhook_port,
            "cocoonset.cocoonstack.io",
        )
        .await;
    }
    let knobs = Arc::new(SimKnobs::new(s.hibernate_delay, s.wake_delay));
    let sim = vk_sim::spawn(client.clone(), Some(ns.clone()), registry.clone(), knobs);
    Env {
        crs: Api::namespaced(client.clone(), &ns),
        pods: Api::namespaced(client.clone(), &ns),
        client,
        ns,
        product,
        sim,
        registry,
    }
}

impl Env {
    pub fn vm(&self, pod: &str) -> String {
        format!("vm-{}-{pod}", self.ns)
    }

    pub async fn pod(&self, name: &str) -> Pod {
        vk_sim::create_vm_pod(&self.client, &self.ns, name, &self.vm(name))
            .await
            .unwrap_or_else(|e| panic!("create pod {name}: {e}"))
    }

    pub async fn tag_exists(&self, vm: &str) -> bool {
        tag_exists(&self.registry, vm)
            .await
            .expect("registry reachable")
    }

    pub async fn events(&self, cr: &str) -> Vec<String> {
        product::event_reasons(&self.client, &self.ns, cr).await
    }

    pub async fn wait_events(&self, cr: &str, want: &[&str]) -> Vec<String> {
        eventually(&format!("events {want:?} on {cr}"), LONG, || async {
            let got = self.events(cr).await;
            want.iter()
                .all(|w| got.iter().any(|g| g == w))
                .then_some(got)
        })
        .await
    }
}

/// HEAD `<vm>:hibernate` on a plain-http registry: `Some(present)`, `None` if unreachable.
pub async fn tag_exists(registry: &str, vm: &str) -> Option<bool> {
    let res = head_tag(registry, vm).await.ok()?;
    Some(res.status().is_success())
}

/// HEAD `<vm>:hibernate` on a plain-http registry, as an OCI or Docker manifest.
pub async fn head_tag(registry: &str, vm: &str) -> reqwest::Result<reqwest::Response> {
    let url = format!("http://{registry}/v2/{vm}/manifests/hibernate");
    reqwest::Client::new()
        .head(&url)
        .header(
            "accept",
            "application/vnd.oci.image.manifest.v1+json, application/vnd.docker.distribution.manifest.v2+json",
        )
        .timeout(Duration::from_secs(3))
        .send()
        .await
}

pub fn ready_message(cr: &CocoonHibernation) -> String {
    cr.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, READY))
        .map(|c| c.message.clone())
        .unwrap_or_default()
}

pub fn condition_status(cr: &CocoonHibernation, type_: &str) -> Option<String> {
    cr.status
        .as_ref()
        .and_then(|s| conditions::find(&s.conditions, type_))
        .map(|c| c.status.clone())
}
