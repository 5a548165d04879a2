//! Test support: a vk-cocoon simulator. It plays the virtual kubelet that runs each pod as
//! a micro-VM, against a real apiserver and a real OCI registry (SPEC "The world around
//! the product"):
//! - hibernate annotation set, not yet hibernated for the pod's round: (with
//!   [`SimKnobs::set_hibernating_first`], as vk-cocoon's README says it does) write
//!   `lifecycle-state=hibernating` in a patch of its own, then push
//!   `<registry>/<vm>:hibernate`, then in one patch clear the VMID and write
//!   `lifecycle-state=hibernated` + `lifecycle-observed-generation`, then report the
//!   container not running through `pods/status`;
//! - annotation removed while hibernated (VM gone): restore from the tag, write a new
//!   VMID and `lifecycle-state=ready`, then (with [`SimKnobs::set_wake_drops_tag`], which
//!   vk-cocoon's README allows) maybe delete the manifest it restored from, then report
//!   the container Running;
//! - annotation removed while `hibernating` with the VMID still there (the hibernate was
//!   withdrawn before the VM was removed): write `lifecycle-state=ready` again;
//! - a `ready` pod with a VMID whose container is not reported Running (e.g. created with
//!   kubectl) is reported Running, as a kubelet would.
//!
//! Also used by `examples/vk_cocoon_simulator.rs` (`make demo`).

mod pods;
mod registry;

pub use pods::{create_vm_pod, create_vm_pod_on, stage_stale_lifecycle};
use pods::{new_vm_id, running_status, stopped_status};
pub use registry::{delete_manifest, push_snapshot, snapshot_digest};

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cocoon_hibernation::api::annotations::{
    LIFECYCLE_OBSERVED_GENERATION, LIFECYCLE_STATE, PodView, STATE_HIBERNATED, STATE_HIBERNATING,
    VM_ID,
};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use serde_json::{Value, json};
use tokio::task::{JoinHandle, JoinSet};

pub type SimError = Box<dyn std::error::Error + Send + Sync>;

/// How often every known pod is re-checked, so a knob flipped at runtime takes effect
/// without a pod event.
const RESYNC: Duration = Duration::from_millis(300);
/// Pause before retrying a failed push or a conflicting write.
const RETRY: Duration = Duration::from_millis(250);
const STATE_READY: &str = "ready";
/// Per-pod override of [`SimKnobs::set_wake_drops_tag`]: `"true"` makes every wake of the
/// pod delete the tag it restored from, `"false"` none.
pub const WAKE_DROPS_TAG_ANNOTATION: &str = "vk-sim.cocoonstack.io/wake-drops-tag";

/// Runtime-adjustable behaviour, shared with tests through an `Arc`.
#[derive(Debug, Default)]
pub struct SimKnobs {
    hibernate_delay_ms: AtomicU64,
    wake_delay_ms: AtomicU64,
    fail_push: AtomicBool,
    never_complete: AtomicBool,
    hibernating_first: AtomicBool,
    /// Share of wakes that delete the tag, per million.
    wake_drops_tag_ppm: AtomicU32,
    drop_seed: AtomicU64,
    pushes: AtomicUsize,
    hibernations: AtomicUsize,
    wakes: AtomicUsize,
    tag_drops: AtomicUsize,
    /// Wakes so far per VM: with the seed, what decides whether a wake drops the tag.
    wake_rounds: Mutex<HashMap<String, u64>>,
}

