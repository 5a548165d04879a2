//! Our own last writes, remembered until the watch brings them back: a pass never plans
//! from a view older than what this process already wrote.

use super::context::Context;
use crate::api::CocoonHibernation;
use crate::api::pod::PodSlice;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Each time the remembered writes grow by this many since the last sweep, the ones the
/// cache has caught up with are dropped. A pass drops its CR's on its next look, but a CR
/// settled by our last write may not be looked at again: 50k new CRs left 50k answers
/// behind (issue 38, a first start's memory).
const SWEEP_AT: usize = 1024;

/// Writes remembered per object, swept when they have grown by [`SWEEP_AT`] since the
/// last sweep: amortised O(1) a write at any size, even when a sweep keeps most of them.
pub struct Remembered<K, V> {
    map: HashMap<K, V>,
    sweep_at: usize,
}

impl<K, V> Default for Remembered<K, V> {
    fn default() -> Self {
        Self {
            map: HashMap::new(),
            sweep_at: SWEEP_AT,
        }
    }
}

impl<K, V> std::ops::Deref for Remembered<K, V> {
    type Target = HashMap<K, V>;
    fn deref(&self) -> &Self::Target {
        &self.map
    }
}

impl<K, V> std::ops::DerefMut for Remembered<K, V> {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.map
    }
}

impl<K: std::hash::Hash + Eq, V> Remembered<K, V> {
    fn insert_then_sweep(&mut self, key: K, value: V, sweep: impl FnOnce(&mut HashMap<K, V>)) {
        self.map.insert(key, value);
        if self.map.len() >= self.sweep_at {
            sweep(&mut self.map);
            self.sweep_at = self.map.len() + SWEEP_AT;
        }
    }
}

/// Drops the writes whose CR the cache (`cache_version`) holds at a version the write did
/// not leave behind, or no longer holds: the same test as [`Context::own_write_view`]'s.
fn sweep(
    map: &mut HashMap<ObjectRef<CocoonHibernation>, OwnWrite>,
    cache_version: impl Fn(&ObjectRef<CocoonHibernation>) -> Option<String>,
) {
    map.retain(|k, own| cache_version(k).is_some_and(|rv| own.behind.contains(&rv)));
}

/// A CR as our last write left it (see `Context::superseded`).
pub struct OwnWrite {
    written: Arc<CocoonHibernation>,
    /// Versions older than `written` that the cache may still hold.
    behind: HashSet<String>,
}

impl Context {
    /// Notes that `cached` (the cache's view) and `base` (the version the write was made
    /// against, a fresh read when there was one) were superseded by our write, which the
    /// apiserver answered with `written`.
    pub(super) fn wrote(
        &self,
        cached: &CocoonHibernation,
        base: &CocoonHibernation,
        written: CocoonHibernation,
    ) {
        let mut map = self.superseded.lock();
        let key = ObjectRef::from_obj(base);
        if written.metadata.resource_version == base.metadata.resource_version {
            // A write that changed nothing leaves every view as new as it was.
            return;
        }
        let mut behind = map.remove(&key).map(|w| w.behind).unwrap_or_default();
        behind.extend(cached.metadata.resource_version.clone());
        behind.extend(base.metadata.resource_version.clone());
        // The apiserver's answer carries managedFields: a tree of maps, kilobytes a CR.
        let mut written = written;
        crate::cache::strip_cr(&mut written);
        let written = Arc::new(written);
        map.insert_then_sweep(key, OwnWrite { written, behind }, |map| {
            sweep(map, |k| {
                self.cache
                    .cr(k.namespace.as_deref().unwrap_or_default(), &k.name)
                    .and_then(|cr| cr.metadata.resource_version.clone())
            });
        });
    }

    /// The CR to plan from: the cache's, unless it still holds a version our own last
    /// write replaced; then that write's answer.
    pub(super) fn own_write_view(&self, cached: Arc<CocoonHibernation>) -> Arc<CocoonHibernation> {
        let mut map = self.superseded.lock();
        let key = ObjectRef::from_obj(cached.as_ref());
        let Some(own) = map.get(&key) else {
            return cached;
        };
        match &cached.metadata.resource_version {
            Some(rv) if own.behind.contains(rv) => own.written.clone(),
            // Caught up, or moved on past our write: the cache is as new as we know.
            _ => {
                map.remove(&key);
                cached
            }
        }
    }

    /// Notes that `pod`, as the cache held it, was superseded by our patch. A patch that
    /// changed nothing keeps the resourceVersion, and no event would ever move past it.
    pub(super) fn wrote_pod(&self, pod: &PodSlice, patched: &PodSlice) {
        let Some(old) = &pod.metadata.resource_version else {
            return;
        };
        if patched.metadata.resource_version.as_ref() != Some(old) {
            let key = (pod.namespace().unwrap_or_default(), pod.name_any());
            self.superseded_pods
                .lock()
                .insert_then_sweep(key, old.clone(), |map| {
                    map.retain(|(ns, name), old| {
                        self.cache
                            .pod(ns, name)
                            .is_some_and(|p| p.metadata.resource_version.as_ref() == Some(old))
                    });
                });
        }
    }

    /// True while the pod cache still holds the version our last patch replaced.
    pub(super) fn pod_behind_own_write(&self, pod: &PodSlice) -> bool {
        let mut map = self.superseded_pods.lock();
        let key = (pod.namespace().unwrap_or_default(), pod.name_any());
        match map.get(&key) {
            Some(rv) if pod.metadata.resource_version.as_ref() == Some(rv) => true,
            Some(_) => {
                map.remove(&key);
                false
            }
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CocoonHibernationSpec, Desire, PodRef};

    fn cr(name: &str, rv: &str) -> CocoonHibernation {
        let mut cr = CocoonHibernation::new(
            name,
            CocoonHibernationSpec {
                pod_ref: PodRef { name: name.into() },
                desire: Desire::Wake,
                hibernate_timeout: None,
                wake_timeout: None,
            },
        );
        cr.metadata.namespace = Some("ns".into());
        cr.metadata.resource_version = Some(rv.into());
        cr
    }

    /// Issue 38 (memory), C3: a sweep keeps exactly the writes a pass would still plan
    /// from (the cache at a version they left behind) and drops the rest.
    #[test]
    fn c3_a_sweep_drops_only_writes_the_cache_caught_up_with() {
        let mut map = HashMap::new();
        for (name, behind) in [("lagging", "1"), ("caught-up", "1"), ("gone", "1")] {
            map.insert(
                ObjectRef::from_obj(&cr(name, "2")),
                OwnWrite {
                    written: Arc::new(cr(name, "2")),
                    behind: [behind.to_owned()].into(),
                },
            );
        }
        sweep(&mut map, |k| match k.name.as_str() {
            "lagging" => Some("1".into()),
            "caught-up" => Some("2".into()),
            _ => None,
        });
        let kept: Vec<_> = map.keys().map(|k| k.name.as_str()).collect();
        assert_eq!(kept, ["lagging"]);
    }
}
