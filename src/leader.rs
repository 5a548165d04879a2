//! Leader election on a Lease (P2): every replica serves the webhook and keeps its cache
//! warm; only the holder reconciles.

use crate::config::ElectionArgs;
use crate::error::{Error, Result};
use kube_lease_manager::{LeaseCreateMode, LeaseManagerBuilder};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

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
        let until = match self.until.lock() {
            Ok(g) => *g,
            Err(poisoned) => *poisoned.into_inner(),
        };
        until.filter(|t| *t > Instant::now())
    }

    pub fn extend_to(&self, until: Instant) {
        self.set(Some(until));
    }

    pub fn close(&self) {
        self.set(None);
    }

    fn set(&self, until: Option<Instant>) {
        match self.until.lock() {
            Ok(mut g) => *g = until,
            Err(poisoned) => *poisoned.into_inner() = until,
        }
    }
}

/// A running election. Dropping `leading` (the receiver) makes the manager release the
/// lease and exit; await `task` to know it is released (P4).
pub struct Election {
    pub leading: watch::Receiver<bool>,
    pub task: Option<JoinHandle<()>>,
    /// S1: open only while the last renewal is recent enough.
    pub fence: Fence,
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
            _always: Some(tx),
        }
    }

    pub async fn start(
        client: kube::Client,
        args: &ElectionArgs,
        identity: String,
    ) -> Result<Self> {
        let duration = args.lease_duration.as_secs().max(2);
        let grace = (duration / 3).max(1);
        let manager = LeaseManagerBuilder::new(client, &args.lease_name)
            .with_namespace(&args.lease_namespace)
            .with_identity(&identity)
            .with_duration(duration)
            .with_grace(grace)
            .with_create_mode(LeaseCreateMode::AutoCreate)
            .with_field_manager("cocoon-hibernation")
            .build()
            .await
            .map_err(|e| Error::Lease(e.to_string()))?;
        let (leading, handle) = manager.watch().await;
        let task = tokio::spawn(async move {
            match handle.await {
                Ok(Ok(_)) => tracing::info!("lease released"),
                Ok(Err(e)) => tracing::warn!(error = %e, "lease manager ended with an error"),
                Err(e) => tracing::warn!(error = %e, "lease manager task failed"),
            }
        });
        tracing::info!(
            identity,
            lease = args.lease_name,
            namespace = args.lease_namespace,
            "leader election started"
        );
        Ok(Self {
            leading,
            task: Some(task),
            // TODO(S1): driven by the elector's renewals.
            fence: Fence::unfenced(),
            _always: None,
        })
    }
}
