//! The pod store (issue 38, memory). kube-runtime's `Store` keys each object by an
//! `ObjectRef` holding its own copy of the name, namespace, resourceVersion and uid: four
//! strings per pod beside the ones the pod holds. This store keys pods by the shared
//! [`Key`] and otherwise applies the watcher's events as kube's `Writer` does: a list goes
//! to a buffer swapped in whole at its end, so a reader never sees half a list, and the
//! store is ready from its first complete list on.

use super::index::{Key, joined};
use crate::api::pod::PodSlice;
use kube::runtime::watcher;
use parking_lot::RwLock;
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::watch;

type Pods = HashMap<Key, Arc<PodSlice>>;

/// The readers' side: cheap to clone.
#[derive(Clone)]
pub struct PodStore {
    pods: Arc<RwLock<Pods>>,
    ready: watch::Receiver<bool>,
}

/// The one writer, the cache's driver.
pub struct PodWriter {
    pods: Arc<RwLock<Pods>>,
    buffer: Pods,
    ready: watch::Sender<bool>,
}

/// An empty store, not ready, and its writer.
pub fn store() -> (PodStore, PodWriter) {
    let pods = Arc::<RwLock<Pods>>::default();
    let (tx, rx) = watch::channel(false);
    let reader = PodStore {
        pods: pods.clone(),
        ready: rx,
    };
    let writer = PodWriter {
        pods,
        buffer: Pods::new(),
        ready: tx,
    };
    (reader, writer)
}

impl PodStore {
    pub fn get(&self, namespace: &str, name: &str) -> Option<Arc<PodSlice>> {
        self.pods
            .read()
            .get(joined(namespace, name).as_str())
            .cloned()
    }

    pub fn state(&self) -> Vec<Arc<PodSlice>> {
        self.pods.read().values().cloned().collect()
    }

    /// Resolves once the first list is in; false if the writer is gone before that.
    pub async fn wait_until_ready(&self) -> bool {
        self.ready.clone().wait_for(|ready| *ready).await.is_ok()
    }
}

impl PodWriter {
    pub fn apply_watcher_event(&mut self, event: &watcher::Event<PodSlice>) {
        self.apply(event, Key::of);
    }

    /// As [`Self::apply_watcher_event`], for a pod event whose key the caller already
    /// holds (the driver keys each event once, for its indexes too).
    pub fn apply_keyed(&mut self, event: &watcher::Event<PodSlice>, key: Key) {
        self.apply(event, |_| key);
    }

    fn apply(&mut self, event: &watcher::Event<PodSlice>, key: impl FnOnce(&PodSlice) -> Key) {
        match event {
            watcher::Event::Apply(pod) => {
                self.pods.write().insert(key(pod), Arc::new(pod.clone()));
            }
            watcher::Event::Delete(pod) => {
                self.pods.write().remove(&key(pod));
            }
            watcher::Event::Init => self.buffer = Pods::new(),
            watcher::Event::InitApply(pod) => {
                self.buffer.insert(key(pod), Arc::new(pod.clone()));
            }
            watcher::Event::InitDone => {
                // The old map is dropped, not cleared: cleared, it would keep its capacity.
                let listed = std::mem::take(&mut self.buffer);
                *self.pods.write() = listed;
                self.ready.send_replace(true);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn pod(name: &str, rv: &str) -> PodSlice {
        PodSlice::new(
            ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                ..ObjectMeta::default()
            },
            false,
        )
    }

    fn version(store: &PodStore, name: &str) -> Option<String> {
        store
            .get("ns", name)
            .and_then(|p| p.metadata.resource_version.clone())
    }

    /// S4, P1: a list is seen whole or not at all, replaces what was there (a pod gone
    /// meanwhile is dropped), and makes the store ready; watch events apply at once.
    #[tokio::test]
    async fn s4_a_list_is_swapped_in_whole_and_events_apply_at_once() {
        let (store, mut writer) = store();
        writer.apply_watcher_event(&watcher::Event::Apply(pod("old", "1")));
        writer.apply_watcher_event(&watcher::Event::Init);
        writer.apply_watcher_event(&watcher::Event::InitApply(pod("a", "2")));
        assert_eq!(version(&store, "a"), None, "half a list is not seen");
        assert_eq!(version(&store, "old"), Some("1".into()));
        assert!(!*store.ready.borrow());
        writer.apply_watcher_event(&watcher::Event::InitDone);
        assert!(store.wait_until_ready().await);
        assert_eq!(version(&store, "a"), Some("2".into()));
        assert_eq!(version(&store, "old"), None, "not listed: gone");
        writer.apply_watcher_event(&watcher::Event::Apply(pod("a", "3")));
        assert_eq!(version(&store, "a"), Some("3".into()));
        writer.apply_watcher_event(&watcher::Event::Delete(pod("a", "3")));
        assert_eq!(version(&store, "a"), None);
        assert!(store.state().is_empty());
    }

    /// P1: a reader waiting for the first list learns that the writer is gone.
    #[tokio::test]
    async fn p1_readiness_fails_when_the_writer_is_gone() {
        let (store, writer) = store();
        drop(writer);
        assert!(!store.wait_until_ready().await);
    }
}
