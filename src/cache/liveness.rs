//! S8 No frozen view: informer liveness, i.e. when each informer last made progress, and the
//! pure verdict on it.
//!
//! kube-runtime's watcher consumes bookmarks and watch restarts without emitting an
//! event, so a quiet but healthy informer looks the same as a frozen one from its event
//! stream alone. Progress is therefore recorded at two levels: every event the driver
//! receives, and every piece of a successful list or watch reply the watch client reads
//! ([`ProgressLayer`]): objects, bookmarks, and the apiserver ending a watch at its
//! timeout. A connection that stays open but sends nothing records nothing.

use crate::api::CocoonHibernation;
use http::{Request, Response};
use http_body::{Body, Frame, SizeHint};
use kube::Resource;
use parking_lot::Mutex;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Instant;

/// One of the cache's two informers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Informer {
    CocoonHibernations,
    Pods,
}

impl Informer {
    pub const ALL: [Informer; 2] = [Informer::CocoonHibernations, Informer::Pods];

    pub fn name(self) -> &'static str {
        match self {
            Informer::CocoonHibernations => "cocoonhibernations",
            Informer::Pods => "pods",
        }
    }

    fn slot(self) -> usize {
        match self {
            Informer::CocoonHibernations => 0,
            Informer::Pods => 1,
        }
    }

    /// The informer a request of the watch client serves: lists and watches are on
    /// collection paths (`.../pods`, `.../cocoonhibernations`).
    fn of_path(path: &str) -> Option<Self> {
        let last = path.trim_end_matches('/').rsplit('/').next()?;
        if last == Informer::Pods.name() {
            Some(Informer::Pods)
        } else if last == CocoonHibernation::plural(&()) {
            Some(Informer::CocoonHibernations)
        } else {
            None
        }
    }
}

/// How long each informer's (re)list took and how many objects it held, logged at its end
/// so an operator can see where a start-up went.
#[derive(Default)]
pub struct ListTimer {
    started: [Option<(Instant, usize)>; 2],
}

impl ListTimer {
    pub fn begin(&mut self, informer: Informer) {
        self.started[informer.slot()] = Some((Instant::now(), 0));
    }

    pub fn object(&mut self, informer: Informer) {
        if let Some((_, n)) = self.started[informer.slot()].as_mut() {
            *n += 1;
        }
    }

    pub fn end(&mut self, informer: Informer) {
        if let Some((since, objects)) = self.started[informer.slot()].take() {
            tracing::info!(
                informer = informer.name(),
                objects,
                took_ms = since.elapsed().as_millis() as u64,
                "listed"
            );
        }
    }
}

/// Last-progress instants, shared by the watch client's layer, the cache driver and
/// the readers (/healthz, the elector).
#[derive(Clone, Debug)]
pub struct Progress {
    last: Arc<Mutex<[Instant; 2]>>,
}

impl Default for Progress {
    fn default() -> Self {
        Self::new()
    }
}

impl Progress {
    /// Counts from now: an informer that never gets a reply stalls after the limit.
    pub fn new() -> Self {
        let now = Instant::now();
        Self {
            last: Arc::new(Mutex::new([now; 2])),
        }
    }

    pub fn record(&self, informer: Informer, at: Instant) {
        self.with(|last| {
            let slot = &mut last[informer.slot()];
            *slot = (*slot).max(at);
        });
    }

    pub fn last(&self, informer: Informer) -> Instant {
        self.with(|last| last[informer.slot()])
    }

    fn with<R>(&self, f: impl FnOnce(&mut [Instant; 2]) -> R) -> R {
        f(&mut self.last.lock())
    }
}

/// One informer's state as read at one instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct InformerState {
    pub informer: Informer,
    pub last_progress: Instant,
    /// Delivered its first full list.
    pub synced: bool,
    /// Between `Init` and `InitDone` of a (re)list: the store still holds the old view.
    pub relisting: bool,
}

/// The cache's fitness to be acted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Synced, not relisting, and every informer made progress within the limit.
    Ready,
    /// Not synced yet, or relisting: fine to keep leading, not to begin (S8).
    Syncing(Informer),
    /// No progress for `silent`, longer than the limit: unhealthy, must not lead (S8).
    Stalled {
        informer: Informer,
        silent: Duration,
    },
}

