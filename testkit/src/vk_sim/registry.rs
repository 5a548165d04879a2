//! The simulator's registry side: snapshots pushed, read and deleted over plain http.

use super::SimError;
use super::pods::new_vm_id;
use oci_client::client::{ClientConfig, ClientProtocol, Config, ImageLayer};
use oci_client::manifest::{OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client as OciClient, Reference};
use reqwest::StatusCode;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Mutex, OnceLock};

/// Where the blobs every snapshot refers to are pushed once per registry. A snapshot push
/// then mounts them into `<vm>` and PUTs a manifest: 3 small requests instead of two
/// uploads and oci-client's `GET /v2/` before each step. vk uploads real snapshots from
/// other machines; here the registry shares the bench's 2 cores with the apiserver.
const SEED_REPOSITORY: &str = "vk-sim-seed";

/// Registries (host:port) known to hold the seed blobs.
static SEEDED: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
/// One seed push at a time: concurrent first pushes of the same blobs to a fresh
/// Distribution registry failed with DIGEST_INVALID / MANIFEST_BLOB_UNKNOWN.
static SEEDING: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn snapshot_parts() -> (ImageLayer, Config) {
    let layer = ImageLayer::oci_v1(b"vk-sim snapshot".to_vec(), None);
    (layer, Config::oci_v1(b"{}".to_vec(), None))
}

fn sim_http() -> &'static reqwest::Client {
    static HTTP: OnceLock<reqwest::Client> = OnceLock::new();
    // No idle pool: each #[tokio::test] has its own runtime, and a connection pooled on one
    // that has ended fails the next test with "runtime dropped the dispatch task".
    HTTP.get_or_init(|| {
        reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap_or_default()
    })
}

/// Pushes a tiny OCI artifact (config + one layer) to `<registry>/<vm>:hibernate` over
/// plain http (`registry` is host:port, optionally with a path prefix). An annotation
/// differs on every push, so each push gets a new digest. Returns the manifest URL.
pub async fn push_snapshot(registry: &str, vm: &str, note: &str) -> Result<String, SimError> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let (host, repository) = repository_of(registry, vm);
    let (layer, config) = snapshot_parts();
    let seeded = || SEEDED.lock().map(|s| s.contains(host)).unwrap_or(false);
    if !seeded() {
        let _one = SEEDING.lock().await;
        if !seeded() {
            push_image(&format!("{host}/{SEED_REPOSITORY}:seed"), None).await?;
            SEEDED.lock().map(|mut s| s.insert(host.to_string())).ok();
        }
    }
    let url = format!("http://{host}/v2/{repository}");
    let mut mounted = true;
    for digest in [config.sha256_digest(), layer.sha256_digest()] {
        let mount = format!("{url}/blobs/uploads/?mount={digest}&from={SEED_REPOSITORY}");
        mounted &= sim_http().post(mount).send().await?.status() == StatusCode::CREATED;
    }
    let note = format!("snapshot of {vm} ({note}) {}", new_vm_id());
    let annotations = BTreeMap::from([("vk-sim.cocoonstack.io/note".to_string(), note)]);
    if !mounted {
        // The registry lost the seed (e.g. a fresh data directory): push it all.
        SEEDED.lock().map(|mut s| s.remove(host)).ok();
        return push_image(&format!("{registry}/{vm}:hibernate"), Some(annotations)).await;
    }
    let manifest = OciImageManifest::build(&[layer], &config, Some(annotations));
    let url = format!("{url}/manifests/hibernate");
    let answer = sim_http()
        .put(&url)
        .header(reqwest::header::CONTENT_TYPE, OCI_IMAGE_MEDIA_TYPE)
        .body(serde_json::to_vec(&manifest)?)
        .send()
        .await?;
    match answer.status() {
        StatusCode::CREATED => Ok(url),
        status => Err(format!("PUT {url}: {status}: {}", answer.text().await?).into()),
    }
}

/// `(host, repository)` of `<vm>` in `registry` (host:port, optionally with a path prefix).
fn repository_of<'a>(registry: &'a str, vm: &str) -> (&'a str, String) {
    match registry.split_once('/') {
        Some((host, prefix)) => (host, format!("{prefix}/{vm}")),
        None => (registry, vm.to_string()),
    }
}

/// The digest `<vm>:hibernate` names now, `None` if there is no such tag.
pub async fn snapshot_digest(registry: &str, vm: &str) -> Result<Option<String>, SimError> {
    let (host, repository) = repository_of(registry, vm);
    let url = format!("http://{host}/v2/{repository}/manifests/hibernate");
    let answer = sim_http()
        .head(&url)
        .header(reqwest::header::ACCEPT, OCI_IMAGE_MEDIA_TYPE)
        .send()
        .await?;
    match answer.status() {
        StatusCode::OK => Ok(answer
            .headers()
            .get("docker-content-digest")
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)),
        StatusCode::NOT_FOUND => Ok(None),
        status => Err(format!("HEAD {url}: {status}").into()),
    }
}

/// Deletes the manifest `digest` of `<vm>` (and so every tag naming it), as a registry
/// that cannot delete tags needs. `false` if it was gone already.
pub async fn delete_manifest(registry: &str, vm: &str, digest: &str) -> Result<bool, SimError> {
    let (host, repository) = repository_of(registry, vm);
    let url = format!("http://{host}/v2/{repository}/manifests/{digest}");
    let answer = sim_http().delete(&url).send().await?;
    match answer.status() {
        StatusCode::ACCEPTED | StatusCode::OK => Ok(true),
        StatusCode::NOT_FOUND => Ok(false),
        status => Err(format!("DELETE {url}: {status}: {}", answer.text().await?).into()),
    }
}

/// The whole push through oci-client: blobs, then the manifest.
async fn push_image(
    reference: &str,
    annotations: Option<BTreeMap<String, String>>,
) -> Result<String, SimError> {
    let reference: Reference = reference.parse()?;
    let client = OciClient::new(ClientConfig {
        protocol: ClientProtocol::Http,
        ..Default::default()
    });
    let (layer, config) = snapshot_parts();
    let manifest = OciImageManifest::build(std::slice::from_ref(&layer), &config, annotations);
    let resp = client
        .push(
            &reference,
            &[layer],
            config,
            &RegistryAuth::Anonymous,
            Some(manifest),
        )
        .await?;
    Ok(resp.manifest_url)
}
