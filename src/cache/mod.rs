//! The one informer cache (P1): CocoonHibernations and Pods, shared by the controller and
//! the webhook. One driver task polls both watch streams, keeps the stores, the podRef
//! index and the pod change tracker in step, and tells its listeners what changed
//! ([`change`]); each controller's trigger policy decides what that wakes. Consuming the raw streams (not shared-store subscribers) is what lets a pod's
//! Delete still reach the CRs that target it (C3). The driver also writes the stores
//! itself, so that no copy older than the one held replaces it (S4, `src/cache/versions.rs`).

pub mod arrivals;
pub mod change;
pub mod consistent;
mod driver;
pub mod index;
pub mod list_mode;
pub mod liveness;
pub mod pod_store;
pub mod pod_wire;
pub mod versions;

use crate::api::CocoonHibernation;
use crate::api::pod::PodSlice;
use change::{Listener, Listeners};
use driver::{Writers, drive};
use index::{PodChangeTracker, PodRefIndex};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use list_mode::{ListChoice, ListMode, POD_LIST_PAGE};
use liveness::{Informer, InformerState, Progress, Verdict};
use parking_lot::RwLock;
use pod_store::PodStore;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

#[derive(Clone)]
pub struct SharedCache {
    crs: Store<CocoonHibernation>,
    pods: PodStore,
    index: Arc<RwLock<PodRefIndex>>,
    /// Written only by the driver; read for the pods naming a VM (S2, G1).
    pod_views: Arc<RwLock<PodChangeTracker>>,
    crs_synced: Arc<AtomicBool>,
    pods_synced: Arc<AtomicBool>,
    /// S8: between `Init` and `InitDone` of a (re)list.
    crs_relisting: Arc<AtomicBool>,
    pods_relisting: Arc<AtomicBool>,
    progress: Progress,
    /// The controllers' trigger policies, told of every change (`change.rs`).
    listeners: Listeners,
}

/// What to watch.
#[derive(Clone, Debug, Default)]
pub struct CacheScope {
    /// Empty watches every namespace.
    pub namespace: String,
    pub pod_selector: String,
    pub list: ListChoice,
}

impl SharedCache {
    /// Readiness (P1, V3): both stores have delivered their initial list.
    pub fn is_synced(&self) -> bool {
        self.crs_synced.load(Ordering::Acquire) && self.pods_synced.load(Ordering::Acquire)
    }

    /// P1, S8: resolves once both stores hold their first full list (set at the list's
    /// `InitDone`: kube's own readiness for CRs, the same rule in `pod_store`); false if a
    /// store's writer is gone.
    pub async fn wait_until_ready(&self) -> bool {
        self.crs.wait_until_ready().await.is_ok() && self.pods.wait_until_ready().await
    }

    /// S8: each informer's progress and list state, as of now.
    pub fn informer_states(&self) -> [InformerState; 2] {
        Informer::ALL.map(|informer| {
            let (synced, relisting) = match informer {
                Informer::CocoonHibernations => (&self.crs_synced, &self.crs_relisting),
                Informer::Pods => (&self.pods_synced, &self.pods_relisting),
            };
            InformerState {
                informer,
                last_progress: self.progress.last(informer),
                synced: synced.load(Ordering::Acquire),
                relisting: relisting.load(Ordering::Acquire),
            }
        })
    }

