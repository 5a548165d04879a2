//! Activity reports (Q4, I2): traffic that moved bytes renews the pod's activity Lease, at
//! most once per VM per [`COALESCE`]. Traffic inside that window is not dropped: it is
//! written when the window ends, so a restart loses no activity older than that (Q6).

use super::hold::VmKey;
use super::metrics::ProxyMetrics;
use crate::api::activity::{ACTIVITY_FOR, COALESCE, lease_name, report_patch};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often owed reports are looked for.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// Which reports to write when. Pure: the caller passes the time.
#[derive(Debug)]
pub struct Coalescer {
    every: Duration,
    last: HashMap<VmKey, Instant>,
    owed: HashSet<VmKey>,
}

impl Coalescer {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: HashMap::new(),
            owed: HashSet::new(),
        }
    }

    /// Traffic for `key` at `now`: `true` when a report is to be written now; otherwise
    /// one is owed for the window's end.
    pub fn note(&mut self, key: &VmKey, now: Instant) -> bool {
        match self.last.get(key) {
            Some(at) if now.duration_since(*at) < self.every => {
                self.owed.insert(key.clone());
                false
            }
            _ => {
                self.last.insert(key.clone(), now);
                self.owed.remove(key);
                true
            }
        }
    }

    /// Every owed report, whatever its window.
    pub fn drain(&mut self) -> Vec<VmKey> {
        self.owed.drain().collect()
    }

    /// The owed reports whose window ended by `now`, marked written.
    pub fn due(&mut self, now: Instant) -> Vec<VmKey> {
        let due: Vec<VmKey> = self
            .owed
            .iter()
            .filter(|k| {
                self.last
                    .get(*k)
                    .is_none_or(|at| now.duration_since(*at) >= self.every)
            })
            .cloned()
            .collect();
        for k in &due {
            self.owed.remove(k);
            self.last.insert(k.clone(), now);
        }
        // Forget VMs quiet for a while: the map stays the size of the busy set.
        let every = self.every;
        self.last
            .retain(|k, at| now.duration_since(*at) < every * 6 || self.owed.contains(k));
        due
    }
}

/// Writes the reports.
#[derive(Clone)]
pub struct Reporter {
    client: kube::Client,
    holder: String,
    metrics: ProxyMetrics,
    coalescer: Arc<Mutex<Coalescer>>,
}

impl Reporter {
    pub fn new(client: kube::Client, holder: String, metrics: ProxyMetrics) -> Self {
        Self {
            client,
            holder,
            metrics,
            coalescer: Arc::new(Mutex::new(Coalescer::new(COALESCE))),
        }
    }

    /// Traffic for the pod moved bytes now.
    pub fn note(&self, key: &VmKey) {
        if self.coalescer.lock().note(key, Instant::now()) {
            let me = self.clone();
            let key = key.clone();
            tokio::spawn(async move { me.write(&key).await });
        }
    }

    /// Writes every owed report now (at exit: a restart loses no activity, Q6).
    pub async fn flush_all(&self) {
        let owed = self.coalescer.lock().drain();
        for key in owed {
            self.write(&key).await;
        }
    }

    /// Writes owed reports as their windows end; runs for the process's life.
    pub async fn flush_forever(self) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        loop {
            tick.tick().await;
            let due = self.coalescer.lock().due(Instant::now());
            for key in due {
                self.write(&key).await;
            }
        }
    }

    /// Renews the Lease, creating it when the pod has none yet.
    async fn write(&self, (ns, pod): &VmKey) {
        let Some(name) = lease_name(pod) else {
            return;
        };
        self.metrics.activity_reports.inc();
        let api: Api<Lease> = Api::namespaced(self.client.clone(), ns);
        let patch = report_patch(jiff::Timestamp::now(), &self.holder);
        let result = match api
            .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let mut lease: Lease = match serde_json::from_value(patch) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(%ns, %pod, error = %e, "activity report");
                        return;
                    }
                };
                lease.metadata = ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(ACTIVITY_FOR.to_owned(), label(pod))])),
                    ..ObjectMeta::default()
                };
                api.create(&PostParams::default(), &lease).await.map(|_| ())
            }
            other => other.map(|_| ()),
        };
        if let Err(e) = result {
            tracing::warn!(%ns, %pod, error = %e, "activity report not written");
        }
    }
}

/// The pod name as a label value (at most 63 characters; the Lease name is the link).
fn label(pod: &str) -> String {
    pod.chars().take(63).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: &str) -> VmKey {
        ("ns".into(), p.into())
    }

    /// SPEC Q4, Q6: the first traffic reports at once; more within 10 s is owed, not written,
    /// and is written when the window ends; another VM has its own window.
    #[tokio::test(start_paused = true)]
    async fn q4_q6_reports_coalesce_per_vm_and_owed_ones_are_written_later() {
        let mut c = Coalescer::new(COALESCE);
        let t0 = Instant::now();
        assert!(c.note(&key("a"), t0));
        assert!(!c.note(&key("a"), t0 + Duration::from_secs(3)));
        assert!(c.note(&key("b"), t0 + Duration::from_secs(3)));
        assert!(c.due(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(c.due(t0 + Duration::from_secs(10)), vec![key("a")]);
        // Written at 10 s: the next window starts there.
        assert!(!c.note(&key("a"), t0 + Duration::from_secs(15)));
        assert!(c.note(&key("a"), t0 + Duration::from_secs(20)));
        assert!(c.due(t0 + Duration::from_secs(40)).is_empty());
        // Q6: at exit, what is owed is written at once.
        assert!(c.note(&key("c"), t0 + Duration::from_secs(41)));
        assert!(!c.note(&key("c"), t0 + Duration::from_secs(42)));
        assert_eq!(c.drain(), vec![key("c")]);
        assert!(c.drain().is_empty());
    }

    /// SPEC Q4: at most one write per VM per 10 s, whatever the traffic.
    #[tokio::test(start_paused = true)]
    async fn q4_at_most_one_write_per_window_under_steady_traffic() {
        let mut c = Coalescer::new(COALESCE);
        let t0 = Instant::now();
        let mut writes = 0;
        for ms in (0..60_000).step_by(100) {
            let now = t0 + Duration::from_millis(ms);
            writes += usize::from(c.note(&key("a"), now));
            writes += c.due(now).len();
        }
        assert_eq!(writes, 6, "one per 10 s over a minute");
    }
}
