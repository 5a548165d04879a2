//! K9: the schedule controller's trigger policy: which schedules a change in the cache
//! wakes, so a selected pod or CR appearing or changing is acted on within seconds, not at
//! the resync. A VM pod arriving, leaving or relabelled wakes the schedules selecting it
//! before or after; a CR new or changed wakes the schedules selecting its pod and the one
//! that manages it; a CR gone wakes every schedule of its namespace (it may have to be
//! made again, K4). A pod change a CR pass reads wakes nothing here.

use super::plan::SCHEDULE_LABEL;
use super::spec::CocoonHibernationSchedule;
use crate::cache::SharedCache;
use crate::cache::arrivals::{Arrival, Labels};
use crate::cache::change::Change;
use crate::runtime::trigger::Policy;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::{ObjectRef, Store};
use std::sync::Arc;

type Schedule = Arc<CocoonHibernationSchedule>;

pub struct SchedulePolicy {
    pub schedules: Store<CocoonHibernationSchedule>,
}

impl Policy for SchedulePolicy {
    type Kind = CocoonHibernationSchedule;

    fn wakes(
        &self,
        change: &Change,
        cache: &SharedCache,
    ) -> Vec<ObjectRef<CocoonHibernationSchedule>> {
        let namespace = match change {
            Change::Arrival(Arrival::Pod { namespace, .. }) => namespace.as_str(),
            Change::Cr(key) => key.namespace(),
            Change::CrGone { namespace, .. } => namespace.as_str(),
            Change::Pod(_) | Change::VmReleased(_) => return Vec::new(),
        };
        // Most namespaces have no schedule: nothing to look up for their changes.
        let in_ns = in_namespace(&self.schedules.state(), namespace);
        if in_ns.is_empty() {
            return Vec::new();
        }
        let woken = match change {
            Change::Arrival(Arrival::Pod { labels, .. }) => selecting(&in_ns, labels, None),
            Change::Cr(key) => match cache.cr(key.namespace(), key.name()) {
                Some(cr) => {
                    let pod = cache.pod(key.namespace(), &cr.spec.pod_ref.name);
                    let labels: Vec<Labels> = pod.iter().map(|p| p.labels()).collect();
                    selecting(&in_ns, &labels, cr.labels().get(SCHEDULE_LABEL))
                }
                None => Vec::new(),
            },
            _ => in_ns,
        };
        woken
            .iter()
            .map(|s| ObjectRef::from_obj(s.as_ref()))
            .collect()
    }
}

fn in_namespace(schedules: &[Schedule], namespace: &str) -> Vec<Schedule> {
    schedules
        .iter()
        .filter(|s| s.namespace().as_deref() == Some(namespace))
        .cloned()
        .collect()
}

