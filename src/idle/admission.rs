//! `POST /validate-cocoonidlepolicy` (I1, Q1–Q5): what the CRD schema cannot check (see
//! [`super::validate`]); denied with every reason at once, like schedules (K1).

use super::spec::CocoonIdlePolicy;
use super::validate;
use crate::metrics::Metrics;
use crate::webhook::handler::Reply;
use crate::webhook::policy;

pub const PATH: &str = "/validate-cocoonidlepolicy";

/// The whole decision for one request body; synchronous so tests need no server.
pub fn review(body: &[u8], metrics: &Metrics) -> Reply {
    policy::review(body, metrics, |p: &CocoonIdlePolicy| {
        validate::settings(&p.spec).err().unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn verdict(op: &str, spec: Value) -> Result<(), String> {
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {
                "uid": "u-1", "operation": op, "namespace": "dev", "name": "sleepy",
                "kind": { "group": "cocoonset.cocoonstack.io", "version": "v1alpha1",
                          "kind": "CocoonIdlePolicy" },
                "resource": { "group": "cocoonset.cocoonstack.io", "version": "v1alpha1",
                              "resource": "cocoonidlepolicies" },
                "userInfo": { "username": "alice" },
                "object": {
                    "apiVersion": "cocoonset.cocoonstack.io/v1alpha1",
                    "kind": "CocoonIdlePolicy",
                    "metadata": { "name": "sleepy", "namespace": "dev" },
                    "spec": spec,
                },
            },
        }))
        .unwrap();
        match review(&body, &Metrics::new()) {
            Reply::Review(r) if r.allowed => Ok(()),
            Reply::Review(r) => Err(r.result.message),
            Reply::BadRequest(m) => Err(format!("400: {m}")),
        }
    }

    fn spec(idle_after: &str, min_awake: Option<&str>, wake: Value) -> Value {
        let mut spec =
            json!({ "selector": { "matchLabels": { "app": "dev" } }, "idleAfter": idle_after });
        if let Some(m) = min_awake {
            spec["minAwake"] = json!(m);
        }
        if !wake.is_null() {
            spec["wakeOnRequest"] = wake;
        }
        spec
    }

    /// I1: idleAfter is at least 1m and every duration parses.
    #[rstest::rstest]
    #[case::i1_thirty_minutes("30m", None, Ok(()))]
    #[case::i1_exactly_the_minimum("1m", Some("0s"), Ok(()))]
    #[case::i1_composite("1h30m", Some("10m"), Ok(()))]
    #[case::i1_below_the_minimum("59s", None, Err("spec.idleAfter"))]
    #[case::i1_not_a_duration("soon", None, Err("spec.idleAfter"))]
    #[case::i1_min_awake_not_a_duration("30m", Some("later"), Err("spec.minAwake"))]
    fn i1_idle_policy_durations(
        #[case] idle_after: &str,
        #[case] min_awake: Option<&str>,
        #[case] want: Result<(), &str>,
    ) {
        match (
            verdict("CREATE", spec(idle_after, min_awake, Value::Null)),
            want,
        ) {
            (Ok(()), Ok(())) => {}
            (Err(got), Err(want)) => assert!(got.contains(want), "{got}"),
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    /// I1 Q1: a route names exactly one pod (a host with one `{pod}`, or `pod`), TCP
    /// listen ports are unique, probe paths and prefixes are paths.
    #[rstest::rstest]
    #[case::q1_host_with_placeholder(json!({ "http": [{ "host": "{pod}.dev.example.com", "port": 8080 }] }), Ok(()))]
    #[case::q1_fixed_host_with_pod(json!({ "http": [{ "host": "ide.example.com", "pod": "ide-0", "port": 80, "pathPrefix": "/" }] }), Ok(()))]
    #[case::q1_host_without_pod(json!({ "http": [{ "host": "ide.example.com", "port": 80 }] }), Err("http[0]: host \"ide.example.com\" has no {pod}"))]
    #[case::q1_host_and_pod(json!({ "http": [{ "host": "{pod}.x", "pod": "a", "port": 80 }] }), Err("keep one"))]
    #[case::q1_two_placeholders(json!({ "http": [{ "host": "{pod}.{pod}.x", "port": 80 }] }), Err("more than once"))]
    #[case::q1_host_with_port(json!({ "http": [{ "host": "{pod}.x:8080", "port": 80 }] }), Err("must not carry a port"))]
    #[case::q1_relative_prefix(json!({ "http": [{ "host": "{pod}.x", "port": 80, "pathPrefix": "api" }] }), Err("pathPrefix"))]
    #[case::q1_tcp_unique_ports(json!({ "tcp": [{ "listenPort": 2222, "pod": "a", "port": 22 }, { "listenPort": 2223, "pod": "b", "port": 22 }] }), Ok(()))]
    #[case::q1_tcp_port_twice(json!({ "tcp": [{ "listenPort": 2222, "pod": "a", "port": 22 }, { "listenPort": 2222, "pod": "b", "port": 22 }] }), Err("tcp[1].listenPort"))]
    #[case::q2_max_wait_zero(json!({ "maxWait": "0s" }), Err("spec.wakeOnRequest.maxWait"))]
    #[case::q2_max_wait_garbage(json!({ "maxWait": "a while" }), Err("spec.wakeOnRequest.maxWait"))]
    #[case::q5_probe_path_relative(json!({ "probePaths": ["healthz"] }), Err("probePaths[0]"))]
    fn i1_idle_policy_routes(#[case] wake: Value, #[case] want: Result<(), &str>) {
        match (verdict("UPDATE", spec("30m", None, wake)), want) {
            (Ok(()), Ok(())) => {}
            (Err(got), Err(want)) => assert!(got.contains(want), "{got}"),
            (got, want) => panic!("got {got:?}, want {want:?}"),
        }
    }

    /// I1: the CRD `cocoon-hibernation crd` prints: names, short name, the CEL floor on
    /// idleAfter (admission repeats it with a readable reason).
    #[test]
    fn i1_crd_names_and_idle_after_floor() {
        use kube::CustomResourceExt;
        let crd = serde_json::to_value(CocoonIdlePolicy::crd()).unwrap();
        assert_eq!(
            crd["metadata"]["name"],
            "cocoonidlepolicies.cocoonset.cocoonstack.io"
        );
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["shortNames"], json!(["cip"]));
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let rules = spec["properties"]["idleAfter"]["x-kubernetes-validations"].to_string();
        assert!(rules.contains("duration('1m')"), "{rules}");
        let yaml = crate::api::crd_yaml().unwrap();
        assert!(yaml.contains("name: cocoonidlepolicies.cocoonset.cocoonstack.io"));
    }

    /// I1: every reason at once, each naming its field; DELETE passes.
    #[test]
    fn i1_every_reason_at_once() {
        let mut bad = spec("10s", Some("x"), json!({ "probePaths": ["x"] }));
        bad["selector"] = json!({ "matchExpressions": [{ "key": "app", "operator": "Bogus" }] });
        let got = verdict("CREATE", bad).unwrap_err();
        for want in [
            "spec.idleAfter",
            "spec.minAwake",
            "spec.selector",
            "probePaths[0]",
        ] {
            assert!(got.contains(want), "{want} missing from {got}");
        }
        assert_eq!(verdict("DELETE", json!({})), Ok(()));
    }
}
