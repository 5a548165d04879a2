//! The wake proxy's metrics (Q7), under the `cocoon_wake_proxy` prefix. Labels are small
//! fixed sets: never a pod or host name.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::sync::Arc;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabels {
    pub cause: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProtocolLabels {
    pub protocol: &'static str,
}

#[derive(Clone)]
pub struct ProxyMetrics {
    /// Requests and connections held now, waiting for a wake.
    pub held: Gauge,
    /// From a request's first held byte to its forwarding.
    pub hold_seconds: Histogram,
    /// Answers that were not forwarded (503s, 404s, closed connections), by cause.
    pub refusals: Family<CauseLabels, Counter>,
    /// Desire flips to Wake this proxy wrote.
    pub wakes: Counter,
    /// Requests and connections forwarded, by protocol.
    pub forwarded: Family<ProtocolLabels, Counter>,
    /// Activity Lease writes (I2, Q4), failed ones included.
    pub activity_reports: Counter,
    registry: Arc<Registry>,
}

impl Default for ProxyMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl ProxyMetrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("cocoon_wake_proxy");
        let held = Gauge::default();
        let hold_seconds =
            Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]);
        let refusals = Family::<CauseLabels, Counter>::default();
        let wakes = Counter::default();
        let forwarded = Family::<ProtocolLabels, Counter>::default();
        let activity_reports = Counter::default();
        registry.register("held", "Requests and connections held now", held.clone());
        registry.register(
            "hold_seconds",
            "From the first held byte to forwarding",
            hold_seconds.clone(),
        );
        registry.register(
            "refusals",
            "Requests and connections answered without forwarding, by cause",
            refusals.clone(),
        );
        registry.register("wakes", "Desire flips to Wake written", wakes.clone());
        registry.register(
            "forwarded",
            "Requests and connections forwarded",
            forwarded.clone(),
        );
        registry.register(
            "activity_reports",
            "Activity Lease writes",
            activity_reports.clone(),
        );
        Self {
            held,
            hold_seconds,
            refusals,
            wakes,
            forwarded,
            activity_reports,
            registry: Arc::new(registry),
        }
    }

    pub fn refused(&self, cause: &'static str) {
        self.refusals.get_or_create(&CauseLabels { cause }).inc();
    }

    pub fn forwarded(&self, protocol: &'static str) {
        self.forwarded
            .get_or_create(&ProtocolLabels { protocol })
            .inc();
    }

    /// OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC Q7: held now, the hold histogram, refusals by cause and activity reports are
    /// exposed, labelled by cause only.
    #[test]
    fn q7_families_are_exposed() {
        let m = ProxyMetrics::new();
        m.held.set(2);
        m.hold_seconds.observe(0.3);
        m.refused("timed_out");
        m.activity_reports.inc();
        let text = m.encode().unwrap();
        for want in [
            "cocoon_wake_proxy_held 2",
            "cocoon_wake_proxy_hold_seconds_count 1",
            "cocoon_wake_proxy_refusals_total{cause=\"timed_out\"} 1",
            "cocoon_wake_proxy_activity_reports_total 1",
        ] {
            assert!(text.contains(want), "{want} missing from:\n{text}");
        }
    }
}
