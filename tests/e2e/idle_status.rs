//! End-to-end: `kubectl cocoon status`'s idle columns (LAST ACTIVITY, BUSY, SLEEPS) with
//! the real plugin binary, the real product (its idle policy makes the CRs) and the
//! activity Leases on the real control plane. The product runs on the real clock with
//! `idleAfter` 1h, so nothing sleeps while the test looks.

use crate::idle::selected_pod;
use crate::plugin::{Run, plugin};
use cocoon_hibernation::api::Desire;
use cocoon_hibernation::api::Phase;
use cocoon_hibernation::api::activity::{ACTIVITY_FOR, OPEN_CONNECTIONS, lease_name};
use cocoon_hibernation::idle::CocoonIdlePolicy;
use cocoon_hibernation::idle::plan::IDLE_LABEL;
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, ResourceExt};
use std::collections::HashMap;
use testkit::env::{LONG, Setup, setup};
use testkit::product::{self, eventually};

/// An activity Lease as the policy makes it, last renewed `ago` before now.
fn lease(pod: &str, ago: SignedDuration, annotations: &[(&str, &str)]) -> Lease {
    let annotations = annotations
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    Lease {
        metadata: ObjectMeta {
            name: lease_name(pod),
            labels: Some([(ACTIVITY_FOR.to_owned(), pod.to_owned())].into()),
            annotations: Some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            renew_time: Some(MicroTime(Timestamp::now() - ago)),
            ..LeaseSpec::default()
        }),
    }
}

/// `status`'s table read as kubectl's is: each cell starts where its header does (the
/// headers are left-aligned, at least two spaces apart; "LAST ACTIVITY" has one inside).
/// Rows by their NAME, each a map from header to cell.
fn table(out: &Run) -> HashMap<String, HashMap<String, String>> {
    let mut lines = out.stdout.lines();
    let header = lines.next().unwrap_or_default();
    let bytes = header.as_bytes();
    let starts: Vec<usize> = (0..bytes.len())
        .filter(|&i| {
            bytes[i] != b' ' && (i == 0 || (i >= 2 && bytes[i - 1] == b' ' && bytes[i - 2] == b' '))
        })
        .collect();
    let cell = |line: &str, k: usize| -> String {
        let from = starts[k].min(line.len());
        let to = starts.get(k + 1).map_or(line.len(), |&e| e.min(line.len()));
        line[from..to].trim().to_owned()
    };
    let names: Vec<String> = (0..starts.len()).map(|k| cell(header, k)).collect();
    lines
        .map(|line| {
            let row: HashMap<String, String> = names
                .iter()
                .enumerate()
                .map(|(k, n)| (n.clone(), cell(line, k)))
                .collect();
            (row.get("NAME").cloned().unwrap_or_default(), row)
        })
        .collect()
}

/// One cell, or the whole output in the failure.
fn at<'a>(
    rows: &'a HashMap<String, HashMap<String, String>>,
    name: &str,
    col: &str,
    out: &Run,
) -> &'a str {
    rows.get(name)
        .and_then(|r| r.get(col))
        .map(String::as_str)
        .unwrap_or_else(|| panic!("no {col} for {name}\n{out}"))
}

/// "in 59m" as minutes.
fn in_minutes(sleeps: &str) -> Option<u64> {
    sleeps.strip_prefix("in ")?.strip_suffix('m')?.parse().ok()
}

