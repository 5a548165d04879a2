//! Activity reports (Q4, I2): traffic that moved bytes renews the pod's activity Lease, at
//! most once per VM per [`COALESCE`]. Traffic inside that window is not dropped: it is
//! written when the window ends, so a restart loses no activity older than that (Q6).

use super::hold::VmKey;
use super::metrics::ProxyMetrics;
use crate::api::activity::{ACTIVITY_FOR, COALESCE, OPEN_CONNECTIONS, lease_name, report_patch};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use parking_lot::Mutex;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// How often owed reports are looked for.
const FLUSH_EVERY: Duration = Duration::from_secs(1);

/// One Lease write: the activity it reports (`renewTime`), and the open-connections count
/// when that changed since the last write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub key: VmKey,
    pub activity: bool,
    pub open: Option<u32>,
}

/// What one VM owes and has written.
#[derive(Debug, Default)]
struct VmState {
    last: Option<Instant>,
    activity_owed: bool,
    open: u32,
    written_open: u32,
    /// The last count's write failed: the count is owed whatever it is now.
    count_unwritten: bool,
    /// A write is on its way; the next waits for it, so counts land in order.
    in_flight: bool,
}

impl VmState {
    fn owes(&self) -> bool {
        self.activity_owed || self.count_unwritten || self.open != self.written_open
    }
}

/// Which reports to write when: at most one write per VM per window, whatever changed.
/// Pure: the caller passes the time.
#[derive(Debug)]
pub struct Coalescer {
    every: Duration,
    vms: HashMap<VmKey, VmState>,
}

impl Coalescer {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            vms: HashMap::new(),
        }
    }

    /// Traffic for `key` at `now`: the report to write now, if its window is free;
    /// otherwise one is owed for the window's end.
    pub fn note(&mut self, key: &VmKey, now: Instant) -> Option<Report> {
        let every = self.every;
        let vm = self.vm(key)?;
        vm.activity_owed = true;
        take_if_free(key, vm, now, every)
    }

    /// A connection to `key` opened (`true`) or closed at `now` (I3): the report to write
    /// now, if its window is free; otherwise the new count is owed.
    pub fn open_changed(&mut self, key: &VmKey, opened: bool, now: Instant) -> Option<Report> {
        let every = self.every;
        let vm = self.vm(key)?;
        vm.open = if opened {
            vm.open.saturating_add(1)
        } else {
            vm.open.saturating_sub(1)
        };
        take_if_free(key, vm, now, every)
    }

    /// The VM's state; the key is cloned only for a VM not yet known (the warm path
    /// allocates nothing here).
    fn vm(&mut self, key: &VmKey) -> Option<&mut VmState> {
        if !self.vms.contains_key(key) {
            self.vms.insert(key.clone(), VmState::default());
        }
        self.vms.get_mut(key)
    }

    /// The write taken for `key` ended; one that failed is owed again, with the latest
    /// count (I3: a lost 0 would keep the pod awake for ever).
    pub fn settled(&mut self, report: &Report, written: bool) {
        if let Some(vm) = self.vms.get_mut(&report.key) {
            vm.in_flight = false;
            if !written {
                vm.activity_owed |= report.activity;
                vm.count_unwritten |= report.open.is_some();
            }
        }
    }

    /// Open connections to `key` now.
    pub fn open(&self, key: &VmKey) -> u32 {
        self.vms.get(key).map_or(0, |v| v.open)
    }

    /// Every owed report, whatever its window; with `closing`, every count written is
    /// reported as zero (the process's connections end with it).
    pub fn drain(&mut self, closing: bool) -> Vec<Report> {
        let mut out = Vec::new();
        for (key, vm) in &mut self.vms {
            if closing {
                vm.open = 0;
            }
            if vm.owes() {
                out.push(take(key, vm, None));
            }
        }
        out
    }

    /// The owed reports whose window ended by `now`, marked written.
    pub fn due(&mut self, now: Instant) -> Vec<Report> {
        let every = self.every;
        let mut due = Vec::new();
        for (key, vm) in &mut self.vms {
            if let Some(r) = take_if_free(key, vm, now, every) {
                due.push(r);
            }
        }
        // Forget VMs quiet for a while: the map stays the size of the busy set.
        self.vms.retain(|_, vm| {
            vm.owes()
                || vm.in_flight
                || vm.open > 0
                || vm.written_open > 0
                || vm.last.is_some_and(|at| now.duration_since(at) < every * 6)
        });
        due
    }
}

