//! Reads the cache into the planner's inputs (K4–K6): selected pods and their driver,
//! CRs with the schedule's mark. Synchronous, over objects already fetched.

use super::plan::{
    CrState, Driver, Mark, OVERRIDE_UNTIL, SCHEDULE_BOUNDARY, SCHEDULE_DESIRE, SCHEDULE_UID,
};
use super::spec::CocoonHibernationSchedule;
use crate::api::annotations::PodView;
use crate::api::pod::PodSlice;
use crate::api::{CocoonHibernation, Desire};
use jiff::Timestamp;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

/// The pods `me` selects that name a VM, each with the schedule that drives it: the
/// oldest live schedule of the namespace selecting it (K6).
pub fn selected_pods(
    me: &CocoonHibernationSchedule,
    schedules: &[Arc<CocoonHibernationSchedule>],
    pods: &[Arc<PodSlice>],
) -> BTreeMap<String, Driver> {
    let ns = me.namespace();
    let Some(mine) = selector(me) else {
        return BTreeMap::new();
    };
    let rivals: Vec<(Timestamp, String, Selector)> = schedules
        .iter()
        .filter(|s| s.namespace() == ns && s.metadata.deletion_timestamp.is_none())
        .filter_map(|s| Some((created(s), s.name_any(), selector(s)?)))
        .collect();
    let mut out = BTreeMap::new();
    for pod in pods {
        let labels = &pod.labels();
        if !mine.matches(labels) || PodView::from_pod(pod).vm_name.is_none() {
            continue;
        }
        let selecting = rivals
            .iter()
            .filter(|(_, _, sel)| sel.matches(labels))
            .map(|(at, name, _)| (*at, name.as_str()));
        let driver = match super::plan::driver(selecting) {
            Some(name) if name != me.name_any() => Driver::Other(name.to_owned()),
            _ => Driver::Us,
        };
        out.insert(pod.name_any(), driver);
    }
    out
}

fn selector(s: &CocoonHibernationSchedule) -> Option<Selector> {
    Selector::try_from(s.spec.selector.clone()).ok()
}

fn created(s: &CocoonHibernationSchedule) -> Timestamp {
    s.metadata
        .creation_timestamp
        .as_ref()
        .map_or(Timestamp::MAX, |t| t.0)
}

/// CRs by pod name: the one named after each selected pod (V1), and every CR of the
/// namespace carrying our uid (to release).
pub fn crs(
    uid: &str,
    pods: &BTreeMap<String, Driver>,
    in_namespace: &[Arc<CocoonHibernation>],
) -> (BTreeMap<String, CrState>, HashMap<String, String>) {
    let mut states = BTreeMap::new();
    let mut versions = HashMap::new();
    for cr in in_namespace {
        let name = cr.name_any();
        let state = cr_state(cr);
        let ours = state.mark.as_ref().is_some_and(|m| m.uid == uid);
        if ours || (pods.contains_key(&name) && cr.spec.pod_ref.name == name) {
            versions.insert(name.clone(), cr.resource_version().unwrap_or_default());
            states.insert(name, state);
        }
    }
    (states, versions)
}

pub fn cr_state(cr: &CocoonHibernation) -> CrState {
    let ann = |k: &str| cr.annotations().get(k).map(String::as_str);
    let mark = match (
        ann(SCHEDULE_UID),
        ann(SCHEDULE_DESIRE),
        ann(SCHEDULE_BOUNDARY),
    ) {
        (Some(uid), Some(d), Some(b)) => Some(Mark {
            uid: uid.to_owned(),
            desire: Desire::from_mark(d),
            // An unreadable boundary is an old one: the next pass writes it again.
            boundary: b.parse().unwrap_or(Timestamp::UNIX_EPOCH),
        }),
        // Our uid without the rest still marks the CR as ours.
        (Some(uid), _, _) => Some(Mark {
            uid: uid.to_owned(),
            desire: Desire::Unknown,
            boundary: Timestamp::UNIX_EPOCH,
        }),
        _ => None,
    };
    CrState {
        desire: cr.spec.desire,
        phase: cr.phase(),
        conflict: cr.failed_by_conflict(),
        mark,
        override_until: ann(OVERRIDE_UNTIL).and_then(|u| u.parse().ok()),
    }
}
