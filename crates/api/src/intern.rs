//! One shared copy of each string the pod cache repeats (issue 38, memory): label keys and
//! values, annotation values. A pod's `app.kubernetes.io/name: sandbox` costs one pointer,
//! not two allocations, in every pod that carries it.
//!
//! Written here rather than taken from `lasso` or `internment`: `lasso` never frees a
//! string, so pod churn would grow it without bound; `internment`'s `ArcIntern` keeps a
//! global map as this does but adds a dependency for forty lines. Strings no pod holds any
//! more are dropped by a sweep each time the pool has doubled since the last one, so its
//! cost stays proportional to the strings alive.

use std::collections::HashSet;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

/// Below this many strings the pool is never swept: too small to matter.
const SWEEP_FLOOR: usize = 1024;

#[derive(Default)]
struct Pool {
    strings: HashSet<Arc<str>>,
    /// The pool's size after the last sweep; the next comes at twice that.
    kept: usize,
}

impl Pool {
    fn intern(&mut self, s: &str) -> Arc<str> {
        if let Some(shared) = self.strings.get(s) {
            return shared.clone();
        }
        if self.strings.len() >= SWEEP_FLOOR.max(2 * self.kept) {
            // Held only by the pool: no pod carries it any more.
            self.strings.retain(|s| Arc::strong_count(s) > 1);
            self.kept = self.strings.len();
        }
        let shared: Arc<str> = Arc::from(s);
        self.strings.insert(shared.clone());
        shared
    }
}

static POOL: LazyLock<Mutex<Pool>> = LazyLock::new(Mutex::default);

/// The pool's copy of `s`.
pub fn intern(s: &str) -> Arc<str> {
    // A panic inside `intern` cannot leave the set half-changed: keep using it.
    POOL.lock()
        .unwrap_or_else(PoisonError::into_inner)
        .intern(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 38: equal strings share one allocation.
    #[test]
    fn equal_strings_share_one_copy() {
        let a = intern("app.kubernetes.io/name-intern-test");
        let b = intern(&String::from("app.kubernetes.io/name-intern-test"));
        assert!(Arc::ptr_eq(&a, &b));
        assert_ne!(&*intern("other-intern-test"), &*a);
    }

    /// Issue 38: a sweep drops what nothing else holds and keeps what is held.
    #[test]
    fn a_sweep_frees_strings_no_pod_holds() {
        let mut pool = Pool::default();
        let held = pool.intern("held");
        for i in 1..SWEEP_FLOOR {
            pool.intern(&format!("gone-{i}"));
        }
        assert_eq!(pool.strings.len(), SWEEP_FLOOR);
        // The next new string sweeps first.
        let _new = pool.intern("new");
        assert_eq!(pool.strings.len(), 2);
        assert!(Arc::ptr_eq(&held, &pool.intern("held")));
        assert_eq!(pool.kept, 1);
    }
}
