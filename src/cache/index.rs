//! Bookkeeping kept in step with the informer streams, so a pod event finds its CRs
//! without scanning every CR (C3), and pod churn that a pass does not read is ignored.

use crate::api::annotations::PodView;
use crate::api::intern::intern;
use std::borrow::Borrow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// A namespaced object's `namespace/name`, one shared copy per object (issue 38, memory):
/// the versions table, the podRef index and the pod tracker each held their own two
/// strings per object. Look one up by [`joined`], which allocates no shared copy.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Key(Arc<str>);

impl Key {
    pub fn new(namespace: &str, name: &str) -> Self {
        Key(intern(&joined(namespace, name)))
    }

    /// The key an object of either store (a CR, a pod) is kept under.
    pub fn of(object: &impl kube::ResourceExt) -> Self {
        Self::new(&object.namespace().unwrap_or_default(), &object.name_any())
    }

    pub fn namespace(&self) -> &str {
        self.parts().0
    }

    pub fn name(&self) -> &str {
        self.parts().1
    }

    pub fn parts(&self) -> (&str, &str) {
        // Neither a namespace nor a name may hold a `/`.
        self.0.split_once('/').unwrap_or(("", &self.0))
    }
}

impl Borrow<str> for Key {
    fn borrow(&self) -> &str {
        &self.0
    }
}

/// The text of [`Key::new`], to look a key up by.
pub fn joined(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A small sorted set (issue 38, memory). Most pods have one CR and most VMs one pod,
/// and a `BTreeSet`'s first node holds 11 slots whatever it holds: about 0.5 KiB for one
/// [`Key`]. This holds what it holds. A sorted `Vec` rather than `smallvec`: the one
/// allocation it would save is not worth a dependency.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Few<T>(Vec<T>);

impl<T> Default for Few<T> {
    fn default() -> Self {
        Few(Vec::new())
    }
}

impl<T: Ord> Few<T> {
    fn insert(&mut self, item: T) {
        if let Err(at) = self.0.binary_search(&item) {
            if self.0.len() < 4 {
                // Vec's first growth would take room for 4.
                self.0.reserve_exact(1);
            }
            self.0.insert(at, item);
        }
    }

    fn remove<Q: Ord + ?Sized>(&mut self, item: &Q)
    where
        T: Borrow<Q>,
    {
        if let Ok(at) = self.0.binary_search_by(|x| x.borrow().cmp(item)) {
            self.0.remove(at);
        }
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn iter(&self) -> std::slice::Iter<'_, T> {
        self.0.iter()
    }
}

/// What the index remembers of one CR.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Entry {
    pod: Key,
    /// `status.vmName`: VM names are cluster-wide (S2), so this side has no namespace.
    vm: Option<Arc<str>>,
}

impl Entry {
    fn into_names(self) -> (String, Option<String>) {
        (self.pod.name().to_owned(), self.vm.map(|v| v.to_string()))
    }
}

/// CRs by the pod they target, (namespace, spec.podRef.name) -> CR names, and by the VM
/// they hold, status.vmName -> (namespace, name) in any namespace (S2, G1).
#[derive(Debug, Default)]
pub struct PodRefIndex {
    by_pod: HashMap<Key, Few<Key>>,
    by_vm: HashMap<Arc<str>, Few<Key>>,
    by_cr: HashMap<Key, Entry>,
    resync_seen: Option<HashSet<Key>>,
}

