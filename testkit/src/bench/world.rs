//! What the benchmark observes and creates: watches that timestamp every CR phase change
//! and every simulator completion, and the bounded-concurrency and retry helpers (pods in
//! [`super::pods`], product metrics in [`super::metrics`]).

use cocoon_hibernation::api::annotations::PodView;
use cocoon_hibernation::api::conditions::READY;
use cocoon_hibernation::api::{CocoonHibernation, CocoonHibernationStatus, Phase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::watcher;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

pub const PHASES: [Phase; 6] = Phase::ALL;

pub fn phase_index(p: Option<Phase>) -> usize {
    p.and_then(|p| PHASES.iter().position(|x| *x == p))
        .unwrap_or(PHASES.len())
}

/// How a CR status change seen by the watch differs from the one before.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusChange {
    /// The phase moved.
    Phase,
    /// Same phase, same condition types: only Ready's reason or message changed.
    Reason,
    /// Anything else (a condition added or removed, vmName, observedGeneration).
    Other,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodDone {
    /// vk's lifecycle patch: hibernated for the round, VMID cleared (what H3 reads).
    Hibernated,
    /// vk's Running report after a new VMID (what W2 reads).
    Woken,
}

#[derive(Default)]
pub struct Seen {
    pub phase: HashMap<String, Option<Phase>>,
    status: HashMap<String, Option<CocoonHibernationStatus>>,
    pub transitions: Vec<(Instant, String, Phase)>,
    pub status_changes: Vec<(Instant, String, StatusChange)>,
    pod_state: HashMap<String, (bool, bool)>,
    pub pod_done: Vec<(Instant, String, PodDone)>,
}

fn classify(old: &CocoonHibernationStatus, new: &CocoonHibernationStatus) -> StatusChange {
    if old.phase != new.phase {
        return StatusChange::Phase;
    }
    let types = |s: &CocoonHibernationStatus| {
        let mut t: Vec<String> = s.conditions.iter().map(|c| c.type_.clone()).collect();
        t.sort();
        t
    };
    let ready = |s: &CocoonHibernationStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == READY)
            .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
    };
    let same_rest = old.vm_name == new.vm_name
        && old.observed_generation == new.observed_generation
        && types(old) == types(new);
    let others_same = |s: &CocoonHibernationStatus| {
        s.conditions
            .iter()
            .filter(|c| c.type_ != READY)
            .map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone()))
            .collect::<Vec<_>>()
    };
    if same_rest && others_same(old) == others_same(new) && ready(old) != ready(new) {
        StatusChange::Reason
    } else {
        StatusChange::Other
    }
}

fn counts(s: &Seen, names: &[String]) -> [usize; 7] {
    let mut c = [0; 7];
    for n in names {
        c[phase_index(s.phase.get(n).copied().flatten())] += 1;
    }
    c
}

/// (ms since the start, counts by phase index).
pub type Sample = (f64, [usize; 7]);

/// Phase counts over time, sampled in the background.
pub struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    task: JoinHandle<()>,
}

impl Sampler {
    /// Stops sampling and returns the samples.
    pub fn finish(self) -> Vec<Sample> {
        self.task.abort();
        self.samples.lock().expect("samples lock").clone()
    }
}

