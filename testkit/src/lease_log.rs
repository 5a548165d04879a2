//! Test support: every version of one Lease, as a watch delivers them, so a test can
//! compare a takeover with the times the holders wrote (wall clock, same machine).

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::task::JoinHandle;

/// One version of the Lease.
#[derive(Clone, Debug)]
pub struct Record {
    pub holder: String,
    pub renew: Option<jiff::Timestamp>,
    pub acquire: Option<jiff::Timestamp>,
    pub duration: Duration,
    pub resource_version: String,
}

impl Record {
    /// renewTime + leaseDurationSeconds: when the record expires for a follower that saw
    /// it as soon as it was written.
    pub fn expiry(&self) -> Option<jiff::Timestamp> {
        let d = jiff::SignedDuration::try_from(self.duration).ok()?;
        self.renew?.checked_add(d).ok()
    }
}

/// Watches one Lease in the background. Stops on drop.
pub struct LeaseLog {
    records: Arc<Mutex<Vec<Record>>>,
    task: JoinHandle<()>,
}

impl Drop for LeaseLog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl LeaseLog {
    pub fn start(client: &kube::Client, namespace: &str, name: &str) -> Self {
        let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
        let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let records = Arc::new(Mutex::new(Vec::<Record>::new()));
        let sink = records.clone();
        let task = tokio::spawn(async move {
            let stream = watcher(api, cfg).applied_objects();
            futures::pin_mut!(stream);
            while let Some(item) = stream.next().await {
                let Ok(lease) = item else { continue };
                let spec = lease.spec.unwrap_or_default();
                let record = Record {
                    holder: spec.holder_identity.unwrap_or_default(),
                    renew: spec.renew_time.map(|t| t.0),
                    acquire: spec.acquire_time.map(|t| t.0),
                    duration: Duration::from_secs(
                        spec.lease_duration_seconds.unwrap_or(0).max(0) as u64
                    ),
                    resource_version: lease.metadata.resource_version.unwrap_or_default(),
                };
                let mut all = sink.lock().unwrap();
                // A relist repeats the current version.
                if all.last().map(|r| &r.resource_version) != Some(&record.resource_version) {
                    all.push(record);
                }
            }
        });
        Self { records, task }
    }

    pub fn records(&self) -> Vec<Record> {
        self.records.lock().unwrap().clone()
    }

    /// The last version written while `holder` held it.
    pub fn last_held_by(&self, holder: &str) -> Option<Record> {
        self.records()
            .into_iter()
            .rev()
            .find(|r| r.holder == holder)
    }

    /// The first version written while `holder` held it.
    pub fn first_held_by(&self, holder: &str) -> Option<Record> {
        self.records().into_iter().find(|r| r.holder == holder)
    }
}
