//! What every pass shares (client, cache, registry, recorder, metrics, settings, locks,
//! slots and the per-CR memories), and how it is built.

use super::locks::VmLocks;
use super::own_writes::OwnWrite;
use super::plan::{self, Settings};
use crate::api::CocoonHibernation;
use crate::cache::SharedCache;
use crate::metrics::Metrics;
use crate::registry::SnapshotStore;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

pub struct Context {
    pub client: Client,
    pub cache: SharedCache,
    pub registry: Arc<dyn SnapshotStore>,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub settings: Settings,
    pub locks: VmLocks,
    /// Consecutive failures per CR, for error backoff.
    pub failures: Mutex<HashMap<ObjectRef<CocoonHibernation>, u32>>,
    /// S1: tag deletes run only while this replica's lease is fresh.
    pub fence: crate::leader::Fence,
    /// C2: registry calls hold fewer slots than there are workers, so a slow registry
    /// never holds every worker; a pass waits for one briefly, then requeues.
    pub registry_slots: Arc<Semaphore>,
    /// Event writes sent after their pass ended, still in flight.
    pub event_slots: Arc<Semaphore>,
    /// S5: consecutive refusals-for-good of each CR's tag delete, for the slow backoff.
    /// Kept apart from `failures`, which a pass that returns Ok clears.
    pub refusals: Mutex<HashMap<ObjectRef<CocoonHibernation>, u32>>,
    /// What this process last wrote to each CR, as the apiserver answered, and the
    /// resourceVersions that write left behind. A pass that finds the cache at one of them
    /// plans from the answer instead: it never acts on a view older than its own write,
    /// and never waits for the watch to bring that write back.
    pub superseded: Mutex<HashMap<ObjectRef<CocoonHibernation>, OwnWrite>>,
    /// The same for pods (namespace, name): a pass that finds the pod cache still at the
    /// version our annotation patch replaced would send that patch again.
    pub superseded_pods: Mutex<HashMap<(String, String), String>>,
}

/// Event writes that may be in flight after their passes ended.
pub const EVENTS_IN_FLIGHT: usize = 64;

/// C2: how long a pass waits, holding its worker, for a registry slot (slots are served
/// in order); then it gives the worker up and looks again (`Deferral::RegistryBusy`).
const REGISTRY_SLOT_WAIT: Duration = Duration::from_millis(250);

/// Builds the controller context: client, cache, registry, event recorder, metrics.
pub fn context(
    client: Client,
    cache: SharedCache,
    registry: impl SnapshotStore + 'static,
    metrics: Metrics,
    settings: plan::Settings,
    reporter_instance: Option<String>,
    fence: crate::leader::Fence,
) -> Arc<Context> {
    let reporter = Reporter {
        controller: "cocoon-hibernation".into(),
        instance: reporter_instance,
    };
    let settings_slots = settings.registry_slots.max(1);
    Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        cache,
        registry: Arc::new(registry),
        metrics,
        settings,
        locks: VmLocks::default(),
        failures: Default::default(),
        fence,
        registry_slots: Arc::new(Semaphore::new(settings_slots)),
        event_slots: Arc::new(Semaphore::new(EVENTS_IN_FLIGHT)),
        refusals: Default::default(),
        superseded: Default::default(),
        superseded_pods: Default::default(),
    })
}

impl Context {
    /// A registry slot, if one frees up within `REGISTRY_SLOT_WAIT` (C2): a stalled
    /// registry holds no worker beyond the slots' own for longer than that.
    pub(super) async fn registry_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        let slot = self.registry_slots.clone().acquire_owned();
        tokio::time::timeout(REGISTRY_SLOT_WAIT, slot)
            .await
            .ok()?
            .ok()
    }
}
