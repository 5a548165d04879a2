//! Our own last writes, remembered until the watch brings them back: a pass never plans
//! from a view older than what this process already wrote.

use super::context::Context;
use crate::api::CocoonHibernation;
use crate::api::pod::PodSlice;
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use std::collections::HashSet;
use std::sync::Arc;

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
        let written = Arc::new(written);
        map.insert(key, OwnWrite { written, behind });
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
            self.superseded_pods.lock().insert(key, old.clone());
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
