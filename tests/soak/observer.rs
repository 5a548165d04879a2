//! The soak's observer: its own watches of the CRs and pods (straight to the apiserver,
//! never through the fault proxy), keeping every version seen with its resourceVersion,
//! which is the etcd revision. The registry side comes from the [`Tap`](crate::proxy::Tap),
//! whose operations carry etcd revisions too, so both histories share one clock. The
//! invariants are judged from these histories once the run is over; the product's logs
//! are never evidence. Events (events.k8s.io/v1) are watched too: their resourceVersions
//! are revisions of the same etcd, so "written before that DELETE" can be decided.

use crate::proxy::{Source, TagOp};
use cocoon_hibernation::api::annotations::{PodView, STATE_HIBERNATED, STATE_HIBERNATING};
use cocoon_hibernation::api::conditions::{self, READY};
use cocoon_hibernation::api::{CocoonHibernation, Desire, Phase};
use futures::StreamExt;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::task::JoinHandle;

pub const PHASES: [Phase; 6] = Phase::ALL;

/// The largest share of S1 checks the observer may leave undecidable before the run
/// fails. A check is undecidable when a relist (an apiserver restart, a broken watch)
/// hid the CR or pod version in force at the DELETE; the soak restarts kube-apiserver once
/// or twice and the observer's watches come back within a quarter of a second, so only a
/// few DELETEs should fall into such a gap. Beyond this share the run says too little
/// about S1 to pass.
pub const MAX_UNDECIDABLE_SHARE: f64 = 0.05;
/// Undecidable S1 checks always allowed: the short soak in `make test` judges about 40
/// deletes, and one apiserver restart can leave two or three in its gap, which would
/// fail it on noise; the full soak (about 250) is held to the share.
pub const UNDECIDABLE_ALLOWANCE: usize = 3;

#[derive(Clone, Debug)]
pub struct CrVersion {
    pub rv: u64,
    pub at: Instant,
    pub phase: Option<Phase>,
    pub desire: Desire,
    pub vm: Option<String>,
    pub deleting: bool,
    pub reason: String,
    /// `status.snapshot.digest`: the manifest this CR confirmed at H3.
    pub snapshot_digest: Option<String>,
    /// Seen through a relist: versions before it may have been missed.
    pub gap: bool,
    /// For a version seen through a relist: the watch had delivered every change up to
    /// this revision before the relist (events come in revision order), so only versions
    /// after it can have been missed.
    pub complete_to: u64,
}

#[derive(Clone, Debug)]
pub struct CrTrack {
    pub uid: String,
    pub name: String,
    pub versions: Vec<CrVersion>,
    /// When the object was seen gone, and its last revision if a watch event said so.
    pub gone: Option<(Instant, Option<u64>)>,
    /// Seen gone only by a relist: it was still there, unchanged since its last version,
    /// up to this revision (see [`CrVersion::complete_to`]).
    pub gone_complete_to: u64,
}

#[derive(Clone, Debug)]
pub struct PodVersion {
    pub rv: u64,
    pub lifecycle: Option<String>,
    /// vk reports this round hibernated and the VM gone (what H3 waits for).
    pub vk_done: bool,
    /// The pod carries the hibernate request.
    pub hibernate_requested: bool,
    /// The VM runs: a VMID, a Running container, and vk reports no hibernate in progress
    /// or done for this round (a stale `hibernated` pair from an earlier round, staged by
    /// the soak, does not stop a VM that has its VMID and runs).
    pub vm_running: bool,
    pub vm_id: Option<String>,
    pub container_running: bool,
    pub gap: bool,
    /// As [`CrVersion::complete_to`].
    pub complete_to: u64,
}

/// One Event the observer saw, by its first sighting.
#[derive(Clone, Debug)]
pub struct EventSeen {
    pub reason: String,
    pub warning: bool,
    pub rv: u64,
    /// First seen through a relist: it may have been written well before `rv` (a series
    /// update of it bumps the resourceVersion), so `rv` is only an upper bound.
    pub gap: bool,
}

