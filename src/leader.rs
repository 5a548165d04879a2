//! Leader election on a Lease (P2): every replica serves the webhook and keeps its cache
//! warm; only the holder reconciles.

use crate::config::ElectionArgs;
use crate::error::{Error, Result};
use kube_lease_manager::{LeaseCreateMode, LeaseManagerBuilder};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A running election. Dropping `leading` (the receiver) makes the manager release the
/// lease and exit; await `task` to know it is released (P4).
pub struct Election {
    pub leading: watch::Receiver<bool>,
    pub task: Option<JoinHandle<()>>,
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
            _always: None,
        })
    }
}
