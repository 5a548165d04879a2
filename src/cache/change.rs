//! What the cache tells the controllers: which object changed, in the cache's own terms.
//! The cache never decides which controller object a change wakes; each controller's
//! trigger policy does (`src/runtime/trigger.rs`). Listeners are called by the driver,
//! in order, once the store holds the change, and dropped when the driver ends, which
//! closes their channels.

use super::SharedCache;
use super::arrivals::Arrival;
use super::index::Key;
use parking_lot::Mutex;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    /// A CR the store now holds is new or changed (held during a relist until the list
    /// is in the store, S4).
    Cr(Key),
    /// A pod changed in a way a pass reads, appeared or left (C3; held like a CR's).
    Pod(Key),
    /// A CR is gone: the pod it targeted and the VM it held (S2).
    CrGone {
        namespace: String,
        pod: String,
        vm: Option<String>,
    },
    /// A CR gave up the VM it held (S2).
    VmReleased(String),
    /// A VM pod or a CR appeared, left or was relabelled (`arrivals.rs`): for label
    /// selectors (K9).
    Arrival(Arrival),
}

/// One controller's listener: its trigger policy and the sending end of its channel.
pub type Listener = Box<dyn FnMut(&Change, &SharedCache) + Send>;

/// The listeners of one cache, shared by its handle (which adds them) and its driver
/// (which calls them and clears them when it ends).
#[derive(Clone, Default)]
pub(super) struct Listeners(Arc<Mutex<Vec<Listener>>>);

impl Listeners {
    pub(super) fn add(&self, listener: Listener) {
        self.0.lock().push(listener);
    }

    pub(super) fn emit(&self, change: &Change, cache: &SharedCache) {
        for listener in self.0.lock().iter_mut() {
            listener(change, cache);
        }
    }

    /// Drops every listener, so each controller's channel closes.
    pub(super) fn clear(&self) {
        self.0.lock().clear();
    }
}

/// Clears the listeners when the driver ends, by return or by being dropped.
pub(super) struct ClearOnDrop(pub(super) Listeners);

impl Drop for ClearOnDrop {
    fn drop(&mut self) {
        self.0.clear();
    }
}
