//! One way to be triggered: the cache tells every listener what changed
//! ([`Change`](crate::cache::change::Change)); each controller owns a [`Policy`] that says
//! which of its objects a change wakes, and reads them as a stream (kube-runtime's
//! `reconcile_on`).
//!
//! The policy runs in the cache's driver, right after the store took the change, so what
//! it looks up (the podRef index, the pods naming a VM, the schedules' store) is as of that
//! change. The channel is unbounded: a trigger is never lost, and the driver never waits on
//! a slow controller; kube-runtime keeps one pending pass per object, so a burst collapses.

use crate::cache::SharedCache;
use crate::cache::change::Change;
use kube::Resource;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

/// Which of a controller's objects a change in the cache wakes. Pure apart from reading
/// the cache and stores it is given; called on the driver's task, so it must not block.
pub trait Policy: Send + 'static {
    type Kind: Resource<DynamicType = ()> + 'static;

    fn wakes(&self, change: &Change, cache: &SharedCache) -> Vec<ObjectRef<Self::Kind>>;
}

/// A controller's triggers: the receiving end of its channel. It ends when the cache's
/// driver does.
pub type Triggers<K> = mpsc::UnboundedReceiver<ObjectRef<K>>;

/// Subscribes `policy` to `cache`: every change from now on, as the policy maps it.
pub fn subscribe<P: Policy>(cache: &SharedCache, policy: P) -> Triggers<P::Kind> {
    let (tx, rx) = mpsc::unbounded_channel();
    cache.listen(Box::new(move |change, cache| {
        for object in policy.wakes(change, cache) {
            // A closed receiver: its controller stopped, which only shutdown does.
            let _ = tx.send(object);
        }
    }));
    rx
}

/// The triggers as a stream, for `Controller::reconcile_on`.
pub fn stream<K: Resource<DynamicType = ()> + Send + 'static>(
    triggers: Triggers<K>,
) -> impl futures::Stream<Item = ObjectRef<K>> + Send + 'static {
    futures::stream::unfold(triggers, |mut rx| async move {
        rx.recv().await.map(|t| (t, rx))
    })
}