impl PodRefIndex {
    /// Records a CR; returns the VM it held before when that changed, so the CRs waiting
    /// on that VM can be told (S2).
    pub fn upsert(&mut self, cr_key: &Key, pod: &str, vm: Option<&str>) -> Option<String> {
        if let Some(seen) = &mut self.resync_seen {
            seen.insert(cr_key.clone());
        }
        let entry = Entry {
            pod: Key::new(cr_key.namespace(), pod),
            vm: vm.map(intern),
        };
        let released = match self.by_cr.get(cr_key) {
            Some(old) if *old == entry => return None,
            Some(old) => {
                let released = old
                    .vm
                    .as_deref()
                    .filter(|v| Some(*v) != vm)
                    .map(str::to_owned);
                self.unlink(cr_key);
                released
            }
            None => None,
        };
        self.by_pod
            .entry(entry.pod.clone())
            .or_default()
            .insert(cr_key.clone());
        if let Some(vm) = &entry.vm {
            self.by_vm
                .entry(vm.clone())
                .or_default()
                .insert(cr_key.clone());
        }
        self.by_cr.insert(cr_key.clone(), entry);
        released
    }

    /// Forgets a CR; returns the pod it targeted and the VM it held.
    pub fn remove(&mut self, cr_key: &Key) -> Option<(String, Option<String>)> {
        self.unlink(cr_key).map(Entry::into_names)
    }

    fn unlink(&mut self, cr_key: &Key) -> Option<Entry> {
        let entry = self.by_cr.remove(cr_key)?;
        if let Some(set) = self.by_pod.get_mut(&entry.pod) {
            set.remove(cr_key);
            if set.is_empty() {
                self.by_pod.remove(&entry.pod);
            }
        }
        if let Some(vm) = &entry.vm
            && let Some(set) = self.by_vm.get_mut(vm)
        {
            set.remove(cr_key);
            if set.is_empty() {
                self.by_vm.remove(vm);
            }
        }
        Some(entry)
    }

    /// CRs in any namespace whose status.vmName is `vm`.
    pub fn crs_holding_vm(&self, vm: &str) -> Vec<Key> {
        self.by_vm
            .get(vm)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Names of the CRs in `namespace` whose podRef is `pod`.
    pub fn crs_for_pod(&self, namespace: &str, pod: &str) -> Vec<String> {
        self.by_pod
            .get(joined(namespace, pod).as_str())
            .map(|s| s.iter().map(|k| k.name().to_owned()).collect())
            .unwrap_or_default()
    }

    /// Counts a CR as listed without changing what the index holds for it (S4: the list
    /// showed an older copy than the one indexed).
    pub fn touch(&mut self, cr_key: &Key) {
        if let Some(seen) = &mut self.resync_seen {
            seen.insert(cr_key.clone());
        }
    }

    /// A relist started: entries not seen again before [`Self::finish_resync`] are gone.
    /// A relist started again (the last one was cut short) starts afresh: only the list
    /// that completes says what is gone.
    pub fn begin_resync(&mut self) {
        self.resync_seen = Some(HashSet::new());
    }

    /// Ends a relist; returns the CRs that vanished meanwhile, with their pod and VM.
    pub fn finish_resync(&mut self) -> Vec<(Key, String, Option<String>)> {
        let Some(seen) = self.resync_seen.take() else {
            return Vec::new();
        };
        let gone: Vec<Key> = self
            .by_cr
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        gone.into_iter()
            .filter_map(|k| {
                let (pod, vm) = self.unlink(&k)?.into_names();
                Some((k, pod, vm))
            })
            .collect()
    }

    pub fn len(&self) -> usize {
        self.by_cr.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_cr.is_empty()
    }
}

/// What the tracker keeps of a pod's last [`PodView`] (issue 38, memory): a digest to tell
/// a change by, not the view's four strings. Two views with one digest (a 64-bit collision,
/// about 2^-64 per change) would cost one trigger, until the pod's next change; no rule
/// acts on what the tracker keeps (a pass reads the pod from the store).
#[derive(Debug)]
struct Seen {
    digest: u64,
    /// `vm.cocoonstack.io/name`, shared with `by_vm`'s key.
    vm: Option<Arc<str>>,
    /// When it last changed (for the reaction-time histogram).
    at: std::time::Instant,
}

fn digest(view: &PodView) -> u64 {
    use std::hash::{Hash, Hasher};
    // Fixed keys: the same view digests the same for the life of the process.
    let mut hasher = std::hash::DefaultHasher::new();
    view.hash(&mut hasher);
    hasher.finish()
}

/// The last [`PodView`] of each pod, to tell relevant changes from churn (C3), and the
/// pods naming each VM, to find the CRs waiting on a VM another CR held (S2).
#[derive(Debug, Default)]
pub struct PodChangeTracker {
    /// Each pod's view and when it last changed (for the reaction-time histogram).
    views: HashMap<Key, Seen>,
    by_vm: HashMap<Arc<str>, Few<Key>>,
    resync_seen: Option<HashSet<Key>>,
}

impl PodChangeTracker {
    /// True when the pod is new or something a pass reads has changed.
    pub fn observe(&mut self, key: Key, view: PodView) -> bool {
        if let Some(seen) = &mut self.resync_seen {
            seen.insert(key.clone());
        }
        let digest = digest(&view);
        match self.views.get(&key) {
            Some(old) if old.digest == digest => false,
            _ => {
                self.remove(&key);
                let vm = view.vm_name.as_deref().map(intern);
                if let Some(vm) = &vm {
                    self.by_vm
                        .entry(vm.clone())
                        .or_default()
                        .insert(key.clone());
                }
                let at = std::time::Instant::now();
                self.views.insert(key, Seen { digest, vm, at });
                true
            }
        }
    }

