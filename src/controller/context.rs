//! What every pass shares (client, cache, registry, recorder, metrics, settings, limits
//! and the per-CR memories), and how it is built.

use super::own_writes::{OwnWrite, Remembered};
use super::plan::{self, Settings};
use crate::api::CocoonHibernation;
use crate::cache::SharedCache;
use crate::metrics::Metrics;
use crate::registry::SnapshotStore;
use crate::runtime::events::{Recorder, Reporter};
use crate::runtime::limits::Limits;
use kube::Client;
use kube::runtime::reflector::ObjectRef;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;

pub struct Context {
    pub client: Client,
    pub cache: SharedCache,
    pub registry: Arc<dyn SnapshotStore>,
    pub recorder: Recorder,
    pub metrics: Metrics,
    pub settings: Settings,
    /// Where a pass waits: its VM (C2), a registry slot (C2), an event slot.
    pub limits: Limits,
    /// Consecutive failures per CR, for error backoff.
    pub failures: Mutex<HashMap<ObjectRef<CocoonHibernation>, u32>>,
    /// S1: tag deletes run only while this replica's lease is fresh.
    pub fence: crate::leader::Fence,
    /// S5: consecutive refusals-for-good of each CR's tag delete, for the slow backoff.
    /// Kept apart from `failures`, which a pass that returns Ok clears.
    pub refusals: Mutex<HashMap<ObjectRef<CocoonHibernation>, u32>>,
    /// What this process last wrote to each CR, as the apiserver answered, and the
    /// resourceVersions that write left behind. A pass that finds the cache at one of them
    /// plans from the answer instead: it never acts on a view older than its own write,
    /// and never waits for the watch to bring that write back.
    pub superseded: Mutex<Remembered<ObjectRef<CocoonHibernation>, OwnWrite>>,
    /// The same for pods (namespace, name): a pass that finds the pod cache still at the
    /// version our annotation patch replaced would send that patch again.
    pub superseded_pods: Mutex<Remembered<(String, String), String>>,
}

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
    let registry_slots = settings.registry_slots;
    Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        cache,
        registry: Arc::new(registry),
        metrics,
        settings,
        limits: Limits::new(registry_slots),
        failures: Default::default(),
        fence,
        refusals: Default::default(),
        superseded: Default::default(),
        superseded_pods: Default::default(),
    })
}
