//! When a failed pass looks again, for every controller: a lost race at once, anything
//! else after a capped exponential backoff. The cap keeps timeouts (H5, W4) detected
//! promptly while the registry or the apiserver keeps failing (H4).

use crate::error::Error;
use kube::runtime::controller::Action as Requeue;
use kube::{Resource, ResourceExt};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::Hash;
use std::time::Duration;

/// A conflict is retried at once: the next pass reads what the cache holds by then.
pub const CONFLICT_RETRY: Duration = Duration::from_millis(200);

/// The longest wait after a failure.
pub const MAX_BACKOFF: Duration = Duration::from_secs(10);

/// The delay before the next pass of an object whose passes failed `attempts` times in
/// a row (counting this one).
pub fn after_failure(err: &Error, attempts: u32) -> Duration {
    if err.is_lost_race() {
        return CONFLICT_RETRY;
    }
    backoff(attempts)
}

/// 1 s, 2 s, 4 s, 8 s, then every 10 s.
fn backoff(attempts: u32) -> Duration {
    Duration::from_millis(500u64.saturating_mul(1 << attempts.min(5))).min(MAX_BACKOFF)
}

/// Failed passes in a row per object, which [`after_failure`] backs off by; a pass that
/// ends well clears its object's count.
#[derive(Debug)]
pub struct Failures<K>(Mutex<HashMap<K, u32>>);

impl<K> Default for Failures<K> {
    fn default() -> Self {
        Self(Mutex::new(HashMap::new()))
    }
}

impl<K: Hash + Eq> Failures<K> {
    /// Counts one more failure of `key`; returns the count, this one included.
    pub fn record(&self, key: K) -> u32 {
        let mut counts = self.0.lock();
        let n = counts.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    }

    pub fn clear(&self, key: &K) {
        self.0.lock().remove(key);
    }
}

/// The error policy of a policy controller (schedules, idle policies): counts the failure
/// by uid, logs it (a lost race quietly: the next pass reads again at once) and backs off.
pub fn policy_retry<P: Resource>(
    policy: &P,
    err: &Error,
    failures: &Failures<String>,
    kind: &'static str,
) -> Requeue {
    let attempts = failures.record(policy.uid().unwrap_or_default());
    let name = policy.name_any();
    if err.is_lost_race() {
        tracing::debug!(kind, policy = %name, attempts, error = %err, "lost a race; reading again");
    } else {
        tracing::warn!(kind, policy = %name, attempts, error = %err,
            error_kind = err.metric_label(), "policy pass failed; retrying");
    }
    Requeue::requeue(after_failure(err, attempts))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn api_error(code: u16) -> Error {
        Error::Kube(kube::Error::Api(
            kube::core::Status::failure("m", "r")
                .with_code(code)
                .boxed(),
        ))
    }

    /// H4: a failing pass backs off, capped, so timeouts are still seen in seconds; a
    /// lost race (409, or 422 from a JSON patch `test`) reads again at once.
    #[rstest::rstest]
    #[case::h4_first_failure(500, 1, 1_000)]
    #[case::h4_doubles(500, 3, 4_000)]
    #[case::h4_capped(500, 5, 10_000)]
    #[case::h4_stays_capped(503, 40, 10_000)]
    #[case::h4_conflict_at_once(409, 7, 200)]
    #[case::h4_failed_test_at_once(422, 7, 200)]
    fn h4_retry_after_failure(#[case] code: u16, #[case] attempts: u32, #[case] millis: u64) {
        assert_eq!(
            after_failure(&api_error(code), attempts),
            Duration::from_millis(millis)
        );
    }

    /// H4: a failure count grows per object and a clear resets only that object.
    #[test]
    fn h4_failures_count_per_object() {
        let failures = Failures::default();
        assert_eq!(failures.record("a"), 1);
        assert_eq!(failures.record("a"), 2);
        assert_eq!(failures.record("b"), 1);
        failures.clear(&"a");
        assert_eq!(failures.record("a"), 1);
        assert_eq!(failures.record("b"), 2);
    }
}
