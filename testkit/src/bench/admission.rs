//! The admission part: the webhook under load, beside a no-op TLS server's ceiling.

use super::pods;
use super::report::{Figures, Kind};
use super::{Opts, load, log};
use crate::cluster;
use kube::Api;
use serde_json::{Value, json};
use std::time::Duration;

/// Admission load at concurrency 16 and 64 against the product's webhook, for a CREATE of
/// a CR on a pod that exists and has none (the full V1–V4 path, allowed).
#[allow(clippy::too_many_arguments)]
pub(super) async fn admission(
    o: &Opts,
    cluster: &cluster::Cluster,
    client: &kube::Client,
    ns: &str,
    port: u16,
    tag: &str,
    figs: &mut Figures,
    detail: &mut serde_json::Map<String, Value>,
) {
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(client.clone(), ns);
    let vm = format!("vm-{ns}-adm-0");
    pods::create_realistic_pod(&pods, "adm-0", &vm).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let body = load::review_body(ns, "adm-0");
    let answer = load::probe(port, &cluster.ca_cert_pem, &body).await;
    assert_eq!(
        answer["response"]["allowed"], true,
        "the benchmark's review must be allowed: {answer}"
    );
    let mut runs = Vec::new();
    for c in [16usize, 64] {
        let (m, all) = load::median_of(
            o.admission_reps,
            port,
            &cluster.ca_cert_pem,
            &body,
            c,
            o.admission_s,
        )
        .await;
        log(format!(
            "admission {tag} c{c}: {:.0} req/s p50 {:.2} ms p99 {:.2} ms",
            m.rps, m.p50_ms, m.p99_ms
        ));
        let key = |what: &str| -> &'static str {
            match (what, c, tag) {
                ("rps", 16, "1k") => "adm.rps_c16_1k",
                ("p50", 16, "1k") => "adm.p50_c16_1k_ms",
                ("p99", 16, "1k") => "adm.p99_c16_1k_ms",
                ("rps", 64, "1k") => "adm.rps_c64_1k",
                ("p50", 64, "1k") => "adm.p50_c64_1k_ms",
                ("p99", 64, "1k") => "adm.p99_c64_1k_ms",
                ("rps", 16, _) => "adm.rps_c16_10k",
                ("rps", 64, _) => "adm.rps_c64_10k",
                ("p50", 64, _) => "adm.p50_c64_10k_ms",
                ("p99", 64, _) => "adm.p99_c64_10k_ms",
                _ => "",
            }
        };
        for (what, v) in [("rps", m.rps), ("p50", m.p50_ms), ("p99", m.p99_ms)] {
            let k = key(what);
            if !k.is_empty() {
                let kind = if what == "rps" {
                    Kind::Rate
                } else {
                    Kind::Time
                };
                figs.set(k, Some(v), "", kind);
            }
        }
        runs.extend(all);
    }
    detail.insert(format!("admission_{tag}_runs"), json!(runs));
}
