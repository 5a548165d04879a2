//! The model test's world: a hostile vk-cocoon, the user, the operator, time, the fence and
//! the cache, around the real `reconcile` and an in-memory apiserver. The truth it checks
//! the product against is vk's: whether the VM still runs, or lives only in its tag.

use super::apiserver::{self, Store};
use super::registry::Registry;
use crate::api::CocoonHibernation;
use crate::api::annotations::{
    COCOONSET_GENERATION, HIBERNATE, LIFECYCLE_OBSERVED_GENERATION, LIFECYCLE_STATE, VM_ID, VM_NAME,
};
use crate::cache::SharedCache;
use crate::controller::{Context, plan::Settings, reconcile::reconcile};
use crate::leader::Fence;
use crate::metrics::Metrics;
use parking_lot::Mutex;
use serde_json::{Value, json};
use std::sync::Arc;
use std::time::Duration;

/// What vk-cocoon is doing with the VM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Vk {
    /// The VM runs; a hibernate annotation starts a round.
    Running,
    /// Snapshotting: the tag is not pushed yet.
    Pushing,
    /// The tag is pushed, the VM not yet removed: the tag is about to be its only copy.
    Pushed,
    /// The VM is removed: the tag is its only copy.
    Removed,
    /// vk found no tag to restore the VM from.
    Lost,
}

pub(super) struct World {
    pub store: Arc<Mutex<Store>>,
    pub registry: Registry,
    fence: Fence,
    client: kube::Client,
    settings: Settings,
    /// The last pass's context: the next one keeps its per-CR memories, as one process would.
    last: Option<Arc<Context>>,
    pub vk: Vk,
    /// vk runs the VM in the replacement pod from now on (G1).
    replaced: bool,
    next_vmid: u32,
    next_uid: u32,
    /// Every version of the CR (None: gone) and of the pods (the CR's, a replacement),
    /// oldest first: a lagging cache (or another replica's, after a failover) shows one of
    /// the last few.
    crs: Vec<Option<Value>>,
    pods: Vec<(Value, Option<Value>)>,
    /// One replica's cache (S4: it never goes back to an older version than it showed),
    /// at these indices into the histories; else any of the last versions (a failover to
    /// a replica whose cache lags further, or a restart on a lagging apiserver).
    monotone: Option<(usize, usize)>,
    /// The user flips the desire during the next pass, after this request of it.
    flip_next: Option<usize>,
    pub violations: Vec<String>,
    pub log: Vec<String>,
}

fn pod() -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "web-0", "namespace": "ns", "uid": "pod-uid",
        "annotations": {VM_NAME: "vm-a", VM_ID: "id-1", LIFECYCLE_STATE: "ready",
            LIFECYCLE_OBSERVED_GENERATION: "1", COCOONSET_GENERATION: "1"}},
        "status": running(true)})
}

fn running(yes: bool) -> Value {
    let state = if yes {
        json!({"running": {}})
    } else {
        json!({"waiting": {"reason": "VMRemoved"}})
    };
    json!({"containerStatuses": [{"name": "vm", "image": "i", "imageID": "", "ready": yes,
        "restartCount": 0, "state": state}]})
}

impl World {
    pub fn new(settings: Settings, monotone: bool) -> Self {
        let fence = Fence::unfenced();
        let store = Arc::new(Mutex::new(Store::new(pod(), fence.clone())));
        let pod = store.lock().pod.clone();
        let registry = Registry::default();
        registry.0.lock().fence = Some(fence.clone());
        World {
            client: apiserver::client(store.clone()),
            store,
            registry,
            fence,
            settings,
            last: None,
            vk: Vk::Running,
            replaced: false,
            next_vmid: 2,
            next_uid: 1,
            crs: vec![None],
            monotone: monotone.then_some((0, 0)),
            flip_next: None,
            pods: vec![(pod, None)],
            violations: Vec::new(),
            log: Vec::new(),
        }
    }

    pub fn cr(&self) -> Option<CocoonHibernation> {
        let cr = self.store.lock().cr.clone()?;
        serde_json::from_value(cr).ok()
    }

    /// The user creates the CR (when there is none).
    pub fn create(&mut self, hibernate: bool) {
        let mut store = self.store.lock();
        if store.cr.is_some() {
            return;
        }
        let desire = if hibernate { "Hibernate" } else { "Wake" };
        let cr = json!({"apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonHibernation",
            "metadata": {"name": "web-0", "namespace": "ns", "uid": format!("uid-{}", self.next_uid),
                "generation": 1, "creationTimestamp": now(0)},
            "spec": {"podRef": {"name": "web-0"}, "desire": desire}});
        self.next_uid += 1;
        store.cr = Some(store.stamp(cr));
    }

    /// The user flips `spec.desire` (a new generation).
    pub fn flip(&mut self) {
        self.store.lock().flip_desire();
    }

    /// The user flips `spec.desire` during the next pass, right after its `n`th request
    /// (F2: a write the pass made before it stands, the ones after meet a new version).
    pub fn flip_during_next_pass(&mut self, n: usize) {
        self.flip_next = Some(n);
    }

