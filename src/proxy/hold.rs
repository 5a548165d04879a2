//! Holding (Q2): a request for a sleeping pod waits for one wake per VM, at most
//! `maxWait`, behind at most `maxPending` others. A held request is a future parked here;
//! dropping it (the client gave up) frees its place. Nothing here reads a request body.

use super::decide::{Refusal, Verdict};
use super::metrics::ProxyMetrics;
use super::routes::Target;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// A flip written this long ago that the cache still does not show may be written again.
pub const WAKE_RETRY: Duration = Duration::from_secs(5);
/// Held requests look again this often even without a cache event.
const RECHECK: Duration = Duration::from_secs(1);

/// (namespace, pod).
pub type VmKey = (String, String);

/// Why a desire flip was not written.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WakeError {
    /// Someone wrote the CR since the proxy read it: look again at the next change.
    Conflict,
    /// Anything else (apiserver unreachable, forbidden): retried after [`WAKE_RETRY`].
    Other(String),
}

/// What the holding loop needs from the cluster: the current verdict for a target, the
/// desire flip, and a signal when the cache changed.
pub trait World: Send + Sync {
    fn verdict(&self, target: &Target) -> Verdict;
    /// Flips the target's CR `cr` to Wake, fenced by `resource_version`.
    fn wake(
        &self,
        target: &Target,
        cr: &str,
        resource_version: Option<&str>,
    ) -> impl Future<Output = Result<(), WakeError>> + Send;
    fn changed(&self) -> &Notify;
}

#[derive(Debug, Default)]
struct Entry {
    pending: u32,
    /// When this proxy last flipped the VM's desire (one wake in flight).
    claimed: Option<Instant>,
}

/// The held requests and wakes in flight, per VM.
#[derive(Debug, Default)]
pub struct Holds {
    vms: Mutex<HashMap<VmKey, Entry>>,
}

/// A held request's place; dropping it frees the place.
#[derive(Debug)]
pub struct Ticket {
    holds: Arc<Holds>,
    key: VmKey,
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut vms = self.holds.vms.lock();
        if let Some(e) = vms.get_mut(&self.key) {
            e.pending = e.pending.saturating_sub(1);
            if e.pending == 0 && e.claimed.is_none() {
                vms.remove(&self.key);
            }
        }
    }
}

impl Holds {
    /// A place among the VM's held requests, unless `max` are held already.
    pub fn enter(self: &Arc<Self>, key: &VmKey, max: u32) -> Option<Ticket> {
        let mut vms = self.vms.lock();
        let e = vms.entry(key.clone()).or_default();
        if e.pending >= max {
            return None;
        }
        e.pending += 1;
        Some(Ticket {
            holds: self.clone(),
            key: key.clone(),
        })
    }

    /// Whether this caller writes the VM's wake: no flip in flight, or one older than
    /// [`WAKE_RETRY`] that never showed.
    pub fn claim_wake(&self, key: &VmKey, now: Instant) -> bool {
        let mut vms = self.vms.lock();
        let e = vms.entry(key.clone()).or_default();
        match e.claimed {
            Some(at) if now.duration_since(at) < WAKE_RETRY => false,
            _ => {
                e.claimed = Some(now);
                true
            }
        }
    }

    /// The wake in flight ended (the pod is served, refused, or the flip failed).
    pub fn settle(&self, key: &VmKey) {
        let mut vms = self.vms.lock();
        if let Some(e) = vms.get_mut(key) {
            e.claimed = None;
            if e.pending == 0 {
                vms.remove(key);
            }
        }
    }

    /// Requests held now for `key`.
    pub fn pending(&self, key: &VmKey) -> u32 {
        self.vms.lock().get(key).map_or(0, |e| e.pending)
    }
}

/// Why a request was not forwarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Refused(Refusal),
    /// Q2: `maxPending` requests are held already.
    Full,
    /// Q2: `maxWait` passed.
    TimedOut,
}

impl Answer {
    /// The metric's cause label.
    pub fn cause(&self) -> &'static str {
        match self {
            Answer::Refused(Refusal::NoPod) => "no_route",
            Answer::Refused(Refusal::NotManaged) => "not_managed",
            Answer::Refused(Refusal::Conflict(_)) => "conflict",
            Answer::Refused(Refusal::WakeFailed(..)) => "wake_failed",
            Answer::Full => "full",
            Answer::TimedOut => "timed_out",
        }
    }
}

/// Where to forward: the pod's address and uid (the fence of the warm path, Q3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ready {
    pub ip: IpAddr,
    pub uid: String,
}

