//! The model test's registry: one tag, deleted only by the digest it names, and the
//! truth the world keeps about it: whether it is (or is about to be) the VM's only copy.

use crate::leader::Fence;
use crate::registry::{DeleteOutcome, Fut, RegistryError, SnapshotStore};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

/// The registry's one tag, and what vk's truth says of it.
#[derive(Default)]
pub(super) struct Tags {
    pub tag: Option<String>,
    pub next_digest: u32,
    /// The tag is (or is about to be) the VM's only copy.
    pub needed: bool,
    /// The user deleted the CR of a round in flight: S6 allows discarding its snapshot.
    pub discarded: bool,
    pub deletes: usize,
    pub violations: Vec<String>,
    /// The product's fence: no DELETE may reach the registry while it is closed (S1).
    pub fence: Option<Fence>,
}

#[derive(Clone, Default)]
pub(super) struct Registry(pub Arc<Mutex<Tags>>);

impl SnapshotStore for Registry {
    fn snapshot_digest<'a>(&'a self, _vm: &'a str) -> Fut<'a, Option<String>> {
        Box::pin(async move { Ok(self.0.lock().tag.clone()) })
    }

    fn delete_snapshot_before<'a>(
        &'a self,
        vm: &'a str,
        digest: &'a str,
        at: tokio::time::Instant,
    ) -> Fut<'a, DeleteOutcome> {
        Box::pin(async move {
            if tokio::time::Instant::now() >= at {
                let after = Duration::ZERO;
                return Err(RegistryError::Timeout {
                    operation: "delete",
                    after,
                });
            }
            let mut tags = self.0.lock();
            if tags.tag.as_deref() != Some(digest) {
                return Ok(DeleteOutcome::Absent);
            }
            if tags
                .fence
                .as_ref()
                .is_some_and(|f| f.valid_until().is_none())
            {
                let v = format!("S1: DELETE {vm}:hibernate@{digest} with the fence closed");
                tags.violations.push(v);
            }
            if tags.needed && !tags.discarded {
                let v = format!("S1: deleted {vm}:hibernate@{digest}, the VM's only copy");
                tags.violations.push(v);
            }
            tags.tag = None;
            tags.deletes += 1;
            Ok(DeleteOutcome::Deleted)
        })
    }
}