    /// The user deletes the CR. Deleting one whose round is in flight discards its
    /// snapshot (S6): what then becomes of that VM is the user's choice.
    pub fn delete(&mut self) {
        let annotated = self.annotation(HIBERNATE).is_some();
        let mut store = self.store.lock();
        let Some(mut cr) = store.cr.clone() else {
            return;
        };
        let in_flight = annotated || self.vk != Vk::Running;
        if cr["metadata"]["deletionTimestamp"].is_null() && in_flight && !self.replaced {
            self.registry.0.lock().discarded = true;
        }
        if cr["metadata"]["finalizers"]
            .as_array()
            .is_none_or(Vec::is_empty)
        {
            store.cr = None;
            return;
        }
        cr["metadata"]["deletionTimestamp"] = json!(now(0));
        store.cr = Some(store.stamp(cr));
    }

    /// An hour passes: every copy of the CR (the apiserver's, the cache's) is that much older.
    pub fn tick(&mut self) {
        let mut store = self.store.lock();
        let copies = self.crs.iter_mut().flatten().chain(store.cr.as_mut());
        for cr in copies {
            let conditions = cr.pointer_mut("/status/conditions");
            let Some(conditions) = conditions.and_then(Value::as_array_mut) else {
                continue;
            };
            for c in conditions {
                let at = c["lastTransitionTime"]
                    .as_str()
                    .and_then(|t| t.parse().ok());
                if let Some(at) = at {
                    c["lastTransitionTime"] = json!(shifted(at, -3600));
                }
            }
        }
    }

    /// S1: the fence closes (this replica lost its lease) or opens again.
    pub fn fence(&mut self, open: bool) {
        if open {
            let far = tokio::time::Instant::now() + Duration::from_secs(3600);
            self.fence.extend_to(far);
        } else {
            self.fence.close();
        }
    }

    /// An annotation of the pod vk runs the VM in.
    fn annotation(&self, key: &str) -> Option<String> {
        let store = self.store.lock();
        let pod = match &store.replacement {
            Some(pod) if self.replaced => pod,
            _ => &store.pod,
        };
        pod["metadata"]["annotations"][key]
            .as_str()
            .map(str::to_owned)
    }

