//! `status`'s idle columns (I6): for a pod an idle policy selects, its last activity (the
//! activity Lease's `renewTime`), its busy mark, and when it would sleep. The instant is
//! the one the policy computes (`cocoon_api::activity::idle_at`, then `minAwake`); the
//! policy's status keeps only counts and the soonest instant, so per-pod figures are read
//! here from the Leases rather than stored on the policy.

use super::view::CrView;
use cocoon_api::activity::{idle_at, later, lease_name};
use cocoon_api::idle::{CocoonIdlePolicy, IDLE_AT, IDLE_DESIRE, IDLE_UID};
use cocoon_api::parse_duration;
use cocoon_api::schedule::{OVERRIDE_UNTIL, SCHEDULE_DESIRE, SCHEDULE_UID};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::core::{PartialObjectMeta, Selector, SelectorExt};
use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

/// I1: `minAwake` when a policy names none (as the policy reads it).
const DEFAULT_MIN_AWAKE: Duration = Duration::from_secs(5 * 60);

/// The policy driving a pod, as far as its sleep goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Driver {
    pub uid: String,
    pub idle_after: Duration,
    pub min_awake: Duration,
    pub suspend: bool,
}

/// The pod's activity Lease, as the policy reads it.
pub use cocoon_api::activity::Record;

/// When the pod would sleep.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sleep {
    /// Its desire is `Hibernate` already.
    Asleep,
    /// A person's CR (never adopted) or an override ahead: the policy leaves it alone.
    Overridden,
    /// The schedule keeps it asleep or another idle policy drives its CR.
    NotThePolicys,
    Suspended,
    /// No activity Lease yet: the policy makes one on its next pass.
    NoRecord,
    /// A proxied connection is open.
    ConnectionOpen,
    /// The busy mark is ahead; the instant is when it would sleep after it.
    Busy(Timestamp),
    /// It would sleep then (or now, when past: the next pass flips it).
    At(Timestamp),
}

impl Sleep {
    pub fn show(&self, now: Timestamp) -> String {
        match self {
            Sleep::Asleep => "asleep".into(),
            Sleep::Overridden => "overridden".into(),
            Sleep::NotThePolicys => "not this policy's".into(),
            Sleep::Suspended => "suspended".into(),
            Sleep::NoRecord => "no activity record yet".into(),
            Sleep::ConnectionOpen => "awake: connection open".into(),
            Sleep::Busy(_) => "awake: busy".into(),
            Sleep::At(at) if *at <= now => "due now".into(),
            Sleep::At(at) => format!("in {}", super::table::age(Some(now), *at)),
        }
    }
}

/// I3 I4 I5: when the pod of `cr` would sleep under `driver`, as the policy's plan
/// decides it (pure).
pub fn sleep(cr: &CrView, driver: &Driver, record: Option<&Record>, now: Timestamp) -> Sleep {
    let ann = |k: &str| cr.annotations.get(k).map(String::as_str);
    if cr.desire == "Hibernate" {
        return Sleep::Asleep;
    }
    let ours = ann(IDLE_UID) == Some(driver.uid.as_str());
    if ann(IDLE_UID).is_some() && !ours {
        return Sleep::NotThePolicys;
    }
    if !ours && ann(SCHEDULE_UID).is_none() {
        return Sleep::Overridden;
    }
    let override_until = ann(OVERRIDE_UNTIL).and_then(|u| u.parse::<Timestamp>().ok());
    if override_until.is_some_and(|u| now < u) {
        return Sleep::Overridden;
    }
    if ann(SCHEDULE_UID).is_some() && ann(SCHEDULE_DESIRE) != Some("Wake") {
        return Sleep::NotThePolicys;
    }
    if driver.suspend {
        return Sleep::Suspended;
    }
    let Some(record) = record else {
        return Sleep::NoRecord;
    };
    if record.open_connections > 0 {
        return Sleep::ConnectionOpen;
    }
    let mut at = idle_at(
        record.last,
        cr.woken_at,
        record.busy_until,
        driver.idle_after,
    );
    if let Some(woken) = cr.woken_at {
        at = at.max(later(woken, driver.min_awake));
    }
    // I5: one idle hibernate per pod per minAwake.
    if ours
        && ann(IDLE_DESIRE) == Some("Hibernate")
        && let Some(mark) = ann(IDLE_AT).and_then(|a| a.parse::<Timestamp>().ok())
    {
        at = at.max(later(mark, driver.min_awake));
    }
    match record.busy_until {
        Some(busy) if now < busy => Sleep::Busy(at),
        _ => Sleep::At(at),
    }
}

