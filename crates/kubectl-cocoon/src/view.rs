//! What the plugin reads from a CocoonHibernation, taken from its JSON leniently: a field
//! that is absent, or of a type this version does not expect, reads as unknown instead of
//! failing the command. This is the one place that knows the status layout; a server
//! older or newer than the plugin still gets its CRs shown.

use cocoon_api::Phase;
use cocoon_api::conditions::{PROGRESSING, READY, REASON_FAILED};
use jiff::Timestamp;
use serde_json::Value;
use std::collections::BTreeMap;

/// One status condition.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ConditionView {
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    pub message: String,
    pub last_transition: Option<Timestamp>,
    pub observed_generation: Option<i64>,
}

impl ConditionView {
    pub fn is_true(&self) -> bool {
        self.status == "True"
    }
}

/// `status.lastFailure`: kept after a retry, so a failure that flashed past stays visible.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FailureView {
    pub reason: String,
    pub message: String,
    pub time: Option<Timestamp>,
}

/// A CocoonHibernation as the plugin shows and judges it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CrView {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub generation: Option<i64>,
    pub created: Option<Timestamp>,
    pub deleting: bool,
    pub pod: String,
    /// `Hibernate` or `Wake` (anything else is shown as it is).
    pub desire: String,
    pub phase: Option<String>,
    pub vm_name: Option<String>,
    pub observed_generation: Option<i64>,
    pub conditions: Vec<ConditionView>,
    pub last_failure: Option<FailureView>,
    pub digest: Option<String>,
    pub attempts: Option<i64>,
    pub hibernated_at: Option<Timestamp>,
    pub woken_at: Option<Timestamp>,
    /// The marks of schedules, idle policies and overrides (string values only).
    pub annotations: BTreeMap<String, String>,
}

fn text(v: &Value, pointer: &str) -> Option<String> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .map(str::to_string)
}

fn int(v: &Value, pointer: &str) -> Option<i64> {
    v.pointer(pointer).and_then(Value::as_i64)
}

fn time(v: &Value, pointer: &str) -> Option<Timestamp> {
    v.pointer(pointer)
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
}