    /// S8: the verdict on this cache now, for /healthz and the elector.
    pub fn verdict(&self, stall_limit: std::time::Duration) -> Verdict {
        liveness::judge(
            &self.informer_states(),
            tokio::time::Instant::now(),
            stall_limit,
        )
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<PodSlice>> {
        self.pods.get(namespace, name)
    }

    pub fn cr(&self, namespace: &str, name: &str) -> Option<Arc<CocoonHibernation>> {
        self.crs.get(&ObjectRef::new(name).within(namespace))
    }

    /// CRs in `namespace` whose podRef names `pod`, found through the index.
    pub fn crs_for_pod(&self, namespace: &str, pod: &str) -> Vec<Arc<CocoonHibernation>> {
        self.cr_names_for_pod(namespace, pod)
            .iter()
            .filter_map(|n| self.cr(namespace, n))
            .collect()
    }

    /// Names from the podRef index alone.
    pub fn cr_names_for_pod(&self, namespace: &str, pod: &str) -> Vec<String> {
        self.index.read().crs_for_pod(namespace, pod)
    }

    /// Pods (namespace, name) that name `vm`, as the cache has them (G1).
    pub fn pods_naming(&self, vm: &str) -> Vec<(String, String)> {
        let keys = self.pod_views.read().pods_naming(vm);
        keys.iter()
            .map(|k| (k.namespace().to_owned(), k.name().to_owned()))
            .collect()
    }

    /// Live CRs, in any namespace, whose pod names `vm`: the CRs that want that VM,
    /// whether or not they act on it yet (S2, G1).
    pub fn crs_on_pods_naming(&self, vm: &str) -> Vec<Arc<CocoonHibernation>> {
        let pods = self.pod_views.read().pods_naming(vm);
        pods.iter()
            .flat_map(|k| self.crs_for_pod(k.namespace(), k.name()))
            .collect()
    }

    /// When the pod last changed in a way a pass reads (vk's lifecycle writes, a running
    /// container): the start of the controller's reaction time.
    pub fn pod_changed_at(&self, namespace: &str, name: &str) -> Option<std::time::Instant> {
        self.pod_views
            .read()
            .changed_at(index::joined(namespace, name).as_str())
    }

    /// CRs in any namespace whose status.vmName is `vm` (S2, G1).
    pub fn crs_holding_vm(&self, vm: &str) -> Vec<Arc<CocoonHibernation>> {
        let keys = self.index.read().crs_holding_vm(vm);
        keys.iter()
            .filter_map(|k| self.cr(k.namespace(), k.name()))
            .collect()
    }

    pub fn all_crs(&self) -> Vec<Arc<CocoonHibernation>> {
        self.crs.state()
    }

    /// Pods of `namespace` (labels kept for the schedules' selectors, K1).
    pub fn pods_in(&self, namespace: &str) -> Vec<Arc<PodSlice>> {
        self.pods
            .state()
            .into_iter()
            .filter(|p| p.metadata.namespace.as_deref() == Some(namespace))
            .collect()
    }

    pub fn cr_store(&self) -> Store<CocoonHibernation> {
        self.crs.clone()
    }

    /// Tells `listener` of every change from now on, until the driver ends; a
    /// controller subscribes through `runtime::trigger`, with its own trigger policy.
    pub fn listen(&self, listener: Listener) {
        self.listeners.add(listener);
    }

    fn emit(&self, change: &change::Change) {
        self.listeners.emit(change, self);
    }
}

/// Builds the cache and the future that drives it. The future runs until both watch
/// streams end, which they do not in normal operation.
pub fn start(
    client: Client,
    scope: &CacheScope,
) -> (
    SharedCache,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    start_tracked(client, scope, Progress::new(), None)
}

/// [`start`] recording progress into `progress` (which the watch client's
/// [`liveness::ProgressLayer`] should share), with each watch asked to end after
/// `watch_timeout` seconds (kube's 290 s when `None`).
pub fn start_tracked(
    client: Client,
    scope: &CacheScope,
    progress: Progress,
    watch_timeout: Option<u32>,
) -> (
    SharedCache,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (cache, writers) = SharedCache::empty(progress);
    let (cr_api, pod_api): (Api<CocoonHibernation>, Api<PodSlice>) = if scope.namespace.is_empty() {
        (Api::all(client.clone()), Api::all(client))
    } else {
        (
            Api::namespaced(client.clone(), &scope.namespace),
            Api::namespaced(client, &scope.namespace),
        )
    };
    let (list, pod_selector) = (scope.list, scope.pod_selector.clone());

    let shared = cache.clone();
    let driver = async move {
        let mut cfg = match list.resolve(&pod_api).await {
            ListMode::Stream => watcher::Config::default().streaming_lists(),
            ListMode::Pages => watcher::Config::default(),
        };
        if let Some(secs) = watch_timeout {
            cfg = cfg.timeout(secs);
        }
        let cr_cfg = cfg.clone();
        // Pages apply only to paged lists (kube ignores them when streaming).
        let mut pod_cfg = cfg.page_size(POD_LIST_PAGE);
        if !pod_selector.is_empty() {
            pod_cfg = pod_cfg.labels(&pod_selector);
        }
        // The driver writes the stores itself (no `.reflect`): S4, no going back in time.
        let cr_events = watcher(cr_api, cr_cfg).default_backoff().modify(strip_cr);
        // Pods arrive slim already: `PodSlice` decodes only what is kept.
        let pod_events = watcher(pod_api, pod_cfg).default_backoff();
        drive(shared, writers, cr_events, pod_events).await;
    };
    (cache, driver)
}

/// A CR as the cache keeps it: without `managedFields` and kubectl's copy of what was last
/// applied, never read. Set to `None`, not cleared: a cleared Vec keeps its buffer, a few
/// hundred bytes per CR (issue 38).
pub fn strip_cr(cr: &mut CocoonHibernation) {
    cr.metadata.managed_fields = None;
    if let Some(annotations) = &mut cr.metadata.annotations {
        // The map stays, even empty: a patch adding an annotation must not replace it.
        annotations.remove(LAST_APPLIED);
    }
}

/// What `kubectl apply` keeps on the object: the whole manifest again.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

impl SharedCache {
    /// An empty, unsynced cache and the writers of its stores.
    fn empty(progress: Progress) -> (Self, Writers) {
        let (crs, cr_writer) = reflector::store::<CocoonHibernation>();
        let (pods, pod_writer) = pod_store::store();
        let cache = SharedCache {
            crs,
            pods,
            index: Arc::default(),
            pod_views: Arc::default(),
            crs_synced: Arc::default(),
            pods_synced: Arc::default(),
            crs_relisting: Arc::default(),
            pods_relisting: Arc::default(),
            progress,
            listeners: Listeners::default(),
        };
        let writers = Writers {
            crs: cr_writer,
            pods: pod_writer,
        };
        (cache, writers)
    }
}

#[cfg(test)]
impl SharedCache {
    /// A synced cache holding exactly these objects, for tests of the layers above it.
    pub fn from_objects(
        crs: Vec<CocoonHibernation>,
        pods: Vec<k8s_openapi::api::core::v1::Pod>,
    ) -> Self {
        let (cr_store, mut cr_writer) = reflector::store::<CocoonHibernation>();
        let (pod_store, mut pod_writer) = pod_store::store();
        let cache = SharedCache {
            crs: cr_store,
            pods: pod_store,
            index: Arc::default(),
            pod_views: Arc::default(),
            crs_synced: Arc::new(AtomicBool::new(true)),
            pods_synced: Arc::new(AtomicBool::new(true)),
            crs_relisting: Arc::default(),
            pods_relisting: Arc::default(),
            progress: Progress::new(),
            listeners: Listeners::default(),
        };
        // The list a watch would deliver, so the stores are ready as after a first sync.
        cr_writer.apply_watcher_event(&watcher::Event::Init);
        for cr in crs {
            let key = index::Key::of(&cr);
            cache
                .index
                .write()
                .upsert(&key, &cr.spec.pod_ref.name, cr.vm_name());
            cr_writer.apply_watcher_event(&watcher::Event::InitApply(cr));
        }
        cr_writer.apply_watcher_event(&watcher::Event::InitDone);
        pod_writer.apply_watcher_event(&watcher::Event::Init);
        for pod in pods.iter().map(PodSlice::from) {
            cache.pod_views.write().observe(
                index::Key::of(&pod),
                crate::api::annotations::PodView::from_pod(&pod),
            );
            pod_writer.apply_watcher_event(&watcher::Event::InitApply(pod));
        }
        pod_writer.apply_watcher_event(&watcher::Event::InitDone);
        cache
    }
}

#[cfg(test)]
mod tests;