    /// G1: the operator frees the node of a hibernated VM and creates a pod of another name
    /// for it, which vk restores from the tag; from now on that pod holds the tag, whatever
    /// becomes of the CR.
    pub fn replace(&mut self) {
        let mut store = self.store.lock();
        let mut tags = self.registry.0.lock();
        if self.vk != Vk::Removed || tags.tag.is_none() || store.replacement.is_some() {
            return;
        }
        tags.discarded = false;
        self.replaced = true;
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {
            "name": "web-0-b", "namespace": "ns", "uid": "pod-uid-b",
            "annotations": {VM_NAME: "vm-a", COCOONSET_GENERATION: "1"}},
            "status": running(false)});
        store.replacement = Some(store.stamp(pod));
    }

    /// A hostile vk-cocoon's next step: on some rounds it never reports `hibernating`; it
    /// pushes, and removes the VM only a step later, whatever the annotation says by then;
    /// it restores a removed VM once the annotation is gone, from the tag if there is one.
    /// `removes`: the step that takes a pushed VM away; the others never do, so a removal
    /// may come many steps (and a timeout) after the push.
    pub fn vk_step(&mut self, skip_hibernating: bool, removes: bool) {
        let annotated = self.annotation(HIBERNATE).is_some();
        let mut annotations: Vec<(&str, Option<String>)> = Vec::new();
        let mut container = None;
        match self.vk {
            Vk::Running if annotated => {
                if !skip_hibernating {
                    annotations.push((LIFECYCLE_STATE, Some("hibernating".into())));
                }
                self.vk = Vk::Pushing;
            }
            Vk::Pushing => {
                let mut tags = self.registry.0.lock();
                tags.next_digest += 1;
                tags.tag = Some(format!("sha256:{:04}", tags.next_digest));
                self.vk = Vk::Pushed;
            }
            Vk::Pushed if removes => {
                annotations.push((VM_ID, None));
                annotations.push((LIFECYCLE_STATE, Some("hibernated".into())));
                container = Some(false);
                self.vk = Vk::Removed;
            }
            Vk::Removed if !annotated => {
                let mut tags = self.registry.0.lock();
                if tags.tag.is_some() {
                    annotations.push((VM_ID, Some(format!("id-{}", self.next_vmid))));
                    annotations.push((LIFECYCLE_STATE, Some("ready".into())));
                    container = Some(true);
                    self.next_vmid += 1;
                    tags.discarded = false;
                    self.vk = Vk::Running;
                } else {
                    if !tags.discarded {
                        self.violations
                            .push("S1: VM lost: no tag to restore it from".into());
                    }
                    self.vk = Vk::Lost;
                }
            }
            _ => {}
        }
        self.registry.0.lock().needed = matches!(self.vk, Vk::Pushed | Vk::Removed);
        if annotations.is_empty() && container.is_none() {
            return;
        }
        let mut store = self.store.lock();
        let replacement = store.replacement.clone().filter(|_| self.replaced);
        let mut pod = replacement.unwrap_or_else(|| store.pod.clone());
        for (key, value) in annotations {
            match value {
                Some(v) => pod["metadata"]["annotations"][key] = json!(v),
                None => drop(
                    pod["metadata"]["annotations"]
                        .as_object_mut()
                        .map(|a| a.remove(key)),
                ),
            }
        }
        if let Some(yes) = container {
            pod["status"] = running(yes);
        }
        let pod = store.stamp(pod);
        if self.replaced {
            store.replacement = Some(pod);
        } else {
            store.pod = pod;
        }
    }

    /// One pass of the real `reconcile`, on a cache `cr_lag` versions behind the CR and
    /// `pod_lag` behind the pod; the fence closes during its `cut`th request.
    pub async fn pass(&mut self, cr_lag: usize, pod_lag: usize, cut: Option<usize>) {
        let flip = self.flip_next.take();
        let mut cr_at = self.crs.len() - 1 - cr_lag.min(self.crs.len() - 1);
        let mut pod_at = self.pods.len() - 1 - pod_lag.min(self.pods.len() - 1);
        if let Some((cr_seen, pod_seen)) = &mut self.monotone {
            cr_at = cr_at.max(*cr_seen);
            pod_at = pod_at.max(*pod_seen);
            (*cr_seen, *pod_seen) = (cr_at, pod_at);
        }
        let cr = self.crs[cr_at].clone();
        let (pod, replacement) = self.pods[pod_at].clone();
        let pods: Result<Vec<_>, _> = [Some(pod), replacement]
            .into_iter()
            .flatten()
            .map(serde_json::from_value)
            .collect();
        let (Some(cr), Ok(pods)) = (cr, pods) else {
            return; // the cache shows no CR: there is nothing to reconcile
        };
        let cr = match serde_json::from_value::<CocoonHibernation>(cr) {
            Ok(cr) => cr,
            Err(e) => return self.violations.push(format!("harness: the CR: {e}")),
        };
        let ctx = self.context(SharedCache::from_objects(vec![cr.clone()], pods));
        self.store.lock().cut_fence_at(cut);
        self.store.lock().flip_after = flip;
        let pass = tokio::time::timeout(Duration::from_secs(10), reconcile(Arc::new(cr), ctx));
        match pass.await {
            Err(_) => self.violations.push("harness: the pass hangs".into()),
            Ok(Err(crate::error::Error::Kube(e))) if !matches!(e, kube::Error::Api(_)) => {
                self.violations.push(format!("harness: {e}"))
            }
            Ok(result) => self.log.push(format!("  -> {result:?}")),
        }
        self.store.lock().cut_fence_at(None);
        self.store.lock().flip_after = None;
        // Events still in flight go out before the world moves on.
        tokio::task::yield_now().await;
    }

    /// A context on `cache`, with the per-CR memories of the last pass's.
    fn context(&mut self, cache: SharedCache) -> Arc<Context> {
        let ctx = crate::controller::context(
            self.client.clone(),
            cache,
            self.registry.clone(),
            Metrics::new(),
            self.settings.clone(),
            None,
            self.fence.clone(),
        );
        if let Some(old) = self.last.take() {
            *ctx.superseded.lock() = std::mem::take(&mut *old.superseded.lock());
            *ctx.superseded_pods.lock() = std::mem::take(&mut *old.superseded_pods.lock());
            *ctx.failures.lock() = std::mem::take(&mut *old.failures.lock());
            *ctx.refusals.lock() = std::mem::take(&mut *old.refusals.lock());
        }
        self.last = Some(ctx.clone());
        ctx
    }

    /// After every step: records new versions for the caches, and checks the invariants.
    pub fn observe(&mut self) {
        let (cr, pod, unexpected) = {
            let mut store = self.store.lock();
            let unexpected = std::mem::take(&mut store.unexpected);
            let pods = (store.pod.clone(), store.replacement.clone());
            (store.cr.clone(), pods, unexpected)
        };
        self.violations
            .extend(unexpected.into_iter().map(|u| format!("harness: {u}")));
        self.violations
            .append(&mut std::mem::take(&mut self.registry.0.lock().violations));
        let discarded = self.registry.0.lock().discarded;
        // W2, S7: on any cache, since a transition ends only on the pod as the apiserver
        // shows it (a lagging cache once gave a false Active here).
        if let Some(cr) = self.cr()
            && self.vk == Vk::Removed
            && !discarded
            && !cr.is_deleting()
            && cr.phase() == Some(crate::api::Phase::Active)
        {
            self.violations
                .push("W2: the CR is Active while vk has removed the VM".into());
        }
        if self.crs.last() != Some(&cr) {
            self.crs.push(cr);
        }
        if self.pods.last() != Some(&pod) {
            self.pods.push(pod);
        }
    }
}

fn now(offset: i64) -> String {
    shifted(jiff::Timestamp::now(), offset)
}

fn shifted(at: jiff::Timestamp, seconds: i64) -> String {
    let at = at
        .checked_add(jiff::SignedDuration::from_secs(seconds))
        .unwrap_or(at);
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}
