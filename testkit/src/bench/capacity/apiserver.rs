//! The apiserver's request latency from its own /metrics: the
//! `apiserver_request_duration_seconds` histogram, as a delta between two scrapes,
//! without WATCH and CONNECT (long-running requests, whose duration is the watch's life).

use std::collections::BTreeMap;

const BUCKET: &str = "apiserver_request_duration_seconds_bucket{";
const COUNT: &str = "apiserver_request_duration_seconds_count{";

/// The histogram's samples, keyed by their label set: cumulative counts per `le`.
#[derive(Default)]
pub(super) struct Scrape {
    buckets: BTreeMap<String, f64>,
    counts: BTreeMap<String, f64>,
}

fn long_running(labels: &str) -> bool {
    labels.contains("verb=\"WATCH\"") || labels.contains("verb=\"CONNECT\"")
}

/// Scrapes the apiserver's /metrics as the admin client; empty when it cannot.
pub(super) async fn scrape(client: &kube::Client) -> Scrape {
    let Ok(req) = http::Request::get("/metrics").body(Vec::new()) else {
        return Scrape::default();
    };
    let Ok(text) = client.request_text(req).await else {
        return Scrape::default();
    };
    let mut s = Scrape::default();
    for line in text.lines() {
        let (map, rest) = if let Some(rest) = line.strip_prefix(BUCKET) {
            (&mut s.buckets, rest)
        } else if let Some(rest) = line.strip_prefix(COUNT) {
            (&mut s.counts, rest)
        } else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once(' ') else {
            continue;
        };
        if long_running(labels) {
            continue;
        }
        if let Ok(v) = value.parse::<f64>() {
            map.insert(labels.to_owned(), v);
        }
    }
    s
}

/// Requests answered between two scrapes (WATCH and CONNECT left out).
pub(super) fn requests(a: &Scrape, b: &Scrape) -> f64 {
    b.counts
        .iter()
        .map(|(k, v)| v - a.counts.get(k).copied().unwrap_or(0.0))
        .sum()
}

/// The `q` quantile, in seconds, of the requests answered between two scrapes: linear
/// inside its bucket, as Prometheus's `histogram_quantile`.
pub(super) fn quantile(a: &Scrape, b: &Scrape, q: f64) -> Option<f64> {
    // Cumulative count per bucket bound, every label set summed.
    let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for (labels, after) in &b.buckets {
        let le = labels.split("le=\"").nth(1)?.split('"').next()?;
        let bound = if le == "+Inf" {
            f64::INFINITY
        } else {
            le.parse().ok()?
        };
        let d = after - a.buckets.get(labels).copied().unwrap_or(0.0);
        by_le.entry(bound.to_bits()).or_insert((bound, 0.0)).1 += d;
    }
    let mut cum: Vec<(f64, f64)> = by_le.into_values().collect();
    cum.sort_by(|x, y| x.0.total_cmp(&y.0));
    let total = cum.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    let mut prev = (0.0, 0.0);
    for (bound, count) in cum {
        if count >= rank {
            if bound.is_infinite() {
                return Some(prev.0);
            }
            let inside = (count - prev.1).max(1e-9);
            return Some(prev.0 + (bound - prev.0) * (rank - prev.1) / inside);
        }
        prev = (bound, count);
    }
    None
}
