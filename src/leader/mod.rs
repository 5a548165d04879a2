//! Leader election on a Lease (P2, S1, P4): every replica serves the webhook and keeps its
//! cache warm; only the holder reconciles, and only while its fence is open.
//!
//! A small elector of our own in the style of client-go's leaderelection, not
//! kube-lease-manager: that crate never tells when a renewal succeeded (its `changed()`
//! fires on state changes only) and reports a lost lease only when it manages to read it,
//! so a leader cut off from the apiserver kept leading on a stale cache; and its followers
//! slept until the old lease's expiry, so a lease released on SIGTERM was taken only
//! after the full duration.
//!
//! - [`decide`]: the pure rules (acquire / renew / wait / step down / release), and the
//!   safety epoch a build stamps on the Lease so an older build never leads after it (S11).
//! - `elector`: the GET / create / patch loop and the watchdog that closes the fence.

/// The pure rules live in cocoon-core; re-exported under their old path.
pub use cocoon_core::leader as decide;
mod elector;

use crate::error::Result;
use decide::{Readiness, Timing};
use elector::{Elector, Leadership};
use k8s_openapi::api::coordination::v1::Lease;
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Whether this replica may still act as the leader, judged on its own clock (S1). The
/// elector moves the deadline forward after each successful renewal; a replica cut off
/// from the apiserver sees its fence expire before another replica can take the lease.
#[derive(Clone, Debug)]
pub struct Fence {
    until: Arc<Mutex<Option<Instant>>>,
}

impl Fence {
    /// A fence that never expires: leader election is off.
    pub fn unfenced() -> Self {
        let far = Instant::now() + std::time::Duration::from_secs(100 * 365 * 24 * 3600);
        Self {
            until: Arc::new(Mutex::new(Some(far))),
        }
    }

    /// A fence that is closed until [`Self::extend_to`] opens it.
    pub fn closed() -> Self {
        Self {
            until: Arc::new(Mutex::new(None)),
        }
    }

    /// The instant until which leader-only effects (tag deletes) may still run, if any.
    pub fn valid_until(&self) -> Option<Instant> {
        self.deadline().filter(|t| *t > Instant::now())
    }

    pub fn extend_to(&self, until: Instant) {
        self.set(Some(until));
    }

    pub fn close(&self) {
        self.set(None);
    }

    fn set(&self, until: Option<Instant>) {
        self.with(|cur| *cur = until);
    }

    /// The raw deadline, passed or not.
    pub fn deadline(&self) -> Option<Instant> {
        self.with(|cur| *cur)
    }

    /// Runs `f` on the deadline under the fence's lock; the elector changes `leading` in
    /// the same critical section so the two never disagree.
    fn with<R>(&self, f: impl FnOnce(&mut Option<Instant>) -> R) -> R {
        f(&mut self.until.lock())
    }
}

/// Which Lease to hold and how long its record stays valid (`--lease-*`).
#[derive(Clone, Debug)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    pub duration: Duration,
    /// S11: the safety epoch to lead with: [`decide::SAFETY_EPOCH`], or lower in a test
    /// that plays an older build.
    pub safety_epoch: u64,
}

/// A running election. Cancel `stop` and await `task` to release the lease (P4).
pub struct Election {
    pub leading: watch::Receiver<bool>,
    pub task: Option<JoinHandle<()>>,
    /// S1: open only while the last renewal is recent enough.
    pub fence: Fence,
    /// Ends the election: stop leading, close the fence, release the lease.
    pub stop: CancellationToken,
    /// Holds the constant `true` of an election that is switched off.
    _always: Option<watch::Sender<bool>>,
}

impl Election {
    /// No election: this replica always leads.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        Self {
            leading: rx,
            task: None,
            fence: Fence::unfenced(),
            stop: CancellationToken::new(),
            _always: Some(tx),
        }
    }

    /// No election, but the controller runs only while `readiness` allows (S8): it stops
    /// while the cache is stalled and begins only on a ready cache.
    pub fn always_while(
        readiness: impl Fn() -> Readiness + Send + Sync + 'static,
        poll: Duration,
    ) -> Self {
        let (tx, rx) = watch::channel(false);
        let stop = CancellationToken::new();
        let done = stop.clone();
        let task = tokio::spawn(async move {
            loop {
                let leading = *tx.borrow();
                let lead = match readiness() {
                    Readiness::Ready => true,
                    Readiness::Syncing => leading,
                    Readiness::Stalled => false,
                };
                if lead != leading {
                    if !lead {
                        tracing::error!("informer cache stalled: controller stopped");
                    }
                    tx.send_replace(lead);
                }
                tokio::select! {
                    _ = done.cancelled() => return,
                    _ = tokio::time::sleep(poll) => {}
                }
            }
        });
        Self {
            leading: rx,
            task: Some(task),
            fence: Fence::unfenced(),
            stop,
            _always: None,
        }
    }

    /// Starts electing on `client`, which must have request timeouts (S1). `readiness`
    /// is the cache's fitness to lead on (S8), asked before every decision.
    pub async fn start(
        client: kube::Client,
        lease: &LeaseSettings,
        identity: String,
        apiserver_timeout: Duration,
        readiness: impl Fn() -> Readiness + Send + Sync + 'static,
    ) -> Result<Self> {
        let timing = Timing::new(lease.duration, apiserver_timeout);
        let fence = Fence::closed();
        let (leading_tx, leading) = watch::channel(false);
        let leadership = Arc::new(Leadership {
            fence: fence.clone(),
            leading: leading_tx,
            span: timing.fence_span(),
        });
        let elector = Elector {
            api: kube::Api::<Lease>::namespaced(client, &lease.namespace),
            name: lease.name.clone(),
            identity: identity.clone(),
            timing,
            leadership,
            readiness: Arc::new(readiness),
            safety_epoch: lease.safety_epoch,
            outranked_by: std::sync::atomic::AtomicU64::new(0),
        };
        let stop = CancellationToken::new();
        let task = tokio::spawn(elector.run(stop.clone()));
        tracing::info!(
            identity,
            lease = lease.name,
            namespace = lease.namespace,
            duration = ?timing.lease_duration,
            margin = ?timing.margin,
            retry = ?timing.retry_period,
            safety_epoch = lease.safety_epoch,
            "leader election started"
        );
        Ok(Self {
            leading,
            task: Some(task),
            fence,
            stop,
            _always: None,
        })
    }
}

#[cfg(test)]
mod tests;
