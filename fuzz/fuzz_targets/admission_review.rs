//! V5: any request body gets a 400 or a review answer carrying the request's uid; it
//! never panics. Thin on purpose: it calls the webhook's one public entry point.
#![no_main]

use cocoon_hibernation::metrics::Metrics;
use cocoon_hibernation::webhook::handler::{Reply, review};
use cocoon_hibernation::webhook::validate::{Claim, ClaimView, VmHolder};
use libfuzzer_sys::fuzz_target;
use std::sync::LazyLock;

/// A synced cache where pod `taken` has a live CR, `leaving` a terminating one, and the
/// VM of pod `held` belongs to a CR elsewhere, so V2 and S2 denials are reachable.
struct View;

impl ClaimView for View {
    fn synced(&self) -> bool {
        true
    }
    fn claims(&self, _namespace: &str, pod: &str) -> Vec<Claim> {
        match pod {
            "taken" => vec![Claim {
                name: "other".into(),
                terminating: false,
            }],
            "leaving" => vec![Claim {
                name: "other".into(),
                terminating: true,
            }],
            _ => vec![],
        }
    }
    fn vm_holder(&self, _namespace: &str, pod: &str) -> Option<VmHolder> {
        (pod == "held").then(|| VmHolder {
            vm: "vm-held".into(),
            holder: "ns/other".into(),
        })
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

fuzz_target!(|body: &[u8]| {
    if let Reply::Review(response) = review(body, &View, &METRICS) {
        // Every review answer carries the request's uid (V5).
        let doc: serde_json::Value = serde_json::from_slice(body).expect("a review came from JSON");
        assert_eq!(doc["request"]["uid"].as_str(), Some(response.uid.as_str()));
        assert!(!response.uid.is_empty());
    }
});