/// Resolves a target to a ready pod, holding while it wakes (Q2). The warm path returns
/// at the first look, taking no place.
pub async fn resolve<W: World>(
    world: &W,
    holds: &Arc<Holds>,
    metrics: &ProxyMetrics,
    target: &Target,
) -> Result<Ready, Answer> {
    match world.verdict(target) {
        Verdict::Forward { ip, uid } => return Ok(Ready { ip, uid }),
        Verdict::Refuse(r) => return Err(Answer::Refused(r)),
        Verdict::Wake { .. } | Verdict::Wait => {}
    }
    // Past the warm path: only a held request pays for its key.
    let key: VmKey = (target.namespace().to_owned(), target.pod.clone());
    let _ticket = holds
        .enter(&key, target.policy.max_pending)
        .ok_or(Answer::Full)?;
    let _gauge = HeldGauge::new(metrics);
    let started = Instant::now();
    let deadline = started + target.policy.max_wait;
    loop {
        let changed = world.changed().notified();
        let mut changed = std::pin::pin!(changed);
        changed.as_mut().enable();
        match world.verdict(target) {
            Verdict::Forward { ip, uid } => {
                holds.settle(&key);
                metrics
                    .hold_seconds
                    .observe(started.elapsed().as_secs_f64());
                return Ok(Ready { ip, uid });
            }
            Verdict::Refuse(r) => {
                holds.settle(&key);
                return Err(Answer::Refused(r));
            }
            Verdict::Wake {
                cr,
                resource_version,
            } => {
                if holds.claim_wake(&key, Instant::now()) {
                    match world.wake(target, &cr, resource_version.as_deref()).await {
                        Ok(()) => {
                            metrics.wakes.inc();
                            continue;
                        }
                        // Someone wrote first: the next change may need a flip again.
                        Err(WakeError::Conflict) => holds.settle(&key),
                        // The claim stays: no retry before WAKE_RETRY, so a refusing
                        // apiserver is not hammered.
                        Err(WakeError::Other(e)) => {
                            tracing::warn!(ns = %key.0, pod = %key.1, error = %e, "wake not written");
                        }
                    }
                }
            }
            Verdict::Wait => {}
        }
        tokio::select! {
            () = &mut changed => {}
            () = tokio::time::sleep(RECHECK) => {}
            () = tokio::time::sleep_until(deadline) => return Err(Answer::TimedOut),
        }
        if Instant::now() >= deadline {
            return Err(Answer::TimedOut);
        }
    }
}

/// The held gauge counts this request while it lives.
struct HeldGauge<'a>(&'a ProxyMetrics);

impl<'a> HeldGauge<'a> {
    fn new(m: &'a ProxyMetrics) -> Self {
        m.held.inc();
        Self(m)
    }
}

