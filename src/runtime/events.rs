//! Kubernetes Events for the controllers: kube-runtime's [`Event`] and [`Reporter`], and a
//! recorder that folds a repeated event into a series, as kube-runtime's and client-go's do.
//!
//! Ours, not kube-runtime's `Recorder`: that one keeps every event it published, whole,
//! for six minutes and scans all of them on every publish. A first start over 50k new
//! CRs (one event each) then holds 50k events and spends O(n²) under one lock. This one
//! keeps a few small fields per event, sweeps the expired ones at most once a
//! [`SWEEP_EVERY`], and keeps at most [`MAX_SERIES`] (client-go's LRU holds 4096): past
//! that, an event is still written, only not folded into a series.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
pub use kube::runtime::events::{Event, EventType, Reporter};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a published event may still grow a series (kube-runtime's and client-go's).
pub const SERIES_TTL: Duration = Duration::from_secs(6 * 60);
/// Events remembered for series at most.
pub const MAX_SERIES: usize = 4096;
/// Expired series are dropped at most this often, so a publish is O(1) amortised.
pub const SWEEP_EVERY: Duration = Duration::from_secs(10);

#[derive(Clone)]
pub struct Recorder {
    client: Client,
    reporter: Arc<Reporter>,
    series: Arc<Mutex<Series>>,
}

/// What a folded event needs: its name, its count, and when it was last seen.
struct Seen {
    name: String,
    count: i32,
    last: Instant,
}

struct Series {
    seen: HashMap<u64, Seen>,
    swept: Instant,
}

/// What a publish does: write a new event, or grow the series of one already written.
#[derive(Debug, PartialEq, Eq)]
enum Write {
    Create,
    Grow { name: String, count: i32 },
}

impl Series {
    fn new(now: Instant) -> Self {
        Self {
            seen: HashMap::new(),
            swept: now,
        }
    }

    /// What to write for the event with `key`, seen at `now`.
    fn write_for(&mut self, key: u64, now: Instant) -> Write {
        if now.duration_since(self.swept) >= SWEEP_EVERY {
            self.seen
                .retain(|_, s| now.duration_since(s.last) < SERIES_TTL);
            self.swept = now;
        }
        match self.seen.get(&key) {
            Some(s) if now.duration_since(s.last) < SERIES_TTL => Write::Grow {
                name: s.name.clone(),
                count: s.count + 1,
            },
            _ => Write::Create,
        }
    }

    fn forget(&mut self, key: u64) {
        self.seen.remove(&key);
    }

    /// Remembers a written event (a new one only while there is room).
    fn written(&mut self, key: u64, name: String, count: i32, now: Instant) {
        if let Some(s) = self.seen.get_mut(&key) {
            *s = Seen {
                name,
                count,
                last: now,
            };
        } else if self.seen.len() < MAX_SERIES {
            self.seen.insert(
                key,
                Seen {
                    name,
                    count,
                    last: now,
                },
            );
        }
    }
}

impl Recorder {
    pub fn new(client: Client, reporter: Reporter) -> Self {
        Self {
            client,
            reporter: Arc::new(reporter),
            series: Arc::new(Mutex::new(Series::new(Instant::now()))),
        }
    }

    /// Publishes `ev` about `reference`: a new Event, or the next count of the series of
    /// the same event (type, action, reason, note, object) published in the last
    /// [`SERIES_TTL`].
    pub async fn publish(
        &self,
        ev: &Event,
        reference: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let key = series_key(ev, reference);
        let write = self.series.lock().write_for(key, Instant::now());
        let events: Api<K8sEvent> = Api::namespaced(
            self.client.clone(),
            reference.namespace.as_deref().unwrap_or("default"),
        );
        let now = Timestamp::now();
        if let Write::Grow { name, count } = write {
            let patch = serde_json::json!({
                "series": { "count": count, "lastObservedTime": MicroTime(now) }
            });
            match events
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {
                    self.series.lock().written(key, name, count, Instant::now());
                    return Ok(());
                }
                // Deleted meanwhile: the event is written anew, its series starts again.
                Err(kube::Error::Api(e)) if e.code == 404 => self.series.lock().forget(key),
                Err(e) => return Err(e),
            }
        }
        let event = self.new_event(ev, reference, now);
        let created = events.create(&PostParams::default(), &event).await?;
        let name = created.metadata.name.unwrap_or_default();
        self.series.lock().written(key, name, 1, Instant::now());
        Ok(())
    }

    fn new_event(&self, ev: &Event, reference: &ObjectReference, now: Timestamp) -> K8sEvent {
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            related: ev.secondary.clone(),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: reference.namespace.clone(),
                // kube-runtime's and client-go's naming: the object's name and the time.
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..Default::default()
        }
    }
}

