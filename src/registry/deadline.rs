//! One deadline per registry operation (C2).
//!
//! `--registry-timeout` is the budget of a whole operation: a probe, or a delete with
//! everything its digest fallback needs (tag DELETE, token, HEAD, every `tags/list` page,
//! the HEAD of each other tag and the re-check, the DELETE by digest). Per-request
//! timeouts alone would let one delete take (5 + tags) × timeout. A caller may bound the operation
//! further by an instant of its own (the leader fence's expiry, S1).

use super::error::RegistryError;
use std::time::Duration;
use tokio::time::Instant;

/// Used when `now + timeout` does not fit an `Instant`: far enough to mean "no bound".
const FAR: Duration = Duration::from_secs(365 * 24 * 3600);

#[derive(Clone, Copy, Debug)]
pub(crate) struct Deadline {
    at: Instant,
    /// What the operation was given; reported by `Timeout` errors.
    budget: Duration,
}

impl Deadline {
    /// min(now + timeout, not_after).
    pub fn new(timeout: Duration, not_after: Option<Instant>) -> Self {
        let now = Instant::now();
        let own = now.checked_add(timeout).unwrap_or(now + FAR);
        let at = not_after.map_or(own, |limit| own.min(limit));
        Self {
            at,
            budget: at.saturating_duration_since(now),
        }
    }

    pub fn budget(&self) -> Duration {
        self.budget
    }

    pub fn timeout(&self, operation: &'static str) -> RegistryError {
        RegistryError::Timeout {
            operation,
            after: self.budget,
        }
    }

    /// Err once the deadline has passed, so no request starts after it.
    pub fn check(&self, operation: &'static str) -> Result<(), RegistryError> {
        if Instant::now() >= self.at {
            Err(self.timeout(operation))
        } else {
            Ok(())
        }
    }

    /// Runs `call` unless the deadline has passed; drops it when the deadline comes.
    pub async fn run<T>(
        &self,
        operation: &'static str,
        call: impl Future<Output = T>,
    ) -> Result<T, RegistryError> {
        self.check(operation)?;
        tokio::time::timeout_at(self.at, call)
            .await
            .map_err(|_| self.timeout(operation))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC C2: the operation's deadline is the earlier of its own budget and the caller's.
    #[tokio::test(start_paused = true)]
    async fn c2_deadline_is_the_earlier_of_budget_and_caller_bound() {
        let budget = Duration::from_secs(10);
        let own = Deadline::new(budget, None);
        assert_eq!(own.budget(), budget);
        let later = Deadline::new(budget, Some(Instant::now() + Duration::from_secs(60)));
        assert_eq!(later.budget(), budget);
        let earlier = Deadline::new(budget, Some(Instant::now() + Duration::from_secs(2)));
        assert_eq!(earlier.budget(), Duration::from_secs(2));
        let huge = Deadline::new(Duration::MAX, None);
        assert!(huge.check("probe").is_ok());
    }

    /// SPEC C2: one deadline for a sequence of calls, not a fresh timeout per call.
    #[tokio::test(start_paused = true)]
    async fn c2_calls_share_one_deadline() {
        let deadline = Deadline::new(Duration::from_secs(10), None);
        let started = Instant::now();
        let mut done = 0;
        let err = loop {
            // Each call alone is well within the budget.
            match deadline
                .run("call", tokio::time::sleep(Duration::from_secs(4)))
                .await
            {
                Ok(()) => done += 1,
                Err(e) => break e,
            }
        };
        assert_eq!(done, 2);
        assert!(
            matches!(err, RegistryError::Timeout { after, .. } if after == Duration::from_secs(10))
        );
        // Paused clock: this is virtual time, exactly the budget.
        assert_eq!(started.elapsed(), Duration::from_secs(10));
    }

    /// SPEC C2/S1: a deadline already past starts nothing.
    #[tokio::test(start_paused = true)]
    async fn c2_past_deadline_runs_nothing() {
        let deadline = Deadline::new(Duration::from_secs(10), Some(Instant::now()));
        assert_eq!(deadline.budget(), Duration::ZERO);
        let mut started = false;
        let err = deadline
            .run("delete", async { started = true })
            .await
            .unwrap_err();
        assert!(!started, "the call must not even be polled");
        assert!(matches!(
            err,
            RegistryError::Timeout {
                operation: "delete",
                ..
            }
        ));
    }
}
