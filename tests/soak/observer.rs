//! The soak's observer: its own watches of the CRs and pods (straight to the apiserver,
//! never through the fault proxy), keeping every version seen with its resourceVersion,
//! which is the etcd revision. The registry side comes from the [`Tap`](crate::proxy::Tap),
//! whose operations carry etcd revisions too, so both histories share one clock. The
//! invariants are judged from these histories once the run is over; the product's logs
//! are never evidence.

use crate::proxy::TagOp;
use cocoon_hibernation::api::annotations::{PodView, STATE_HIBERNATED, STATE_HIBERNATING};
use cocoon_hibernation::api::conditions::{self, READY};
use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

pub const PHASES: [Phase; 6] = Phase::ALL;

#[derive(Clone, Debug)]
pub struct CrVersion {
    pub rv: u64,
    pub at: Instant,
    pub phase: Option<Phase>,
    pub desire: Desire,
    pub vm: Option<String>,
    pub deleting: bool,
    pub reason: String,
    /// Seen through a relist: versions before it may have been missed.
    pub gap: bool,
}

#[derive(Clone, Debug)]
pub struct CrTrack {
    pub uid: String,
    pub name: String,
    pub versions: Vec<CrVersion>,
    /// When the object was seen gone, and its last revision if a watch event said so.
    pub gone: Option<(Instant, Option<u64>)>,
}

#[derive(Clone, Debug)]
pub struct PodVersion {
    pub rv: u64,
    pub lifecycle: Option<String>,
    /// vk reports this round hibernated and the VM gone (what H3 waits for).
    pub vk_done: bool,
    pub gap: bool,
}

#[derive(Default)]
pub struct World {
    pub crs: HashMap<String, CrTrack>,
    /// CR name -> uid of its newest object.
    pub by_name: HashMap<String, String>,
    pub pods: HashMap<String, Vec<PodVersion>>,
    pub relists: usize,
    /// (ms since start, live CRs per phase in [`PHASES`] order, then "no phase").
    pub timeline: Vec<(f64, [usize; 7])>,
}

/// What a lookup in a history found.
pub enum At<T> {
    Known(T),
    /// A relist may have hidden the version in force then.
    Unknown,
}

fn rv_of(meta: &kube::api::ObjectMeta) -> u64 {
    meta.resource_version
        .as_deref()
        .and_then(|r| r.parse().ok())
        .unwrap_or(0)
}