impl CrView {
    pub fn from_json(v: &Value) -> Self {
        let conditions = v
            .pointer("/status/conditions")
            .and_then(Value::as_array)
            .map(|list| {
                list.iter()
                    .map(|c| ConditionView {
                        type_: text(c, "/type").unwrap_or_default(),
                        status: text(c, "/status").unwrap_or_default(),
                        reason: text(c, "/reason").unwrap_or_default(),
                        message: text(c, "/message").unwrap_or_default(),
                        last_transition: time(c, "/lastTransitionTime"),
                        observed_generation: int(c, "/observedGeneration"),
                    })
                    .collect()
            })
            .unwrap_or_default();
        let last_failure = v
            .pointer("/status/lastFailure")
            .filter(|f| f.is_object())
            .map(|f| FailureView {
                reason: text(f, "/reason").unwrap_or_default(),
                message: text(f, "/message").unwrap_or_default(),
                time: time(f, "/time"),
            });
        Self {
            namespace: text(v, "/metadata/namespace").unwrap_or_default(),
            name: text(v, "/metadata/name").unwrap_or_default(),
            uid: text(v, "/metadata/uid").unwrap_or_default(),
            generation: int(v, "/metadata/generation"),
            created: time(v, "/metadata/creationTimestamp"),
            deleting: v.pointer("/metadata/deletionTimestamp").is_some(),
            pod: text(v, "/spec/podRef/name").unwrap_or_default(),
            desire: text(v, "/spec/desire").unwrap_or_default(),
            phase: text(v, "/status/phase"),
            vm_name: text(v, "/status/vmName"),
            observed_generation: int(v, "/status/observedGeneration"),
            conditions,
            last_failure,
            digest: text(v, "/status/snapshot/digest"),
            attempts: int(v, "/status/attempts"),
            hibernated_at: time(v, "/status/hibernatedAt"),
            woken_at: time(v, "/status/wokenAt"),
            annotations: v
                .pointer("/metadata/annotations")
                .and_then(Value::as_object)
                .map(|m| {
                    m.iter()
                        .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }

    pub fn condition(&self, type_: &str) -> Option<&ConditionView> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }

    /// Whether the CR is in `phase` (a phase this version does not know is in none).
    pub fn phase_is(&self, phase: Phase) -> bool {
        self.phase.as_deref() == Some(phase.as_str())
    }

    fn failed(&self) -> bool {
        self.phase_is(Phase::Failed)
    }

    /// The reason worth showing. In `Failed`, why: the first specific one of `Ready`
    /// (e.g. `Conflict`), `lastFailure` (e.g. a timeout), `Progressing`. Otherwise what
    /// a transition waits for (`Progressing`), else the `Ready` reason.
    pub fn reason(&self) -> &str {
        let of = |t: &str| self.condition(t).map_or("", |c| c.reason.as_str());
        if self.failed() {
            let failure = self.last_failure.as_ref().map_or("", |f| f.reason.as_str());
            return [of(READY), failure, of(PROGRESSING)]
                .into_iter()
                .find(|r| !r.is_empty() && *r != REASON_FAILED)
                .unwrap_or(REASON_FAILED);
        }
        [of(PROGRESSING), of(READY)]
            .into_iter()
            .find(|r| !r.is_empty())
            .unwrap_or("")
    }

    /// The message worth showing: in `Failed` the `Ready` message (it names the cause),
    /// else `lastFailure`'s; otherwise the last probe or delete error (`Progressing`),
    /// else the `Ready` message.
    pub fn message(&self) -> &str {
        let of = |t: &str| self.condition(t).map_or("", |c| c.message.as_str());
        let failure = self
            .last_failure
            .as_ref()
            .map_or("", |f| f.message.as_str());
        let order = if self.failed() {
            [of(READY), failure, of(PROGRESSING)]
        } else {
            [of(PROGRESSING), of(READY), ""]
        };
        order.into_iter().find(|m| !m.is_empty()).unwrap_or("")
    }

    /// Since when the CR has been in its current state: the phase's own timestamp when it
    /// has one, else the latest transition of `Ready` or `Progressing`, else its creation.
    pub fn since(&self) -> Option<Timestamp> {
        let phase_stamp = if self.phase_is(Phase::Hibernated) {
            self.hibernated_at
        } else if self.phase_is(Phase::Active) {
            self.woken_at
        } else {
            None
        };
        phase_stamp
            .or_else(|| {
                [READY, PROGRESSING]
                    .iter()
                    .filter_map(|t| self.condition(t).and_then(|c| c.last_transition))
                    .max()
            })
            .or(self.created)
    }

    /// `namespace/name`, as messages name a CR.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    #[test]
    fn reads_the_whole_status_contract() {
        let cr = CrView::from_json(&json!({
            "metadata": {"namespace": "ns", "name": "web-0", "uid": "u1", "generation": 3,
                         "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"podRef": {"name": "web-0"}, "desire": "Hibernate"},
            "status": {
                "phase": "Hibernating", "vmName": "vm-1", "observedGeneration": 3,
                "attempts": 2, "snapshot": {"digest": "sha256:abc"},
                "lastFailure": {"reason": "HibernateTimedOut", "message": "m", "time": "2026-01-01T00:01:00Z"},
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "Pending", "message": "waiting",
                     "lastTransitionTime": "2026-01-01T00:02:00Z"},
                    {"type": "Progressing", "status": "True", "reason": "WaitingForSnapshot",
                     "message": "probe failed: 503", "lastTransitionTime": "2026-01-01T00:03:00Z"}
                ]
            }
        }));
        assert_eq!(cr.key(), "ns/web-0");
        assert_eq!(cr.generation, Some(3));
        assert_eq!(cr.phase.as_deref(), Some("Hibernating"));
        assert_eq!(cr.vm_name.as_deref(), Some("vm-1"));
        assert_eq!(cr.digest.as_deref(), Some("sha256:abc"));
        assert_eq!(cr.attempts, Some(2));
        assert_eq!(cr.reason(), "WaitingForSnapshot");
        assert_eq!(cr.message(), "probe failed: 503");
        assert_eq!(cr.since(), Some(ts("2026-01-01T00:03:00Z")));
        assert_eq!(
            cr.last_failure.as_ref().map(|f| f.reason.as_str()),
            Some("HibernateTimedOut")
        );
    }

    #[test]
    fn absent_or_odd_fields_read_as_unknown() {
        let cr = CrView::from_json(&json!({
            "metadata": {"name": "x", "creationTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"podRef": {"name": "x"}, "desire": "Wake"},
            "status": {"attempts": "two", "conditions": "none", "lastFailure": "?"}
        }));
        assert_eq!(cr.phase, None);
        assert_eq!(cr.attempts, None);
        assert!(cr.conditions.is_empty());
        assert_eq!(cr.last_failure, None);
        assert_eq!(cr.reason(), "");
        assert_eq!(cr.since(), Some(ts("2026-01-01T00:00:00Z")));
        assert_eq!(CrView::from_json(&json!(null)), CrView::default());
    }

    /// F1: a Failed CR says why, in the most specific words it has.
    #[test]
    fn f1_failed_shows_the_specific_reason_and_the_ready_message() {
        let failed = |ready_reason: &str, failure: Option<&str>| {
            CrView::from_json(&json!({"status": {"phase": "Failed",
            "lastFailure": failure.map(|r| json!({"reason": r, "message": "from lastFailure"})),
            "conditions": [
                {"type": "Ready", "status": "False", "reason": ready_reason, "message": "did not complete within 5s"},
                {"type": "Progressing", "status": "False", "reason": "Failed", "message": ""}
            ]}}))
        };
        let cr = failed("Failed", Some("HibernateTimedOut"));
        assert_eq!(cr.reason(), "HibernateTimedOut");
        assert_eq!(cr.message(), "did not complete within 5s");
        assert_eq!(
            failed("Conflict", Some("HibernateTimedOut")).reason(),
            "Conflict"
        );
        assert_eq!(failed("Failed", None).reason(), "Failed");
    }

    #[test]
    fn ready_speaks_when_progressing_is_absent_or_silent() {
        let cr = CrView::from_json(&json!({
            "status": {"phase": "Active", "wokenAt": "2026-01-01T00:05:00Z", "conditions": [
                {"type": "Ready", "status": "True", "reason": "Done", "message": "vm woken",
                 "lastTransitionTime": "2026-01-01T00:04:00Z"},
                {"type": "Progressing", "status": "False", "reason": "", "message": ""}
            ]}
        }));
        assert_eq!(cr.reason(), "Done");
        assert_eq!(cr.message(), "vm woken");
        assert_eq!(
            cr.since(),
            Some(ts("2026-01-01T00:05:00Z")),
            "the phase's own stamp"
        );
    }
}