impl Drop for HeldGauge<'_> {
    fn drop(&mut self) {
        self.0.held.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proxy::routes::Policy;
    use std::sync::atomic::{AtomicU32, Ordering};

    /// A cluster in memory: a VM that wakes `wake_takes` after its flip, or fails.
    struct FakeWorld {
        state: Mutex<State>,
        changed: Notify,
        flips: AtomicU32,
    }

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    enum State {
        Asleep,
        Waking,
        Awake,
        Failed,
    }

    impl World for FakeWorld {
        fn verdict(&self, _: &Target) -> Verdict {
            match *self.state.lock() {
                State::Asleep => Verdict::Wake {
                    cr: "cr".into(),
                    resource_version: None,
                },
                State::Waking => Verdict::Wait,
                State::Awake => Verdict::Forward {
                    ip: "127.0.0.2".parse().unwrap(),
                    uid: "u".into(),
                },
                State::Failed => {
                    Verdict::Refuse(Refusal::WakeFailed("WakeTimedOut".into(), "m".into()))
                }
            }
        }
        async fn wake(&self, _: &Target, _: &str, _: Option<&str>) -> Result<(), WakeError> {
            self.flips.fetch_add(1, Ordering::SeqCst);
            let mut s = self.state.lock();
            if *s == State::Asleep {
                *s = State::Waking;
            }
            Ok(())
        }
        fn changed(&self) -> &Notify {
            &self.changed
        }
    }

    impl FakeWorld {
        fn new(state: State) -> Arc<Self> {
            Arc::new(Self {
                state: Mutex::new(state),
                changed: Notify::new(),
                flips: AtomicU32::new(0),
            })
        }
        fn set(&self, s: State) {
            *self.state.lock() = s;
            self.changed.notify_waiters();
        }
    }

    fn target(max_pending: u32, max_wait: Duration) -> Target {
        Target {
            pod: "web-0".into(),
            port: 80,
            policy: Arc::new(Policy {
                namespace: "ns".into(),
                name: "p".into(),
                selector: Default::default(),
                max_wait,
                max_pending,
                probe_paths: vec![],
            }),
        }
    }

    fn spawn_many(
        n: usize,
        world: &Arc<FakeWorld>,
        holds: &Arc<Holds>,
        metrics: &ProxyMetrics,
        t: &Target,
    ) -> Vec<tokio::task::JoinHandle<Result<Ready, Answer>>> {
        (0..n)
            .map(|_| {
                let (w, h, m, t) = (world.clone(), holds.clone(), metrics.clone(), t.clone());
                tokio::spawn(async move { resolve(&*w, &h, &m, &t).await })
            })
            .collect()
    }

    /// SPEC Q2: 50 requests to a sleeping VM write one wake and are all served once it
    /// is awake; the histogram saw each.
    #[tokio::test(start_paused = true)]
    async fn q2_one_wake_for_many_held_requests() {
        let world = FakeWorld::new(State::Asleep);
        let (holds, metrics) = (Arc::new(Holds::default()), ProxyMetrics::new());
        let t = target(100, Duration::from_secs(60));
        let tasks = spawn_many(50, &world, &holds, &metrics, &t);
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(metrics.held.get(), 50);
        world.set(State::Awake);
        for task in tasks {
            assert!(task.await.unwrap().is_ok());
        }
        assert_eq!(world.flips.load(Ordering::SeqCst), 1);
        assert_eq!(metrics.held.get(), 0);
        assert_eq!(holds.pending(&("ns".into(), "web-0".into())), 0);
    }

    /// SPEC Q2, Q6: with the product down the wake never completes: every held request
    /// ends at maxWait, none earlier, and nothing but the one flip was written.
    #[tokio::test(start_paused = true)]
    async fn q2_q6_bounded_wait_when_nothing_wakes() {
        let world = FakeWorld::new(State::Asleep);
        let (holds, metrics) = (Arc::new(Holds::default()), ProxyMetrics::new());
        let t = target(100, Duration::from_secs(10));
        let start = Instant::now();
        let tasks = spawn_many(5, &world, &holds, &metrics, &t);
        for task in tasks {
            assert_eq!(task.await.unwrap(), Err(Answer::TimedOut));
        }
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        assert_eq!(world.flips.load(Ordering::SeqCst), 1);
    }

    /// SPEC Q2: past maxPending held requests, the next is refused at once; a client that
    /// gives up frees its place for the next.
    #[tokio::test(start_paused = true)]
    async fn q2_max_pending_and_a_client_that_gives_up_frees_its_place() {
        let world = FakeWorld::new(State::Waking);
        let (holds, metrics) = (Arc::new(Holds::default()), ProxyMetrics::new());
        let t = target(2, Duration::from_secs(60));
        let held = spawn_many(2, &world, &holds, &metrics, &t);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(
            resolve(&*world, &holds, &metrics, &t).await,
            Err(Answer::Full)
        );
        held[0].abort();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let key: VmKey = ("ns".into(), "web-0".into());
        assert_eq!(holds.pending(&key), 1);
        let again = spawn_many(1, &world, &holds, &metrics, &t);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(holds.pending(&key), 2);
        world.set(State::Awake);
        assert!(again.into_iter().next().unwrap().await.unwrap().is_ok());
    }

    /// SPEC Q6: a wake that ends Failed answers every held request at once with the CR's
    /// reason, long before maxWait.
    #[tokio::test(start_paused = true)]
    async fn q6_failed_wake_answers_held_requests_at_once() {
        let world = FakeWorld::new(State::Asleep);
        let (holds, metrics) = (Arc::new(Holds::default()), ProxyMetrics::new());
        let t = target(100, Duration::from_secs(60));
        let start = Instant::now();
        let tasks = spawn_many(3, &world, &holds, &metrics, &t);
        tokio::time::sleep(Duration::from_secs(2)).await;
        world.set(State::Failed);
        for task in tasks {
            let got = task.await.unwrap();
            assert_eq!(
                got,
                Err(Answer::Refused(Refusal::WakeFailed(
                    "WakeTimedOut".into(),
                    "m".into()
                )))
            );
        }
        assert_eq!(start.elapsed(), Duration::from_secs(2));
    }

    /// SPEC Q3: an awake pod is forwarded without taking a place or counting as held.
    #[tokio::test(start_paused = true)]
    async fn q3_warm_path_takes_no_place() {
        let world = FakeWorld::new(State::Awake);
        let (holds, metrics) = (Arc::new(Holds::default()), ProxyMetrics::new());
        let t = target(1, Duration::from_secs(60));
        assert!(resolve(&*world, &holds, &metrics, &t).await.is_ok());
        assert_eq!(metrics.held.get(), 0);
        assert!(metrics.encode().unwrap().contains("hold_seconds_count 0"));
        assert_eq!(holds.pending(&("ns".into(), "web-0".into())), 0);
    }
}