#[derive(Default)]
pub struct World {
    pub crs: HashMap<String, CrTrack>,
    /// CR name -> uid of its newest object.
    pub by_name: HashMap<String, String>,
    pub pods: HashMap<String, Vec<PodVersion>>,
    /// Events by the uid of the object they are about.
    pub events: HashMap<String, Vec<EventSeen>>,
    /// Event uids already recorded (a series update repeats an event).
    event_uids: HashSet<String>,
    /// The event watch has listed once: without it no event can be judged.
    pub events_synced: bool,
    pub relists: usize,
    /// Lists completed by the CR and the pod watch (the first and every relist): after an
    /// apiserver restart the soak holds the product back until both have grown.
    pub cr_lists: usize,
    pub pod_lists: usize,
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
    /// `relist`: seen through a relist, after the watch had delivered everything up to
    /// that revision.
    fn record_cr(&mut self, cr: &CocoonHibernation, relist: Option<u64>) {
        let (Some(uid), Some(name)) = (cr.metadata.uid.clone(), cr.metadata.name.clone()) else {
            return;
        };
        let rv = rv_of(&cr.metadata);
        let track = self.crs.entry(uid.clone()).or_insert_with(|| CrTrack {
            uid: uid.clone(),
            name: name.clone(),
            versions: Vec::new(),
            gone: None,
            gone_complete_to: 0,
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
            snapshot_digest: cr
                .status
                .as_ref()
                .and_then(|s| s.snapshot.as_ref())
                .and_then(|s| s.digest.clone()),
            gap: relist.is_some(),
            complete_to: relist.unwrap_or(0),
        });
        self.by_name.insert(name, uid);
    }

    fn record_pod(&mut self, pod: &Pod, relist: Option<u64>) {
        let Some(name) = pod.metadata.name.clone() else {
            return;
        };
        let rv = rv_of(&pod.metadata);
        let view = PodView::of(pod);
        let versions = self.pods.entry(name).or_default();
        if versions.last().is_some_and(|v| v.rv >= rv) {
            return;
        }
        let hibernating = view.lifecycle_state.as_deref() == Some(STATE_HIBERNATING);
        versions.push(PodVersion {
            rv,
            vk_done: view.lifecycle_hibernated_for_round() && view.vm_id.is_none(),
            hibernate_requested: view.hibernate_requested,
            vm_running: view.container_running
                && view.vm_id.is_some()
                && !hibernating
                && !view.lifecycle_hibernated_for_round(),
            vm_id: view.vm_id.clone(),
            container_running: view.container_running,
            lifecycle: view.lifecycle_state.clone(),
            gap: relist.is_some(),
            complete_to: relist.unwrap_or(0),
        });
    }

    fn record_event(&mut self, ev: &Event, gap: bool) {
        let (Some(uid), Some(about)) = (
            ev.metadata.uid.clone(),
            ev.regarding.as_ref().and_then(|r| r.uid.clone()),
        ) else {
            return;
        };
        if !self.event_uids.insert(uid) {
            return; // a series update of an event already recorded
        }
        self.events.entry(about).or_default().push(EventSeen {
            reason: ev.reason.clone().unwrap_or_default(),
            warning: ev.type_.as_deref() == Some("Warning"),
            rv: rv_of(&ev.metadata),
            gap,
        });
    }

    /// The newest object named `name`, if it is still there.
    pub fn current(&self, name: &str) -> Option<&CrTrack> {
        let t = self.crs.get(self.by_name.get(name)?)?;
        t.gone.is_none().then_some(t)
    }

    /// The digest the newest CR named `name` (deleted or not) last confirmed.
    pub fn confirmed_digest(&self, name: &str) -> Option<&str> {
        let t = self.crs.get(self.by_name.get(name)?)?;
        t.versions
            .iter()
            .rev()
            .find_map(|v| v.snapshot_digest.as_deref())
    }

    pub fn live_tracks(&self) -> impl Iterator<Item = &CrTrack> {
        self.crs.values().filter(|t| t.gone.is_none())
    }

