//! S4, no going back in time, for whole lists: kube-runtime asks for a streamed list
//! (`sendInitialEvents=true`, `resourceVersionMatch=NotOlderThan`) at resourceVersion
//! "0", which lets the apiserver serve it from its watch cache at any revision: after a
//! failover to an apiserver whose cache lags, older than the state the cache held, with
//! objects created since missing altogether (which no per-object check can notice).
//! With the resourceVersion left empty, as the `--initial-list auto` probe already asks,
//! the apiserver makes it a consistent read: it first waits until its watch cache has
//! caught up with etcd. The paged LISTs are consistent already (kube's `MostRecent`).
//!
//! This layer of the watch client rewrites that one query and passes everything else.

use http::Request;
use http::uri::{PathAndQuery, Uri};
use std::task::{Context, Poll};

const STREAMED: &str = "sendInitialEvents=true";
const ANY_VERSION: &str = "resourceVersion=0";
const CONSISTENT: &str = "resourceVersion=";

/// The URI of a streamed list at "any" version made a consistent one; `None` for any
/// other request.
pub fn consistent(uri: &Uri) -> Option<Uri> {
    let query = uri.query()?;
    let pairs: Vec<&str> = query.split('&').collect();
    if !pairs.contains(&STREAMED) || !pairs.contains(&ANY_VERSION) {
        return None;
    }
    let pairs: Vec<&str> = pairs
        .into_iter()
        .map(|p| if p == ANY_VERSION { CONSISTENT } else { p })
        .collect();
    let path_and_query = format!("{}?{}", uri.path(), pairs.join("&"));
    let mut parts = uri.clone().into_parts();
    parts.path_and_query = Some(PathAndQuery::try_from(path_and_query).ok()?);
    Uri::from_parts(parts).ok()
}

/// Applies [`consistent`] to every request of the client it wraps.
#[derive(Clone, Copy, Debug, Default)]
pub struct ConsistentListLayer;

impl<S> tower::Layer<S> for ConsistentListLayer {
    type Service = ConsistentLists<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConsistentLists { inner }
    }
}

#[derive(Clone, Debug)]
pub struct ConsistentLists<S> {
    inner: S,
}

impl<S, B> tower::Service<Request<B>> for ConsistentLists<S>
where
    S: tower::Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<B>) -> Self::Future {
        if let Some(uri) = consistent(req.uri()) {
            *req.uri_mut() = uri;
        }
        self.inner.call(req)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::{ListParams, WatchParams};
    use kube::core::Request as KubeRequest;

    fn path(uri: Option<Uri>) -> Option<String> {
        uri.map(|u| {
            u.path_and_query()
                .map(ToString::to_string)
                .unwrap_or_default()
        })
    }

    /// SPEC S4: the streamed list kube-runtime asks for becomes a consistent read; the
    /// resumed watch, the paged list and everything else pass as they are.
    #[test]
    fn s4_only_a_streamed_list_at_any_version_is_made_consistent() {
        let pods = KubeRequest::new("/api/v1/namespaces/ns/pods");
        let streamed = WatchParams {
            bookmarks: true,
            send_initial_events: true,
            ..WatchParams::default()
        };
        let uri = |r: http::Request<Vec<u8>>| r.uri().clone();
        // What kube-runtime's watcher sends for a streamed list.
        let list = uri(pods.watch(&streamed, "0").unwrap());
        assert_eq!(
            path(consistent(&list)).as_deref(),
            Some(
                "/api/v1/namespaces/ns/pods?&watch=true&timeoutSeconds=290&allowWatchBookmarks=true\
                 &sendInitialEvents=true&resourceVersionMatch=NotOlderThan&resourceVersion="
            )
        );
        let resumed = uri(pods.watch(&WatchParams::default(), "0").unwrap());
        assert_eq!(consistent(&resumed), None, "no sendInitialEvents");
        let from_bookmark = uri(pods.watch(&WatchParams::default(), "1234").unwrap());
        assert_eq!(consistent(&from_bookmark), None);
        let streamed_from = uri(pods.watch(&streamed, "1234").unwrap());
        assert_eq!(
            consistent(&streamed_from),
            None,
            "an explicit version stays"
        );
        let paged = uri(pods.list(&ListParams::default().limit(50)).unwrap());
        assert_eq!(consistent(&paged), None);
        let get = uri(pods.get("p", &Default::default()).unwrap());
        assert_eq!(consistent(&get), None);
        // A full URI keeps its scheme and authority.
        let full: Uri =
            "https://10.0.0.1:6443/api/v1/pods?sendInitialEvents=true&resourceVersion=0"
                .parse()
                .unwrap();
        assert_eq!(
            consistent(&full).map(|u| u.to_string()).as_deref(),
            Some("https://10.0.0.1:6443/api/v1/pods?sendInitialEvents=true&resourceVersion=")
        );
    }

    /// SPEC S4: the layer hands the rewritten request on.
    #[tokio::test]
    async fn s4_the_layer_rewrites_what_it_passes_on() {
        use tower::{Layer, ServiceExt};
        let echo = tower::service_fn(|req: Request<()>| async move {
            Ok::<_, std::convert::Infallible>(req.uri().to_string())
        });
        let svc = ConsistentListLayer.layer(echo);
        let req = Request::get("/api/v1/pods?sendInitialEvents=true&resourceVersion=0")
            .body(())
            .unwrap();
        let seen = svc.oneshot(req).await.unwrap();
        assert_eq!(seen, "/api/v1/pods?sendInitialEvents=true&resourceVersion=");
    }
}
