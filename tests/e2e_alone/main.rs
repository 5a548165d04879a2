//! End-to-end tests that must not share the cluster with the other tests of their process:
//! each takes [`alone`] first, so they run one at a time whatever `--test-threads` says,
//! and never beside `tests/e2e` (cargo runs test binaries one after another).
//! - `cluster_wide`: its product watches every namespace, so it would reconcile other
//!   tests' CRs;
//! - `bench_short`: 1,000 pods and 100 CRs at once; beside it, tests with second-scale
//!   timeouts (the Lease's, P4) failed on a 2-core machine.

mod bench_short;
mod cluster_wide;

/// Held for a whole test: one test of this binary at a time.
pub async fn alone() -> tokio::sync::MutexGuard<'static, ()> {
    static ALONE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    ALONE.lock().await
}