    /// The version of a CR in force at etcd revision `rv`: `Known(None)` when it did not
    /// exist yet or was gone.
    pub fn cr_at(t: &CrTrack, rv: u64) -> At<Option<&CrVersion>> {
        let idx = t.versions.partition_point(|v| v.rv <= rv);
        if t.versions
            .get(idx)
            .is_some_and(|next| next.gap && rv >= next.complete_to)
        {
            return At::Unknown;
        }
        // Seen gone only by a relist: after its last seen version it may have changed
        // (been marked for deletion, say) at any revision before it vanished.
        if matches!(t.gone, Some((_, None))) && idx == t.versions.len() && rv >= t.gone_complete_to
        {
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
        if versions
            .get(idx)
            .is_some_and(|next| next.gap && rv >= next.complete_to)
        {
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

/// How far one watch is known complete: a watch delivers changes in revision order, so
/// once it has delivered revision R, every change up to R has been seen. A list counts
/// only once it is whole.
#[derive(Default)]
struct Sync {
    /// Highest revision up to which every change has been delivered.
    to: u64,
    /// `to` when the current relist began.
    relist_from: u64,
    /// Highest revision among the objects of the list in progress.
    listing: u64,
}

impl Sync {
    fn seen(&mut self, meta: &kube::api::ObjectMeta) {
        self.to = self.to.max(rv_of(meta));
    }
    fn relist_begins(&mut self) {
        self.relist_from = self.to;
        self.listing = 0;
    }
    fn listed(&mut self, meta: &kube::api::ObjectMeta) {
        self.listing = self.listing.max(rv_of(meta));
    }
    fn relist_done(&mut self) {
        self.to = self.to.max(self.listing);
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
        let events: Api<Event> = Api::namespaced(client.clone(), ns);
        let cr_task = {
            let world = world.clone();
            tokio::spawn(async move {
                let stream = watcher(crs, watcher::Config::default()).backoff(Quick);
                futures::pin_mut!(stream);
                let mut synced = false;
                let mut seen: HashSet<String> = HashSet::new();
                let mut sync = Sync::default();
                while let Some(ev) = stream.next().await {
                    let Ok(ev) = ev else { continue };
                    let mut w = world.lock().unwrap();
                    match ev {
                        watcher::Event::Init => {
                            seen.clear();
                            sync.relist_begins();
                            if synced {
                                w.relists += 1;
                            }
                        }
                        watcher::Event::InitApply(cr) => {
                            if let Some(uid) = &cr.metadata.uid {
                                seen.insert(uid.clone());
                            }
                            sync.listed(&cr.metadata);
                            w.record_cr(&cr, synced.then_some(sync.relist_from));
                        }
                        watcher::Event::InitDone => {
                            if synced {
                                let now = Instant::now();
                                for t in w.crs.values_mut() {
                                    if t.gone.is_none() && !seen.contains(&t.uid) {
                                        t.gone = Some((now, None));
                                        t.gone_complete_to = sync.relist_from;
                                    }
                                }
                            }
                            sync.relist_done();
                            synced = true;
                            w.cr_lists += 1;
                        }
                        watcher::Event::Apply(cr) => {
                            sync.seen(&cr.metadata);
                            w.record_cr(&cr, None)
                        }
                        watcher::Event::Delete(cr) => {
                            sync.seen(&cr.metadata);
                            w.record_cr(&cr, None);
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
                let mut sync = Sync::default();
                while let Some(ev) = stream.next().await {
                    let Ok(ev) = ev else { continue };
                    let mut w = world.lock().unwrap();
                    match ev {
                        watcher::Event::InitApply(p) => {
                            sync.listed(&p.metadata);
                            w.record_pod(&p, synced.then_some(sync.relist_from));
                        }
                        watcher::Event::InitDone => {
                            sync.relist_done();
                            synced = true;
                            w.pod_lists += 1;
                        }
                        watcher::Event::Apply(p) | watcher::Event::Delete(p) => {
                            sync.seen(&p.metadata);
                            w.record_pod(&p, None)
                        }
                        watcher::Event::Init => sync.relist_begins(),
                    }
                }
            })
        };
        let event_task = {
            let world = world.clone();
            tokio::spawn(async move {
                let stream = watcher(events, watcher::Config::default()).backoff(Quick);
                futures::pin_mut!(stream);
                let mut synced = false;
                while let Some(ev) = stream.next().await {
                    let Ok(ev) = ev else { continue };
                    let mut w = world.lock().unwrap();
                    match ev {
                        watcher::Event::InitApply(e) => w.record_event(&e, synced),
                        watcher::Event::InitDone => {
                            synced = true;
                            w.events_synced = true;
                        }
                        watcher::Event::Apply(e) => w.record_event(&e, false),
                        watcher::Event::Delete(_) | watcher::Event::Init => {}
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
            tasks: vec![cr_task, pod_task, event_task, sampler],
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
    /// Instances the rule does not apply to (S1: vk's own drops of a restored tag).
    pub exempt: usize,
    /// What made instances undecidable (S1), for the report.
    pub undecided: Vec<String>,
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

/// Whether `from -> to` is an edge of the phase graph (docs/rules.md, crates/core/src/plan/mod.rs),
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

/// Why a tag of the VM may be its only copy while a CR is in version `v` and the pod in
/// `pod`: `Known(None)` when the VM runs a restored VM (or was never taken away).
pub fn only_copy(v: &CrVersion, pod: At<Option<&PodVersion>>) -> At<Option<String>> {
    let phase = v.phase.map_or("(no phase)".to_owned(), |p| p.to_string());
    if matches!(v.phase, Some(Phase::Hibernated | Phase::Hibernating)) {
        return At::Known(Some(phase));
    }
    match pod {
        At::Unknown => At::Unknown,
        At::Known(None) => At::Known(Some(format!("{phase} with no pod"))),
        At::Known(Some(p)) if p.hibernate_requested => At::Known(Some(format!(
            "{phase} while its pod (revision {}) asked vk to hibernate (lifecycle {:?})",
            p.rv, p.lifecycle
        ))),
        At::Known(Some(p)) if !p.vm_running => At::Known(Some(format!(
            "{phase} while its VM was not running (pod revision {}: lifecycle {:?}, VMID {:?}, container running {})",
            p.rv, p.lifecycle, p.vm_id, p.container_running
        ))),
        At::Known(Some(_)) => At::Known(None),
    }
}

/// The outcome of one S1 check.
#[derive(Debug)]
pub enum Judged {
    Safe,
    /// What the observer could not see.
    Undecidable(String),
    Violation(String),
}

/// S1 for one DELETE of the product that removed the tag of `pod`'s VM. It is looked at
/// at every instant of its window: the revision before it reached the registry and each
/// CR or pod version written until its answer. At each, every object named like the CR
/// that was live then must have been in a state where the tag is not the only copy, or
/// been deleting (G1) with its Warning SnapshotDiscarded written before the DELETE.
/// With no CR at all, the VM must have been running.
fn judge_delete(
    world: &World,
    op: &TagOp,
    pod: &str,
    tracks: &[&CrTrack],
    successor: &HashMap<&str, u64>,
) -> Judged {
    let in_window = |rv: &u64| *rv > op.rev_before && *rv <= op.rev_after;
    let mut revs = vec![op.rev_before];
    for t in tracks {
        revs.extend(t.versions.iter().map(|v| v.rv).filter(in_window));
    }
    if let Some(vs) = world.pods.get(pod) {
        revs.extend(vs.iter().map(|v| v.rv).filter(in_window));
    }
    revs.sort_unstable();
    revs.dedup();
    let what = format!(
        "tag {}:hibernate deleted by the product (DELETE answered {}, revisions {}..{})",
        op.vm, op.status, op.rev_before, op.rev_after
    );
    // The first thing the observer could not see, if any.
    let mut undecidable: Option<String> = None;
    let unknown = |undecidable: &mut Option<String>, why: String| {
        undecidable.get_or_insert(why);
    };
    for rv in revs {
        let mut any_cr = false;
        for t in tracks {
            let at = match successor.get(t.uid.as_str()) {
                Some(next) if *next <= rv => At::Known(None),
                _ => World::cr_at(t, rv),
            };
            let v = match at {
                At::Unknown => {
                    unknown(
                        &mut undecidable,
                        format!(
                            "{what}: a relist hid CR {} (uid {}) at revision {rv}",
                            t.name, t.uid
                        ),
                    );
                    continue;
                }
                At::Known(None) => continue,
                At::Known(Some(v)) => v,
            };
            any_cr = true;
            let why = match only_copy(v, world.pod_at(pod, rv)) {
                At::Unknown => {
                    unknown(
                        &mut undecidable,
                        format!(
                            "{what}: a relist hid pod {pod} at revision {rv} (CR {} {:?})",
                            t.name, v.phase
                        ),
                    );
                    continue;
                }
                At::Known(None) => continue,
                At::Known(Some(why)) => why,
            };
            if !v.deleting {
                return Judged::Violation(format!(
                    "{what} while CR {} (uid {}) was {why} at revision {rv}",
                    t.name, t.uid
                ));
            }
            // G1: a deliberate discard, which S6 wants announced before the DELETE.
            match discard_announced(world, &t.uid, op.rev_before) {
                At::Known(true) => {}
                At::Known(false) => {
                    return Judged::Violation(format!(
                        "{what} while CR {} (uid {}) was being deleted and {why} at revision {rv}, with no Warning SnapshotDiscarded event about it written before the DELETE (events about it: {:?})",
                        t.name,
                        t.uid,
                        world.events.get(&t.uid)
                    ));
                }
                At::Unknown => unknown(
                    &mut undecidable,
                    format!(
                        "{what}: CR {} (uid {}) was being deleted and {why}; whether its SnapshotDiscarded came first cannot be seen ({})",
                        t.name,
                        t.uid,
                        if world.events_synced {
                            "the event was first seen through a relist"
                        } else {
                            "the event watch never listed"
                        }
                    ),
                ),
            }
        }
        // No live CR at all: nothing owed this delete, so the VM must have been running.
        if !any_cr && undecidable.is_none() {
            match world.pod_at(pod, rv) {
                At::Unknown => unknown(
                    &mut undecidable,
                    format!(
                        "{what}: no CR of pod {pod} at revision {rv}, and a relist hid the pod"
                    ),
                ),
                At::Known(Some(p)) if p.vm_running && !p.hibernate_requested => {}
                At::Known(p) => {
                    return Judged::Violation(format!(
                        "{what} while no CR of pod {pod} existed at revision {rv} and its VM was not running (pod: {:?})",
                        p.map(|p| (p.rv, &p.lifecycle, &p.vm_id, p.container_running))
                    ));
                }
            }
        }
    }
    match undecidable {
        Some(why) => Judged::Undecidable(why),
        None => Judged::Safe,
    }
}

/// Whether a Warning `SnapshotDiscarded` about the object `uid` was written at or before
/// revision `rv`. Undecidable when the event watch never listed, or the only such event
/// was first seen through a relist after `rv` (it may be older than its revision says).
pub fn discard_announced(world: &World, uid: &str, rv: u64) -> At<bool> {
    if !world.events_synced {
        return At::Unknown;
    }
    let discards: Vec<&EventSeen> = world
        .events
        .get(uid)
        .map(|evs| {
            evs.iter()
                .filter(|e| e.warning && e.reason == "SnapshotDiscarded")
                .collect()
        })
        .unwrap_or_default();
    if discards.iter().any(|e| e.rv <= rv) {
        At::Known(true)
    } else if discards.iter().any(|e| e.gap) {
        At::Unknown
    } else {
        At::Known(false)
    }
}

/// The history checks: S1 on every tag-removing DELETE, H3 on every entry to Hibernated,
/// W2 on every entry to Active, and the phase graph on every transition.
/// `pod_of_vm` maps a VM to its pod (and CR) name.
/// `allowance`: undecidable S1 checks accepted whatever the share
/// ([`UNDECIDABLE_ALLOWANCE`] in a run; the self-check holds its few cases to the share).
pub fn judge(
    world: &World,
    ops: &[TagOp],
    pod_of_vm: &HashMap<String, String>,
    allowance: usize,
) -> (Vec<Verdict>, usize) {
    let mut s1 = Verdict::new(
        "S1",
        "no tag deleted by the product while it may be the VM's only copy: its CR Hibernating or Hibernated, or the VM not running a restored VM (Waking unconfirmed, a Failed or Active CR whose pod asks for a hibernate or whose VM vk removed), or no CR; a deleting CR's discard (G1) only after its Warning SnapshotDiscarded; vk's own drops after a restore exempt",
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

    // A track seen gone only through a relist was gone by the time the next object of
    // its name was created (names are unique among live objects).
    let mut successor: HashMap<&str, u64> = HashMap::new();
    {
        let mut by_name: HashMap<&str, Vec<&CrTrack>> = HashMap::new();
        for t in world.crs.values() {
            by_name.entry(t.name.as_str()).or_default().push(t);
        }
        for tracks in by_name.values_mut() {
            tracks.sort_by_key(|t| t.versions.first().map_or(u64::MAX, |v| v.rv));
            for pair in tracks.windows(2) {
                if let Some(first) = pair[1].versions.first() {
                    successor.insert(pair[0].uid.as_str(), first.rv);
                }
            }
        }
    }
    for op in ops.iter().filter(|o| o.removed_tag()) {
        if op.source == Source::Vk {
            // vk-cocoon dropping the tag it has just restored from: its own business.
            s1.exempt += 1;
            continue;
        }
        let Some(pod) = pod_of_vm.get(&op.vm) else {
            s1.checked += 1; // not one of the soak's VMs
            continue;
        };
        let tracks: Vec<&CrTrack> = world.crs.values().filter(|t| &t.name == pod).collect();
        match judge_delete(world, op, pod, &tracks, &successor) {
            Judged::Safe => s1.checked += 1,
            Judged::Undecidable(why) => {
                s1.unknown += 1;
                s1.undecided.push(why);
            }
            Judged::Violation(m) => {
                s1.checked += 1;
                s1.violations.push(m);
            }
        }
    }
    let judged = s1.checked + s1.unknown;
    if s1.unknown > allowance && s1.unknown as f64 > MAX_UNDECIDABLE_SHARE * judged as f64 {
        s1.violations.push(format!(
            "{} of {judged} tag deletes could not be judged (more than {:.0}%): the run says too little about S1",
            s1.unknown,
            MAX_UNDECIDABLE_SHARE * 100.0
        ));
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

// ---------------------------------------------------------------------------------------
// The judge's own table (the soak has no test harness: `run` calls this first, and
// `SOAK_SELF_CHECK=1` runs only this).

/// Checks S1's judgement on hand-made histories; returns the cases that went wrong.
pub fn self_check() -> Vec<String> {
    const VM: &str = "vm-0";
    const POD: &str = "p-0";
    #[derive(Clone, Copy)]
    enum P {
        /// Ready, a VMID, Running.
        Running,
        /// As Running, with the hibernate request on.
        Requested,
        /// `hibernating`, VMID still there.
        Hibernating,
        /// Hibernated for the round, VMID gone.
        Hibernated,
        /// As Hibernated, with the request withdrawn (a wake vk has not done yet).
        Restoring,
        /// `hibernating` with the VMID, the request withdrawn (vk has not noticed yet).
        HibernatingWithdrawn,
        /// A stale `hibernated` pair from an earlier round, VMID there, Running.
        StaleLifecycle,
    }
    fn pod(rv: u64, p: P, gap: bool) -> PodVersion {
        let (lifecycle, vm_id, running, requested, vk_done, vm_running) = match p {
            P::Running => ("ready", true, true, false, false, true),
            P::Requested => ("ready", true, true, true, false, true),
            P::Hibernating => ("hibernating", true, true, true, false, false),
            P::Hibernated => ("hibernated", false, false, true, true, false),
            P::Restoring => ("hibernated", false, false, false, true, false),
            P::HibernatingWithdrawn => ("hibernating", true, true, false, false, false),
            P::StaleLifecycle => ("hibernated", true, true, false, false, true),
        };
        PodVersion {
            rv,
            lifecycle: Some(lifecycle.into()),
            vk_done,
            hibernate_requested: requested,
            vm_running,
            vm_id: vm_id.then(|| "vmid-1".into()),
            container_running: running,
            gap,
            complete_to: 0,
        }
    }
    fn cr(rv: u64, phase: Option<Phase>, deleting: bool, gap: bool) -> CrVersion {
        CrVersion {
            rv,
            at: Instant::now(),
            phase,
            desire: Desire::Wake,
            vm: Some(VM.into()),
            deleting,
            reason: String::new(),
            snapshot_digest: None,
            gap,
            complete_to: 0,
        }
    }
    fn op(source: Source, rev_before: u64, rev_after: u64) -> TagOp {
        TagOp {
            vm: VM.into(),
            source,
            delete: true,
            rev_before,
            rev_after,
            status: 202,
            before: Some("sha256:00".into()),
            after: None,
        }
    }
    /// A CR's uid, its versions and how it was seen gone.
    type Track = (&'static str, Vec<CrVersion>, Option<(Instant, Option<u64>)>);
    struct Case {
        name: &'static str,
        crs: Vec<Track>,
        pods: Vec<PodVersion>,
        events: Option<Vec<(&'static str, u64, bool)>>,
        ops: Vec<TagOp>,
        /// (violations, undecidable, exempt, checked)
        want: (usize, usize, usize, usize),
    }
    use Phase::*;
    let p = Source::Product;
    let cases = vec![
        Case {
            name: "a product delete of a Hibernated CR's tag",
            crs: vec![("u1", vec![cr(10, Some(Hibernated), false, false)], None)],
            pods: vec![pod(9, P::Hibernated, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "Hibernating while the VM still runs",
            crs: vec![("u1", vec![cr(10, Some(Hibernating), false, false)], None)],
            pods: vec![pod(9, P::Requested, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "Hibernating even when the pod no longer asks and runs (a recreated pod)",
            crs: vec![("u1", vec![cr(10, Some(Hibernating), false, false)], None)],
            pods: vec![pod(9, P::Running, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "Waking before vk restored the VM",
            crs: vec![("u1", vec![cr(10, Some(Waking), false, false)], None)],
            pods: vec![pod(9, P::Restoring, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "Waking once the VM runs again (W2's delete)",
            crs: vec![("u1", vec![cr(10, Some(Waking), false, false)], None)],
            pods: vec![pod(9, P::Restoring, false), pod(15, P::Running, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (0, 0, 0, 1),
        },
        Case {
            name: "a Failed hibernate that vk finished",
            crs: vec![("u1", vec![cr(10, Some(Failed), false, false)], None)],
            pods: vec![pod(9, P::Hibernated, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "a Failed wake whose VM vk has not restored",
            crs: vec![("u1", vec![cr(10, Some(Failed), false, false)], None)],
            pods: vec![pod(9, P::Restoring, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "vk still says hibernating after the request was withdrawn (a Failed CR)",
            crs: vec![("u1", vec![cr(10, Some(Failed), false, false)], None)],
            pods: vec![pod(9, P::HibernatingWithdrawn, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "vk says hibernating (a Failed CR)",
            crs: vec![("u1", vec![cr(10, Some(Failed), false, false)], None)],
            pods: vec![pod(9, P::Hibernating, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "an Active CR whose pod asks vk to hibernate (F2's window)",
            crs: vec![("u1", vec![cr(10, Some(Active), false, false)], None)],
            pods: vec![pod(9, P::Requested, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "an Active CR paying its debt while the VM runs (W3)",
            crs: vec![("u1", vec![cr(10, Some(Active), false, false)], None)],
            pods: vec![pod(9, P::Running, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (0, 0, 0, 1),
        },
        Case {
            name: "a stale lifecycle pair on a running VM is no hibernate",
            crs: vec![("u1", vec![cr(10, Some(Active), false, false)], None)],
            pods: vec![pod(9, P::StaleLifecycle, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (0, 0, 0, 1),
        },
        Case {
            name: "the pod asks for a hibernate inside the DELETE's window",
            crs: vec![("u1", vec![cr(10, Some(Active), false, false)], None)],
            pods: vec![pod(9, P::Running, false), pod(21, P::Requested, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "G1 discard announced before the DELETE",
            crs: vec![("u1", vec![cr(10, Some(Hibernated), true, false)], None)],
            pods: vec![pod(9, P::Hibernated, false)],
            events: Some(vec![("SnapshotDiscarded", 18, false)]),
            ops: vec![op(p, 20, 22)],
            want: (0, 0, 0, 1),
        },
        Case {
            name: "G1 discard announced only after the DELETE",
            crs: vec![("u1", vec![cr(10, Some(Hibernated), true, false)], None)],
            pods: vec![pod(9, P::Hibernated, false)],
            events: Some(vec![("SnapshotDiscarded", 23, false)]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "G1 discard of a Waking CR whose VM vk removed, unannounced",
            crs: vec![("u1", vec![cr(10, Some(Waking), true, false)], None)],
            pods: vec![pod(9, P::Restoring, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "G1 of an Active CR whose VM runs needs no event",
            crs: vec![("u1", vec![cr(10, Some(Active), true, false)], None)],
            pods: vec![pod(9, P::Running, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (0, 0, 0, 1),
        },
        Case {
            name: "G1 discard when the events cannot be seen",
            crs: vec![("u1", vec![cr(10, Some(Hibernated), true, false)], None)],
            pods: vec![pod(9, P::Hibernated, false)],
            events: None,
            ops: vec![op(p, 20, 22), op(p, 30, 32)],
            want: (1, 2, 0, 0), // and too many undecidable
        },
        Case {
            name: "vk dropping the tag it restored from",
            crs: vec![("u1", vec![cr(10, Some(Waking), false, false)], None)],
            pods: vec![pod(9, P::Restoring, false)],
            events: Some(vec![]),
            ops: vec![op(Source::Vk, 20, 22)],
            want: (0, 0, 1, 0),
        },
        Case {
            name: "a relist hid the CR version in force",
            crs: vec![(
                "u1",
                vec![
                    cr(10, Some(Active), false, false),
                    cr(25, Some(Active), false, true),
                ],
                None,
            )],
            pods: vec![pod(9, P::Running, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 1, 0, 0), // and too many undecidable
        },
        Case {
            name: "a relist after the DELETE, the watch complete past it: decided",
            crs: vec![(
                "u1",
                vec![
                    cr(10, Some(Active), false, false),
                    CrVersion {
                        complete_to: 23,
                        ..cr(25, Some(Active), false, true)
                    },
                ],
                None,
            )],
            pods: vec![
                pod(9, P::Running, false),
                PodVersion {
                    complete_to: 23,
                    ..pod(24, P::Running, true)
                },
            ],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (0, 0, 0, 1),
        },
        Case {
            name: "a relist hid the pod version in force",
            crs: vec![("u1", vec![cr(10, Some(Active), false, false)], None)],
            pods: vec![
                pod(9, P::Running, false),
                PodVersion {
                    complete_to: 19,
                    ..pod(24, P::Running, true)
                },
            ],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 1, 0, 0), // and too many undecidable
        },
        Case {
            name: "no CR at all while the VM is hibernated",
            crs: vec![],
            pods: vec![pod(9, P::Restoring, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (1, 0, 0, 1),
        },
        Case {
            name: "a CR seen gone by a relist, then recreated: the new one decides",
            crs: vec![
                (
                    "u1",
                    vec![cr(10, Some(Hibernated), false, false)],
                    Some((Instant::now(), None)),
                ),
                ("u2", vec![cr(15, None, false, false)], None),
            ],
            pods: vec![pod(9, P::Running, false)],
            events: Some(vec![]),
            ops: vec![op(p, 20, 22)],
            want: (0, 0, 0, 1),
        },
    ];
    let mut failures = Vec::new();
    for c in cases {
        let mut world = World::default();
        for (uid, versions, gone) in c.crs {
            world.crs.insert(
                uid.into(),
                CrTrack {
                    uid: uid.into(),
                    name: POD.into(),
                    versions,
                    gone,
                    gone_complete_to: 0,
                },
            );
            world.by_name.insert(POD.into(), uid.into());
        }
        world.pods.insert(POD.into(), c.pods);
        if let Some(events) = c.events {
            world.events_synced = true;
            for (reason, rv, gap) in events {
                world
                    .events
                    .entry("u1".into())
                    .or_default()
                    .push(EventSeen {
                        reason: reason.into(),
                        warning: true,
                        rv,
                        gap,
                    });
            }
        }
        let pod_of_vm = HashMap::from([(VM.to_owned(), POD.to_owned())]);
        let (verdicts, _) = judge(&world, &c.ops, &pod_of_vm, 0);
        let s1 = &verdicts[0];
        let got = (s1.violations.len(), s1.unknown, s1.exempt, s1.checked);
        if got != c.want {
            failures.push(format!(
                "S1 self-check \"{}\": (violations, undecidable, exempt, checked) = {got:?}, want {:?}; {:?}",
                c.name, c.want, s1.violations
            ));
        }
    }
    failures
}
