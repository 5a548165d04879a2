//! The activity record (SPEC I2): one `coordination.k8s.io` Lease per VM pod, in the pod's
//! namespace, whose `spec.renewTime` is the pod's last activity. The idle policy reads it
//! and fences its decision on it (I3); the wake proxy, agents' heartbeats and `kubectl
//! cocoon keepalive` write it. A Lease because RBAC on one Lease is the narrowest grant
//! that lets an agent report, and one `kubectl`/`curl` update is a heartbeat.

use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use serde_json::{Value, json};
use std::time::Duration;

/// The Lease name is this prefix and the pod's name.
pub const LEASE_PREFIX: &str = "cocoon-activity-";
/// Label on the Lease naming its pod (label values stop at 63 characters; the name is
/// the authoritative link, this one is for `kubectl get lease -l`).
pub const ACTIVITY_FOR: &str = "cocoonset.cocoonstack.io/activity-for";
/// Annotation on the Lease: RFC 3339 instant until which the pod counts as busy
/// (`kubectl cocoon keepalive POD --for 2h`).
pub const BUSY_UNTIL: &str = "cocoonset.cocoonstack.io/busy-until";
/// Annotation on the Lease, set by the wake proxy: how many proxied connections to the
/// pod are open now (a decimal count; absent or `0`: none). An open one keeps the pod
/// awake whatever the last activity (I3).
pub const OPEN_CONNECTIONS: &str = "cocoonset.cocoonstack.io/open-connections";
/// Annotation on the Lease: the RFC 3339 instant of the idle decision that took it (I3).
/// The take leaves `renewTime` alone, so it is never mistaken for activity.
pub const IDLE_DECISION: &str = "cocoonset.cocoonstack.io/idle-decision";
/// One reporter writes at most once per VM per this long (I2, Q4).
pub const COALESCE: Duration = Duration::from_secs(10);
/// Object names are DNS subdomains: at most 253 characters.
const MAX_NAME: usize = 253;

/// The activity Lease's name for `pod`, or `None` when the prefixed name would exceed
/// the apiserver's limit (such a pod cannot be managed by an idle policy, and says so).
pub fn lease_name(pod: &str) -> Option<String> {
    let name = format!("{LEASE_PREFIX}{pod}");
    (name.len() <= MAX_NAME).then_some(name)
}

/// The merge patch one activity report writes: the last activity and who reported it.
/// It carries no resourceVersion: reports never conflict with each other, and any report
/// changes the resourceVersion the idle decision was fenced on (I3).
pub fn report_patch(now: Timestamp, holder: &str) -> Value {
    json!({
        "spec": {
            "renewTime": MicroTime(now),
            "holderIdentity": holder,
        }
    })
}

/// I3: the instant a pod turns idle: `idle_after` past the latest of its last activity,
/// its last wake and its busy mark. Shared by the policy's plan and the plugin's status,
/// so the two never disagree.
pub fn idle_at(
    last: Option<Timestamp>,
    woken_at: Option<Timestamp>,
    busy_until: Option<Timestamp>,
    idle_after: Duration,
) -> Timestamp {
    let latest = [last, woken_at, busy_until]
        .into_iter()
        .flatten()
        .max()
        .unwrap_or(Timestamp::UNIX_EPOCH);
    later(latest, idle_after)
}

/// `at` plus `d`, saturating at the end of time.
pub fn later(at: Timestamp, d: Duration) -> Timestamp {
    jiff::SignedDuration::try_from(d)
        .ok()
        .and_then(|d| at.checked_add(d).ok())
        .unwrap_or(Timestamp::MAX)
}

/// The activity record as the idle policy (and `kubectl cocoon status`) reads it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Record {
    /// `spec.renewTime`: the last report.
    pub last: Option<Timestamp>,
    /// The busy mark (`kubectl cocoon keepalive`).
    pub busy_until: Option<Timestamp>,
    /// Connections the wake proxy holds open to the pod now (Q4).
    pub open_connections: u32,
}

/// I2: a Lease read as the record. An unreadable annotation counts as absent, except an
/// open-connections count, which counts as open: a pod is never put to sleep on a value
/// nobody can read.
pub fn record(lease: &Lease) -> Record {
    let ann = |k: &str| {
        lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(k))
            .map(String::as_str)
    };
    Record {
        last: lease
            .spec
            .as_ref()
            .and_then(|s| s.renew_time.as_ref())
            .map(|t| t.0),
        busy_until: ann(BUSY_UNTIL).and_then(|b| b.parse().ok()),
        open_connections: ann(OPEN_CONNECTIONS).map_or(0, |n| n.trim().parse().unwrap_or(1)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// I2: the Lease is named after the pod, and a name the apiserver would refuse is
    /// reported, not truncated onto another pod's record.
    #[test]
    fn i2_lease_name_is_prefixed_pod_name_within_the_limit() {
        assert_eq!(
            lease_name("web-0").as_deref(),
            Some("cocoon-activity-web-0")
        );
        let longest = "a".repeat(MAX_NAME - LEASE_PREFIX.len());
        assert_eq!(lease_name(&longest).map(|n| n.len()), Some(MAX_NAME));
        assert_eq!(lease_name(&format!("{longest}a")), None);
    }

    /// I3: the latest of activity, wake and busy mark counts; none is the epoch.
    #[test]
    fn i3_idle_at_counts_from_the_latest_mark() {
        let t = |s: i64| Timestamp::from_second(s).unwrap_or(Timestamp::UNIX_EPOCH);
        let min = Duration::from_secs(60);
        assert_eq!(idle_at(Some(t(100)), Some(t(50)), None, min), t(160));
        assert_eq!(
            idle_at(Some(t(100)), Some(t(50)), Some(t(900)), min),
            t(960)
        );
        assert_eq!(idle_at(None, Some(t(200)), None, min), t(260));
        assert_eq!(idle_at(None, None, None, min), t(60));
        assert_eq!(later(Timestamp::MAX, min), Timestamp::MAX);
    }

    /// I2: a report sets the last activity and the reporter, nothing else.
    #[test]
    fn i2_report_patch_sets_renew_time_and_holder() {
        let at = Timestamp::from_second(1_700_000_000).unwrap_or(Timestamp::UNIX_EPOCH);
        let patch = report_patch(at, "wake-proxy");
        assert_eq!(patch["spec"]["holderIdentity"], "wake-proxy");
        assert_eq!(patch["spec"]["renewTime"], "2023-11-14T22:13:20.000000Z");
        assert_eq!(patch.as_object().map(|o| o.len()), Some(1));
    }
}
