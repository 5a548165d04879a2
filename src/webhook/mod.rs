//! The validating admission webhook: axum over rustls (V1–V6).

pub mod handler;
pub mod tls;
pub mod validate;

use crate::cache::SharedCache;
use crate::metrics::Metrics;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::response::IntoResponse;
use axum::routing::post;
use std::time::Duration;

pub const PATH: &str = "/validate-cocoonhibernation";
/// CocoonHibernations are tiny; anything near this is not a real review.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct WebhookState<V> {
    pub view: V,
    pub metrics: Metrics,
}

pub fn router<V: validate::ClaimView + Clone + Send + Sync + 'static>(
    state: WebhookState<V>,
) -> Router {
    Router::new()
        .route(PATH, post(validate_handler::<V>))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(tower_http::timeout::TimeoutLayer::with_status_code(
            axum::http::StatusCode::REQUEST_TIMEOUT,
            REQUEST_TIMEOUT,
        ))
        .with_state(state)
}

async fn validate_handler<V: validate::ClaimView + Clone + Send + Sync + 'static>(
    State(state): State<WebhookState<V>>,
    body: Bytes,
) -> impl IntoResponse {
    handler::review(&body, &state.view, &state.metrics)
}

/// The production router over the shared cache.
pub fn cache_router(cache: SharedCache, metrics: Metrics) -> Router {
    router(WebhookState {
        view: cache,
        metrics,
    })
}