/// S8, the pure rule. A stall outranks syncing: an informer stuck in its first list is
/// both, and the stall is what /healthz and the elector must act on.
pub fn judge(states: &[InformerState], now: Instant, limit: Duration) -> Verdict {
    let stalled = states
        .iter()
        .map(|s| (s.informer, now.saturating_duration_since(s.last_progress)))
        .filter(|(_, silent)| *silent > limit)
        .max_by_key(|(_, silent)| *silent);
    if let Some((informer, silent)) = stalled {
        return Verdict::Stalled { informer, silent };
    }
    match states.iter().find(|s| !s.synced || s.relisting) {
        Some(s) => Verdict::Syncing(s.informer),
        None => Verdict::Ready,
    }
}

/// The server-side timeout asked of each informer watch: a third of the stall limit, at
/// most kube's 290 s. Before ending a watch the apiserver sends a bookmark, and ending it
/// is progress too, so a healthy idle informer shows progress well within the limit;
/// kube-runtime also gives up on a watch silent for this plus 5 s and opens a new one.
pub fn watch_timeout(stall_limit: Duration) -> u32 {
    let third = (stall_limit / 3).as_secs().clamp(1, 290);
    u32::try_from(third).unwrap_or(290)
}

/// A tower layer for the watch client that records progress for the informer each
/// successful reply serves, as its body is read.
#[derive(Clone, Debug)]
pub struct ProgressLayer(pub Progress);

