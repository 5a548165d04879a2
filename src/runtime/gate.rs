//! The leadership gate every controller asks (P2, S8): open while this replica leads on
//! a cache that holds its first lists. A pass that finds it closed ends quietly, writing
//! nothing; [`Gate::openings`] re-triggers the controller when it opens, so nothing polls.

use crate::cache::SharedCache;
use futures::Stream;
use tokio::sync::watch;

#[derive(Clone)]
pub struct Gate {
    leading: watch::Receiver<bool>,
    cache: SharedCache,
}

impl Gate {
    pub fn new(leading: watch::Receiver<bool>, cache: SharedCache) -> Self {
        Self { leading, cache }
    }

    /// Open now: for a pass, at its start.
    pub fn is_open(&self) -> bool {
        *self.leading.borrow() && self.cache.is_synced()
    }

    /// Resolves once open (S8: on kube's own store readiness, not a flag polled). False
    /// when the lease watch or a store's writer is gone: it never opens again.
    pub async fn opened(&mut self) -> bool {
        self.leading.wait_for(|leading| *leading).await.is_ok()
            && self.cache.wait_until_ready().await
    }

    /// Resolves when this replica stops leading, or the lease watch is gone.
    pub async fn closed(&mut self) {
        let _ = self.leading.wait_for(|leading| !*leading).await;
    }

    /// One item each time the gate opens, for `Controller::reconcile_all_on`: every
    /// object a closed gate turned away gets its pass. A term lost and regained between
    /// two looks still yields (the watch counts every change); a spare item only costs
    /// passes. Ends with the lease watch.
    pub fn openings(self) -> impl Stream<Item = ()> + Send + 'static {
        futures::stream::unfold((self, true), |(mut gate, first)| async move {
            let mut look_now = first;
            loop {
                if !look_now {
                    gate.leading.changed().await.ok()?;
                }
                look_now = false;
                if *gate.leading.borrow_and_update() {
                    let ready = gate.cache.wait_until_ready().await;
                    return ready.then_some(((), (gate, false)));
                }
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::StreamExt;
    use std::time::Duration;

    /// Whether the stream yields within `within` (paused time: no real wait).
    async fn yields<S: Stream<Item = ()> + Unpin>(s: &mut S, within: Duration) -> bool {
        tokio::time::timeout(within, s.next()).await == Ok(Some(()))
    }

    /// SPEC P2: the gate is closed while not leading and opens with the lease; each
    /// opening yields once, at once, even a term lost and regained between two looks;
    /// nothing yields while it stays closed or stays open; the stream ends with the
    /// lease watch.
    #[tokio::test(start_paused = true)]
    async fn p2_the_gate_opens_with_the_lease_and_says_so_at_once() {
        let (tx, rx) = watch::channel(false);
        let gate = Gate::new(rx, SharedCache::from_objects(Vec::new(), Vec::new()));
        let mut openings = Box::pin(gate.clone().openings());
        assert!(!gate.is_open());
        assert!(!yields(&mut openings, Duration::from_secs(60)).await);

        tx.send_replace(true);
        assert!(gate.is_open());
        assert!(yields(&mut openings, Duration::from_millis(1)).await);
        assert!(
            !yields(&mut openings, Duration::from_secs(60)).await,
            "stays open"
        );

        tx.send_replace(false);
        assert!(!gate.is_open());
        assert!(!yields(&mut openings, Duration::from_secs(60)).await);
        tx.send_replace(true);
        assert!(yields(&mut openings, Duration::from_millis(1)).await);

        // Lost and regained before the stream looks again: still one opening.
        tx.send_replace(false);
        tx.send_replace(true);
        assert!(yields(&mut openings, Duration::from_millis(1)).await);

        drop(tx);
        assert_eq!(openings.next().await, None);
    }

    /// SPEC P2: a gate already open when the controller starts yields at once;
    /// `opened` and `closed` follow the lease.
    #[tokio::test(start_paused = true)]
    async fn p2_an_open_gate_yields_at_start_and_closes_with_the_lease() {
        let (tx, rx) = watch::channel(true);
        let mut gate = Gate::new(rx, SharedCache::from_objects(Vec::new(), Vec::new()));
        let mut openings = Box::pin(gate.clone().openings());
        assert!(yields(&mut openings, Duration::from_millis(1)).await);
        assert!(tokio::time::timeout(Duration::from_millis(1), gate.opened()).await == Ok(true));
        let closed = tokio::time::timeout(Duration::from_secs(60), gate.closed()).await;
        assert!(closed.is_err(), "closed while leading");
        tx.send_replace(false);
        let closed = tokio::time::timeout(Duration::from_millis(1), gate.closed()).await;
        assert!(closed.is_ok());
    }
}
