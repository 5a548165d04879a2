//! Observing the product: its /metrics, deltas and quantiles, its memory and CPU time, the CR
//! count.

use cocoon_hibernation::api::CocoonHibernation;
use kube::Api;
use std::collections::HashMap;
use std::sync::OnceLock;

/// Every sample of the product's /metrics, keyed by `name{labels}`.
pub fn scrape(product: &crate::product::Product) -> HashMap<String, f64> {
    let Ok((200, body)) = product.get("/metrics") else {
        return HashMap::new();
    };
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_owned(), v.parse().ok()?))
        })
        .collect()
}

/// `after - before` of every sample whose key starts with `prefix`, by label set.
pub fn delta(
    before: &HashMap<String, f64>,
    after: &HashMap<String, f64>,
    prefix: &str,
) -> std::collections::BTreeMap<String, f64> {
    after
        .iter()
        .filter(|(k, _)| k.starts_with(prefix))
        .map(|(k, v)| {
            let labels = k[prefix.len()..].to_owned();
            (labels, v - before.get(k).copied().unwrap_or(0.0))
        })
        .filter(|(_, d)| *d != 0.0)
        .collect()
}

/// The `q` quantile of a Prometheus histogram from its `_bucket` deltas (keys
/// `{le="…",…}`, every label set summed): the upper bound of the bucket it falls in.
pub fn histogram_quantile(
    buckets: &std::collections::BTreeMap<String, f64>,
    q: f64,
) -> Option<f64> {
    let mut by_le: std::collections::BTreeMap<u64, (f64, f64)> = Default::default();
    for (labels, count) in buckets {
        let le = labels.split("le=\"").nth(1)?.split('"').next()?;
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        by_le.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += count;
    }
    let mut cumulative: Vec<(f64, f64)> = by_le.into_values().collect();
    cumulative.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total = cumulative.last()?.1;
    cumulative
        .into_iter()
        .find(|(_, c)| *c >= q * total)
        .map(|(le, _)| le)
}

pub const REGISTRY_CALLS: &str = "cocoon_hibernation_registry_calls_total";
pub const RECONCILE_PASSES: &str = "cocoon_hibernation_reconcile_passes_total";
pub const RECONCILE_ERRORS: &str = "cocoon_hibernation_reconcile_errors_total";

/// (VmRSS, VmHWM) in KiB of a process.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Clock ticks per second of /proc's CPU times.
fn ticks_per_s() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// User + system CPU seconds a process has used.
pub fn cpu_s(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (which may hold spaces): state is field 3, utime 14, stime 15.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / ticks_per_s())
}

/// Lists every CR of a namespace in pages (for counting without a watch).
pub async fn count_crs(api: &Api<CocoonHibernation>) -> usize {
    let mut n = 0;
    let mut lp = kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list(&lp).await.expect("list CRs");
        n += page.items.len();
        match page.metadata.continue_ {
            Some(c) if !c.is_empty() => lp = lp.continue_token(&c),
            _ => return n,
        }
    }
}
