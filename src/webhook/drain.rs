//! P4: a terminating replica keeps answering reviews for a moment, but asks every client
//! to close its connection after the answer. The apiserver pools webhook connections by
//! the Service's name and reuses one whichever pod it reaches, so closing idle connections
//! under it races a review being written: that admission fails with "broken pipe".

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::Response;

#[derive(Clone, Default, Debug)]
pub struct Drain(Arc<AtomicBool>);

impl Drain {
    pub fn start(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn draining(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// `router` whose answers carry `Connection: close` once draining.
    pub fn closing(&self, router: Router) -> Router {
        let drain = self.clone();
        router.layer(axum::middleware::map_response(move |mut res: Response| {
            let draining = drain.draining();
            async move {
                if draining {
                    res.headers_mut()
                        .insert(header::CONNECTION, HeaderValue::from_static("close"));
                }
                res
            }
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Request;
    use axum::routing::get;
    use tower::ServiceExt;

    async fn connection_header(drain: &Drain) -> Option<HeaderValue> {
        let app = drain.closing(Router::new().route("/", get(|| async { "ok" })));
        let res = app
            .oneshot(Request::get("/").body(Body::empty()).expect("request"))
            .await
            .expect("answer");
        res.headers().get(header::CONNECTION).cloned()
    }

    #[tokio::test]
    async fn p4_draining_replica_asks_clients_to_close_their_connections() {
        let drain = Drain::default();
        assert_eq!(connection_header(&drain).await, None);
        drain.start();
        assert_eq!(
            connection_header(&drain).await,
            Some(HeaderValue::from_static("close"))
        );
    }
}