impl SimKnobs {
    pub fn new(hibernate_delay: Duration, wake_delay: Duration) -> Self {
        let knobs = Self::default();
        knobs.set_hibernate_delay(hibernate_delay);
        knobs.set_wake_delay(wake_delay);
        knobs
    }
    pub fn hibernate_delay(&self) -> Duration {
        Duration::from_millis(self.hibernate_delay_ms.load(Ordering::Relaxed))
    }
    pub fn set_hibernate_delay(&self, d: Duration) {
        self.hibernate_delay_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }
    pub fn wake_delay(&self) -> Duration {
        Duration::from_millis(self.wake_delay_ms.load(Ordering::Relaxed))
    }
    pub fn set_wake_delay(&self, d: Duration) {
        self.wake_delay_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }
    /// While set, every snapshot push fails: nothing is written and the push is retried.
    pub fn fail_push(&self) -> bool {
        self.fail_push.load(Ordering::Relaxed)
    }
    pub fn set_fail_push(&self, on: bool) {
        self.fail_push.store(on, Ordering::Relaxed);
    }
    /// While set, hibernate and wake requests are ignored (a stuck vk).
    pub fn never_complete(&self) -> bool {
        self.never_complete.load(Ordering::Relaxed)
    }
    pub fn set_never_complete(&self, on: bool) {
        self.never_complete.store(on, Ordering::Relaxed);
    }
    /// While set, a hibernate first writes `lifecycle-state=hibernating` in a patch of its
    /// own (a write more per hibernate, so off by default: the bench measures speed).
    pub fn hibernating_first(&self) -> bool {
        self.hibernating_first.load(Ordering::Relaxed)
    }
    pub fn set_hibernating_first(&self, on: bool) {
        self.hibernating_first.store(on, Ordering::Relaxed);
    }
    /// The share (0..=1) of wakes that delete the manifest they restored from once the new
    /// VMID is written. 0 (the default) never, 1 always; a pod's
    /// [`WAKE_DROPS_TAG_ANNOTATION`] overrides it.
    pub fn wake_drops_tag(&self) -> f64 {
        f64::from(self.wake_drops_tag_ppm.load(Ordering::Relaxed)) / 1e6
    }
    pub fn set_wake_drops_tag(&self, share: f64) {
        let ppm = (share.clamp(0.0, 1.0) * 1e6).round() as u32;
        self.wake_drops_tag_ppm.store(ppm, Ordering::Relaxed);
    }
    /// Seeds the choice of the wakes that drop their tag (per VM and wake round), so a
    /// seeded run makes the same choices.
    pub fn set_seed(&self, seed: u64) {
        self.drop_seed.store(seed, Ordering::Relaxed);
    }
    /// Whether this wake of `vm` drops its tag: the pod's annotation, else the share.
    fn drops_tag(&self, vm: &str, annotation: Option<&str>) -> bool {
        match annotation {
            Some("true") => return true,
            Some("false") => return false,
            _ => {}
        }
        let ppm = self.wake_drops_tag_ppm.load(Ordering::Relaxed);
        if ppm == 0 {
            return false;
        }
        let round = {
            let Ok(mut rounds) = self.wake_rounds.lock() else {
                return false;
            };
            let r = rounds.entry(vm.to_owned()).or_default();
            *r += 1;
            *r
        };
        // DefaultHasher::new() has fixed keys: the same seed gives the same choices.
        let mut h = DefaultHasher::new();
        (self.drop_seed.load(Ordering::Relaxed), vm, round).hash(&mut h);
        h.finish() % 1_000_000 < u64::from(ppm)
    }
    /// Successful snapshot pushes so far (staged stale tags included).
    pub fn pushes(&self) -> usize {
        self.pushes.load(Ordering::Relaxed)
    }
    /// Completed hibernations (the lifecycle patch landed).
    pub fn hibernations(&self) -> usize {
        self.hibernations.load(Ordering::Relaxed)
    }
    /// Wakes that wrote a new VMID (the Running report follows it).
    pub fn wakes(&self) -> usize {
        self.wakes.load(Ordering::Relaxed)
    }
    /// Wakes that deleted the tag they restored from (the DELETE was answered 202).
    pub fn tag_drops(&self) -> usize {
        self.tag_drops.load(Ordering::Relaxed)
    }
}