impl World {
    fn record_cr(&mut self, cr: &CocoonHibernation, gap: bool) {
        let (Some(uid), Some(name)) = (cr.metadata.uid.clone(), cr.metadata.name.clone()) else {
            return;
        };
        let rv = rv_of(&cr.metadata);
        let track = self.crs.entry(uid.clone()).or_insert_with(|| CrTrack {
            uid: uid.clone(),
            name: name.clone(),
            versions: Vec::new(),
            gone: None,
        });
        if track.versions.last().is_some_and(|v| v.rv >= rv) {
            return; // a relist repeats what we have
        }
        let reason = cr
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, READY))
            .map(|c| c.reason.clone())
            .unwrap_or_default();
        track.versions.push(CrVersion {
            rv,
            at: Instant::now(),
            phase: cr.phase(),
            desire: cr.spec.desire,
            vm: cr.vm_name().map(str::to_owned),
            deleting: cr.is_deleting(),
            reason,
            gap,
        });
        self.by_name.insert(name, uid);
    }

    fn record_pod(&mut self, pod: &Pod, gap: bool) {
        let Some(name) = pod.metadata.name.clone() else {
            return;
        };
        let rv = rv_of(&pod.metadata);
        let view = PodView::of(pod);
        let versions = self.pods.entry(name).or_default();
        if versions.last().is_some_and(|v| v.rv >= rv) {
            return;
        }
        versions.push(PodVersion {
            rv,
            vk_done: view.lifecycle_hibernated_for_round() && view.vm_id.is_none(),
            lifecycle: view.lifecycle_state.clone(),
            gap,
        });
    }

    /// The newest object named `name`, if it is still there.
    pub fn current(&self, name: &str) -> Option<&CrTrack> {
        let t = self.crs.get(self.by_name.get(name)?)?;
        t.gone.is_none().then_some(t)
    }

    pub fn live_tracks(&self) -> impl Iterator<Item = &CrTrack> {
        self.crs.values().filter(|t| t.gone.is_none())
    }

    /// The version of a CR in force at etcd revision `rv`: `Known(None)` when it did not
    /// exist yet or was gone.
    pub fn cr_at(t: &CrTrack, rv: u64) -> At<Option<&CrVersion>> {
        let idx = t.versions.partition_point(|v| v.rv <= rv);
        if t.versions.get(idx).is_some_and(|next| next.gap) {
            return At::Unknown;
        }
        // Seen gone only by a relist: after its last seen version it may have changed
        // (been marked for deletion, say) at any revision before it vanished.
        if matches!(t.gone, Some((_, None))) && idx == t.versions.len() {
            return At::Unknown;
        }
        if let Some((_, Some(gone))) = t.gone
            && gone <= rv
        {
            return At::Known(None);
        }
        At::Known(idx.checked_sub(1).and_then(|i| t.versions.get(i)))
    }

    pub fn pod_at(&self, pod: &str, rv: u64) -> At<Option<&PodVersion>> {
        let Some(versions) = self.pods.get(pod) else {
            return At::Known(None);
        };
        let idx = versions.partition_point(|v| v.rv <= rv);
        if versions.get(idx).is_some_and(|next| next.gap) {
            return At::Unknown;
        }
        At::Known(idx.checked_sub(1).and_then(|i| versions.get(i)))
    }

    fn sample(&mut self, ms: f64) {
        let mut counts = [0usize; 7];
        for t in self.crs.values().filter(|t| t.gone.is_none()) {
            let p = t.versions.last().and_then(|v| v.phase);
            let i = p
                .and_then(|p| PHASES.iter().position(|x| *x == p))
                .unwrap_or(6);
            counts[i] += 1;
        }
        self.timeline.push((ms, counts));
    }
}

/// Retry a broken watch every 250 ms: after an apiserver restart the observer must be
/// back before the product is, or its relist hides transitions (they count as undecidable).
struct Quick;

impl Iterator for Quick {
    type Item = Duration;
    fn next(&mut self) -> Option<Duration> {
        Some(Duration::from_millis(250))
    }
}

impl kube::runtime::utils::Backoff for Quick {
    fn reset(&mut self) {}
}

