//! Reads fetched objects into the plan's inputs (I2–I4): the selected pods and which
//! policy drives each, their activity Leases, their CRs and whether a schedule selects
//! them. Synchronous, over objects already fetched.

use super::plan::{Activity, CrState, IDLE_AT, IDLE_DESIRE, IDLE_UID, Mark, PodInput};
use super::spec::CocoonIdlePolicy;
use crate::api::activity::{LEASE_PREFIX, lease_name};
use crate::api::annotations::PodView;
use crate::api::pod::PodSlice;
use crate::api::{CocoonHibernation, Desire};
use crate::schedule::CocoonHibernationSchedule;
use crate::schedule::plan::{OVERRIDE_UNTIL, SCHEDULE_DESIRE, SCHEDULE_UID};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

fn selector(s: &LabelSelector) -> Option<Selector> {
    Selector::try_from(s.clone()).ok()
}

/// What one pass reads, fetched.
pub struct Fetched<'a> {
    pub policies: &'a [Arc<CocoonIdlePolicy>],
    pub schedules: &'a [CocoonHibernationSchedule],
    pub pods: &'a [Arc<PodSlice>],
    pub crs: &'a [Arc<CocoonHibernation>],
    pub leases: &'a [Arc<Lease>],
}

/// The pods `me` selects that name a VM, with their inputs, and the resourceVersions the
/// writes are fenced on: CRs' by pod name, Leases' by pod name.
pub struct Read {
    pub pods: BTreeMap<String, PodInput>,
    pub strays: Vec<String>,
    pub cr_versions: HashMap<String, String>,
    pub lease_versions: HashMap<String, String>,
    pub pod_uids: HashMap<String, String>,
}

pub fn read(me: &CocoonIdlePolicy, f: &Fetched<'_>) -> Read {
    let ns = me.namespace();
    let uid = me.uid().unwrap_or_default();
    let mine = selector(&me.spec.selector);
    let rivals: Vec<(Timestamp, String, Selector)> = f
        .policies
        .iter()
        .filter(|p| p.namespace() == ns && p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let at = p
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(Timestamp::MAX, |t| t.0);
            Some((at, p.name_any(), selector(&p.spec.selector)?))
        })
        .collect();
    let schedules: Vec<Selector> = f
        .schedules
        .iter()
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .filter_map(|s| selector(&s.spec.selector))
        .collect();
    let leases: HashMap<String, &Arc<Lease>> = f
        .leases
        .iter()
        .filter(|l| l.namespace() == ns)
        .filter_map(|l| Some((l.name_any().strip_prefix(LEASE_PREFIX)?.to_owned(), l)))
        .collect();
    let crs: HashMap<String, &Arc<CocoonHibernation>> = f
        .crs
        .iter()
        .filter(|c| c.namespace() == ns)
        .map(|c| (c.name_any(), c))
        .collect();
    let mut out = Read {
        pods: BTreeMap::new(),
        strays: Vec::new(),
        cr_versions: HashMap::new(),
        lease_versions: HashMap::new(),
        pod_uids: HashMap::new(),
    };
    for pod in f.pods.iter().filter(|p| p.namespace() == ns) {
        let labels = &pod.labels();
        let name = pod.name_any();
        // A pod whose Lease name would be refused cannot be tracked (I2).
        if !mine.as_ref().is_some_and(|s| s.matches(labels))
            || PodView::from_pod(pod).vm_name.is_none()
            || lease_name(&name).is_none()
        {
            continue;
        }
        let selecting = rivals
            .iter()
            .filter(|(_, _, sel)| sel.matches(labels))
            .map(|(at, n, _)| (*at, n.as_str()));
        let driven_by = match super::plan::driver(selecting) {
            Some(n) if n != me.name_any() => Some(n.to_owned()),
            _ => None,
        };
        let lease = leases.get(&name);
        // V1: a pod's CR is named after it and points at it.
        let cr = crs.get(&name).filter(|c| c.spec.pod_ref.name == name);
        if let Some(l) = lease {
            out.lease_versions
                .insert(name.clone(), l.resource_version().unwrap_or_default());
        }
        if let Some(c) = cr {
            out.cr_versions
                .insert(name.clone(), c.resource_version().unwrap_or_default());
        }
        out.pod_uids
            .insert(name.clone(), pod.uid().unwrap_or_default());
        out.pods.insert(
            name,
            PodInput {
                driven_by,
                activity: lease.map(|l| activity(l)),
                cr: cr.map(|c| cr_state(c)),
                scheduled: schedules.iter().any(|s| s.matches(labels)),
            },
        );
    }
    for (name, cr) in &crs {
        let ours = cr.annotations().get(IDLE_UID) == Some(&uid);
        if ours && !out.pods.contains_key(name) {
            out.cr_versions
                .insert(name.clone(), cr.resource_version().unwrap_or_default());
            out.strays.push(name.clone());
        }
    }
    out.strays.sort();
    out
}