/// The running simulator; dropping it stops it (and any in-flight work).
pub struct SimHandle {
    task: JoinHandle<()>,
    client: kube::Client,
    registry: String,
    pub knobs: Arc<SimKnobs>,
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl SimHandle {
    /// Pushes `<vm>:hibernate` now, before any request: a stale tag from an earlier cycle.
    /// Returns the manifest URL.
    pub async fn stage_stale_tag(&self, vm: &str) -> Result<String, SimError> {
        let url = push_snapshot(&self.registry, vm, "stale").await?;
        self.knobs.pushes.fetch_add(1, Ordering::Relaxed);
        Ok(url)
    }

    /// Writes `lifecycle-state=hibernated` with an observed generation one below the pod's
    /// generation stamp: a stale lifecycle pair from an earlier round. The VMID and the
    /// Running container stay, so the simulator does not treat the VM as gone.
    pub async fn stage_stale_lifecycle(&self, namespace: &str, pod: &str) -> Result<(), SimError> {
        stage_stale_lifecycle(&self.client, namespace, pod).await
    }
}

/// Starts the simulator on pods in `namespace` (all namespaces if `None`) that carry
/// `vm.cocoonstack.io/name`, pushing snapshots to the plain-http `registry` (host:port).
pub fn spawn(
    client: kube::Client,
    namespace: Option<String>,
    registry: String,
    knobs: Arc<SimKnobs>,
) -> SimHandle {
    // reqwest (under oci-client) needs a process-wide rustls provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let api: Api<Pod> = match &namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let sim = Sim {
        client: client.clone(),
        registry: registry.clone(),
        knobs: knobs.clone(),
        in_flight: Arc::new(Mutex::new(HashSet::new())),
    };
    let task = tokio::spawn(sim.run(api));
    SimHandle {
        task,
        client,
        registry,
        knobs,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Hibernate,
    Wake,
}

/// What vk would do for this pod now, if anything.
fn plan(pod: &Pod, knobs: &SimKnobs) -> Option<Action> {
    if pod.metadata.deletion_timestamp.is_some() || knobs.never_complete() {
        return None;
    }
    let view = PodView::of(pod);
    view.vm_name.as_ref()?;
    let vm_gone = view.vm_id.is_none();
    let state = view.lifecycle_state.as_deref();
    if view.hibernate_requested {
        // A lifecycle pair from an earlier round does not count as done; a finished
        // lifecycle patch whose status write failed still needs the status.
        let done = view.lifecycle_hibernated_for_round() && vm_gone && !view.container_running;
        (!done).then_some(Action::Hibernate)
    } else {
        // Wake only a VM this runtime removed (hibernated, no VMID): a staged stale
        // lifecycle with its VMID is left alone. A ready VM not reported Running (a wake
        // whose status write failed) gets its status. A hibernate withdrawn before the VM
        // was removed goes back to ready.
        let removed = state == Some(STATE_HIBERNATED) && vm_gone;
        let unreported = state == Some(STATE_READY) && !vm_gone && !view.container_running;
        let withdrawn = state == Some(STATE_HIBERNATING) && !vm_gone;
        (removed || unreported || withdrawn).then_some(Action::Wake)
    }
}

type PodKey = (String, String);

#[derive(Clone)]
struct Sim {
    client: kube::Client,
    registry: String,
    knobs: Arc<SimKnobs>,
    /// Pods with a worker running; events for them are left to that worker, which
    /// re-reads the pod before every write.
    in_flight: Arc<Mutex<HashSet<PodKey>>>,
}

impl Sim {
    async fn run(self, api: Api<Pod>) {
        let (store, writer) = reflector::store();
        let events = reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        let mut events = std::pin::pin!(events);
        let mut resync = tokio::time::interval(RESYNC);
        // Workers live in this set, so aborting this task aborts them too.
        let mut workers = JoinSet::new();
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(pod)) => self.consider(&pod, &mut workers),
                    Some(Err(e)) => tracing::warn!(error = %e, "vk-sim: pod watch error"),
                    None => return,
                },
                _ = resync.tick() => {
                    for pod in store.state() {
                        self.consider(&pod, &mut workers);
                    }
                }
                Some(_) = workers.join_next(), if !workers.is_empty() => {}
            }
        }
    }

    fn consider(&self, pod: &Pod, workers: &mut JoinSet<()>) {
        if plan(pod, &self.knobs).is_none() {
            return;
        }
        let (Some(ns), Some(name)) = (&pod.metadata.namespace, &pod.metadata.name) else {
            return;
        };
        let key = (ns.clone(), name.clone());
        if !self.in_flight.lock().unwrap().insert(key.clone()) {
            return;
        }
        let sim = self.clone();
        workers.spawn(async move {
            sim.work(&key.0, &key.1).await;
            sim.in_flight.lock().unwrap().remove(&key);
        });
    }

    /// Drives one pod until there is nothing left to do. Never panics: a deleted pod ends
    /// the work, a failure or a conflict is retried.
    async fn work(&self, ns: &str, name: &str) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        loop {
            let Some(action) = self.current_plan(&api, name).await else {
                return;
            };
            let delay = match action {
                Action::Hibernate => self.knobs.hibernate_delay(),
                Action::Wake => self.knobs.wake_delay(),
            };
            tokio::time::sleep(delay).await;
            // The request may have been withdrawn or the pod replaced during the delay.
            let pod = match api.get_opt(name).await {
                Ok(Some(pod)) => pod,
                Ok(None) => return,
                Err(e) => {
                    tracing::warn!(%ns, %name, error = %e, "vk-sim: get pod");
                    tokio::time::sleep(RETRY).await;
                    continue;
                }
            };
            if plan(&pod, &self.knobs) != Some(action) {
                continue;
            }
            let result = match action {
                Action::Hibernate => self.hibernate(&api, &pod).await,
                Action::Wake => self.wake(&api, &pod).await,
            };
            if let Err(e) = result {
                tracing::warn!(%ns, %name, ?action, error = %e, "vk-sim: retrying");
                tokio::time::sleep(RETRY).await;
            }
        }
    }

    async fn current_plan(&self, api: &Api<Pod>, name: &str) -> Option<Action> {
        loop {
            match api.get_opt(name).await {
                Ok(pod) => return pod.and_then(|p| plan(&p, &self.knobs)),
                Err(e) => {
                    tracing::warn!(%name, error = %e, "vk-sim: get pod");
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }

    async fn hibernate(&self, api: &Api<Pod>, pod: &Pod) -> Result<(), SimError> {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let view = PodView::of(pod);
        let vm = view.vm_name.as_deref().unwrap_or_default();
        if !(view.lifecycle_hibernated_for_round() && view.vm_id.is_none()) {
            // vk-cocoon says it is at work first, in a patch of its own.
            let mut resource_version = pod.metadata.resource_version.clone();
            if self.knobs.hibernating_first()
                && view.lifecycle_state.as_deref() != Some(STATE_HIBERNATING)
            {
                let patch = json!({
                    "metadata": {
                        "resourceVersion": resource_version,
                        "annotations": { LIFECYCLE_STATE: STATE_HIBERNATING }
                    }
                });
                let written = api
                    .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                resource_version = written.metadata.resource_version;
            }
            if self.knobs.fail_push() {
                return Err(format!("injected push failure for {vm}").into());
            }
            push_snapshot(&self.registry, vm, name).await?;
            self.knobs.pushes.fetch_add(1, Ordering::Relaxed);
            // One patch, as vk does. resourceVersion makes it a compare-and-swap, so the
            // generation written is the one read; a conflict is retried by `work`.
            let patch = json!({
                "metadata": {
                    "resourceVersion": resource_version,
                    "annotations": {
                        VM_ID: Value::Null,
                        LIFECYCLE_STATE: STATE_HIBERNATED,
                        LIFECYCLE_OBSERVED_GENERATION: view.cocoonset_generation.to_string(),
                    }
                }
            });
            api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await?;
            self.knobs.hibernations.fetch_add(1, Ordering::Relaxed);
        }
        let status = stopped_status(pod);
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        tracing::info!(%name, %vm, "vk-sim: hibernated");
        Ok(())
    }

    async fn wake(&self, api: &Api<Pod>, pod: &Pod) -> Result<(), SimError> {
        let name = pod.metadata.name.as_deref().unwrap_or_default();
        let view = PodView::of(pod);
        let vm = view.vm_name.as_deref().unwrap_or_default();
        let vm_id = match view.vm_id {
            // A hibernate withdrawn before the VM was removed: the VM still runs.
            Some(id) if view.lifecycle_state.as_deref() == Some(STATE_HIBERNATING) => {
                let patch = json!({
                    "metadata": {
                        "resourceVersion": pod.metadata.resource_version,
                        "annotations": { LIFECYCLE_STATE: STATE_READY }
                    }
                });
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                tracing::info!(%name, %id, "vk-sim: hibernate withdrawn, VM kept");
                id
            }
            // A VM not reported yet (a new pod, or a wake whose status write failed).
            Some(id) => id,
            None => {
                // The manifest the VM is restored from, if this wake is to drop it after.
                let annotation = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(WAKE_DROPS_TAG_ANNOTATION))
                    .map(String::as_str);
                let restored_from = if self.knobs.drops_tag(vm, annotation) {
                    snapshot_digest(&self.registry, vm).await?
                } else {
                    None
                };
                let vm_id = new_vm_id();
                let patch = json!({
                    "metadata": {
                        "resourceVersion": pod.metadata.resource_version,
                        "annotations": { VM_ID: vm_id, LIFECYCLE_STATE: STATE_READY }
                    }
                });
                api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
                    .await?;
                self.knobs.wakes.fetch_add(1, Ordering::Relaxed);
                tracing::info!(%name, %vm_id, "vk-sim: woke with a new VMID");
                // Only once the restored VM is recorded: a failed drop is not retried
                // (the tag leaks, which the product's own delete then pays).
                if let Some(digest) = restored_from {
                    match delete_manifest(&self.registry, vm, &digest).await {
                        Ok(true) => {
                            self.knobs.tag_drops.fetch_add(1, Ordering::Relaxed);
                            tracing::info!(%name, %vm, %digest, "vk-sim: dropped the tag");
                        }
                        Ok(false) => {}
                        Err(e) => tracing::warn!(%name, %vm, error = %e, "vk-sim: drop tag"),
                    }
                }
                vm_id
            }
        };
        let status = running_status(pod, &vm_id);
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        tracing::info!(%name, %vm_id, "vk-sim: container Running");
        Ok(())
    }
}
