//! Background load while the release is upgraded or its leader killed: admission requests
//! at a steady rate, a fleet of CRs flipping between Hibernate and Wake, and a watch on
//! the Lease that times every change of leader.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cocoon_hibernation::api::Desire;
use tokio::sync::Mutex;
use tokio::task::JoinHandle;

use crate::world::{World, settled};

/// Dry-run CREATEs of valid CRs: the apiserver calls the webhook for each (sideEffects
/// None) and stores nothing. Every answer but an admission is a failure.
pub struct AdmissionLoad {
    pub sent: Arc<AtomicUsize>,
    pub failed: Arc<AtomicUsize>,
    pub errors: Arc<Mutex<Vec<String>>>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl AdmissionLoad {
    /// `pods` have no CR; each request names one of them in turn.
    pub fn start(world: Arc<World>, pods: Vec<String>, every: Duration) -> Self {
        let sent = Arc::new(AtomicUsize::new(0));
        let failed = Arc::new(AtomicUsize::new(0));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s, f, e, st) = (sent.clone(), failed.clone(), errors.clone(), stop.clone());
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut i = 0usize;
            while !st.load(Ordering::Relaxed) {
                tick.tick().await;
                let pod = &pods[i % pods.len()];
                i += 1;
                s.fetch_add(1, Ordering::Relaxed);
                if let Err(err) = world.create_cr(pod, Desire::Hibernate, true).await {
                    f.fetch_add(1, Ordering::Relaxed);
                    let mut errors = e.lock().await;
                    if errors.len() < 10 {
                        errors.push(format!("{:?}: {err}", Instant::now()));
                    }
                }
            }
        });
        AdmissionLoad {
            sent,
            failed,
            errors,
            stop,
            task,
        }
    }

    pub async fn stop(self) -> (usize, usize, Vec<String>) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        let errors = self.errors.lock().await.clone();
        (
            self.sent.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
            errors,
        )
    }
}

/// Flips every settled CR of the fleet to the other desire, so transitions are always in
/// flight; counts the flips that completed.
pub struct Cycler {
    pub completed: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Cycler {
    pub fn start(world: Arc<World>) -> Self {
        let completed = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (c, st) = (completed.clone(), stop.clone());
        let task = tokio::spawn(async move {
            // A CR counts once per flip: after it settles in the phase its flip asked for.
            let mut pending: BTreeMap<String, Desire> = BTreeMap::new();
            while !st.load(Ordering::Relaxed) {
                if let Ok(phases) = world.phases().await {
                    for (name, (desire, phase)) in phases {
                        if phase.is_none() || phase != settled(desire) {
                            continue;
                        }
                        if pending.remove(&name).is_some() {
                            c.fetch_add(1, Ordering::Relaxed);
                        }
                        let next = match desire {
                            Desire::Hibernate => Desire::Wake,
                            _ => Desire::Hibernate,
                        };
                        if world.set_desire(&name, next).await.is_ok() {
                            pending.insert(name, next);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        });
        Cycler {
            completed,
            stop,
            task,
        }
    }

    pub async fn stop(self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.completed.load(Ordering::Relaxed)
    }
}

/// One observation of the Lease.
#[derive(Clone, Debug)]
pub struct Seen {
    pub at: Instant,
    pub holder: Option<String>,
    pub renew: Option<jiff::Timestamp>,
}

/// Polls the Lease every 100 ms and keeps every change (holder or renewTime).
pub struct LeaseWatch {
    pub log: Arc<Mutex<Vec<Seen>>>,
    stop: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl LeaseWatch {
    pub fn start(world: Arc<World>) -> Self {
        let log: Arc<Mutex<Vec<Seen>>> = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (l, st) = (log.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !st.load(Ordering::Relaxed) {
                if let Ok((holder, renew)) = world.lease().await {
                    let mut log = l.lock().await;
                    let changed = log
                        .last()
                        .is_none_or(|last| last.holder != holder || last.renew != renew);
                    if changed {
                        log.push(Seen {
                            at: Instant::now(),
                            holder,
                            renew,
                        });
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        LeaseWatch { log, stop, task }
    }

    pub async fn stop(self) -> Vec<Seen> {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.log.lock().await.clone()
    }
}

/// The longest time without a leader across changes of holder: from the old holder's
/// last renewal seen to the first sight of the new one.
pub fn longest_handover(log: &[Seen]) -> Option<Duration> {
    let mut longest: Option<Duration> = None;
    let mut last_renewal: Option<(&str, Instant)> = None;
    for seen in log {
        match (&seen.holder, last_renewal) {
            (Some(h), Some((old, at))) if h != old => {
                let gap = seen.at.duration_since(at);
                longest = Some(longest.map_or(gap, |l| l.max(gap)));
                last_renewal = Some((h, seen.at));
            }
            (Some(h), _) => last_renewal = Some((h, seen.at)),
            (None, _) => {}
        }
    }
    longest
}

/// When a holder other than `old` was first seen after `since`.
pub fn new_holder_after(log: &[Seen], old: &str, since: Instant) -> Option<(String, Instant)> {
    log.iter()
        .filter(|s| s.at >= since)
        .find_map(|s| match &s.holder {
            Some(h) if h != old => Some((h.clone(), s.at)),
            _ => None,
        })
}

/// The last renewTime `holder` wrote.
pub fn last_renewal_of(log: &[Seen], holder: &str) -> Option<jiff::Timestamp> {
    log.iter()
        .filter(|s| s.holder.as_deref() == Some(holder))
        .filter_map(|s| s.renew)
        .max()
}
