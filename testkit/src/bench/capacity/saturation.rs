//! When a resource counts as saturated in a step (docs/performance.md, "Capacity of one
//! leader", states the same bounds). Each resource's load is its figure over its bound;
//! at 1 or more it is saturated.

use super::step::Step;

/// A process above this many cores, averaged over the burst, is saturated: on this
/// 2-core machine it holds most of a core while four others share the rest.
pub(super) const CPU_CORES: f64 = 0.9;
/// ... if the burst lasted this long: a few busy seconds are not a sustained load.
pub(super) const SUSTAINED_S: f64 = 10.0;
/// The product's memory limit in the Helm chart's default values (`resources.limits`):
/// above it the default install is OOM-killed.
pub(super) const PRODUCT_RSS_MIB: f64 = 256.0;
/// The apiserver's p99 request latency (WATCH and CONNECT left out): above 1 s every
/// client's writes and reads queue.
pub(super) const APISERVER_P99_MS: f64 = 1000.0;
/// The product's reaction p99 target (vk's completion write → the CR's terminal phase).
pub(super) const REACTION_P99_MS: f64 = 1000.0;

/// Every resource's load (figure / bound), in a fixed order.
pub(super) fn ratios(s: &Step) -> Vec<(&'static str, f64)> {
    let cpu = |name| s.core(name).unwrap_or(0.0) / CPU_CORES;
    // A burst that never finished has no p99: its reaction is unbounded.
    let reaction = if s.completed {
        s.reaction_p99_ms.unwrap_or(0.0) / REACTION_P99_MS
    } else {
        f64::INFINITY
    };
    vec![
        ("product_cpu", cpu("product")),
        ("product_rss", s.product_rss_mib / PRODUCT_RSS_MIB),
        ("apiserver_cpu", cpu("apiserver")),
        ("etcd_cpu", cpu("etcd")),
        (
            "apiserver_latency",
            s.apiserver_p99_ms.unwrap_or(0.0) / APISERVER_P99_MS,
        ),
        ("reaction", reaction),
    ]
}

/// The saturated resources, the most loaded first.
pub(super) fn saturated(s: &Step) -> Vec<(&'static str, f64)> {
    let sustained = s.window_s >= SUSTAINED_S;
    let mut v: Vec<_> = ratios(s)
        .into_iter()
        .filter(|(name, r)| *r >= 1.0 && (sustained || !name.ends_with("_cpu")))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    v
}

/// The first step (in ladder order) with a saturated resource: (resource, crs, burst).
pub(super) fn first(steps: &[Step]) -> Option<(&'static str, usize, usize)> {
    steps
        .iter()
        .find_map(|s| saturated(s).first().map(|(r, _)| (*r, s.crs, s.burst)))
}

/// Per resource, the first step where it saturated.
pub(super) fn first_per_resource(steps: &[Step]) -> Vec<(&'static str, usize, usize)> {
    let mut out: Vec<(&'static str, usize, usize)> = Vec::new();
    for s in steps {
        for (r, _) in saturated(s) {
            if !out.iter().any(|(x, _, _)| *x == r) {
                out.push((r, s.crs, s.burst));
            }
        }
    }
    out
}