/// The VM's owed report when its window is free at `now`, marked written.
fn take_if_free(key: &VmKey, vm: &mut VmState, now: Instant, every: Duration) -> Option<Report> {
    let free = !vm.in_flight && vm.last.is_none_or(|at| now.duration_since(at) >= every);
    (free && vm.owes()).then(|| take(key, vm, Some(now)))
}

fn take(key: &VmKey, vm: &mut VmState, now: Option<Instant>) -> Report {
    let open = (vm.count_unwritten || vm.open != vm.written_open).then_some(vm.open);
    let report = Report {
        key: key.clone(),
        activity: vm.activity_owed,
        open,
    };
    vm.activity_owed = false;
    vm.count_unwritten = false;
    vm.in_flight = true;
    vm.written_open = vm.open;
    if now.is_some() {
        vm.last = now;
    }
    report
}

/// The merge patch of one report: `renewTime` only for activity (a count alone is no
/// activity, Q4), the count as the Lease's annotation (I3).
pub fn patch(report: &Report, now: jiff::Timestamp, holder: &str) -> serde_json::Value {
    let mut patch = if report.activity {
        report_patch(now, holder)
    } else {
        serde_json::json!({})
    };
    if let Some(n) = report.open {
        patch["metadata"] =
            serde_json::json!({ "annotations": { OPEN_CONNECTIONS: n.to_string() } });
    }
    patch
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
        let report = self.coalescer.lock().note(key, Instant::now());
        self.spawn_write(report);
    }

    /// A connection to the pod is open (held, forwarded, a TCP session or an upgraded
    /// one) until the guard drops (I3).
    pub fn opened(&self, key: &VmKey) -> OpenGuard {
        let report = self
            .coalescer
            .lock()
            .open_changed(key, true, Instant::now());
        self.spawn_write(report);
        OpenGuard {
            reporter: self.clone(),
            key: key.clone(),
        }
    }

    fn spawn_write(&self, report: Option<Report>) {
        if let Some(report) = report {
            let me = self.clone();
            tokio::spawn(async move { me.write_and_settle(&report).await });
        }
    }

    /// Writes one report and tells the coalescer how it went, so a failed one is owed
    /// again and the VM's next write may start.
    async fn write_and_settle(&self, report: &Report) {
        let written = self.write(report).await;
        self.coalescer.lock().settled(report, written);
    }

    /// Writes every owed report now, open counts as zero (at exit: a restart loses no
    /// activity, Q6, and leaves no count that would keep a pod awake for ever, I3).
    pub async fn flush_all(&self) {
        let owed = self.coalescer.lock().drain(true);
        for report in owed {
            self.write_and_settle(&report).await;
        }
    }

    /// Writes owed reports as their windows end; runs for the process's life.
    pub async fn flush_forever(self) {
        let mut tick = tokio::time::interval(FLUSH_EVERY);
        loop {
            tick.tick().await;
            let due = self.coalescer.lock().due(Instant::now());
            for report in due {
                self.write_and_settle(&report).await;
            }
        }
    }

    /// Renews the Lease, creating it when the pod has none yet; whether it was written.
    async fn write(&self, report: &Report) -> bool {
        let (ns, pod) = &report.key;
        let Some(name) = lease_name(pod) else {
            return true;
        };
        self.metrics.activity_reports.inc();
        let api: Api<Lease> = Api::namespaced(self.client.clone(), ns);
        let patch = patch(report, jiff::Timestamp::now(), &self.holder);
        let params = PatchParams::default();
        let merge_patch = Patch::Merge(&patch);
        let merge = || api.patch(&name, &params, &merge_patch);
        let result = match merge().await {
            Err(kube::Error::Api(e)) if e.code == 404 => {
                let mut lease: Lease = match serde_json::from_value(patch.clone()) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::warn!(%ns, %pod, error = %e, "activity report");
                        return true;
                    }
                };
                lease.metadata = ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(ACTIVITY_FOR.to_owned(), label(pod))])),
                    annotations: report
                        .open
                        .map(|n| BTreeMap::from([(OPEN_CONNECTIONS.to_owned(), n.to_string())])),
                    ..ObjectMeta::default()
                };
                match api.create(&PostParams::default(), &lease).await {
                    // The idle policy made it meanwhile (I2): patch that one.
                    Err(kube::Error::Api(e)) if e.code == 409 => merge().await.map(|_| ()),
                    other => other.map(|_| ()),
                }
            }
            other => other.map(|_| ()),
        };
        match result {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(%ns, %pod, error = %e, "activity report not written; owed again");
                false
            }
        }
    }
}