/// SPEC I6 I2 I3 I4: `kubectl cocoon status` shows, for each pod an idle policy selects,
/// its last activity (I2: the Lease's renewTime) and when it would sleep (I3: about
/// `idleAfter` after its last activity or wake, "in 59m"); after `kubectl cocoon
/// keepalive POD --for 2h`, BUSY shows the mark and SLEEPS says "awake: busy" (I2); an
/// open proxied connection on the Lease gives "awake: connection open" (I3); a person's CR
/// on a selected pod is "overridden" (I4), and the policy leaves it as it was.
/// I3, I4: the pod with an open connection and the pod a person's CR holds never sleep.
fn open_and_hand_stay_awake(rows: &HashMap<String, HashMap<String, String>>, out: &Run) {
    assert_eq!(
        at(rows, "open-0", "SLEEPS", out),
        "awake: connection open",
        "{out}"
    );
    assert_eq!(at(rows, "hand-0", "SLEEPS", out), "overridden", "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_i6_i2_i3_i4_status_shows_last_activity_busy_and_when_each_pod_sleeps() {
    let env = setup("idle-cols", Setup::default()).await;
    let leases: Api<Lease> = Api::namespaced(env.client.clone(), &env.ns);
    for name in ["quiet-0", "kept-0", "open-0", "hand-0"] {
        selected_pod(&env, name).await;
    }
    let three_min = SignedDuration::from_mins(3);
    for l in [
        lease("quiet-0", three_min, &[]),
        lease("kept-0", three_min, &[]),
        // Quiet for hours, but the wake proxy holds a connection to it open.
        lease(
            "open-0",
            SignedDuration::from_hours(3),
            &[(OPEN_CONNECTIONS, "1")],
        ),
    ] {
        leases.create(&PostParams::default(), &l).await.unwrap();
    }
    product::create_cr(&env.crs, "hand-0", "hand-0", Desire::Wake).await;
    let policies: Api<CocoonIdlePolicy> = Api::namespaced(env.client.clone(), &env.ns);
    let policy: CocoonIdlePolicy = serde_json::from_value(serde_json::json!({
        "apiVersion": "cocoonset.cocoonstack.io/v1alpha1", "kind": "CocoonIdlePolicy",
        "metadata": { "name": "sleepy" },
        "spec": { "selector": { "matchLabels": { "tier": "dev" } }, "idleAfter": "1h" },
    }))
    .unwrap();
    policies
        .create(&PostParams::default(), &policy)
        .await
        .unwrap();
    // The policy makes the CRs of the pods without one, and they reach Active (woken).
    for name in ["quiet-0", "kept-0", "open-0"] {
        eventually(&format!("the policy's CR {name}, Active"), LONG, || async {
            let cr = env.crs.get_opt(name).await.ok()??;
            let ours = cr.labels().get(IDLE_LABEL).map(String::as_str) == Some("sleepy");
            (ours && cr.phase() == Some(Phase::Active)).then_some(())
        })
        .await;
    }

    let out = plugin(&env, &["status"]).await;
    assert_eq!(out.code, 0, "{out}");
    let header: Vec<&str> = out
        .stdout
        .lines()
        .next()
        .unwrap_or_default()
        .split("  ")
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect();
    assert_eq!(
        header[header.len() - 4..],
        ["LAST ACTIVITY", "BUSY", "SLEEPS", "MESSAGE"],
        "{out}"
    );
    let rows = table(&out);
    let last = at(&rows, "quiet-0", "LAST ACTIVITY", &out);
    assert!(
        last.starts_with("3m") && last.ends_with(" ago"),
        "quiet-0 reported 3 minutes ago: {last:?}\n{out}"
    );
    assert_eq!(at(&rows, "quiet-0", "BUSY", &out), "", "{out}");
    for name in ["quiet-0", "kept-0"] {
        // Woken (Active) moments ago, idleAfter 1h: about an hour ahead.
        let sleeps = at(&rows, name, "SLEEPS", &out);
        assert!(
            in_minutes(sleeps).is_some_and(|m| (55..=60).contains(&m)),
            "{name} sleeps in about an hour: {sleeps:?}\n{out}"
        );
    }
    assert_eq!(
        at(&rows, "open-0", "LAST ACTIVITY", &out),
        "3h ago",
        "{out}"
    );
    open_and_hand_stay_awake(&rows, &out);

    let out = plugin(&env, &["keepalive", "kept-0", "--for", "2h"]).await;
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains("kept-0: busy until"), "{out}");

    let out = plugin(&env, &["status"]).await;
    assert_eq!(out.code, 0, "{out}");
    let rows = table(&out);
    let busy = at(&rows, "kept-0", "BUSY", &out);
    assert!(
        ["for 119m", "for 120m"].contains(&busy),
        "busy for 2h: {busy:?}\n{out}"
    );
    assert_eq!(at(&rows, "kept-0", "SLEEPS", &out), "awake: busy", "{out}");
    let last = at(&rows, "kept-0", "LAST ACTIVITY", &out);
    assert!(
        last.ends_with("s ago") && !last.contains('m'),
        "keepalive reported activity now: {last:?}\n{out}"
    );
    // The others as they were.
    assert_eq!(at(&rows, "quiet-0", "BUSY", &out), "", "{out}");
    assert!(
        in_minutes(at(&rows, "quiet-0", "SLEEPS", &out)).is_some(),
        "{out}"
    );
    open_and_hand_stay_awake(&rows, &out);

    // Nothing slept, and the person's CR was never adopted (I4).
    for name in ["quiet-0", "kept-0", "open-0", "hand-0"] {
        let cr = env.crs.get(name).await.unwrap();
        assert_eq!(cr.spec.desire, Desire::Wake, "{name}");
    }
    let hand = env.crs.get("hand-0").await.unwrap();
    assert!(
        !hand.labels().contains_key(IDLE_LABEL),
        "a person's CR was adopted"
    );
}
