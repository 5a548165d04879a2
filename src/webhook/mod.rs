//! The validating admission webhook: axum over rustls (V1–V6).

pub mod drain;
pub mod handler;
pub mod policy;
pub mod tls;
/// The pure rules live in cocoon-core; re-exported under their old path.
pub use cocoon_core::admission as validate;

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
        .route(
            crate::schedule::admission::PATH,
            post(validate_schedule::<V>),
        )
        .route(crate::idle::admission::PATH, post(validate_idle::<V>))
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

/// K1: schedules need no cache, only the bundled tz database.
async fn validate_schedule<V: Clone + Send + Sync + 'static>(
    State(state): State<WebhookState<V>>,
    body: Bytes,
) -> impl IntoResponse {
    crate::schedule::admission::review(&body, &state.metrics)
}

/// I1: idle policies need no cache either.
async fn validate_idle<V: Clone + Send + Sync + 'static>(
    State(state): State<WebhookState<V>>,
    body: Bytes,
) -> impl IntoResponse {
    crate::idle::admission::review(&body, &state.metrics)
}

/// The production router over the shared cache.
pub fn cache_router(cache: SharedCache, metrics: Metrics) -> Router {
    router(WebhookState {
        view: cache,
        metrics,
    })
}

/// The cache as the validation rules see it (V2, V3, S2).
impl validate::ClaimView for SharedCache {
    fn synced(&self) -> bool {
        self.is_synced()
    }

    fn claims(&self, namespace: &str, pod: &str) -> Vec<validate::Claim> {
        self.crs_for_pod(namespace, pod)
            .iter()
            .map(|cr| validate::Claim {
                name: cr.metadata.name.clone().unwrap_or_default(),
                terminating: cr.is_deleting(),
            })
            .collect()
    }

    fn vm_holder(&self, namespace: &str, pod: &str) -> Option<validate::VmHolder> {
        let vm = crate::api::annotations::PodView::from_pod(&*self.pod(namespace, pod)?).vm_name?;
        self.crs_holding_vm(&vm)
            .iter()
            .find(|cr| {
                let same_pod = cr.metadata.namespace.as_deref() == Some(namespace)
                    && cr.spec.pod_ref.name == pod;
                !cr.is_deleting() && !same_pod
            })
            .map(|cr| validate::VmHolder {
                namespace: cr.metadata.namespace.clone().unwrap_or_default(),
                name: cr.metadata.name.clone().unwrap_or_default(),
                vm: vm.clone(),
            })
    }
}