    /// True when the pod was known.
    pub fn forget(&mut self, key: &Key) -> bool {
        self.remove(key)
    }

    fn remove(&mut self, key: &Key) -> bool {
        let Some(old) = self.views.remove(key) else {
            return false;
        };
        if let Some(vm) = old.vm
            && let Some(set) = self.by_vm.get_mut(&vm)
        {
            set.remove(key);
            if set.is_empty() {
                self.by_vm.remove(&vm);
            }
        }
        true
    }

    /// When something a pass reads last changed on this pod, as this process saw it.
    pub fn changed_at(&self, key: &str) -> Option<std::time::Instant> {
        self.views.get(key).map(|seen| seen.at)
    }

    /// Pods whose `vm.cocoonstack.io/name` is `vm`, in any namespace.
    pub fn pods_naming(&self, vm: &str) -> Vec<Key> {
        self.by_vm
            .get(vm)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// Counts a pod as listed without changing its view (S4: the list showed an older
    /// copy than the one tracked).
    pub fn touch(&mut self, key: &Key) {
        if let Some(seen) = &mut self.resync_seen {
            seen.insert(key.clone());
        }
    }

    /// As [`PodRefIndex::begin_resync`]: a relist started again starts afresh.
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
            self.remove(k);
        }
        gone
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(ns: &str, n: &str) -> Key {
        Key::new(ns, n)
    }

    /// Issue 38: one shared copy per object, found by its parts; an empty namespace too.
    #[test]
    fn a_key_is_one_shared_copy_found_by_its_parts() {
        let (a, b) = (key("ns", "web-0"), key("ns", "web-0"));
        assert!(Arc::ptr_eq(&a.0, &b.0));
        assert_eq!(a.parts(), ("ns", "web-0"));
        assert_eq!(key("", "node").parts(), ("", "node"));
        let map = HashMap::from([(a, 1)]);
        assert_eq!(map.get(joined("ns", "web-0").as_str()), Some(&1));
        assert_eq!(map.get(joined("ns", "web-1").as_str()), None);
        assert_eq!(map.get(joined("n", "s/web-0").as_str()), None);
    }

    /// Issue 38, C3: the index's sets stay sorted and free of duplicates, and one item
    /// takes room for one.
    #[test]
    fn c3_few_is_a_sorted_set_sized_to_its_items() {
        let mut few = Few::default();
        few.insert("b".to_owned());
        assert_eq!(few.0.capacity(), 1);
        few.insert("c".to_owned());
        few.insert("a".to_owned());
        few.insert("b".to_owned());
        assert_eq!(few.0, ["a", "b", "c"]);
        few.remove("b");
        few.remove("x");
        assert_eq!(few.iter().collect::<Vec<_>>(), ["a", "c"]);
        few.remove("a");
        few.remove("c");
        assert!(few.is_empty());
    }

