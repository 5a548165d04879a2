//! K9: the pod changes a label-selecting consumer (the schedules) must hear at once: a VM
//! pod appearing, leaving, relabelled or starting to name a VM, with its labels before
//! and after. Judged by the cache's driver before it applies an event to the store, which
//! still holds the previous object to compare with, and told once it has (`change.rs`).

use super::pod_store::PodStore;
use crate::api::annotations::VM_NAME;
use crate::api::pod::{LabelPair, PodSlice};
use kube::ResourceExt;
use kube::runtime::watcher;
use std::collections::BTreeMap;

pub type Labels = BTreeMap<String, String>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A pod that names (or named) a VM appeared, left, changed its labels, or started
    /// or stopped naming a VM:
    /// its label sets before and after, so both the selectors it joins and those it
    /// leaves hear of it.
    Pod {
        namespace: String,
        labels: Vec<Labels>,
    },
}

/// The pure rule for a pod: `old` as the store holds it, `new` as the event brings it
/// (`None` for a delete).
pub fn of_pod(old: Option<&PodSlice>, new: Option<&PodSlice>) -> Option<Arrival> {
    // Borrowed until there is something to publish: most pod events change neither.
    // Names a VM as PodView reads it: a non-empty name annotation.
    fn seen(p: &PodSlice) -> (&[LabelPair], bool) {
        let vm = p.annotation(VM_NAME).is_some_and(|v| !v.is_empty());
        (p.label_pairs(), vm)
    }
    let (before, after) = (old.map(seen), new.map(seen));
    let names_vm = |s: &Option<(&[LabelPair], bool)>| s.is_some_and(|(_, vm)| vm);
    if before == after || !(names_vm(&before) || names_vm(&after)) {
        return None;
    }
    let namespace = new.or(old)?.namespace().unwrap_or_default();
    Some(Arrival::Pod {
        namespace,
        labels: [before, after]
            .into_iter()
            .flatten()
            .map(|(l, _)| {
                l.iter()
                    .map(|(k, v)| ((**k).to_owned(), (**v).to_owned()))
                    .collect()
            })
            .collect(),
    })
}

/// The arrival a pod `event` makes, with `store` still holding the pod before it.
pub fn of_event(store: &PodStore, event: &watcher::Event<PodSlice>) -> Option<Arrival> {
    match event {
        watcher::Event::Apply(pod) | watcher::Event::InitApply(pod) => {
            let held = store.get(&pod.namespace().unwrap_or_default(), &pod.name_any());
            of_pod(held.as_deref(), Some(pod))
        }
        watcher::Event::Delete(pod) => of_pod(Some(pod), None),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn pod(labels: &[(&str, &str)], vm: Option<&str>) -> PodSlice {
        PodSlice::new(
            ObjectMeta {
                name: Some("web-0".into()),
                namespace: Some("shop".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                annotations: vm.map(|vm| BTreeMap::from([(VM_NAME.to_owned(), vm.to_owned())])),
                ..ObjectMeta::default()
            },
            false,
        )
    }

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// K9: a VM pod appearing, leaving, relabelled or given its VM is an arrival, with
    /// its label sets before and after; a status-only change, or a pod that never names
    /// a VM, is not (a schedule drives only pods naming a VM).
    #[rstest::rstest]
    #[case::k9_new_vm_pod(None, Some(pod(&[("tier", "web")], Some("vm-1"))), Some(vec![labels(&[("tier", "web")])]))]
    #[case::k9_vm_pod_deleted(Some(pod(&[("tier", "web")], Some("vm-1"))), None, Some(vec![labels(&[("tier", "web")])]))]
    #[case::k9_relabelled(Some(pod(&[("tier", "web")], Some("vm-1"))), Some(pod(&[("tier", "db")], Some("vm-1"))), Some(vec![labels(&[("tier", "web")]), labels(&[("tier", "db")])]))]
    #[case::k9_given_its_vm(Some(pod(&[("tier", "web")], None)), Some(pod(&[("tier", "web")], Some("vm-1"))), Some(vec![labels(&[("tier", "web")]), labels(&[("tier", "web")])]))]
    #[case::k9_another_vm_is_quiet(Some(pod(&[("tier", "web")], Some("vm-1"))), Some(pod(&[("tier", "web")], Some("vm-2"))), None)]
    #[case::k9_an_empty_vm_name_is_none(None, Some(pod(&[("tier", "web")], Some(""))), None)]
    #[case::k9_unchanged_is_quiet(Some(pod(&[("tier", "web")], Some("vm-1"))), Some(pod(&[("tier", "web")], Some("vm-1"))), None)]
    #[case::k9_no_vm_is_quiet(None, Some(pod(&[("tier", "web")], None)), None)]
    #[case::k9_relabelled_without_vm_is_quiet(Some(pod(&[("tier", "web")], None)), Some(pod(&[("tier", "db")], None)), None)]
    fn k9_pod_arrivals(
        #[case] old: Option<PodSlice>,
        #[case] new: Option<PodSlice>,
        #[case] want: Option<Vec<Labels>>,
    ) {
        let got = of_pod(old.as_ref(), new.as_ref());
        let want = want.map(|labels| Arrival::Pod {
            namespace: "shop".into(),
            labels,
        });
        assert_eq!(got, want);
    }

    /// K9: an arrival is judged against the store as it held the object before the event
    /// (an unchanged pod is quiet; a relabelled one names both label sets).
    #[test]
    fn k9_arrivals_are_judged_against_the_stores_previous_object() {
        let (store, mut writer) = super::super::pod_store::store();
        let web = pod(&[("tier", "web")], Some("vm-1"));
        let db = pod(&[("tier", "db")], Some("vm-1"));
        let mut seen = Vec::new();
        for p in [web.clone(), web, db] {
            let event = watcher::Event::Apply(p);
            seen.push(of_event(&store, &event));
            writer.apply_watcher_event(&event);
        }
        let pod_arrival = |labels: Vec<Labels>| Arrival::Pod {
            namespace: "shop".into(),
            labels,
        };
        assert_eq!(
            seen,
            vec![
                Some(pod_arrival(vec![labels(&[("tier", "web")])])),
                None,
                Some(pod_arrival(vec![
                    labels(&[("tier", "web")]),
                    labels(&[("tier", "db")])
                ])),
            ]
        );
    }
}