/// I2: the Lease as the policy reads it.
pub fn record(lease: &Lease) -> Record {
    cocoon_api::activity::record(lease)
}

/// The three columns for one CR: last activity, busy mark, sleep. Empty when no policy
/// selects its pod.
pub type Columns = [String; 3];

/// What the idle columns are computed from, fetched.
#[derive(Default)]
pub struct Fetched {
    pub policies: Vec<CocoonIdlePolicy>,
    pub pods: Vec<PartialObjectMeta<Pod>>,
    pub leases: Vec<Lease>,
}

/// The columns for each CR (by `namespace/name`), when any policy is in scope (pure).
pub fn columns(crs: &[CrView], f: &Fetched, now: Timestamp) -> HashMap<String, Columns> {
    let empty = BTreeMap::new();
    let labels: HashMap<(String, String), &BTreeMap<String, String>> = f
        .pods
        .iter()
        .map(|p| {
            let key = (p.namespace().unwrap_or_default(), p.name_any());
            (key, p.metadata.labels.as_ref().unwrap_or(&empty))
        })
        .collect();
    let leases: HashMap<(String, String), &Lease> = f
        .leases
        .iter()
        .map(|l| ((l.namespace().unwrap_or_default(), l.name_any()), l))
        .collect();
    let mut out = HashMap::new();
    for cr in crs {
        let Some(labels) = labels.get(&(cr.namespace.clone(), cr.pod.clone())) else {
            continue;
        };
        let Some(driver) = driver(&f.policies, &cr.namespace, labels) else {
            continue;
        };
        let record = lease_name(&cr.pod)
            .and_then(|n| leases.get(&(cr.namespace.clone(), n)))
            .map(|l| record(l));
        let last = record
            .as_ref()
            .and_then(|r| r.last)
            .map_or_else(String::new, |t| {
                format!("{} ago", super::table::age(Some(t), now))
            });
        let busy = record
            .as_ref()
            .and_then(|r| r.busy_until)
            .filter(|b| now < *b)
            .map_or_else(String::new, |b| {
                format!("for {}", super::table::age(Some(now), b))
            });
        let sleep = sleep(cr, &driver, record.as_ref(), now).show(now);
        out.insert(cr.key(), [last, busy, sleep]);
    }
    out
}

