//! The unit test binary: pure tables and properties, the admission router and webhook TLS
//! in-process, the registry client against a real `docker-registry`, and the test kit's
//! own checks. One module per area; the shared kit is the `testkit` crate.

mod api_tap;
mod bench_audit;
mod chart_crd;
mod chart_values;
mod compat_claim;
mod doc_paths;
mod docs_sync;
mod fuzz_regressions;
mod plan_properties;
mod plan_rules;
mod plugin_literals;
mod pod_selector;
mod registry_client;
mod registry_harness;
mod safety_rules;
mod test_binaries;
mod webhook_router;
mod webhook_tls;
