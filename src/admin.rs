//! Plain-HTTP admin endpoints: /healthz, /readyz (cache synced, P1) and /metrics (O1).

use crate::cache::SharedCache;
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
}

pub fn router(cache: SharedCache, metrics: Metrics) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics_text))
        .with_state(AdminState { cache, metrics })
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