impl<S> tower::Layer<S> for ProgressLayer {
    type Service = ProgressService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ProgressService {
            inner,
            progress: self.0.clone(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct ProgressService<S> {
    inner: S,
    progress: Progress,
}

impl<S, Req, B> tower::Service<Request<Req>> for ProgressService<S>
where
    S: tower::Service<Request<Req>, Response = Response<B>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: Send + 'static,
{
    type Response = Response<ProgressBody<B>>;
    type Error = S::Error;
    type Future = futures::future::BoxFuture<'static, Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<Req>) -> Self::Future {
        let informer = Informer::of_path(req.uri().path());
        let progress = self.progress.clone();
        let reply = self.inner.call(req);
        Box::pin(async move {
            let resp = reply.await?;
            // An error status is no progress: a relist failing fast must still stall.
            let mark = informer
                .filter(|_| resp.status().is_success())
                .map(|i| (progress, i));
            Ok(resp.map(|inner| ProgressBody { inner, mark }))
        })
    }
}

/// A reply body that records progress on every data frame and on its clean end.
pub struct ProgressBody<B> {
    inner: B,
    mark: Option<(Progress, Informer)>,
}

impl<B: Body + Unpin> Body for ProgressBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Some((progress, informer)) = &self.mark {
            let progressed = match &polled {
                Poll::Ready(Some(Ok(frame))) => frame.is_data(),
                Poll::Ready(None) => true,
                _ => false,
            };
            if progressed {
                progress.record(*informer, Instant::now());
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const LIMIT: Duration = Duration::from_secs(60);

    /// The S8 table: (silent seconds, synced, relisting) of the CR and the pod informer,
    /// judged with a 60 s limit.
    #[rstest]
    #[case::s8_fresh_and_synced_is_ready((5, true, false), (5, true, false), Verdict::Ready)]
    #[case::s8_exactly_at_the_limit_is_not_yet_stalled((60, true, false), (0, true, false), Verdict::Ready)]
    #[case::s8_silent_past_the_limit_is_stalled((61, true, false), (0, true, false),
        Verdict::Stalled { informer: Informer::CocoonHibernations, silent: Duration::from_secs(61) })]
    #[case::s8_the_pod_informer_alone_stalls_the_cache((0, true, false), (300, true, false),
        Verdict::Stalled { informer: Informer::Pods, silent: Duration::from_secs(300) })]
    #[case::s8_the_longer_silence_is_named((90, true, false), (120, true, false),
        Verdict::Stalled { informer: Informer::Pods, silent: Duration::from_secs(120) })]
    #[case::s8_unsynced_is_syncing((0, true, false), (10, false, true), Verdict::Syncing(Informer::Pods))]
    #[case::s8_relisting_is_syncing((1, true, true), (1, true, false), Verdict::Syncing(Informer::CocoonHibernations))]
    #[case::s8_a_first_list_that_hangs_is_stalled((0, true, false), (61, false, true),
        Verdict::Stalled { informer: Informer::Pods, silent: Duration::from_secs(61) })]
    fn s8_informer_verdict_table(
        #[case] crs: (u64, bool, bool),
        #[case] pods: (u64, bool, bool),
        #[case] want: Verdict,
    ) {
        let now = Instant::now() + Duration::from_secs(1000);
        let state = |informer, (silent, synced, relisting): (u64, bool, bool)| InformerState {
            informer,
            last_progress: now - Duration::from_secs(silent),
            synced,
            relisting,
        };
        let states = [
            state(Informer::CocoonHibernations, crs),
            state(Informer::Pods, pods),
        ];
        assert_eq!(judge(&states, now, LIMIT), want);
    }

    /// S8: the watch asked of the apiserver ends well within the stall limit, never past
    /// kube's 290 s, never zero (zero would turn kube's own idle timeout off).
    #[rstest]
    #[case(3, 1)]
    #[case(9, 3)]
    #[case(300, 100)]
    #[case(3600, 290)]
    fn s8_watch_timeout_is_a_third_of_the_stall_limit(#[case] limit: u64, #[case] want: u32) {
        assert_eq!(watch_timeout(Duration::from_secs(limit)), want);
    }

    #[rstest]
    #[case("/api/v1/pods", Some(Informer::Pods))]
    #[case("/api/v1/namespaces/ns/pods", Some(Informer::Pods))]
    #[case(
        "/apis/cocoonset.cocoonstack.io/v1/namespaces/ns/cocoonhibernations",
        Some(Informer::CocoonHibernations)
    )]
    #[case("/api/v1/namespaces/ns/pods/web-0", None)]
    #[case("/apis/coordination.k8s.io/v1/namespaces/ns/leases/l", None)]
    fn s8_requests_are_told_apart_by_collection(
        #[case] path: &str,
        #[case] want: Option<Informer>,
    ) {
        assert_eq!(Informer::of_path(path), want);
    }

    /// S8: only a successful reply's body is progress, frame by frame; an error reply
    /// and headers without a body are not.
    #[tokio::test(start_paused = true)]
    async fn s8_progress_is_recorded_per_body_frame_of_successful_replies() {
        use http_body_util::BodyExt;
        use tower::{Layer, Service, ServiceExt};
        let progress = Progress::new();
        let start = progress.last(Informer::Pods);
        let reply = |status: u16| {
            tower::service_fn(move |_req: Request<()>| async move {
                let body = http_body_util::Full::new(&b"{}"[..]);
                Ok::<_, std::convert::Infallible>(
                    Response::builder().status(status).body(body).unwrap(),
                )
            })
        };
        let get = |path: &str| Request::get(path).body(()).unwrap();

        tokio::time::advance(Duration::from_secs(10)).await;
        let mut failing = ProgressLayer(progress.clone()).layer(reply(500));
        let resp = failing
            .ready()
            .await
            .unwrap()
            .call(get("/api/v1/pods"))
            .await;
        let _ = resp.unwrap().into_body().collect().await;
        assert_eq!(progress.last(Informer::Pods), start, "a 500 is no progress");

        let mut ok = ProgressLayer(progress.clone()).layer(reply(200));
        let resp = ok.ready().await.unwrap().call(get("/api/v1/pods")).await;
        let body = resp.unwrap().into_body();
        assert_eq!(
            progress.last(Informer::Pods),
            start,
            "headers alone are no progress"
        );
        let _ = body.collect().await;
        assert_eq!(
            progress.last(Informer::Pods),
            start + Duration::from_secs(10)
        );
        assert_eq!(progress.last(Informer::CocoonHibernations), start);
    }
}
