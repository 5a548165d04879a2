//! `POST /validate-cocoonhibernationschedule` (K1, K9): what the CRD schema cannot check,
//! the time zone against the bundled tz database above all, and a calendar that would
//! hibernate for ever without saying so; denied with every reason at once.

use super::spec::{self, CocoonHibernationSchedule};
use crate::metrics::Metrics;
use crate::webhook::handler::Reply;
use crate::webhook::policy;

pub const PATH: &str = "/validate-cocoonhibernationschedule";

/// The whole decision for one request body; synchronous so tests need no server.
pub fn review(body: &[u8], metrics: &Metrics) -> Reply {
    policy::review(body, metrics, |p: &CocoonHibernationSchedule| {
        spec::calendar(&p.spec).err().unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(op: &str, spec: serde_json::Value) -> Vec<u8> {
        serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1", "operation": op, "namespace": "ns", "name": "office",
                "kind": { "group": "cocoonset.cocoonstack.io", "version": "v1alpha1",
                          "kind": "CocoonHibernationSchedule" },
                "resource": { "group": "cocoonset.cocoonstack.io", "version": "v1alpha1",
                              "resource": "cocoonhibernationschedules" },
                "userInfo": { "username": "alice" },
                "object": {
                    "apiVersion": "cocoonset.cocoonstack.io/v1alpha1",
                    "kind": "CocoonHibernationSchedule",
                    "metadata": { "name": "office", "namespace": "ns" },
                    "spec": spec,
                },
            },
        }))
        .unwrap()
    }

    fn verdict(op: &str, spec: serde_json::Value) -> Result<(), String> {
        match review(&body(op, spec), &Metrics::new()) {
            Reply::Review(r) if r.allowed => Ok(()),
            Reply::Review(r) => Err(r.result.message),
            Reply::BadRequest(m) => Err(format!("400: {m}")),
        }
    }

    /// K1: the time zone is checked against the bundled database, windows are read, and
    /// every reason is given at once.
    #[rstest::rstest]
    #[case::k1_valid("CREATE", "Europe/London", "09:00", "17:00", Ok(()))]
    #[case::k1_valid_update("UPDATE", "Australia/Lord_Howe", "22:00", "24:00", Ok(()))]
    #[case::k1_unknown_zone("CREATE", "Mars/Olympus", "09:00", "17:00", Err("spec.timeZone"))]
    #[case::k1_abbreviation_is_not_a_zone("CREATE", "CEST", "09:00", "17:00", Err("spec.timeZone"))]
    #[case::k1_24_00_only_as_end("CREATE", "UTC", "24:00", "17:00", Err("spec.awake[0]"))]
    #[case::k1_bad_time("UPDATE", "UTC", "09:00", "7pm", Err("spec.awake[0]"))]
    fn k1_schedule_admission(
        #[case] op: &str,
        #[case] zone: &str,
        #[case] from: &str,
        #[case] to: &str,
        #[case] want: Result<(), &str>,
    ) {
        let spec = json!({
            "selector": { "matchLabels": { "app": "web" } },
            "timeZone": zone,
            "awake": [{ "days": ["Mon", "Fri"], "from": from, "to": to }],
        });
        match (verdict(op, spec), want) {
            (Ok(()), Ok(())) => {}
            (Err(got), Err(want)) => assert!(got.contains(want), "{got}"),
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    /// K9: a schedule without an awake window would hibernate its pods for ever (with an
    /// empty selector, every VM pod of the namespace): refused unless `alwaysAsleep: true`
    /// says so, and `alwaysAsleep` with a window is refused as a contradiction.
    #[rstest::rstest]
    #[case::k9_empty_awake_refused("CREATE", json!({ "matchLabels": { "app": "web" } }), json!([]), None, Err("the selected pods would hibernate for ever"))]
    #[case::k9_empty_awake_and_selector_refused("CREATE", json!({}), json!([]), None, Err("every VM pod of this namespace"))]
    #[case::k9_empty_awake_refused_on_update("UPDATE", json!({}), json!([]), Some(false), Err("spec.alwaysAsleep: true"))]
    #[case::k9_always_asleep_accepted("CREATE", json!({}), json!([]), Some(true), Ok(()))]
    #[case::k9_always_asleep_with_a_window_refused("CREATE", json!({}), json!([{ "from": "09:00", "to": "17:00" }]), Some(true), Err("leave one of them out"))]
    #[case::k9_a_window_without_the_flag_accepted("CREATE", json!({}), json!([{ "from": "09:00", "to": "17:00" }]), Some(false), Ok(()))]
    fn k9_schedule_admission(
        #[case] op: &str,
        #[case] selector: serde_json::Value,
        #[case] awake: serde_json::Value,
        #[case] always_asleep: Option<bool>,
        #[case] want: Result<(), &str>,
    ) {
        let mut spec = json!({ "selector": selector, "timeZone": "UTC", "awake": awake });
        if let Some(flag) = always_asleep {
            spec["alwaysAsleep"] = json!(flag);
        }
        match (verdict(op, spec), want) {
            (Ok(()), Ok(())) => {}
            (Err(got), Err(want)) => {
                assert!(got.contains(want), "{got}");
                assert!(got.starts_with("spec.a"), "names the field: {got}");
            }
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    /// K1: a bad zone and a bad window are both named in one denial.
    #[test]
    fn k1_every_reason_at_once() {
        let spec = json!({
            "selector": { "matchExpressions": [{ "key": "app", "operator": "Bogus" }] },
            "timeZone": "Nowhere", "wakeLead": "30h",
            "awake": [{ "from": "25:00", "to": "17:00" }],
        });
        let got = verdict("CREATE", spec).unwrap_err();
        for want in [
            "spec.timeZone",
            "spec.awake[0]",
            "spec.wakeLead",
            "spec.selector",
        ] {
            assert!(got.contains(want), "{want} missing from {got}");
        }
        assert_eq!(verdict("DELETE", json!({})), Ok(()));
    }
}