/// I4: of the live policies of `namespace` selecting these labels, the oldest drives.
fn driver(
    policies: &[CocoonIdlePolicy],
    namespace: &str,
    labels: &BTreeMap<String, String>,
) -> Option<Driver> {
    let p = policies
        .iter()
        .filter(|p| p.namespace().as_deref() == Some(namespace))
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| Selector::try_from(p.spec.selector.clone()).is_ok_and(|s| s.matches(labels)))
        .min_by_key(|p| {
            let at = p
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::MAX, |t| t.0);
            (at, p.name_any())
        })?;
    Some(Driver {
        uid: p.uid().unwrap_or_default(),
        idle_after: parse_duration(&p.spec.idle_after).ok()?,
        min_awake: p
            .spec
            .min_awake
            .as_deref()
            .map_or(Ok(DEFAULT_MIN_AWAKE), parse_duration)
            .ok()?,
        suspend: p.spec.suspend,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cocoon_api::activity::BUSY_UNTIL;
    use rstest::rstest;
    use serde_json::json;

    fn t(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    const NOW: &str = "2026-06-10T12:00:00Z";

    fn cr(desire: &str, annotations: serde_json::Value, woken: Option<&str>) -> CrView {
        CrView::from_json(&json!({
            "metadata": {"namespace": "dev", "name": "web-0", "annotations": annotations},
            "spec": {"podRef": {"name": "web-0"}, "desire": desire},
            "status": {"phase": "Active", "wokenAt": woken},
        }))
    }

    fn driver() -> Driver {
        Driver {
            uid: "u-1".into(),
            idle_after: Duration::from_secs(30 * 60),
            min_awake: Duration::from_secs(5 * 60),
            suspend: false,
        }
    }

    fn ours() -> serde_json::Value {
        json!({IDLE_UID: "u-1", IDLE_DESIRE: "Wake"})
    }

    fn rec(last: &str, busy: Option<&str>, open: u32) -> Option<Record> {
        Some(Record {
            last: Some(t(last)),
            busy_until: busy.map(t),
            open_connections: open,
        })
    }

    /// SPEC I6 I3 I4 I5: when a pod would sleep, as the policy's plan decides it: the
    /// last activity plus idleAfter, the later wake or busy mark, minAwake after a wake
    /// or after the policy's last hibernate, and the cases the policy leaves alone.
    #[rstest]
    #[case::idle_after_past_last_activity(
        cr("Wake", ours(), None),
        rec("2026-06-10T11:50:00Z", None, 0),
        Sleep::At(t("2026-06-10T12:20:00Z")),
        "in 20m"
    )]
    #[case::past_is_due(
        cr("Wake", ours(), None),
        rec("2026-06-10T11:00:00Z", None, 0),
        Sleep::At(t("2026-06-10T11:30:00Z")),
        "due now"
    )]
    #[case::a_later_wake_counts(
        cr("Wake", ours(), Some("2026-06-10T11:55:00Z")),
        rec("2026-06-10T11:00:00Z", None, 0),
        Sleep::At(t("2026-06-10T12:25:00Z")),
        "in 25m"
    )]
    #[case::busy_mark_ahead(
        cr("Wake", ours(), None),
        rec("2026-06-10T11:59:00Z", Some("2026-06-10T14:00:00Z"), 0),
        Sleep::Busy(t("2026-06-10T14:30:00Z")),
        "awake: busy"
    )]
    #[case::connection_open(
        cr("Wake", ours(), None),
        rec("2026-06-10T10:00:00Z", None, 2),
        Sleep::ConnectionOpen,
        "awake: connection open"
    )]
    #[case::min_awake_after_the_last_idle_hibernate(cr("Wake", json!({IDLE_UID: "u-1", IDLE_DESIRE: "Hibernate", IDLE_AT: "2026-06-10T11:58:00Z"}), None), rec("2026-06-10T11:00:00Z", None, 0), Sleep::At(t("2026-06-10T12:03:00Z")), "in 3m")]
    #[case::a_persons_cr(cr("Wake", json!({}), None), rec("2026-06-10T11:00:00Z", None, 0), Sleep::Overridden, "overridden")]
    #[case::override_ahead(cr("Wake", json!({IDLE_UID: "u-1", OVERRIDE_UNTIL: "2026-06-10T13:00:00Z"}), None), rec("2026-06-10T11:00:00Z", None, 0), Sleep::Overridden, "overridden")]
    #[case::schedule_keeps_it_asleep(cr("Wake", json!({SCHEDULE_UID: "s-1", SCHEDULE_DESIRE: "Hibernate"}), None), rec("2026-06-10T11:00:00Z", None, 0), Sleep::NotThePolicys, "not this policy's")]
    #[case::schedule_awake_window(cr("Wake", json!({SCHEDULE_UID: "s-1", SCHEDULE_DESIRE: "Wake"}), None), rec("2026-06-10T11:50:00Z", None, 0), Sleep::At(t("2026-06-10T12:20:00Z")), "in 20m")]
    #[case::another_policys(cr("Wake", json!({IDLE_UID: "u-2"}), None), rec("2026-06-10T11:00:00Z", None, 0), Sleep::NotThePolicys, "not this policy's")]
    #[case::asleep(
        cr("Hibernate", ours(), None),
        rec("2026-06-10T11:00:00Z", None, 0),
        Sleep::Asleep,
        "asleep"
    )]
    #[case::no_lease(
        cr("Wake", ours(), None),
        None,
        Sleep::NoRecord,
        "no activity record yet"
    )]
    fn i6_status_shows_when_the_pod_would_sleep(
        #[case] cr: CrView,
        #[case] record: Option<Record>,
        #[case] want: Sleep,
        #[case] shown: &str,
    ) {
        let got = sleep(&cr, &driver(), record.as_ref(), t(NOW));
        assert_eq!(got, want);
        assert_eq!(got.show(t(NOW)), shown);
    }

    /// SPEC I6: a suspended policy says so.
    #[test]
    fn i6_suspended_policy() {
        let d = Driver {
            suspend: true,
            ..driver()
        };
        let r = rec("2026-06-10T11:00:00Z", None, 0);
        assert_eq!(
            sleep(&cr("Wake", ours(), None), &d, r.as_ref(), t(NOW)),
            Sleep::Suspended
        );
    }

    fn policy(name: &str, created: &str, uid: &str, labels: serde_json::Value) -> CocoonIdlePolicy {
        serde_json::from_value(json!({
            "apiVersion": "cocoonset.cocoonstack.io/v1alpha1", "kind": "CocoonIdlePolicy",
            "metadata": {"name": name, "namespace": "dev", "uid": uid, "creationTimestamp": created},
            "spec": {"selector": {"matchLabels": labels}, "idleAfter": "30m", "minAwake": "1m"},
        }))
        .unwrap()
    }

    /// SPEC I6 I4: the columns come from the oldest policy selecting the pod and the
    /// pod's Lease; a pod no policy selects gets none.
    #[test]
    fn i6_columns_from_the_driving_policy_and_the_lease() {
        let pod = |name: &str, tier: &str| -> PartialObjectMeta<Pod> {
            serde_json::from_value(json!({
                "apiVersion": "meta.k8s.io/v1", "kind": "PartialObjectMetadata",
                "metadata": {"name": name, "namespace": "dev", "labels": {"tier": tier}},
            }))
            .unwrap()
        };
        let lease: Lease = serde_json::from_value(json!({
            "metadata": {"name": "cocoon-activity-web-0", "namespace": "dev",
                "annotations": {BUSY_UNTIL: "2026-06-10T13:00:00Z"}},
            "spec": {"renewTime": "2026-06-10T11:57:00.000000Z"},
        }))
        .unwrap();
        let f = Fetched {
            policies: vec![
                policy(
                    "young",
                    "2026-06-02T00:00:00Z",
                    "u-2",
                    json!({"tier": "dev"}),
                ),
                policy("old", "2026-06-01T00:00:00Z", "u-1", json!({"tier": "dev"})),
            ],
            pods: vec![pod("web-0", "dev"), pod("db-0", "prod")],
            leases: vec![lease],
        };
        let mut other = cr("Wake", ours(), None);
        other.name = "db-0".into();
        other.pod = "db-0".into();
        let cols = columns(&[cr("Wake", ours(), None), other], &f, t(NOW));
        assert_eq!(
            cols.get("dev/web-0").unwrap(),
            &["3m ago".to_string(), "for 60m".into(), "awake: busy".into()]
        );
        assert!(!cols.contains_key("dev/db-0"), "no policy selects db-0");
    }
}