    /// SPEC C3.
    #[test]
    fn c3_index_maps_pod_to_its_crs_per_namespace() {
        let mut idx = PodRefIndex::default();
        idx.upsert(&key("a", "cr1"), "pod", None);
        idx.upsert(&key("a", "cr2"), "pod", None);
        idx.upsert(&key("b", "cr3"), "pod", None);
        assert_eq!(idx.crs_for_pod("a", "pod"), vec!["cr1", "cr2"]);
        assert_eq!(idx.crs_for_pod("b", "pod"), vec!["cr3"]);
        idx.remove(&key("a", "cr1"));
        assert_eq!(idx.crs_for_pod("a", "pod"), vec!["cr2"]);
        idx.upsert(&key("a", "cr2"), "other", None);
        assert!(idx.crs_for_pod("a", "pod").is_empty());
        assert_eq!(idx.crs_for_pod("a", "other"), vec!["cr2"]);
        assert_eq!(idx.len(), 2);
    }

    /// SPEC C3.
    #[test]
    fn c3_index_relist_drops_crs_deleted_while_disconnected() {
        let mut idx = PodRefIndex::default();
        idx.upsert(&key("a", "kept"), "p1", None);
        idx.upsert(&key("a", "gone"), "p2", None);
        idx.begin_resync();
        idx.upsert(&key("a", "kept"), "p1", None);
        assert_eq!(
            idx.crs_for_pod("a", "p2"),
            vec!["gone"],
            "live until the relist ends"
        );
        let gone = idx.finish_resync();
        assert_eq!(gone, vec![(key("a", "gone"), "p2".to_owned(), None)]);
        assert!(idx.crs_for_pod("a", "p2").is_empty());
        assert_eq!(idx.crs_for_pod("a", "p1"), vec!["kept"]);
    }

    /// SPEC S2: VM names are cluster-wide; a CR that changes or drops its VM releases it.
    #[test]
    fn s2_index_finds_vm_holders_in_every_namespace() {
        let mut idx = PodRefIndex::default();
        assert_eq!(idx.upsert(&key("a", "cr1"), "p", Some("vm-x")), None);
        assert_eq!(idx.upsert(&key("b", "cr2"), "q", Some("vm-x")), None);
        assert_eq!(
            idx.crs_holding_vm("vm-x"),
            vec![key("a", "cr1"), key("b", "cr2")]
        );
        assert_eq!(
            idx.upsert(&key("a", "cr1"), "p", Some("vm-y")),
            Some("vm-x".to_owned()),
            "moving to another VM releases the old one"
        );
        assert_eq!(idx.crs_holding_vm("vm-x"), vec![key("b", "cr2")]);
        assert_eq!(
            idx.remove(&key("b", "cr2")),
            Some(("q".to_owned(), Some("vm-x".to_owned())))
        );
        assert!(idx.crs_holding_vm("vm-x").is_empty());
    }

    /// SPEC S2.
    #[test]
    fn s2_tracker_finds_pods_naming_a_vm() {
        let mut t = PodChangeTracker::default();
        let naming = |vm: &str| PodView {
            vm_name: Some(vm.into()),
            ..Default::default()
        };
        t.observe(key("a", "p"), naming("vm-x"));
        t.observe(key("b", "q"), naming("vm-x"));
        assert_eq!(t.pods_naming("vm-x"), vec![key("a", "p"), key("b", "q")]);
        t.observe(key("a", "p"), naming("vm-y"));
        assert_eq!(t.pods_naming("vm-x"), vec![key("b", "q")]);
        t.forget(&key("b", "q"));
        assert!(t.pods_naming("vm-x").is_empty());
        assert_eq!(t.pods_naming("vm-y"), vec![key("a", "p")]);
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
