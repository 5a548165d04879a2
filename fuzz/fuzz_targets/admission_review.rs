//! V5: any request body gets a 400 or a review answer carrying the request's uid; it
//! never panics. Thin on purpose: it calls the webhook's one public entry point.
#![no_main]

use cocoon_core::admission::{Claim, ClaimView, VmHolder};
use cocoon_hibernation::metrics::Metrics;
use cocoon_hibernation::webhook::handler::{Reply, review};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;
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
            namespace: "ns".into(),
            name: "other".into(),
        })
    }
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// Only the request's uid, read as leniently as the product reads a review: serde skips a
/// field no struct names without checking its strings (UTF-8, `\u` escapes), where
/// `serde_json::Value` checks them all. A body with invalid UTF-8 in such a field gets a
/// review answer, rightly (crash 8fefb010dd4e), and a `Value` would refuse it.
#[derive(Deserialize)]
struct Review {
    request: Request,
}

#[derive(Deserialize)]
struct Request {
    uid: String,
}

fuzz_target!(|body: &[u8]| {
    if let Reply::Review(response) = review(body, &View, &METRICS) {
        // Every review answer carries the request's uid (V5).
        let sent: Review = serde_json::from_slice(body).expect("a review came from JSON");
        assert_eq!(sent.request.uid, response.uid);
        assert!(!response.uid.is_empty());
    }
});