/// One event's identity for a series: the same object (not the same resourceVersion) and
/// the same type, action, reason, note and related object.
fn series_key(ev: &Event, reference: &ObjectReference) -> u64 {
    let mut h = DefaultHasher::new();
    ev.type_.hash(&mut h);
    ev.action.hash(&mut h);
    ev.reason.hash(&mut h);
    ev.note.hash(&mut h);
    for r in std::iter::once(reference).chain(ev.secondary.as_ref()) {
        r.api_version.hash(&mut h);
        r.kind.hash(&mut h);
        r.namespace.hash(&mut h);
        r.name.hash(&mut h);
        r.uid.hash(&mut h);
    }
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(reason: &str, note: &str) -> Event {
        Event {
            type_: EventType::Normal,
            reason: reason.into(),
            note: Some(note.into()),
            action: "Reconcile".into(),
            secondary: None,
        }
    }

    fn obj(name: &str, rv: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("cocoonset.cocoonstack.io/v1".into()),
            kind: Some("CocoonHibernation".into()),
            namespace: Some("ns".into()),
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            resource_version: Some(rv.into()),
            ..Default::default()
        }
    }

    #[test]
    fn a_repeated_event_grows_its_series_and_a_new_object_version_does_not_split_it() {
        let t0 = Instant::now();
        let mut s = Series::new(t0);
        let k = series_key(&ev("Hibernated", "done"), &obj("a", "1"));
        assert_eq!(s.write_for(k, t0), Write::Create);
        s.written(k, "a.1".into(), 1, t0);
        let again = series_key(&ev("Hibernated", "done"), &obj("a", "2"));
        assert_eq!(again, k);
        let t1 = t0 + Duration::from_secs(30);
        assert_eq!(
            s.write_for(again, t1),
            Write::Grow {
                name: "a.1".into(),
                count: 2
            }
        );
        s.written(k, "a.1".into(), 2, t1);
        assert_eq!(
            s.write_for(k, t1 + Duration::from_secs(1)),
            Write::Grow {
                name: "a.1".into(),
                count: 3
            }
        );
    }

    #[test]
    fn other_notes_reasons_and_objects_are_other_events() {
        let k = series_key(&ev("Hibernated", "done"), &obj("a", "1"));
        assert_ne!(k, series_key(&ev("Hibernated", "other"), &obj("a", "1")));
        assert_ne!(k, series_key(&ev("Woken", "done"), &obj("a", "1")));
        assert_ne!(k, series_key(&ev("Hibernated", "done"), &obj("b", "1")));
    }

    #[test]
    fn a_series_ends_after_its_ttl_and_is_swept() {
        let t0 = Instant::now();
        let mut s = Series::new(t0);
        s.written(1, "a.1".into(), 1, t0);
        let late = t0 + SERIES_TTL;
        assert_eq!(s.write_for(1, late), Write::Create);
        assert!(s.seen.is_empty(), "the expired series was swept");
    }

    #[test]
    fn the_memory_is_bounded_and_a_full_table_still_grows_known_series() {
        let t0 = Instant::now();
        let mut s = Series::new(t0);
        for k in 0..(MAX_SERIES as u64 + 100) {
            s.written(k, format!("e.{k}"), 1, t0);
        }
        assert_eq!(s.seen.len(), MAX_SERIES);
        assert_eq!(s.write_for(MAX_SERIES as u64 + 50, t0), Write::Create);
        assert_eq!(
            s.write_for(7, t0),
            Write::Grow {
                name: "e.7".into(),
                count: 2
            }
        );
    }
}
