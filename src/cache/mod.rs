//! The one informer cache (P1): CocoonHibernations and Pods, shared by the controller and
//! the webhook. One driver task polls both watch streams, keeps the stores, the podRef
//! index and the pod change tracker in step, and turns relevant events into reconcile
//! triggers. Consuming the raw streams (not shared-store subscribers) is what lets a pod's
//! Delete still reach the CRs that target it (C3).

pub mod consistent;
pub mod index;
pub mod list_mode;
pub mod pod_wire;
pub mod progress;
pub mod versions;

use crate::api::CocoonHibernation;
use crate::api::annotations::PodView;
use crate::api::pod::PodSlice;
use futures::{Stream, StreamExt};
use index::{Key, PodChangeTracker, PodRefIndex};
use kube::runtime::reflector::{self, ObjectRef, Store, store::Writer};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, ResourceExt};
use list_mode::{ListChoice, ListMode, POD_LIST_PAGE};
use parking_lot::{RwLock, RwLockWriteGuard};
use progress::{Informer, InformerState, ListTimer, Progress, Verdict};
use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::mpsc::UnboundedSender;
use versions::{Pick, Seen, Versions};

/// Reconcile requests produced by cache events.
pub type Trigger = ObjectRef<CocoonHibernation>;

#[derive(Clone)]
pub struct SharedCache {
    crs: Store<CocoonHibernation>,
    pods: Store<PodSlice>,
    index: Arc<RwLock<PodRefIndex>>,
    /// Written only by the driver; read for the pods naming a VM (S2, G1).
    pod_views: Arc<RwLock<PodChangeTracker>>,
    crs_synced: Arc<AtomicBool>,
    pods_synced: Arc<AtomicBool>,
    /// S8: between `Init` and `InitDone` of a (re)list.
    crs_relisting: Arc<AtomicBool>,
    pods_relisting: Arc<AtomicBool>,
    progress: Progress,
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

    /// P1, S8: resolves once both stores hold their first full list (kube's own
    /// readiness, set at the list's `InitDone`); false if a store's writer is gone.
    pub async fn wait_until_ready(&self) -> bool {
        self.crs.wait_until_ready().await.is_ok() && self.pods.wait_until_ready().await.is_ok()
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
        progress::judge(
            &self.informer_states(),
            tokio::time::Instant::now(),
            stall_limit,
        )
    }

    pub fn pod(&self, namespace: &str, name: &str) -> Option<Arc<PodSlice>> {
        self.pods.get(&ObjectRef::new(name).within(namespace))
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
    fn cr_names_for_pod(&self, namespace: &str, pod: &str) -> Vec<String> {
        self.index.read().crs_for_pod(namespace, pod)
    }

    /// Live CRs, in any namespace, whose pod names `vm`: the CRs that want that VM,
    /// whether or not they act on it yet (S2, G1).
    pub fn crs_on_pods_naming(&self, vm: &str) -> Vec<Arc<CocoonHibernation>> {
        let pods = self.pod_views.read().pods_naming(vm);
        pods.iter()
            .flat_map(|(ns, pod)| self.crs_for_pod(ns, pod))
            .collect()
    }

    /// When the pod last changed in a way a pass reads (vk's lifecycle writes, a running
    /// container): the start of the controller's reaction time.
    pub fn pod_changed_at(&self, namespace: &str, name: &str) -> Option<std::time::Instant> {
        let key = (namespace.to_owned(), name.to_owned());
        self.pod_views.read().changed_at(&key)
    }

    /// CRs in any namespace whose status.vmName is `vm` (S2, G1).
    pub fn crs_holding_vm(&self, vm: &str) -> Vec<Arc<CocoonHibernation>> {
        let keys = self.index.read().crs_holding_vm(vm);
        keys.iter().filter_map(|(ns, n)| self.cr(ns, n)).collect()
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
}

/// Builds the cache and the future that drives it. The future runs until both watch
/// streams end, which they do not in normal operation.
pub fn start(
    client: Client,
    scope: &CacheScope,
    triggers: UnboundedSender<Trigger>,
) -> (
    SharedCache,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    start_tracked(client, scope, triggers, Progress::new(), None)
}

/// [`start`] recording progress into `progress` (which the watch client's
/// [`progress::ProgressLayer`] should share), with each watch asked to end after
/// `watch_timeout` seconds (kube's 290 s when `None`).
pub fn start_tracked(
    client: Client,
    scope: &CacheScope,
    triggers: UnboundedSender<Trigger>,
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
        let cr_events = watcher(cr_api, cr_cfg)
            .default_backoff()
            .modify(|cr: &mut CocoonHibernation| cr.managed_fields_mut().clear());
        let pod_events = watcher(pod_api, pod_cfg)
            .default_backoff()
            .modify(strip_pod);
        drive(shared, writers, cr_events, pod_events, triggers).await;
    };
    (cache, driver)
}

/// Keep only what a pass or the webhook reads: name, namespace, uid, resourceVersion and
/// the contract's annotations ([`PodSlice`] already dropped the spec and all but whether a
/// container runs), and the labels schedules select on (K1); other annotations (such as last-applied-configuration), owner references and
/// managed fields go.
pub fn strip_pod(pod: &mut PodSlice) {
    let meta = &mut pod.metadata;
    meta.managed_fields = None;
    meta.owner_references = None;
    meta.finalizers = None;
    meta.generate_name = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        // An empty map, not None: a patch creating the map must know one exists.
        annotations.retain(|k, _| crate::api::annotations::CONTRACT.contains(&k.as_str()));
    }
}

