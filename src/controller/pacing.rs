//! Pacing of a term's first enqueue (issue 38, memory): a new term enqueues every CR, and
//! kube-runtime spawns every ready pass at once, so 50k CRs meant 50k spawned passes, and
//! its scheduler and in-flight maps grown to 50k entries (kept at that size afterwards).
//! The first enqueue is let in at most [`IN_FLIGHT`] CRs ahead of the passes that ended.
//! Only that enqueue is paced: a trigger from a change (a user's flip) goes straight in,
//! so C2's intake lane is untouched, and pacing only orders work `Turns` would queue anyway.

use super::triggers::Trigger;
use crate::cache::SharedCache;
use futures::Stream;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// CRs of the first enqueue let in ahead of the passes that ended: far more than the
/// workers, so no worker ever idles for want of one.
pub const IN_FLIGHT: usize = 1024;

/// A permit is also freed when its CR leaves the cache: kube-runtime skips a pass for an
/// object no longer in its store, so no pass would free it. Checked this often while the
/// enqueue waits.
const SWEEP_EVERY: Duration = Duration::from_secs(5);

/// The permits of one term: one per CR let in whose pass has not ended.
#[derive(Clone)]
pub struct Pacing {
    slots: Arc<Semaphore>,
    held: Arc<Mutex<HashMap<Trigger, OwnedSemaphorePermit>>>,
}

impl Pacing {
    pub fn new(in_flight: usize) -> Self {
        Pacing {
            slots: Arc::new(Semaphore::new(in_flight)),
            held: Arc::default(),
        }
    }

    /// `first` let in as passes end.
    pub fn pace(
        &self,
        first: Vec<Trigger>,
        cache: SharedCache,
    ) -> impl Stream<Item = Trigger> + Send + 'static {
        let pacing = self.clone();
        futures::stream::unfold(
            (first.into_iter(), pacing, cache),
            |(mut rest, pacing, cache)| async move {
                let next = rest.next()?;
                pacing.admit(&next, &cache).await;
                Some((next, (rest, pacing, cache)))
            },
        )
    }

    /// The term's triggers: `first` paced, and `changes` let in at once beside it (C2: a
    /// flip never waits for the first enqueue).
    pub fn beside(
        &self,
        first: Vec<Trigger>,
        cache: SharedCache,
        changes: impl Stream<Item = Trigger> + Send + 'static,
    ) -> impl Stream<Item = Trigger> + Send + 'static {
        futures::stream::select(self.pace(first, cache), changes)
    }

    async fn admit(&self, trigger: &Trigger, cache: &SharedCache) {
        let permit = loop {
            match tokio::time::timeout(SWEEP_EVERY, self.slots.clone().acquire_owned()).await {
                Ok(Ok(permit)) => break permit,
                // Never closed; if it were, pacing would only stop limiting.
                Ok(Err(_)) => return,
                Err(_) => self.lock().retain(|t, _| {
                    let ns = t.namespace.as_deref().unwrap_or_default();
                    cache.cr(ns, &t.name).is_some()
                }),
            }
        };
        // A CR let in twice before its pass keeps one permit: one pass serves both.
        self.lock().insert(trigger.clone(), permit);
    }

    /// The pass of `trigger` ended: its permit, if it holds one, is free.
    pub fn done(&self, trigger: &Trigger) {
        self.lock().remove(trigger);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Trigger, OwnedSemaphorePermit>> {
        // A panic cannot leave the map half-changed.
        self.held.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn held(&self) -> usize {
        self.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use kube::runtime::reflector::ObjectRef;

    fn cr(i: usize) -> crate::api::CocoonHibernation {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "cocoonset.cocoonstack.io/v1",
            "kind": "CocoonHibernation",
            "metadata": {"name": format!("cr-{i}"), "namespace": "ns"},
            "spec": {"podRef": {"name": format!("pod-{i}")}, "desire": "Wake"},
        }))
        .unwrap_or_else(|e| panic!("test CR: {e}"))
    }

    fn trigger(i: usize) -> Trigger {
        ObjectRef::new(&format!("cr-{i}")).within("ns")
    }

    /// Issue 38: the first enqueue stops at the limit and goes on as passes end.
    #[tokio::test(start_paused = true)]
    async fn the_first_enqueue_waits_for_passes_to_end() {
        let cache = SharedCache::from_objects((0..5).map(cr).collect(), Vec::new());
        let pacing = Pacing::new(2);
        let mut first = Box::pin(pacing.pace((0..5).map(trigger).collect(), cache));
        assert_eq!(first.next().await, Some(trigger(0)));
        assert_eq!(first.next().await, Some(trigger(1)));
        assert!(
            tokio::time::timeout(Duration::from_secs(1), first.next())
                .await
                .is_err(),
            "a third CR let in while two passes run"
        );
        pacing.done(&trigger(0));
        assert_eq!(first.next().await, Some(trigger(2)));
        assert_eq!(pacing.held(), 2);
    }

    /// C2: a change's trigger goes in while the first enqueue waits for passes to end.
    #[tokio::test(start_paused = true)]
    async fn c2_a_change_is_not_paced() {
        let cache = SharedCache::from_objects((0..3).map(cr).collect(), Vec::new());
        let pacing = Pacing::new(1);
        let (tx, rx) = futures::channel::mpsc::unbounded();
        let first = vec![trigger(0), trigger(1)];
        let mut all = Box::pin(pacing.beside(first, cache, rx));
        assert_eq!(all.next().await, Some(trigger(0)));
        tx.unbounded_send(trigger(2))
            .unwrap_or_else(|e| panic!("send: {e}"));
        let next = tokio::time::timeout(Duration::from_secs(1), all.next()).await;
        assert_eq!(
            next,
            Ok(Some(trigger(2))),
            "the flip waited for the enqueue"
        );
    }

    /// A CR deleted before its pass frees its permit: kube-runtime never runs that pass.
    #[tokio::test(start_paused = true)]
    async fn a_cr_gone_from_the_cache_frees_its_permit() {
        // cr-0 is not in the cache: deleted after the term listed it.
        let cache = SharedCache::from_objects((1..3).map(cr).collect(), Vec::new());
        let pacing = Pacing::new(1);
        let mut first = Box::pin(pacing.pace((0..3).map(trigger).collect(), cache));
        assert_eq!(first.next().await, Some(trigger(0)));
        let next = tokio::time::timeout(SWEEP_EVERY * 3, first.next()).await;
        assert_eq!(next, Ok(Some(trigger(1))));
        // cr-1 is in the cache: its permit stays until its pass ends.
        let stuck = tokio::time::timeout(SWEEP_EVERY * 3, first.next()).await;
        assert!(stuck.is_err(), "a live CR's permit was swept");
    }

    /// A CR let in twice before its pass holds one permit, freed by its one pass.
    #[tokio::test(start_paused = true)]
    async fn a_cr_let_in_twice_holds_one_permit() {
        let cache = SharedCache::from_objects((0..2).map(cr).collect(), Vec::new());
        let pacing = Pacing::new(2);
        let triggers = vec![trigger(0), trigger(0), trigger(1)];
        let mut first = Box::pin(pacing.pace(triggers, cache));
        assert_eq!(first.next().await, Some(trigger(0)));
        assert_eq!(first.next().await, Some(trigger(0)));
        assert_eq!(first.next().await, Some(trigger(1)));
        assert_eq!(pacing.held(), 2);
        pacing.done(&trigger(0));
        pacing.done(&trigger(1));
        assert_eq!(pacing.held(), 0);
    }
}
