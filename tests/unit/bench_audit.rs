//! The bench's intake and reaction figures (issue 38) read from audit events.

use serde_json::{Value, json};
use testkit::bench::audit::{intakes, reactions};

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

fn status_write(who: &str, name: &str, phase: &str, received: &str, done: &str) -> Value {
    let mut e = write(who, "patch", "cocoonhibernations", "status", name, done);
    e["requestReceivedTimestamp"] = json!(received);
    e["requestObject"] = json!({ "status": { "phase": phase } });
    e
}

/// From vk's last pod write before the product's status write setting the phase was
/// received, to when that write finished; the product's own pod patches, vk writes after
/// it, other phases and later writes of the same phase do not count.
#[test]
fn reaction_is_vks_last_pod_write_to_the_terminal_status_write() {
    let t = |s: &str| format!("2026-01-01T00:00:{s}Z");
    let events = [
        write("vk", "patch", "pods", "", "p-0", &t("00.100")),
        write("vk", "patch", "pods", "status", "p-0", &t("00.300")),
        write("op", "patch", "pods", "", "p-0", &t("00.350")),
        status_write("op", "p-0", "Waking", &t("00.360"), &t("00.370")),
        status_write("op", "p-0", "Active", &t("00.380"), &t("00.400")),
        // Received before it finished, so not what the product reacted to.
        write("vk", "patch", "pods", "status", "p-0", &t("00.390")),
        status_write("op", "p-0", "Active", &t("05.000"), &t("05.010")),
        // No pod write before it: left out.
        status_write("op", "p-1", "Active", &t("00.500"), &t("00.510")),
        write("vk", "patch", "pods", "status", "p-2", &t("01.000")),
        status_write("op", "p-2", "Active", &t("01.900"), &t("02.000")),
        // Another phase only: left out.
        write("vk", "patch", "pods", "status", "p-3", &t("01.000")),
        status_write("op", "p-3", "Hibernated", &t("01.100"), &t("01.200")),
    ];
    let got = reactions(&events, |u| u == "op", "Active");
    assert_eq!(got.len(), 2, "{got:?}");
    assert!((got[0] - 100.0).abs() < 0.01, "{got:?}");
    assert!((got[1] - 1000.0).abs() < 0.01, "{got:?}");
}
