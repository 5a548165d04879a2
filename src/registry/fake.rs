//! A scripted [`SnapshotStore`] for the controller's unit tests: no network.

use super::{DeleteOutcome, Fut, RegistryError, SnapshotStore};
use std::sync::{Arc, Mutex};
use tokio::time::Instant;

/// Answers every probe with `digest` and every delete with `delete` (or, when
/// `unreachable`, a transport error), and records the calls it got in `calls`, which a
/// test keeps a clone of.
#[derive(Debug, Default)]
pub(crate) struct FakeStore {
    pub digest: Option<String>,
    pub delete: Option<DeleteOutcome>,
    pub unreachable: bool,
    /// "probe <vm>" / "delete <vm>@<digest>", in order.
    pub calls: Arc<Mutex<Vec<String>>>,
    /// When set, a probe answers only once this is notified.
    pub probe_gate: Option<Arc<tokio::sync::Notify>>,
}

impl FakeStore {
    /// A registry nobody can reach: every call fails as a transport error.
    pub fn unreachable() -> Self {
        Self {
            unreachable: true,
            ..Self::default()
        }
    }

    fn answer<T>(&self, operation: &'static str, vm: &str, ok: T) -> Result<T, RegistryError> {
        self.calls.lock().unwrap().push(format!("{operation} {vm}"));
        if self.unreachable {
            let message = "connection refused (fake)".into();
            return Err(RegistryError::Transport { operation, message });
        }
        Ok(ok)
    }
}

impl SnapshotStore for FakeStore {
    fn snapshot_digest<'a>(&'a self, vm: &'a str) -> Fut<'a, Option<String>> {
        Box::pin(async move {
            if let Some(gate) = &self.probe_gate {
                gate.notified().await;
            }
            self.answer("probe", vm, self.digest.clone())
        })
    }

    fn delete_snapshot_before<'a>(
        &'a self,
        vm: &'a str,
        digest: &'a str,
        at: Instant,
    ) -> Fut<'a, DeleteOutcome> {
        Box::pin(async move {
            if Instant::now() >= at {
                let after = std::time::Duration::ZERO;
                return Err(RegistryError::Timeout {
                    operation: "delete",
                    after,
                });
            }
            let outcome = self.delete.clone().unwrap_or(DeleteOutcome::Absent);
            self.answer("delete", &format!("{vm}@{digest}"), outcome)
        })
    }
}