/// The schedules selecting any of the label sets, and the one named `manager`.
fn selecting(schedules: &[Schedule], labels: &[Labels], manager: Option<&String>) -> Vec<Schedule> {
    schedules
        .iter()
        .filter(|s| {
            // An invalid selector selects nothing; its own pass reports it.
            let selects = || {
                Selector::try_from(s.spec.selector.clone())
                    .is_ok_and(|sel| labels.iter().any(|l| sel.matches(l)))
            };
            manager == Some(&s.name_any()) || selects()
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{CocoonHibernation, CocoonHibernationSpec, Desire, PodRef};
    use crate::schedule::spec::CocoonHibernationScheduleSpec;
    use k8s_openapi::api::core::v1::Pod;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kube::runtime::watcher;
    use std::collections::BTreeMap;

    fn schedule(ns: &str, name: &str, tier: Option<&str>) -> CocoonHibernationSchedule {
        let mut s = CocoonHibernationSchedule::new(
            name,
            CocoonHibernationScheduleSpec::always_asleep(LabelSelector {
                match_labels: tier.map(|t| BTreeMap::from([("tier".to_owned(), t.to_owned())])),
                ..LabelSelector::default()
            }),
        );
        s.metadata.namespace = Some(ns.into());
        s
    }

    fn tier(t: &str) -> Labels {
        BTreeMap::from([("tier".to_owned(), t.to_owned())])
    }

    fn policy() -> SchedulePolicy {
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for s in [
            schedule("shop", "web", Some("web")),
            schedule("shop", "db", Some("db")),
            schedule("shop", "everything", None),
            schedule("other", "web-there", Some("web")),
        ] {
            writer.apply_watcher_event(&watcher::Event::InitApply(s));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        SchedulePolicy { schedules: store }
    }

    /// Pod `web-0` (tier web) with a hand-made CR `hand`, pod `db-0` (tier db) with a CR
    /// `managed` that the schedule `web` manages, in `shop`.
    fn cache() -> SharedCache {
        let pod = |name: &str, t: &str| {
            let mut p = Pod::default();
            p.metadata.name = Some(name.into());
            p.metadata.namespace = Some("shop".into());
            p.metadata.labels = Some(tier(t));
            p
        };
        let cr = |name: &str, pod: &str, manager: Option<&str>| {
            let mut cr = CocoonHibernation::new(
                name,
                CocoonHibernationSpec {
                    pod_ref: PodRef { name: pod.into() },
                    desire: Desire::Hibernate,
                    hibernate_timeout: None,
                    wake_timeout: None,
                },
            );
            cr.metadata.namespace = Some("shop".into());
            cr.metadata.labels =
                manager.map(|m| BTreeMap::from([(SCHEDULE_LABEL.to_owned(), m.to_owned())]));
            cr
        };
        SharedCache::from_objects(
            vec![
                cr("hand", "web-0", None),
                cr("managed", "db-0", Some("web")),
            ],
            vec![pod("web-0", "web"), pod("db-0", "db")],
        )
    }

    fn key(ns: &str, n: &str) -> crate::cache::index::Key {
        crate::cache::index::Key::new(ns, n)
    }

    /// K9: a pod arrival wakes the schedules of its namespace that select it, before or
    /// after a relabel; a CR new or changed wakes those selecting its pod and its manager;
    /// a CR gone wakes every schedule of its namespace; another namespace's schedules, and
    /// a change only a CR pass reads, wake none.
    #[rstest::rstest]
    #[case::k9_new_pod(Change::Arrival(Arrival::Pod { namespace: "shop".into(), labels: vec![tier("web")] }), &["everything", "web"])]
    #[case::k9_relabelled_pod(Change::Arrival(Arrival::Pod { namespace: "shop".into(), labels: vec![tier("web"), tier("db")] }), &["db", "everything", "web"])]
    #[case::k9_unselected_pod(Change::Arrival(Arrival::Pod { namespace: "shop".into(), labels: vec![tier("cache")] }), &["everything"])]
    #[case::k9_other_namespace(Change::Arrival(Arrival::Pod { namespace: "elsewhere".into(), labels: vec![tier("web")] }), &[])]
    #[case::k9_hand_made_cr_changed(Change::Cr(key("shop", "hand")), &["everything", "web"])]
    #[case::k9_managed_cr_changed(Change::Cr(key("shop", "managed")), &["db", "everything", "web"])]
    #[case::k9_unknown_cr(Change::Cr(key("shop", "never")), &[])]
    #[case::k9_cr_gone(Change::CrGone { namespace: "shop".into(), pod: "web-0".into(), vm: None }, &["db", "everything", "web"])]
    #[case::k9_pass_only_pod_change(Change::Pod(key("shop", "web-0")), &[])]
    #[case::k9_vm_released(Change::VmReleased("vm-1".into()), &[])]
    fn k9_schedules_woken(#[case] change: Change, #[case] want: &[&str]) {
        let mut names: Vec<String> = policy()
            .wakes(&change, &cache())
            .into_iter()
            .map(|r| r.name)
            .collect();
        names.sort();
        assert_eq!(names, want);
    }
}
