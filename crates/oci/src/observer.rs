//! What the registry client reports as it works. The operator's `Metrics` implement it;
//! the plugin builds its client without one, so it needs none of the server's parts.

use super::error::Op;
use std::fmt::Debug;
use std::sync::Arc;

/// Told of every registry call and of every tag kept for a shared digest (O1, S5).
pub trait RegistryObserver: Send + Sync + Debug {
    /// A call of `operation` ended with `outcome` (`ok`, `absent`, `error`, `timeout`, ...).
    fn call(&self, operation: &'static str, outcome: &'static str);
    /// A tag delete was left undone: another tag shares the digest.
    fn tag_kept(&self);
}

/// A client's observer: none, or the one it was built with.
#[derive(Clone, Debug, Default)]
pub(super) struct Observer(Option<Arc<dyn RegistryObserver>>);

impl Observer {
    pub fn new(observer: Arc<dyn RegistryObserver>) -> Self {
        Self(Some(observer))
    }

    pub fn call(&self, operation: Op, outcome: &'static str) {
        if let Some(o) = &self.0 {
            o.call(operation, outcome);
        }
    }

    pub fn tag_kept(&self) {
        if let Some(o) = &self.0 {
            o.tag_kept();
        }
    }
}
