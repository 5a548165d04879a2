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
//! A hostile vk, as the real one may be: [`SimKnobs::set_removal_delay`] removes the VM
//! only some time after the push and ignores an annotation removed meanwhile (it finishes
//! the hibernate, then restores); [`SimKnobs::set_restore_replacements`] restores a newly
//! created pod from an existing tag. [`SimKnobs::restores_without_snapshot`] counts the
//! VMs lost because their tag was gone when vk restored them.
//!
//! With [`SimKnobs::set_serve`], each awake VM serves HTTP and a TCP echo on a loopback
//! address reported as the pod's IP, and refuses while hibernated (`serve.rs`).
//!
//! Each request carried out is timed per VM ([`SimKnobs::timings`]): the bench takes the
//! simulator's own time out of a round's wall. Also used by
//! `examples/vk_cocoon_simulator.rs` (`make demo`).

mod knobs;
mod pods;
mod registry;
mod serve;
mod timing;

pub use knobs::SimKnobs;
pub use pods::{create_replacement_pod, create_vm_pod, create_vm_pod_on, stage_stale_lifecycle};
use pods::{new_vm_id, running_status, stopped_status};
pub use registry::{delete_manifest, push_snapshot, snapshot_digest};
pub use timing::{Span, Timings};

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
        servers: Arc::new(serve::Servers::default()),
    };
    let task = tokio::spawn(sim.run(api));
    SimHandle {
        task,
        client,
        registry,
        knobs,
    }
}

/// What the simulator does for a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
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
        let replacement = knobs.restore_replacements() && state.is_none() && vm_gone;
        (removed || unreported || withdrawn || replacement).then_some(Action::Wake)
    }
}

type PodKey = (String, String);

fn key_of(pod: &Pod) -> Option<PodKey> {
    Some((pod.metadata.namespace.clone()?, pod.metadata.name.clone()?))
}

#[derive(Clone)]
struct Sim {
    client: kube::Client,
    registry: String,
    knobs: Arc<SimKnobs>,
    /// Pods with a worker running; events for them are left to that worker, which
    /// re-reads the pod before every write.
    in_flight: Arc<Mutex<HashSet<PodKey>>>,
    /// The awake VMs' servers (with [`SimKnobs::set_serve`]).
    servers: Arc<serve::Servers>,
}