/// I3: of the CRs this policy flipped (pod → the CR's resourceVersion the flip was
/// conditional on), those the cache still shows at that version: the flip is newer than
/// what was read, so they are asleep, not due. The others are forgotten. Without this, a
/// pass whose cache lagged its own flips took their Leases again and failed their flips
/// (430 of 1,000 pods once, in the writes of the passes other pods waited for).
pub fn unseen_flips(
    flipped: &mut HashMap<String, String>,
    cr_versions: &HashMap<String, String>,
) -> Vec<String> {
    flipped.retain(|pod, version| cr_versions.get(pod) == Some(version));
    let mut pods: Vec<String> = flipped.keys().cloned().collect();
    pods.sort();
    pods
}

/// I2: the activity record as the plan reads it.
pub fn activity(lease: &Lease) -> Activity {
    crate::api::activity::record(lease)
}

pub fn cr_state(cr: &CocoonHibernation) -> CrState {
    let ann = |k: &str| cr.annotations().get(k).map(String::as_str);
    let mark = ann(IDLE_UID).map(|uid| Mark {
        uid: uid.to_owned(),
        desire: ann(IDLE_DESIRE).map_or(Desire::Unknown, Desire::from_mark),
        // An unreadable instant is an old one.
        at: ann(IDLE_AT)
            .and_then(|a| a.parse().ok())
            .unwrap_or(Timestamp::UNIX_EPOCH),
    });
    let schedule_desire =
        ann(SCHEDULE_UID).map(|_| ann(SCHEDULE_DESIRE).map_or(Desire::Unknown, Desire::from_mark));
    let status = cr.status.as_ref();
    CrState {
        desire: cr.spec.desire,
        phase: cr.phase(),
        conflict: cr.failed_by_conflict(),
        mark,
        schedule_desire,
        override_until: ann(OVERRIDE_UNTIL).and_then(|u| u.parse().ok()),
        woken_at: status.and_then(|s| s.woken_at.as_ref()).map(|t| t.0),
        attempts: status.and_then(|s| s.attempts).unwrap_or(0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// SPEC I3: a flip the cache has not seen yet (the CR still at the version the flip
    /// was conditional on) counts as made; once the cache shows the CR moved on (the
    /// flip, or anything after it), or the CR is gone, it is forgotten.
    #[rstest::rstest]
    #[case::i3_cache_behind_the_flip(&[("a", "7")], &[("a", "7")], &["a"], &[("a", "7")])]
    #[case::i3_cache_saw_the_flip(&[("a", "7")], &[("a", "8")], &[], &[])]
    #[case::i3_cr_gone(&[("a", "7")], &[], &[], &[])]
    #[case::i3_never_flipped(&[], &[("a", "7")], &[], &[])]
    #[case::i3_some_of_each(&[("a", "7"), ("b", "3")], &[("a", "7"), ("b", "4")], &["a"], &[("a", "7")])]
    fn i3_a_flip_the_cache_has_not_seen_is_not_decided_again(
        #[case] flipped: &[(&str, &str)],
        #[case] cached: &[(&str, &str)],
        #[case] asleep: &[&str],
        #[case] kept: &[(&str, &str)],
    ) {
        let mut flipped = map(flipped);
        assert_eq!(unseen_flips(&mut flipped, &map(cached)), asleep);
        assert_eq!(flipped, map(kept));
    }
}
