//! Per-VM serialization (C2): passes that touch one VM's annotation or tag run one at a
//! time; other VMs proceed in parallel.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use tokio::sync::OwnedMutexGuard;

#[derive(Clone, Default)]
pub struct VmLocks {
    // Weak: an entry lives only while a pass holds or awaits it, so the map stays small.
    inner: Arc<Mutex<HashMap<String, Weak<tokio::sync::Mutex<()>>>>>,
}

impl VmLocks {
    pub async fn lock(&self, key: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut map = self.inner.lock();
            map.retain(|_, w| w.strong_count() > 0);
            match map.get(key).and_then(Weak::upgrade) {
                Some(existing) => existing,
                None => {
                    let fresh = Arc::new(tokio::sync::Mutex::new(()));
                    map.insert(key.to_owned(), Arc::downgrade(&fresh));
                    fresh
                }
            }
        };
        lock.lock_owned().await
    }

    pub fn len(&self) -> usize {
        self.inner.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::task::Poll;

    /// SPEC C2. No clock: a lock is either granted on its first poll or it is pending.
    #[tokio::test]
    async fn c2_same_vm_serializes_other_vms_proceed() {
        let locks = VmLocks::default();
        let held = locks.lock("vm-a").await;
        // Another VM is not blocked by vm-a's holder.
        let other = locks.lock("vm-b");
        tokio::pin!(other);
        assert!(matches!(futures::poll!(&mut other), Poll::Ready(_)));
        // The same VM waits until the holder is done...
        let same = locks.lock("vm-a");
        tokio::pin!(same);
        assert!(futures::poll!(&mut same).is_pending());
        assert!(futures::poll!(&mut same).is_pending());
        // ...and gets the lock once it is released.
        drop(held);
        assert!(matches!(futures::poll!(&mut same), Poll::Ready(_)));
    }

    /// SPEC C2.
    #[tokio::test]
    async fn c2_released_locks_are_forgotten() {
        let locks = VmLocks::default();
        for i in 0..50 {
            drop(locks.lock(&format!("vm-{i}")).await);
        }
        let _g = locks.lock("last").await;
        assert_eq!(locks.len(), 1);
    }
}