/// The stores' writers, which only the driver holds.
struct Writers {
    crs: Writer<CocoonHibernation>,
    pods: Writer<PodSlice>,
}

impl SharedCache {
    /// An empty, unsynced cache and the writers of its stores.
    fn empty(progress: Progress) -> (Self, Writers) {
        let (crs, cr_writer) = reflector::store::<CocoonHibernation>();
        let (pods, pod_writer) = reflector::store::<PodSlice>();
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
        };
        let writers = Writers {
            crs: cr_writer,
            pods: pod_writer,
        };
        (cache, writers)
    }
}

async fn drive(
    cache: SharedCache,
    writers: Writers,
    cr_events: impl Stream<Item = Result<watcher::Event<CocoonHibernation>, watcher::Error>> + Send,
    pod_events: impl Stream<Item = Result<watcher::Event<PodSlice>, watcher::Error>> + Send,
    triggers: UnboundedSender<Trigger>,
) {
    let mut handler = EventHandler::new(cache.clone(), writers, triggers);
    let cr_events = cr_events.map(Either::Cr);
    let pod_events = pod_events.map(Either::Pod);
    let merged = futures::stream::select(cr_events, pod_events);
    futures::pin_mut!(merged);
    while let Some(item) = merged.next().await {
        // S8: every event is progress (errors are not: the watcher retries them).
        let now = tokio::time::Instant::now();
        match &item {
            Either::Cr(Ok(_)) => cache.progress.record(Informer::CocoonHibernations, now),
            Either::Pod(Ok(_)) => cache.progress.record(Informer::Pods, now),
            _ => {}
        }
        match item {
            Either::Cr(Ok(ev)) => handler.on_cr(ev),
            Either::Pod(Ok(ev)) => handler.on_pod(ev),
            // The watcher retries with backoff; the store keeps serving its last state.
            Either::Cr(Err(e)) => tracing::warn!(error = %e, "CocoonHibernation watch error"),
            Either::Pod(Err(e)) => tracing::warn!(error = %e, "Pod watch error"),
        }
    }
}

enum Either<A, B> {
    Cr(A),
    Pod(B),
}

struct EventHandler {
    cache: SharedCache,
    writers: Writers,
    /// The newest resourceVersion taken of each CR and pod: which ones a relist changed,
    /// and which copies are older than the cache's (S4).
    cr_versions: Versions,
    pod_versions: Versions,
    relist: Relist,
    lists: ListTimer,
    triggers: UnboundedSender<Trigger>,
}

/// Work held back while a relist is in progress. kube's store swaps in the relisted objects
/// only at `InitDone`; a pass triggered earlier would read the old object and could then
/// wait forever for an unrelated event (S4). A relist cut short and started again keeps
/// what it held: the versions and the pod views already moved on, so the retried list
/// shows those objects unchanged.
#[derive(Default)]
struct Relist {
    crs: Option<HashSet<Key>>,
    pods: Option<HashSet<Key>>,
}

impl EventHandler {
    fn new(cache: SharedCache, writers: Writers, triggers: UnboundedSender<Trigger>) -> Self {
        EventHandler {
            cache,
            writers,
            cr_versions: Versions::default(),
            pod_versions: Versions::default(),
            relist: Relist::default(),
            lists: ListTimer::default(),
            triggers,
        }
    }