pub struct Observer {
    pub world: Arc<Mutex<World>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

impl Observer {
    pub fn start(client: &kube::Client, ns: &str, started: Instant) -> Self {
        let world = Arc::new(Mutex::new(World::default()));
        let crs: Api<CocoonHibernation> = Api::namespaced(client.clone(), ns);
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let cr_task = {
            let world = world.clone();
            tokio::spawn(async move {
                let stream = watcher(crs, watcher::Config::default()).backoff(Quick);
                futures::pin_mut!(stream);
                let mut synced = false;
                let mut seen: HashSet<String> = HashSet::new();
                while let Some(ev) = stream.next().await {
                    let Ok(ev) = ev else { continue };
                    let mut w = world.lock().unwrap();
                    match ev {
                        watcher::Event::Init => {
                            seen.clear();
                            if synced {
                                w.relists += 1;
                            }
                        }
                        watcher::Event::InitApply(cr) => {
                            if let Some(uid) = &cr.metadata.uid {
                                seen.insert(uid.clone());
                            }
                            w.record_cr(&cr, synced);
                        }
                        watcher::Event::InitDone => {
                            if synced {
                                let now = Instant::now();
                                for t in w.crs.values_mut() {
                                    if t.gone.is_none() && !seen.contains(&t.uid) {
                                        t.gone = Some((now, None));
                                    }
                                }
                            }
                            synced = true;
                        }
                        watcher::Event::Apply(cr) => w.record_cr(&cr, false),
                        watcher::Event::Delete(cr) => {
                            w.record_cr(&cr, false);
                            if let Some(t) = cr.metadata.uid.as_ref().and_then(|u| w.crs.get_mut(u))
                            {
                                t.gone = Some((Instant::now(), Some(rv_of(&cr.metadata))));
                            }
                        }
                    }
                }
            })
        };
        let pod_task = {
            let world = world.clone();
            tokio::spawn(async move {
                let stream = watcher(pods, watcher::Config::default()).backoff(Quick);
                futures::pin_mut!(stream);
                let mut synced = false;
                while let Some(ev) = stream.next().await {
                    let Ok(ev) = ev else { continue };
                    let mut w = world.lock().unwrap();
                    match ev {
                        watcher::Event::InitApply(p) => w.record_pod(&p, synced),
                        watcher::Event::InitDone => synced = true,
                        watcher::Event::Apply(p) | watcher::Event::Delete(p) => {
                            w.record_pod(&p, false)
                        }
                        watcher::Event::Init => {}
                    }
                }
            })
        };
        let sampler = {
            let world = world.clone();
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(Duration::from_secs(1));
                loop {
                    tick.tick().await;
                    let ms = started.elapsed().as_secs_f64() * 1000.0;
                    world.lock().unwrap().sample(ms);
                }
            })
        };
        Self {
            world,
            tasks: vec![cr_task, pod_task, sampler],
        }
    }
}

// ---------------------------------------------------------------------------------------
// Judging the histories.

/// One invariant's outcome.
#[derive(Clone, Debug, Default)]
pub struct Verdict {
    pub id: &'static str,
    pub what: &'static str,
    /// Instances looked at.
    pub checked: usize,
    /// Instances a relist made undecidable (not counted as checked).
    pub unknown: usize,
    pub violations: Vec<String>,
}

impl Verdict {
    pub fn new(id: &'static str, what: &'static str) -> Self {
        Self {
            id,
            what,
            ..Default::default()
        }
    }
}

/// Whether `from -> to` is an edge of the phase graph (docs/rules.md, src/controller/plan.rs),
/// given the desire in the object that carries `to` (a status write carries the
/// resourceVersion it was planned from, so that is the desire the pass saw).
pub fn allowed(from: Option<Phase>, to: Phase, desire: Desire) -> bool {
    use Phase::*;
    let hib = desire == Desire::Hibernate;
    let wake = desire == Desire::Wake;
    match (from, to) {
        (_, Failed) => true, // a timeout, a conflict (S2) or R3, from anywhere
        (None | Some(Pending), Pending) => true,
        (None | Some(Pending) | Some(Active) | Some(Failed), Hibernating) => hib,
        (None | Some(Pending) | Some(Hibernated) | Some(Failed), Waking) => wake,
        // A new Wake CR whose pod already runs its VM goes straight to Active (W2).
        (None | Some(Pending), Active) => wake,
        (Some(Hibernating), Hibernated) => true,
        // D1: a wake in flight ends whatever the desire says now.
        (Some(Waking), Active) => true,
        // R2: the pod vanished (Hibernated and Waking keep their phase).
        (Some(Hibernating | Active | Failed), Pending) => true,
        _ => false,
    }
}

/// The tag's presence at etcd revision `rv`, from the tapped operations of its VM (sorted
/// by revision). Every PUT and DELETE of a snapshot goes through the tap, serialized per
/// VM, so between two operations the tag does not change.
pub fn tag_at(ops: &[&TagOp], rv: u64) -> At<bool> {
    for op in ops {
        if op.rev_before <= rv && rv < op.rev_after {
            // In flight: decided only if it changed nothing.
            return match (op.before.is_some(), op.after.is_some()) {
                (a, b) if a == b => At::Known(a),
                _ => At::Unknown,
            };
        }
        if op.rev_before > rv {
            return At::Known(op.before.is_some());
        }
    }
    At::Known(ops.last().is_some_and(|op| op.after.is_some()))
}