/// Watches of CRs and pods in one namespace, recording what they see with timestamps.
pub struct Watches {
    pub seen: Arc<Mutex<Seen>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Watches {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Watches {
    pub fn start(client: &kube::Client, ns: &str, pods: bool) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut tasks = Vec::new();
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), ns);
        let s = seen.clone();
        tasks.push(tokio::spawn(async move {
            let stream = watcher(crs, watcher::Config::default().any_semantic());
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let now = Instant::now();
                let obj = match ev {
                    Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                    _ => continue,
                };
                let name = obj.metadata.name.clone().unwrap_or_default();
                let mut s = s.lock().expect("seen lock");
                let new_phase = obj.phase();
                let old_phase = s.phase.insert(name.clone(), new_phase).flatten();
                if let Some(p) = new_phase
                    && old_phase != Some(p)
                {
                    s.transitions.push((now, name.clone(), p));
                }
                let old = s.status.insert(name.clone(), obj.status.clone()).flatten();
                if let Some(new) = &obj.status
                    && old.as_ref() != Some(new)
                {
                    let change = classify(&old.unwrap_or_default(), new);
                    s.status_changes.push((now, name, change));
                }
            }
        }));
        if pods {
            let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
            let s = seen.clone();
            tasks.push(tokio::spawn(async move {
                let stream = watcher(pods, watcher::Config::default().any_semantic());
                futures::pin_mut!(stream);
                while let Some(ev) = stream.next().await {
                    let now = Instant::now();
                    let pod = match ev {
                        Ok(watcher::Event::Apply(o) | watcher::Event::InitApply(o)) => o,
                        _ => continue,
                    };
                    let name = pod.metadata.name.clone().unwrap_or_default();
                    let v = PodView::of(&pod);
                    let hib = v.lifecycle_hibernated_for_round() && v.vm_id.is_none();
                    let woke = v.woken();
                    let mut s = s.lock().expect("seen lock");
                    let (was_hib, was_woke) = s
                        .pod_state
                        .insert(name.clone(), (hib, woke))
                        .unwrap_or((false, true));
                    if hib && !was_hib {
                        s.pod_done.push((now, name.clone(), PodDone::Hibernated));
                    }
                    if woke && !was_woke {
                        s.pod_done.push((now, name, PodDone::Woken));
                    }
                }
            }));
        }
        Self { seen, tasks }
    }

    /// Counts of `names` by phase index (see [`PHASES`]; the last slot is "no phase").
    pub fn counts(&self, names: &[String]) -> [usize; 7] {
        counts(&self.seen.lock().expect("seen lock"), names)
    }

    /// Samples [`Self::counts`] every `every` (ms since `t0`) until the task is aborted.
    pub fn sampler(&self, names: Vec<String>, t0: Instant, every: Duration) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let (seen, out) = (self.seen.clone(), samples.clone());
        let task = tokio::spawn(async move {
            loop {
                let c = counts(&seen.lock().expect("seen lock"), &names);
                out.lock()
                    .expect("samples lock")
                    .push((t0.elapsed().as_secs_f64() * 1000.0, c));
                tokio::time::sleep(every).await;
            }
        });
        Sampler { samples, task }
    }

    /// Waits until every name is in `want`; samples phase counts every `every` into
    /// `timeline` (ms since `t0`). Panics after `timeout`.
    pub async fn wait_all(
        &self,
        names: &[String],
        want: Phase,
        timeout: Duration,
        t0: Instant,
        every: Duration,
        timeline: &mut Vec<(f64, [usize; 7])>,
    ) {
        let deadline = Instant::now() + timeout;
        loop {
            let c = self.counts(names);
            timeline.push((t0.elapsed().as_secs_f64() * 1000.0, c));
            if c[phase_index(Some(want))] == names.len() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "not all {} CRs reached {want} within {timeout:?}: counts {c:?} \
                 (Pending, Hibernating, Hibernated, Waking, Active, Failed, none)",
                names.len()
            );
            tokio::time::sleep(every).await;
        }
    }

    /// When each name first reached `want` at or after `since`.
    pub fn reached(
        &self,
        names: &[String],
        want: Phase,
        since: Instant,
    ) -> HashMap<String, Instant> {
        // A set: the capacity part asks for thousands of names among 50k transitions.
        let names: HashSet<&String> = names.iter().collect();
        let s = self.seen.lock().expect("seen lock");
        let mut out = HashMap::new();
        for (t, n, p) in &s.transitions {
            if *p == want && *t >= since && names.contains(n) {
                out.entry(n.clone()).or_insert(*t);
            }
        }
        out
    }

    /// When each pod first reported `what` at or after `since`.
    pub fn pod_done(&self, what: PodDone, since: Instant) -> HashMap<String, Instant> {
        let s = self.seen.lock().expect("seen lock");
        let mut out = HashMap::new();
        for (t, n, d) in &s.pod_done {
            if *d == what && *t >= since {
                out.entry(n.clone()).or_insert(*t);
            }
        }
        out
    }

    /// Status changes of `names` between two instants, by kind.
    pub fn status_changes(&self, names: &[String], from: Instant, to: Instant) -> [usize; 3] {
        let s = self.seen.lock().expect("seen lock");
        let mut c = [0; 3];
        for (t, n, k) in &s.status_changes {
            if *t >= from && *t <= to && names.contains(n) {
                c[match k {
                    StatusChange::Phase => 0,
                    StatusChange::Reason => 1,
                    StatusChange::Other => 2,
                }] += 1;
            }
        }
        c
    }
}

/// Runs `f` over `items` with at most `concurrency` in flight.
pub async fn for_each_concurrent<T, F, Fut>(items: Vec<T>, concurrency: usize, f: F)
where
    F: Fn(T) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    futures::stream::iter(items)
        .map(f)
        .buffer_unordered(concurrency)
        .collect::<Vec<()>>()
        .await;
}

/// Retries a write a few times on transient errors (a loaded apiserver may time out).
pub async fn retry<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let mut last = None;
    for attempt in 0..5 {
        match f().await {
            Ok(v) => return v,
            Err(e) => {
                last = Some(e);
                tokio::time::sleep(Duration::from_millis(200 << attempt)).await;
            }
        }
    }
    panic!("{what}: {:?}", last);
}
