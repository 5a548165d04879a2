//! Bookkeeping kept in step with the informer streams, so a pod event finds its CRs
//! without scanning every CR (C3), and pod churn that a pass does not read is ignored.

use crate::api::annotations::PodView;
use std::collections::{BTreeSet, HashMap, HashSet};

/// (namespace, name)
pub type Key = (String, String);

/// CRs by the pod they target: (namespace, spec.podRef.name) -> CR names.
#[derive(Debug, Default)]
pub struct PodRefIndex {
    by_pod: HashMap<Key, BTreeSet<String>>,
    by_cr: HashMap<Key, String>,
    resync_seen: Option<HashSet<Key>>,
}

impl PodRefIndex {
    pub fn upsert(&mut self, namespace: &str, cr: &str, pod: &str) {
        let cr_key = (namespace.to_owned(), cr.to_owned());
        if let Some(seen) = &mut self.resync_seen {
            seen.insert(cr_key.clone());
        }
        match self.by_cr.get(&cr_key) {
            Some(old) if old == pod => return,
            Some(_) => self.unlink(&cr_key),
            None => {}
        }
        self.by_cr.insert(cr_key, pod.to_owned());
        self.by_pod
            .entry((namespace.to_owned(), pod.to_owned()))
            .or_default()
            .insert(cr.to_owned());
    }

    pub fn remove(&mut self, namespace: &str, cr: &str) {
        self.unlink(&(namespace.to_owned(), cr.to_owned()));
    }

    fn unlink(&mut self, cr_key: &Key) {
        if let Some(pod) = self.by_cr.remove(cr_key) {
            let pod_key = (cr_key.0.clone(), pod);
            if let Some(set) = self.by_pod.get_mut(&pod_key) {
                set.remove(&cr_key.1);
                if set.is_empty() {
                    self.by_pod.remove(&pod_key);
                }
            }
        }
    }

    /// Names of the CRs in `namespace` whose podRef is `pod`.
    pub fn crs_for_pod(&self, namespace: &str, pod: &str) -> Vec<String> {
        self.by_pod
            .get(&(namespace.to_owned(), pod.to_owned()))
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// A relist started: entries not seen again before [`Self::finish_resync`] are gone.
    pub fn begin_resync(&mut self) {
        self.resync_seen = Some(HashSet::new());
    }

    pub fn finish_resync(&mut self) {
        if let Some(seen) = self.resync_seen.take() {
            let gone: Vec<Key> = self
                .by_cr
                .keys()
                .filter(|k| !seen.contains(*k))
                .cloned()
                .collect();
            for k in gone {
                self.unlink(&k);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.by_cr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_cr.is_empty()
    }
}

/// The last [`PodView`] of each pod, to tell relevant changes from churn (C3).
#[derive(Debug, Default)]
pub struct PodChangeTracker {
    views: HashMap<Key, PodView>,
    resync_seen: Option<HashSet<Key>>,
}

impl PodChangeTracker {
    /// True when the pod is new or something a pass reads has changed.
    pub fn observe(&mut self, key: Key, view: PodView) -> bool {
        if let Some(seen) = &mut self.resync_seen {
            seen.insert(key.clone());
        }
        match self.views.get(&key) {
            Some(old) if *old == view => false,
            _ => {
                self.views.insert(key, view);
                true
            }
        }
    }

    /// True when the pod was known.
    pub fn forget(&mut self, key: &Key) -> bool {
        self.views.remove(key).is_some()
    }

    pub fn begin_resync(&mut self) {
        self.resync_seen = Some(HashSet::new());
    }

    /// Pods that vanished during the relist: their deletes were never seen.
    pub fn finish_resync(&mut self) -> Vec<Key> {
        let Some(seen) = self.resync_seen.take() else {
            return Vec::new();
        };
        let gone: Vec<Key> = self
            .views
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for k in &gone {
            self.views.remove(k);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, n: &str) -> Key {
        (ns.to_owned(), n.to_owned())
    }

    /// SPEC C3.
    #[test]
    fn c3_index_maps_pod_to_its_crs_per_namespace() {
        let mut idx = PodRefIndex::default();
        idx.upsert("a", "cr1", "pod");
        idx.upsert("a", "cr2", "pod");
        idx.upsert("b", "cr3", "pod");
        assert_eq!(idx.crs_for_pod("a", "pod"), vec!["cr1", "cr2"]);
        assert_eq!(idx.crs_for_pod("b", "pod"), vec!["cr3"]);
        idx.remove("a", "cr1");
        assert_eq!(idx.crs_for_pod("a", "pod"), vec!["cr2"]);
        idx.upsert("a", "cr2", "other");
        assert!(idx.crs_for_pod("a", "pod").is_empty());
        assert_eq!(idx.crs_for_pod("a", "other"), vec!["cr2"]);
        assert_eq!(idx.len(), 2);
    }

    /// SPEC C3.
    #[test]
    fn c3_index_relist_drops_crs_deleted_while_disconnected() {
        let mut idx = PodRefIndex::default();
        idx.upsert("a", "kept", "p1");
        idx.upsert("a", "gone", "p2");
        idx.begin_resync();
        idx.upsert("a", "kept", "p1");
        assert_eq!(
            idx.crs_for_pod("a", "p2"),
            vec!["gone"],
            "live until the relist ends"
        );
        idx.finish_resync();
        assert!(idx.crs_for_pod("a", "p2").is_empty());
        assert_eq!(idx.crs_for_pod("a", "p1"), vec!["kept"]);
    }

    /// SPEC C3.
    #[test]
    fn c3_tracker_reports_only_relevant_changes() {
        let mut t = PodChangeTracker::default();
        let v = PodView {
            vm_name: Some("vm".into()),
            ..Default::default()
        };
        assert!(t.observe(key("a", "p"), v.clone()), "create enqueues");
        assert!(
            !t.observe(key("a", "p"), v.clone()),
            "unrelated churn does not"
        );
        let running = PodView {
            container_running: true,
            ..v
        };
        assert!(t.observe(key("a", "p"), running));
        assert!(t.forget(&key("a", "p")), "delete enqueues");
        assert!(!t.forget(&key("a", "p")));
    }

    /// SPEC C3.
    #[test]
    fn c3_tracker_relist_reports_pods_deleted_while_disconnected() {
        let mut t = PodChangeTracker::default();
        t.observe(key("a", "p1"), PodView::default());
        t.observe(key("a", "p2"), PodView::default());
        t.begin_resync();
        t.observe(key("a", "p1"), PodView::default());
        assert_eq!(t.finish_resync(), vec![key("a", "p2")]);
        assert!(t.finish_resync().is_empty());
    }
}
