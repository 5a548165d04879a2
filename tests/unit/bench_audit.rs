//! The bench's intake figure (issue 38) read from audit events.

use serde_json::{Value, json};
use testkit::bench::audit::intakes;

fn write(who: &str, verb: &str, res: &str, sub: &str, name: &str, at: &str) -> Value {
    json!({
        "stage": "ResponseComplete", "verb": verb, "user": { "username": who },
        "objectRef": { "resource": res, "subresource": sub, "name": name },
        "responseStatus": { "code": 200 },
        "requestReceivedTimestamp": at, "stageTimestamp": at,
    })
}

/// From the driver's flip to the product's first pod patch of that CR's pod; status
/// writes, other users' pod writes and later pod patches do not count.
#[test]
fn intake_is_flip_to_the_first_pod_patch() {
    let events = [
        write(
            "bench",
            "create",
            "cocoonhibernations",
            "",
            "p-0",
            "2026-01-01T00:00:00.000Z",
        ),
        write(
            "op",
            "patch",
            "cocoonhibernations",
            "status",
            "p-0",
            "2026-01-01T00:00:00.050Z",
        ),
        write("vk", "patch", "pods", "", "p-0", "2026-01-01T00:00:00.060Z"),
        write("op", "patch", "pods", "", "p-0", "2026-01-01T00:00:00.120Z"),
        write("op", "patch", "pods", "", "p-0", "2026-01-01T00:00:09.000Z"),
        // A pod patch with no flip before it (a pod of another round) is no intake.
        write("op", "patch", "pods", "", "p-1", "2026-01-01T00:00:00.130Z"),
        write(
            "bench",
            "patch",
            "cocoonhibernations",
            "",
            "p-1",
            "2026-01-01T00:00:00.200Z",
        ),
        write("op", "patch", "pods", "", "p-1", "2026-01-01T00:00:01.200Z"),
    ];
    let got = intakes(&events, |u| u == "op");
    assert_eq!(got.len(), 2, "{got:?}");
    assert!((got[0] - 120.0).abs() < 0.01, "{got:?}");
    assert!((got[1] - 1000.0).abs() < 0.01, "{got:?}");
}