impl Sim {
    async fn run(self, api: Api<Pod>) {
        let (store, writer) = reflector::store();
        let events = reflector(writer, watcher(api, watcher::Config::default()))
            .default_backoff()
            .touched_objects();
        let mut events = std::pin::pin!(events);
        // Workers live in this set, so aborting this task aborts them too.
        let mut workers = JoinSet::new();
        // A deadline rather than an interval: the period is a knob read at each re-check.
        let resync = tokio::time::sleep(self.knobs.resync());
        let mut resync = std::pin::pin!(resync);
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(Ok(pod)) => self.consider(&pod, &mut workers),
                    Some(Err(e)) => tracing::warn!(error = %e, "vk-sim: pod watch error"),
                    None => return,
                },
                () = &mut resync => {
                    let pods = store.state();
                    for pod in &pods {
                        self.consider(pod, &mut workers);
                    }
                    let known: HashSet<PodKey> = pods.iter().filter_map(|p| key_of(p)).collect();
                    self.servers.retain(|k| known.contains(k));
                    let next = tokio::time::Instant::now() + self.knobs.resync();
                    resync.as_mut().reset(next);
                }
                Some(_) = workers.join_next(), if !workers.is_empty() => {}
            }
        }
    }

    fn consider(&self, pod: &Pod, workers: &mut JoinSet<()>) {
        self.serve(pod, workers);
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
        let (sim, seen) = (self.clone(), Instant::now());
        workers.spawn(async move {
            sim.work(&key.0, &key.1, seen).await;
            sim.in_flight.lock().unwrap().remove(&key);
        });
    }

    /// With serving on: a VM that is gone or asked to hibernate stops serving; an awake
    /// one (e.g. created awake by a test) serves, and its address is reported.
    fn serve(&self, pod: &Pod, workers: &mut JoinSet<()>) {
        let (Some(ports), Some(key)) = (self.knobs.serve_ports(), key_of(pod)) else {
            return;
        };
        let view = PodView::of(pod);
        if view.hibernate_requested || view.vm_id.is_none() {
            self.servers.stop(&key);
            return;
        }
        let awake = view.container_running && view.lifecycle_state.as_deref() == Some(STATE_READY);
        let Some(vm_id) = view.vm_id.filter(|_| awake) else {
            return;
        };
        let ip = match self
            .servers
            .ensure(&key, &vm_id, ports, self.knobs.serve_net())
        {
            Ok(ip) => ip.to_string(),
            Err(e) => {
                tracing::warn!(ns = %key.0, pod = %key.1, error = %e, "vk-sim: serve");
                return;
            }
        };
        let reported = pod.status.as_ref().and_then(|s| s.pod_ip.as_deref());
        if reported == Some(ip.as_str()) {
            return;
        }
        let api: Api<Pod> = Api::namespaced(self.client.clone(), &key.0);
        workers.spawn(async move {
            let patch = json!({ "status": { "podIP": ip, "podIPs": [{ "ip": ip }] } });
            if let Err(e) = api
                .patch_status(&key.1, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                tracing::warn!(pod = %key.1, error = %e, "vk-sim: report the pod IP");
            }
        });
    }

    /// Drives one pod until there is nothing left to do. Never panics: a deleted pod ends
    /// the work, a failure or a conflict is retried. `seen`: when the event that started
    /// it arrived; each request carried out is recorded in [`SimKnobs::timings`].
    async fn work(&self, ns: &str, name: &str, seen: Instant) {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), ns);
        let mut first_seen = Some(seen);
        // The request in hand and when it was seen: a retry keeps the first sighting.
        let mut pending: Option<(Action, Instant)> = None;
        loop {
            let checked = Instant::now();
            let Some(action) = self.current_plan(&api, name).await else {
                return;
            };
            let since = match pending {
                Some((a, t)) if a == action => t,
                _ => first_seen.take().unwrap_or(checked),
            };
            pending = Some((action, since));
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
            match result {
                Ok(()) => {
                    let vm = PodView::of(&pod).vm_name.unwrap_or_default();
                    let done = Instant::now();
                    let span = Span {
                        action,
                        seen: since,
                        done,
                    };
                    self.knobs.timings().record(&vm, span);
                    pending = None;
                }
                Err(e) => {
                    tracing::warn!(%ns, %name, ?action, error = %e, "vk-sim: retrying");
                    tokio::time::sleep(RETRY).await;
                }
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
            let delay = self.knobs.removal_delay();
            if !delay.is_zero() {
                // A slow vk removes the VM later, whatever the pod asks by then.
                tokio::time::sleep(delay).await;
                return self.remove_vm_late(api, name, vm).await;
            }
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

    /// The end of a slow hibernate ([`SimKnobs::set_removal_delay`]): the VM is removed
    /// on the pod as it is now, even if the hibernate annotation is gone by then.
    async fn remove_vm_late(&self, api: &Api<Pod>, name: &str, vm: &str) -> Result<(), SimError> {
        let pod = api.get(name).await?;
        let view = PodView::of(&pod);
        let patch = json!({
            "metadata": {
                "resourceVersion": pod.metadata.resource_version,
                "annotations": {
                    VM_ID: Value::Null,
                    LIFECYCLE_STATE: STATE_HIBERNATED,
                    LIFECYCLE_OBSERVED_GENERATION: view.cocoonset_generation.to_string(),
                }
            }
        });
        let removed = api
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.knobs.hibernations.fetch_add(1, Ordering::Relaxed);
        self.knobs.late_removals.fetch_add(1, Ordering::Relaxed);
        if !view.hibernate_requested {
            self.knobs
                .withdrawn_removals
                .fetch_add(1, Ordering::Relaxed);
        }
        api.patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(&stopped_status(&removed)),
        )
        .await?;
        tracing::info!(%name, %vm, requested = view.hibernate_requested, "vk-sim: removed the VM late");
        Ok(())
    }

    /// Whether `<vm>:hibernate` exists, for the counters of restores; an unreachable
    /// registry counts as unknown.
    async fn tag_present(&self, vm: &str) -> Option<bool> {
        match snapshot_digest(&self.registry, vm).await {
            Ok(digest) => Some(digest.is_some()),
            Err(e) => {
                tracing::warn!(%vm, error = %e, "vk-sim: probe the tag before a restore");
                None
            }
        }
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
                let replacement = view.lifecycle_state.is_none();
                match self.tag_present(vm).await {
                    Some(true) if replacement => {
                        self.knobs
                            .replacement_restores
                            .fetch_add(1, Ordering::Relaxed);
                        tracing::info!(%name, %vm, "vk-sim: replacement pod restored from the tag");
                    }
                    Some(false) if !replacement => {
                        self.knobs
                            .restores_without_snapshot
                            .fetch_add(1, Ordering::Relaxed);
                        if let Ok(mut lost) = self.knobs.lost.lock() {
                            let ns = pod.metadata.namespace.as_deref().unwrap_or_default();
                            lost.push(format!("{ns}/{name} {vm}"));
                        }
                        tracing::error!(%name, %vm, "vk-sim: no snapshot to restore from: the VM is lost");
                    }
                    _ => {}
                }
                // The manifest the VM is restored from, if this wake is to drop it after.
                let annotation = pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(WAKE_DROPS_TAG_ANNOTATION))
                    .map(String::as_str);
                // A replacement's restore leaves the tag to the product (G1, the audit).
                let restored_from = if !replacement && self.knobs.drops_tag(vm, annotation) {
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
        let mut status = running_status(pod, &vm_id);
        // The woken VM serves before it is reported Running, on a fresh address.
        if let (Some(ports), Some(key)) = (self.knobs.serve_ports(), key_of(pod)) {
            let ip = self
                .servers
                .ensure(&key, &vm_id, ports, self.knobs.serve_net())?;
            status["status"]["podIP"] = json!(ip.to_string());
            status["status"]["podIPs"] = json!([{ "ip": ip.to_string() }]);
        }
        api.patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await?;
        tracing::info!(%name, %vm_id, "vk-sim: container Running");
        Ok(())
    }
}