/// Holds one open connection's place in its pod's count; dropping it closes it.
pub struct OpenGuard {
    reporter: Reporter,
    key: VmKey,
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        let report = self
            .reporter
            .coalescer
            .lock()
            .open_changed(&self.key, false, Instant::now());
        // A drop outside a runtime (at exit) leaves the count to `flush_all`.
        if tokio::runtime::Handle::try_current().is_ok() {
            self.reporter.spawn_write(report);
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
    use rstest::rstest;

    fn key(p: &str) -> VmKey {
        ("ns".into(), p.into())
    }

    fn activity(p: &str) -> Option<Report> {
        Some(Report {
            key: key(p),
            activity: true,
            open: None,
        })
    }

    /// A coalescer whose every write succeeds as soon as it is taken.
    struct Settling(Coalescer);

    impl Settling {
        fn new() -> Self {
            Self(Coalescer::new(COALESCE))
        }
        fn settle(&mut self, r: Option<Report>) -> Option<Report> {
            if let Some(r) = &r {
                self.0.settled(r, true);
            }
            r
        }
        fn note(&mut self, k: &VmKey, now: Instant) -> Option<Report> {
            let r = self.0.note(k, now);
            self.settle(r)
        }
        fn open_changed(&mut self, k: &VmKey, opened: bool, now: Instant) -> Option<Report> {
            let r = self.0.open_changed(k, opened, now);
            self.settle(r)
        }
        fn due(&mut self, now: Instant) -> Vec<Report> {
            let due = self.0.due(now);
            for r in &due {
                self.0.settled(r, true);
            }
            due
        }
    }

    impl std::ops::Deref for Settling {
        type Target = Coalescer;
        fn deref(&self) -> &Coalescer {
            &self.0
        }
    }

    impl std::ops::DerefMut for Settling {
        fn deref_mut(&mut self) -> &mut Coalescer {
            &mut self.0
        }
    }

    fn keys(reports: Vec<Report>) -> Vec<VmKey> {
        reports.into_iter().map(|r| r.key).collect()
    }

    /// SPEC Q4, Q6: the first traffic reports at once; more within 10 s is owed, not written,
    /// and is written when the window ends; another VM has its own window.
    #[tokio::test(start_paused = true)]
    async fn q4_q6_reports_coalesce_per_vm_and_owed_ones_are_written_later() {
        let mut c = Settling::new();
        let t0 = Instant::now();
        assert_eq!(c.note(&key("a"), t0), activity("a"));
        assert_eq!(c.note(&key("a"), t0 + Duration::from_secs(3)), None);
        assert_eq!(
            c.note(&key("b"), t0 + Duration::from_secs(3)),
            activity("b")
        );
        assert!(c.due(t0 + Duration::from_secs(9)).is_empty());
        assert_eq!(keys(c.due(t0 + Duration::from_secs(10))), vec![key("a")]);
        // Written at 10 s: the next window starts there.
        assert_eq!(c.note(&key("a"), t0 + Duration::from_secs(15)), None);
        assert!(c.note(&key("a"), t0 + Duration::from_secs(20)).is_some());
        assert!(c.due(t0 + Duration::from_secs(40)).is_empty());
        // Q6: at exit, what is owed is written at once.
        assert!(c.note(&key("c"), t0 + Duration::from_secs(41)).is_some());
        assert_eq!(c.note(&key("c"), t0 + Duration::from_secs(42)), None);
        assert_eq!(keys(c.drain(true)), vec![key("c")]);
        assert!(c.drain(true).is_empty());
    }

    /// SPEC Q4: at most one write per VM per 10 s, whatever the traffic.
    #[tokio::test(start_paused = true)]
    async fn q4_at_most_one_write_per_window_under_steady_traffic() {
        let mut c = Settling::new();
        let t0 = Instant::now();
        let mut writes = 0;
        for ms in (0..60_000).step_by(100) {
            let now = t0 + Duration::from_millis(ms);
            writes += usize::from(c.note(&key("a"), now).is_some());
            // Connections open and close too: still one write per window.
            writes += usize::from(c.open_changed(&key("a"), ms % 200 == 0, now).is_some());
            writes += c.due(now).len();
        }
        assert_eq!(writes, 6, "one per 10 s over a minute");
    }

    /// SPEC I3, Q4: the first connection's count is written at once, without renewing the
    /// activity (a count alone moved no bytes); counts changed inside a window are written
    /// at its end as the latest count; back to zero is written too, and a count that
    /// returned to the written one owes nothing.
    #[tokio::test(start_paused = true)]
    async fn i3_open_connections_are_reported_coalesced_and_back_to_zero() {
        let mut c = Settling::new();
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let open = |n: u32| Report {
            key: key("a"),
            activity: false,
            open: Some(n),
        };
        assert_eq!(c.open_changed(&key("a"), true, at(0)), Some(open(1)));
        assert_eq!(c.open_changed(&key("a"), true, at(1)), None);
        assert_eq!(c.open_changed(&key("a"), true, at(2)), None);
        assert_eq!(c.open(&key("a")), 3);
        assert_eq!(c.due(at(10)), vec![open(3)]);
        // Activity and a count in one window: one write carries both.
        assert_eq!(c.note(&key("a"), at(12)), None);
        assert_eq!(c.open_changed(&key("a"), false, at(13)), None);
        assert_eq!(
            c.due(at(20)),
            vec![Report {
                key: key("a"),
                activity: true,
                open: Some(2)
            }]
        );
        // 2 -> 1 -> 2 inside a window: nothing owed.
        assert_eq!(c.open_changed(&key("a"), false, at(21)), None);
        assert_eq!(c.open_changed(&key("a"), true, at(22)), None);
        assert!(c.due(at(30)).is_empty());
        // A window free again: written at once; the next change waits for its end.
        assert_eq!(c.open_changed(&key("a"), false, at(31)), Some(open(1)));
        assert_eq!(c.open_changed(&key("a"), false, at(32)), None);
        assert!(c.due(at(40)).is_empty());
        assert_eq!(c.due(at(41)), vec![open(0)]);
        // Quiet since: forgotten, and no write owed.
        assert!(c.due(at(200)).is_empty());
        assert!(c.vms.is_empty());
    }

    /// SPEC I3, Q4, Q6: a write that failed (an apiserver error, a Lease the policy made
    /// first) is owed again, the latest count included, so a count of 0 is never lost and
    /// keeps no pod awake for ever.
    #[tokio::test(start_paused = true)]
    async fn i3_q6_a_failed_write_is_owed_again() {
        let mut c = Coalescer::new(COALESCE);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let count = |n: u32, activity: bool| Report {
            key: key("a"),
            activity,
            open: Some(n),
        };
        let first = c.note(&key("a"), at(0));
        assert_eq!(first, activity("a"));
        c.settled(&count(0, true), true);
        assert_eq!(
            c.open_changed(&key("a"), true, at(10)),
            Some(count(1, false))
        );
        c.settled(&count(1, false), false);
        assert_eq!(c.open_changed(&key("a"), false, at(11)), None);
        assert_eq!(
            c.due(at(20)),
            vec![count(0, false)],
            "the count the failed write carried is owed, as its latest value"
        );
        c.settled(&count(0, false), false);
        assert_eq!(c.note(&key("a"), at(25)), None);
        assert_eq!(
            c.due(at(30)),
            vec![count(0, true)],
            "failed twice: the count is still owed, with the activity since"
        );
        c.settled(&count(0, true), true);
        assert!(c.due(at(45)).is_empty(), "written: nothing owed");
    }

    /// SPEC I3, Q4: one write per VM in flight. A write still on its way when its window
    /// ends holds back the next, so an older count can never land after a newer one.
    #[tokio::test(start_paused = true)]
    async fn i3_a_slow_write_is_never_overtaken_by_a_newer_count() {
        let mut c = Coalescer::new(COALESCE);
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let first = c
            .open_changed(&key("a"), true, at(0))
            .expect("the first count is written at once");
        assert_eq!(c.open_changed(&key("a"), false, at(1)), None);
        assert!(
            c.due(at(12)).is_empty(),
            "the first write is still in flight"
        );
        assert_eq!(c.open_changed(&key("a"), true, at(13)), None);
        assert_eq!(c.open_changed(&key("a"), false, at(14)), None);
        c.settled(&first, true);
        let second = c.due(at(15));
        assert_eq!(
            second,
            vec![Report {
                key: key("a"),
                activity: false,
                open: Some(0)
            }]
        );
        // Forgotten only once nothing is in flight.
        assert!(c.due(at(200)).is_empty());
        assert_eq!(c.vms.len(), 1, "in flight: kept");
        c.settled(&second[0], true);
        assert!(c.due(at(400)).is_empty());
        assert!(c.vms.is_empty());
    }

    /// SPEC I3: at exit every count written is reported as zero, so a stopped proxy keeps
    /// no pod awake; a count never written owes nothing.
    #[tokio::test(start_paused = true)]
    async fn i3_exit_writes_open_counts_as_zero() {
        let mut c = Settling::new();
        let t0 = Instant::now();
        assert!(c.open_changed(&key("a"), true, t0).is_some());
        assert!(c.open_changed(&key("b"), true, t0).is_some());
        assert_eq!(c.open_changed(&key("b"), false, t0), None);
        let mut out = c.drain(true);
        out.sort_by(|x, y| x.key.cmp(&y.key));
        assert_eq!(
            out,
            vec![
                Report {
                    key: key("a"),
                    activity: false,
                    open: Some(0)
                },
                Report {
                    key: key("b"),
                    activity: false,
                    open: Some(0)
                },
            ]
        );
    }

    /// SPEC I3, Q4: what one write patches.
    #[rstest]
    #[case::activity_only(true, None, true, None)]
    #[case::count_only(false, Some(2), false, Some("2"))]
    #[case::both(true, Some(0), true, Some("0"))]
    fn i3_q4_report_patch(
        #[case] activity: bool,
        #[case] open: Option<u32>,
        #[case] renews: bool,
        #[case] count: Option<&str>,
    ) {
        let report = Report {
            key: key("a"),
            activity,
            open,
        };
        let p = patch(&report, jiff::Timestamp::UNIX_EPOCH, "wake-proxy");
        assert_eq!(p["spec"]["renewTime"].is_string(), renews, "{p}");
        assert_eq!(
            p["metadata"]["annotations"][OPEN_CONNECTIONS].as_str(),
            count,
            "{p}"
        );
    }
}
