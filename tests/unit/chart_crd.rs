//! SPEC P5 A1 A2: the Helm chart ships exactly the CRD the binary generates, so the CEL
//! rule, short name and printer columns a chart install gets are the tested ones.
//! `cargo xtask chart-check` covers the rest of the chart (lint, kubeconform, dry run).

#[test]
fn p5_chart_crd_is_byte_identical_to_the_generated_crd() {
    let path = testkit::repo_root().join("charts/cocoon-hibernation/crds/cocoonhibernations.yaml");
    let shipped =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let generated = cocoon_hibernation::api::crd_yaml().unwrap();
    assert!(
        shipped == generated,
        "the chart's CRD drifted: run `cargo run -- crd > charts/cocoon-hibernation/crds/cocoonhibernations.yaml`"
    );
    assert!(shipped.contains("self == oldSelf"));
}