    fn index(&self) -> RwLockWriteGuard<'_, PodRefIndex> {
        self.cache.index.write()
    }

    fn pods(&self) -> RwLockWriteGuard<'_, PodChangeTracker> {
        self.cache.pod_views.write()
    }

    fn trigger(&self, namespace: &str, name: &str) {
        // A closed channel means the process is shutting down.
        let _ = self.triggers.send(ObjectRef::new(name).within(namespace));
    }

    fn on_cr(&mut self, ev: watcher::Event<CocoonHibernation>) {
        match ev {
            watcher::Event::Init => {
                self.writers.crs.apply_watcher_event(&ev);
                self.lists.begin(Informer::CocoonHibernations);
                self.cache.crs_relisting.store(true, Ordering::Release);
                self.index().begin_resync();
                self.relist.crs.get_or_insert_with(HashSet::new);
            }
            watcher::Event::InitApply(ref cr) | watcher::Event::Apply(ref cr) => {
                self.lists.object(Informer::CocoonHibernations);
                let key = (cr.namespace().unwrap_or_default(), cr.name_any());
                let version = cr.resource_version().unwrap_or_default();
                let seen = self.cr_versions.observe(&key, &version);
                if seen == Seen::Older {
                    self.index().touch(&key.0, &key.1);
                    self.keep_newer_cr(ev, &key, &version);
                    return;
                }
                self.writers.crs.apply_watcher_event(&ev);
                let released =
                    self.index()
                        .upsert(&key.0, &key.1, &cr.spec.pod_ref.name, cr.vm_name());
                let changed = seen != Seen::Unchanged;
                if let Some(vm) = released {
                    self.enqueue_waiting_on_vm(&vm);
                }
                match &mut self.relist.crs {
                    Some(pending) => {
                        if changed {
                            pending.insert(key);
                        }
                    }
                    None => self.trigger(&key.0, &key.1),
                }
            }
            watcher::Event::Delete(ref cr) => {
                let key = (cr.namespace().unwrap_or_default(), cr.name_any());
                let version = cr.resource_version().unwrap_or_default();
                if !self.cr_versions.delete(&key, &version) {
                    tracing::warn!(cr = ?key, version, "ignored a delete older than the CR the cache holds");
                    return;
                }
                self.writers.crs.apply_watcher_event(&ev);
                let removed = self.index().remove(&key.0, &key.1);
                if let Some((pod, vm)) = removed {
                    self.on_cr_gone(&key.0, &pod, vm.as_deref());
                }
            }
            watcher::Event::InitDone => {
                // The store swaps in the list first, so every pass triggered below reads it.
                self.writers.crs.apply_watcher_event(&ev);
                self.lists.end(Informer::CocoonHibernations);
                let gone = self.index().finish_resync();
                self.cache.crs_synced.store(true, Ordering::Release);
                self.cache.crs_relisting.store(false, Ordering::Release);
                for ((ns, name), pod, vm) in gone {
                    self.cr_versions.forget(&(ns.clone(), name));
                    self.on_cr_gone(&ns, &pod, vm.as_deref());
                }
                for (ns, name) in self.relist.crs.take().unwrap_or_default() {
                    self.trigger(&ns, &name);
                }
            }
        }
    }

    /// S4: `ev` carries an older copy of a CR than the cache took. A watch event is dropped
    /// (the store keeps its copy); a list gets the newer of its copy and the store's.
    fn keep_newer_cr(&mut self, ev: watcher::Event<CocoonHibernation>, key: &Key, version: &str) {
        tracing::warn!(cr = ?key, version, "an older copy of the CR than the cache holds; kept the newer");
        let watcher::Event::InitApply(cr) = ev else {
            return;
        };
        let held = self.cache.cr(&key.0, &key.1);
        let held_version = held.as_ref().and_then(|c| c.resource_version());
        let listed = match (
            self.cr_versions
                .pick_for_list(key, version, held_version.as_deref()),
            held,
        ) {
            (Pick::Store, Some(held)) => (*held).clone(),
            _ => cr,
        };
        self.writers
            .crs
            .apply_watcher_event(&watcher::Event::InitApply(listed));
    }

    /// S4: as [`Self::keep_newer_cr`], for a pod.
    fn keep_newer_pod(&mut self, ev: watcher::Event<PodSlice>, key: &Key, version: &str) {
        tracing::warn!(pod = ?key, version, "an older copy of the pod than the cache holds; kept the newer");
        let watcher::Event::InitApply(pod) = ev else {
            return;
        };
        let held = self.cache.pod(&key.0, &key.1);
        let held_version = held.as_ref().and_then(|p| p.resource_version());
        let listed = match (
            self.pod_versions
                .pick_for_list(key, version, held_version.as_deref()),
            held,
        ) {
            (Pick::Store, Some(held)) => (*held).clone(),
            _ => pod,
        };
        self.writers
            .pods
            .apply_watcher_event(&watcher::Event::InitApply(listed));
    }

    /// S2: a CR that is gone may have been the one others on its pod or VM deferred to.
    fn on_cr_gone(&self, namespace: &str, pod: &str, vm: Option<&str>) {
        self.enqueue_for_pod(&(namespace.to_owned(), pod.to_owned()));
        if let Some(vm) = vm {
            self.enqueue_waiting_on_vm(vm);
        }
    }

    /// CRs of every pod naming `vm`: the ones a holder of `vm` may have kept waiting.
    fn enqueue_waiting_on_vm(&self, vm: &str) {
        let pods = self.pods().pods_naming(vm);
        for key in pods {
            self.enqueue_for_pod(&key);
        }
    }

    fn on_pod(&mut self, ev: watcher::Event<PodSlice>) {
        match ev {
            watcher::Event::Init => {
                self.writers.pods.apply_watcher_event(&ev);
                self.lists.begin(Informer::Pods);
                self.cache.pods_relisting.store(true, Ordering::Release);
                self.pods().begin_resync();
                self.relist.pods.get_or_insert_with(HashSet::new);
            }
            watcher::Event::InitApply(ref pod) | watcher::Event::Apply(ref pod) => {
                self.lists.object(Informer::Pods);
                let key = pod_key(pod);
                let version = pod.resource_version().unwrap_or_default();
                let seen = self.pod_versions.observe(&key, &version);
                if seen == Seen::Older {
                    self.pods().touch(&key);
                    self.keep_newer_pod(ev, &key, &version);
                    return;
                }
                self.writers.pods.apply_watcher_event(&ev);
                let viewed = self.pods().observe(key.clone(), PodView::from_pod(pod));
                // A store that only now catches up is a change though the view is not.
                if viewed || seen == Seen::CaughtUp {
                    match &mut self.relist.pods {
                        Some(pending) => {
                            pending.insert(key);
                        }
                        None => self.enqueue_for_pod(&key),
                    }
                }
            }
            watcher::Event::Delete(ref pod) => {
                let key = pod_key(pod);
                let version = pod.resource_version().unwrap_or_default();
                if !self.pod_versions.delete(&key, &version) {
                    tracing::warn!(pod = ?key, version, "ignored a delete older than the pod the cache holds");
                    return;
                }
                self.writers.pods.apply_watcher_event(&ev);
                let known = self.pods().forget(&key);
                if known {
                    self.enqueue_for_pod(&key);
                }
            }
            watcher::Event::InitDone => {
                self.writers.pods.apply_watcher_event(&ev);
                self.lists.end(Informer::Pods);
                let mut changed = self.relist.pods.take().unwrap_or_default();
                let gone = self.pods().finish_resync();
                for key in &gone {
                    self.pod_versions.forget(key);
                }
                changed.extend(gone);
                self.cache.pods_synced.store(true, Ordering::Release);
                self.cache.pods_relisting.store(false, Ordering::Release);
                for key in changed {
                    self.enqueue_for_pod(&key);
                }
            }
        }
    }

    fn enqueue_for_pod(&self, key: &Key) {
        let names = self.cache.cr_names_for_pod(&key.0, &key.1);
        for name in names {
            self.trigger(&key.0, &name);
        }
    }
}

