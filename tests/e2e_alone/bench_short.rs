//! The short variant of `make bench` (issue 8) inside `make test`: 100 CRs hibernated and
//! then woken at once among 1,000 pods, a fresh `Wake` CR on a running pod, and a quiet
//! minute, on the shared local control plane. It runs the benchmark's own code and asserts
//! only exact counts (writes per round, conflicts, registry calls, quiet-minute writes),
//! never a time.

use testkit::bench as system;

use std::collections::BTreeMap;

/// W2, W3, C3 (and the write floor of H1–H3, W1, R1): one hibernate + wake round costs the
/// finalizer, one pod patch and two phase writes each way, and two events (9 writes) with
/// no conflict; a wake costs at most 3 registry calls on Distribution; a new `Wake` CR on a
/// running pod costs at most 3 writes; a settled minute makes no API write and no
/// registry call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn e2e_w2_c3_short_bench_round_trips_at_the_write_floor_and_quiet_when_settled() {
    let _alone = crate::alone().await;
    let _ = rustls::crypto::ring::default_provider().install_default();
    let out = tempfile::tempdir().expect("tempdir");
    let args: Vec<String> = [
        "--n=100",
        "--filler-pods=900",
        "--fresh-n=10",
        "--quiet-s=60",
        "--scale-n=0",
        "--parts=roundtrip,quiet",
        // Never compared with the committed baseline here: counts are asserted below.
        "--baseline=/nonexistent",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!("--out={}", out.path().display())])
    .collect();
    let opts = system::Opts::parse(&args);
    let (figs, detail) = system::measure(&opts).await;
    let n = 100.0;
    let get = |key: &str| {
        figs.get(key)
            .unwrap_or_else(|| panic!("{key} was not measured; detail: {detail:?}"))
    };
    let (round, fresh, quiet) = (
        &detail["roundtrip"],
        &detail["fresh_wake"],
        &detail["quiet"],
    );
    // Every count is checked before failing, so one run shows all that is off.
    let mut off = Vec::new();
    let mut expect = |ok: bool, what: String| {
        if !ok {
            off.push(what);
        }
    };
    let writes = get("rt.writes_per_round");
    expect(
        writes == 9.0,
        format!(
            "transition writes per round {writes}, floor 9 (finalizer, 2 pod patches, 4 phase writes, 2 events)"
        ),
    );
    let events = get("rt.events_per_round");
    expect(events == 2.0, format!("events per round {events}, want 2"));
    let conflicts = get("rt.conflicts");
    expect(
        conflicts == 0.0,
        format!("{conflicts} conflicts (409) to the product"),
    );
    let non_2xx = get("rt.non_2xx_writes");
    expect(
        non_2xx == 0.0,
        format!("{non_2xx} product writes answered >= 300"),
    );
    let reason = get("rt.reason_writes");
    expect(
        reason <= 2.0,
        format!("{reason} status writes per round that leave the phase as it was, want <= 2"),
    );
    // W2/S7 on Distribution: HEAD, one tag list, DELETE by the confirmed digest; no
    // DELETE by tag is ever sent, so nothing is learned per process either.
    let calls: BTreeMap<String, f64> =
        serde_json::from_value(round["registry_calls_wake"].clone()).expect("registry calls");
    let total: f64 = calls.values().sum();
    expect(
        total <= 3.0 * n,
        format!("registry calls for {n} wakes: {calls:?}, want <= 3 per wake"),
    );
    let fresh_writes = get("fresh.writes_per_cr");
    expect(
        fresh_writes <= 3.0,
        format!("{fresh_writes} writes per new Wake CR on a running pod, want <= 3 ({fresh})"),
    );
    let quiet_writes = get("quiet.writes");
    expect(
        quiet_writes == 0.0,
        format!("{quiet_writes} API writes in a settled minute ({quiet})"),
    );
    let quiet_calls = get("quiet.registry_calls");
    expect(
        quiet_calls == 0.0,
        format!("{quiet_calls} registry calls in a settled minute ({quiet})"),
    );
    assert!(off.is_empty(), "{}\nround: {round}", off.join("\n"));
}