/// The history checks: S1 on every tag-removing DELETE, H3 on every entry to Hibernated,
/// W2 on every entry to Active, and the phase graph on every transition.
/// `pod_of_vm` maps a VM to its pod (and CR) name.
pub fn judge(
    world: &World,
    ops: &[TagOp],
    pod_of_vm: &HashMap<String, String>,
) -> (Vec<Verdict>, usize) {
    let mut s1 = Verdict::new(
        "S1",
        "no tag deleted while a live CR of its VM is Hibernated, or vk reports the VM hibernated (Hibernating with vk done, Waking before vk woke it)",
    );
    let mut h3 = Verdict::new("H3", "no CR enters Hibernated without its tag present");
    let mut w2 = Verdict::new(
        "W2",
        "no CR enters Active while vk reports hibernating/hibernated",
    );
    let mut graph = Verdict::new(
        "D1",
        "phases follow the transition graph (no skipped state; Waking/Hibernating only with that desire)",
    );
    let mut by_vm: HashMap<&str, Vec<&TagOp>> = HashMap::new();
    for op in ops {
        by_vm.entry(op.vm.as_str()).or_default().push(op);
    }
    for v in by_vm.values_mut() {
        v.sort_by_key(|o| o.rev_before);
    }

    for op in ops.iter().filter(|o| o.removed_tag()) {
        s1.checked += 1;
        let Some(pod) = pod_of_vm.get(&op.vm) else {
            continue;
        };
        for t in world.crs.values().filter(|t| &t.name == pod) {
            let mut revs = vec![op.rev_before];
            revs.extend(
                t.versions
                    .iter()
                    .map(|v| v.rv)
                    .filter(|rv| *rv > op.rev_before && *rv <= op.rev_after),
            );
            for rv in revs {
                let v = match World::cr_at(t, rv) {
                    At::Unknown => {
                        s1.unknown += 1;
                        continue;
                    }
                    At::Known(None) => continue,
                    At::Known(Some(v)) => v,
                };
                if v.deleting {
                    continue;
                }
                // Hibernated, or any other phase while vk reports the VM hibernated and
                // gone (Hibernating with vk done, or a wake vk has not done yet): the tag
                // is then the VM's only copy.
                let bad = match (v.phase, world.pod_at(pod, rv)) {
                    (Some(Phase::Hibernated), _) => Some("Hibernated".to_owned()),
                    (phase, At::Known(Some(p))) if p.vk_done => Some(format!(
                        "{} while vk reported the VM hibernated and gone",
                        phase.map_or("(no phase)".to_owned(), |p| p.to_string())
                    )),
                    (_, At::Unknown) => {
                        s1.unknown += 1;
                        None
                    }
                    _ => None,
                };
                if let Some(state) = bad {
                    s1.violations.push(format!(
                        "tag {}:hibernate deleted (DELETE answered {}, revisions {}..{}) while CR {} (uid {}) was {state} at revision {rv}",
                        op.vm, op.status, op.rev_before, op.rev_after, t.name, t.uid
                    ));
                }
            }
        }
    }

    let mut transitions = 0;
    let vm_of_pod: HashMap<&str, &str> = pod_of_vm
        .iter()
        .map(|(vm, pod)| (pod.as_str(), vm.as_str()))
        .collect();
    for t in world.crs.values() {
        let mut prev: Option<Phase> = None;
        for (k, v) in t.versions.iter().enumerate() {
            let Some(phase) = v.phase else { continue };
            if prev == Some(phase) {
                continue;
            }
            transitions += 1;
            if v.gap {
                graph.unknown += 1;
            } else {
                graph.checked += 1;
                if !allowed(prev, phase, v.desire) {
                    graph.violations.push(format!(
                        "CR {} (uid {}): {} -> {phase} ({}) with desire {:?} at revision {}",
                        t.name,
                        t.uid,
                        prev.map_or("(none)".to_owned(), |p| p.to_string()),
                        v.reason,
                        v.desire,
                        v.rv
                    ));
                }
            }
            let vm =
                v.vm.as_deref()
                    .or_else(|| vm_of_pod.get(t.name.as_str()).copied());
            match phase {
                Phase::Hibernated => {
                    h3.checked += 1;
                    let ops = vm.and_then(|vm| by_vm.get(vm)).map_or(&[][..], |o| &o[..]);
                    match tag_at(ops, v.rv) {
                        At::Known(true) => {
                            // H3: a tag pushed before this hibernate began (a stale tag)
                            // never completes it. The cycle began at the last version
                            // before this one that was neither Hibernating nor Failed.
                            let start = t.versions[..k]
                                .iter()
                                .rev()
                                .find(|p| !matches!(p.phase, Some(Phase::Hibernating | Phase::Failed)))
                                .or(t.versions.first())
                                .map_or(0, |p| p.rv);
                            let put = ops
                                .iter()
                                .rev()
                                .find(|o| o.rev_after <= v.rv && !o.delete && o.after.is_some());
                            // A CR made for a pod vk had already hibernated (the CR
                            // before it was deleted and its cleanup kept the tag, G2)
                            // adopts that hibernation: the tag is current when vk has
                            // reported the VM hibernated and gone ever since the push.
                            let adopted = |put: &&TagOp| {
                                world.pods.get(t.name.as_str()).is_some_and(|vs| {
                                    let mut window = vs
                                        .iter()
                                        .filter(|p| p.rv > put.rev_after && p.rv <= v.rv)
                                        .peekable();
                                    window.peek().is_some() && window.all(|p| p.vk_done && !p.gap)
                                })
                            };
                            if let Some(put) =
                                put.filter(|o| o.rev_after <= start).filter(|o| !adopted(o))
                            {
                                h3.violations.push(format!(
                                    "CR {} (uid {}) entered Hibernated at revision {} on a tag pushed at revisions {}..{}, before its hibernate began (revision {start})",
                                    t.name, t.uid, v.rv, put.rev_before, put.rev_after
                                ));
                            }
                        }
                        At::Known(false) => h3.violations.push(format!(
                            "CR {} (uid {}) entered Hibernated at revision {} while {:?}:hibernate was absent; the VM's tag operations (delete, revisions, status, digest before -> after): {:?}",
                            t.name,
                            t.uid,
                            v.rv,
                            vm,
                            ops.iter()
                                .map(|o| format!(
                                    "{} {}..{} {} {:?} -> {:?}",
                                    if o.delete { "DELETE" } else { "PUT" },
                                    o.rev_before,
                                    o.rev_after,
                                    o.status,
                                    o.before.as_deref().map(|d| d.get(7..19).unwrap_or(d)),
                                    o.after.as_deref().map(|d| d.get(7..19).unwrap_or(d))
                                ))
                                .collect::<Vec<_>>()
                        )),
                        At::Unknown => {
                            h3.checked -= 1;
                            h3.unknown += 1;
                        }
                    }
                }
                Phase::Active => {
                    w2.checked += 1;
                    match world.pod_at(&t.name, v.rv) {
                        At::Known(Some(p))
                            if matches!(
                                p.lifecycle.as_deref(),
                                Some(STATE_HIBERNATED | STATE_HIBERNATING)
                            ) =>
                        {
                            w2.violations.push(format!(
                                "CR {} (uid {}) entered Active at revision {} while its pod (revision {}) reported lifecycle-state={:?}",
                                t.name, t.uid, v.rv, p.rv, p.lifecycle
                            ))
                        }
                        At::Unknown => {
                            w2.checked -= 1;
                            w2.unknown += 1;
                        }
                        _ => {}
                    }
                }
                _ => {}
            }
            prev = Some(phase);
        }
    }
    (vec![s1, h3, w2, graph], transitions)
}