fn pod_key(pod: &PodSlice) -> Key {
    (pod.namespace().unwrap_or_default(), pod.name_any())
}

#[cfg(test)]
impl SharedCache {
    /// A synced cache holding exactly these objects, for tests of the layers above it.
    pub fn from_objects(
        crs: Vec<CocoonHibernation>,
        pods: Vec<k8s_openapi::api::core::v1::Pod>,
    ) -> Self {
        let (cr_store, mut cr_writer) = reflector::store::<CocoonHibernation>();
        let (pod_store, mut pod_writer) = reflector::store::<PodSlice>();
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
        };
        // The list a watch would deliver, so the stores are ready as after a first sync.
        cr_writer.apply_watcher_event(&watcher::Event::Init);
        for cr in crs {
            cache.index.write().upsert(
                &cr.namespace().unwrap_or_default(),
                &cr.name_any(),
                &cr.spec.pod_ref.name,
                cr.vm_name(),
            );
            cr_writer.apply_watcher_event(&watcher::Event::InitApply(cr));
        }
        cr_writer.apply_watcher_event(&watcher::Event::InitDone);
        pod_writer.apply_watcher_event(&watcher::Event::Init);
        for pod in pods.iter().map(PodSlice::from) {
            cache
                .pod_views
                .write()
                .observe(pod_key(&pod), PodView::from_pod(&pod));
            pod_writer.apply_watcher_event(&watcher::Event::InitApply(pod));
        }
        pod_writer.apply_watcher_event(&watcher::Event::InitDone);
        cache
    }
}

#[cfg(test)]
mod tests;
