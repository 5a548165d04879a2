//! The cache's driver task: polls both watch streams, applies each event to the stores
//! itself (S4: a copy older than the one held never replaces it, `src/cache/versions.rs`),
//! keeps the podRef index and the pod change tracker in step, and tells the listeners of
//! each change (`change.rs`), holding CR and pod changes while a relist is in progress
//! (S4). Which controller object a change wakes is each controller's trigger policy.

use super::SharedCache;
use super::change::{Change, ClearOnDrop};
use super::index::{Key, PodChangeTracker, PodRefIndex};
use super::liveness::{Informer, ListTimer};
use super::pod_store::PodWriter;
use super::versions::{Pick, Seen, Versions};
use crate::api::CocoonHibernation;
use crate::api::annotations::PodView;
use crate::api::pod::PodSlice;
use futures::{Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use parking_lot::RwLockWriteGuard;
use std::collections::HashSet;
use std::sync::atomic::Ordering;

/// The stores' writers, which only the driver holds.
pub(super) struct Writers {
    pub(super) crs: Writer<CocoonHibernation>,
    pub(super) pods: PodWriter,
}
pub(super) async fn drive(
    cache: SharedCache,
    writers: Writers,
    cr_events: impl Stream<Item = Result<watcher::Event<CocoonHibernation>, watcher::Error>> + Send,
    pod_events: impl Stream<Item = Result<watcher::Event<PodSlice>, watcher::Error>> + Send,
) {
    // The listeners' channels close when the driver ends: their controllers see it.
    let _clear = ClearOnDrop(cache.listeners.clone());
    let mut handler = EventHandler::new(cache.clone(), writers);
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

pub(super) struct EventHandler {
    pub(super) cache: SharedCache,
    writers: Writers,
    /// The newest resourceVersion taken of each CR and pod: which ones a relist changed,
    /// and which copies are older than the cache's (S4).
    cr_versions: Versions,
    pod_versions: Versions,
    relist: Relist,
    lists: ListTimer,
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
    pub(super) fn new(cache: SharedCache, writers: Writers) -> Self {
        EventHandler {
            cache,
            writers,
            cr_versions: Versions::default(),
            pod_versions: Versions::default(),
            relist: Relist::default(),
            lists: ListTimer::default(),
        }
    }

    fn index(&self) -> RwLockWriteGuard<'_, PodRefIndex> {
        self.cache.index.write()
    }

    fn pods(&self) -> RwLockWriteGuard<'_, PodChangeTracker> {
        self.cache.pod_views.write()
    }

    fn emit(&self, change: Change) {
        self.cache.emit(&change);
    }

    pub(super) fn on_cr(&mut self, ev: watcher::Event<CocoonHibernation>) {
        self.apply_cr(ev);
    }

    /// K9: an arrival is judged against the store before the event is applied and
    /// told once it is, so a schedule woken by it finds the pod in the store.
    pub(super) fn on_pod(&mut self, ev: watcher::Event<PodSlice>) {
        let arrival = super::arrivals::of_event(&self.cache.pods, &ev);
        self.apply_pod(ev);
        if let Some(arrival) = arrival {
            self.emit(Change::Arrival(arrival));
        }
    }

    fn apply_cr(&mut self, ev: watcher::Event<CocoonHibernation>) {
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
                let key = Key::of(cr);
                let version = cr.resource_version().unwrap_or_default();
                let seen = self.cr_versions.observe(&key, &version);
                if seen == Seen::Older {
                    self.index().touch(&key);
                    self.keep_newer_cr(ev, &key, &version);
                    return;
                }
                self.writers.crs.apply_watcher_event(&ev);
                let released = self
                    .index()
                    .upsert(&key, &cr.spec.pod_ref.name, cr.vm_name());
                let changed = seen != Seen::Unchanged;
                if let Some(vm) = released {
                    self.emit(Change::VmReleased(vm));
                }
                match &mut self.relist.crs {
                    Some(pending) => {
                        if changed {
                            pending.insert(key);
                        }
                    }
                    None => self.emit(Change::Cr(key)),
                }
            }
            watcher::Event::Delete(ref cr) => {
                let key = Key::of(cr);
                let version = cr.resource_version().unwrap_or_default();
                if !self.cr_versions.delete(&key, &version) {
                    tracing::warn!(cr = ?key, version, "ignored a delete older than the CR the cache holds");
                    return;
                }
                self.writers.crs.apply_watcher_event(&ev);
                let removed = self.index().remove(&key);
                if let Some((pod, vm)) = removed {
                    self.on_cr_gone(key.namespace(), &pod, vm.as_deref());
                }
            }
            watcher::Event::InitDone => {
                // The store swaps in the list first, so every pass triggered below reads it.
                self.writers.crs.apply_watcher_event(&ev);
                self.lists.end(Informer::CocoonHibernations);
                let gone = self.index().finish_resync();
                self.cache.crs_synced.store(true, Ordering::Release);
                self.cache.crs_relisting.store(false, Ordering::Release);
                for (key, pod, vm) in gone {
                    self.cr_versions.forget(&key);
                    self.on_cr_gone(key.namespace(), &pod, vm.as_deref());
                }
                for key in self.relist.crs.take().unwrap_or_default() {
                    self.emit(Change::Cr(key));
                }
            }
        }
    }

    /// S4: `ev` carries an older copy of a CR than the cache took. A watch event is dropped
    /// (the store keeps its copy); a list gets the newer of its copy and the store's.
    fn keep_newer_cr(&mut self, ev: watcher::Event<CocoonHibernation>, key: &Key, version: &str) {
        tracing::warn!(cr = ?key, version, "an older copy of the CR than the cache holds; kept the newer");
        if let watcher::Event::InitApply(cr) = ev {
            let held = self.cache.cr(key.namespace(), key.name());
            let listed = newer_copy(&mut self.cr_versions, key, version, cr, held);
            self.writers
                .crs
                .apply_watcher_event(&watcher::Event::InitApply(listed));
        }
    }

    /// S4: as [`Self::keep_newer_cr`], for a pod.
    fn keep_newer_pod(&mut self, ev: watcher::Event<PodSlice>, key: &Key, version: &str) {
        tracing::warn!(pod = ?key, version, "an older copy of the pod than the cache holds; kept the newer");
        if let watcher::Event::InitApply(pod) = ev {
            let held = self.cache.pod(key.namespace(), key.name());
            let listed = newer_copy(&mut self.pod_versions, key, version, pod, held);
            self.writers
                .pods
                .apply_keyed(&watcher::Event::InitApply(listed), key.clone());
        }
    }

    /// S2: a CR that is gone may have been the one others on its pod or VM deferred to.
    fn on_cr_gone(&self, namespace: &str, pod: &str, vm: Option<&str>) {
        self.emit(Change::CrGone {
            namespace: namespace.to_owned(),
            pod: pod.to_owned(),
            vm: vm.map(str::to_owned),
        });
    }

    fn apply_pod(&mut self, ev: watcher::Event<PodSlice>) {
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
                let key = Key::of(pod);
                let version = pod.resource_version().unwrap_or_default();
                let seen = self.pod_versions.observe(&key, &version);
                if seen == Seen::Older {
                    self.pods().touch(&key);
                    self.keep_newer_pod(ev, &key, &version);
                    return;
                }
                self.writers.pods.apply_keyed(&ev, key.clone());
                let viewed = self.pods().observe(key.clone(), PodView::from_pod(pod));
                // A store that only now catches up is a change though the view is not.
                if viewed || seen == Seen::CaughtUp {
                    match &mut self.relist.pods {
                        Some(pending) => {
                            pending.insert(key);
                        }
                        None => self.emit(Change::Pod(key)),
                    }
                }
            }
            watcher::Event::Delete(ref pod) => {
                let key = Key::of(pod);
                let version = pod.resource_version().unwrap_or_default();
                if !self.pod_versions.delete(&key, &version) {
                    tracing::warn!(pod = ?key, version, "ignored a delete older than the pod the cache holds");
                    return;
                }
                self.writers.pods.apply_keyed(&ev, key.clone());
                let known = self.pods().forget(&key);
                if known {
                    self.emit(Change::Pod(key));
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
                    self.emit(Change::Pod(key));
                }
            }
        }
    }
}

/// S4: of a listed copy older than the version taken and the store's copy `held`, the one a
/// list leaves in the store.
fn newer_copy<K: kube::Resource + Clone>(
    versions: &mut Versions,
    key: &Key,
    version: &str,
    listed: K,
    held: Option<std::sync::Arc<K>>,
) -> K {
    let held_version = held.as_ref().and_then(|h| h.resource_version());
    match (
        versions.pick_for_list(key, version, held_version.as_deref()),
        held,
    ) {
        (Pick::Store, Some(held)) => (*held).clone(),
        _ => listed,
    }
}
