//! Plain-HTTP admin endpoints: /healthz (no stalled informer, S8), /readyz (cache synced,
//! P1) and /metrics (O1).

use crate::cache::SharedCache;
use crate::cache::liveness::Verdict;
use crate::metrics::Metrics;
use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;

#[derive(Clone)]
struct AdminState {
    cache: SharedCache,
    metrics: Metrics,
    stall_limit: std::time::Duration,
}

/// `stall_limit`: how long an informer may show no progress before /healthz fails (S8).
pub fn router(cache: SharedCache, metrics: Metrics, stall_limit: std::time::Duration) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState {
            cache,
            metrics,
            stall_limit,
        })
}

/// S8: unhealthy while an informer is stalled, naming it and for how long, so a probe's
/// event says what froze. Syncing is healthy: /readyz covers it.
async fn healthz(State(s): State<AdminState>) -> impl IntoResponse {
    health(s.cache.verdict(s.stall_limit), s.stall_limit)
}

fn health(verdict: Verdict, limit: std::time::Duration) -> (StatusCode, String) {
    match verdict {
        Verdict::Stalled { informer, silent } => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "informer {} stalled: no progress for {}s (limit {}s)",
                informer.name(),
                silent.as_secs(),
                limit.as_secs()
            ),
        ),
        Verdict::Ready | Verdict::Syncing(_) => (StatusCode::OK, "ok".to_owned()),
    }
}

async fn readyz(State(s): State<AdminState>) -> impl IntoResponse {
    if s.cache.is_synced() {
        (StatusCode::OK, "ready")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "informer cache not synced")
    }
}

async fn metrics_text(State(s): State<AdminState>) -> impl IntoResponse {
    match s.metrics.encode() {
        Ok(body) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::liveness::Informer;
    use std::time::Duration;

    /// SPEC S8: a stalled informer fails /healthz with its name and silence in the body;
    /// a syncing cache stays healthy (that is /readyz's business).
    #[test]
    fn s8_healthz_names_the_stalled_informer() {
        let limit = Duration::from_secs(60);
        let (code, body) = health(
            Verdict::Stalled {
                informer: Informer::Pods,
                silent: Duration::from_secs(75),
            },
            limit,
        );
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(
            body,
            "informer pods stalled: no progress for 75s (limit 60s)"
        );
        for v in [
            Verdict::Ready,
            Verdict::Syncing(Informer::CocoonHibernations),
        ] {
            assert_eq!(health(v, limit).0, StatusCode::OK);
        }
    }
}
