//! K9: what a label-selecting consumer (the schedules) must hear at once rather than at its
//! resync: a VM pod appearing, leaving, or changing its labels or VM; a CocoonHibernation
//! appearing or leaving. Seen on the watch streams before the store applies them, so the
//! store still holds the previous object to compare with; published on a bounded
//! broadcast, whose lagging receiver is told so and looks at everything instead.

use crate::api::CocoonHibernation;
use crate::api::annotations::PodView;
use crate::api::pod::PodSlice;
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use std::collections::BTreeMap;
use tokio::sync::broadcast;

/// Arrivals held for a slow receiver before it lags (a first list of many pods does).
pub const CAPACITY: usize = 1024;

pub type Labels = BTreeMap<String, String>;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Arrival {
    /// A pod that names (or named) a VM appeared, left, or changed its labels or VM:
    /// its label sets before and after, so both the selectors it joins and those it
    /// leaves hear of it.
    Pod {
        namespace: String,
        labels: Vec<Labels>,
    },
    /// A CocoonHibernation appeared or left.
    Cr { namespace: String },
}

/// The pure rule for a pod: `old` as the store holds it, `new` as the event brings it
/// (`None` for a delete).
pub fn of_pod(old: Option<&PodSlice>, new: Option<&PodSlice>) -> Option<Arrival> {
    let seen = |p: &PodSlice| (p.labels().clone(), PodView::from_pod(p).vm_name);
    let (before, after) = (old.map(seen), new.map(seen));
    let names_vm =
        |s: &Option<(Labels, Option<String>)>| s.as_ref().is_some_and(|(_, vm)| vm.is_some());
    if before == after || !(names_vm(&before) || names_vm(&after)) {
        return None;
    }
    let namespace = new.or(old)?.namespace().unwrap_or_default();
    Some(Arrival::Pod {
        namespace,
        labels: [before, after]
            .into_iter()
            .flatten()
            .map(|(l, _)| l)
            .collect(),
    })
}

/// The pure rule for a CR: only its appearance and its leaving count.
pub fn of_cr(existed: bool, new: Option<&CocoonHibernation>, gone: bool) -> Option<Arrival> {
    let namespace = new?.namespace().unwrap_or_default();
    (gone || !existed).then_some(Arrival::Cr { namespace })
}

/// Publishes arrivals seen on one watch stream, before its store applies them.
pub struct Tap<K: kube::Resource + Clone + 'static>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    pub store: Store<K>,
    pub sender: broadcast::Sender<Arrival>,
}

impl Tap<PodSlice> {
    pub fn see(&self, item: &Result<watcher::Event<PodSlice>, watcher::Error>) {
        let arrival = match item {
            Ok(watcher::Event::Apply(pod) | watcher::Event::InitApply(pod)) => of_pod(
                self.store.get(&ObjectRef::from_obj(pod)).as_deref(),
                Some(pod),
            ),
            Ok(watcher::Event::Delete(pod)) => of_pod(Some(pod), None),
            _ => None,
        };
        self.publish(arrival);
    }
}

impl Tap<CocoonHibernation> {
    pub fn see(&self, item: &Result<watcher::Event<CocoonHibernation>, watcher::Error>) {
        let arrival = match item {
            Ok(watcher::Event::Apply(cr) | watcher::Event::InitApply(cr)) => {
                let existed = self.store.get(&ObjectRef::from_obj(cr)).is_some();
                of_cr(existed, Some(cr), false)
            }
            Ok(watcher::Event::Delete(cr)) => of_cr(true, Some(cr), true),
            _ => None,
        };
        self.publish(arrival);
    }
}

impl<K: kube::Resource + Clone + 'static> Tap<K>
where
    K::DynamicType: std::hash::Hash + Eq + Clone,
{
    fn publish(&self, arrival: Option<Arrival>) {
        if let Some(arrival) = arrival {
            // No receiver (no schedule controller) is not an error.
            let _ = self.sender.send(arrival);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn pod(labels: &[(&str, &str)], vm: Option<&str>) -> PodSlice {
        PodSlice {
            metadata: ObjectMeta {
                name: Some("web-0".into()),
                namespace: Some("shop".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                        .collect(),
                ),
                annotations: vm.map(|vm| {
                    BTreeMap::from([(crate::api::annotations::VM_NAME.to_owned(), vm.to_owned())])
                }),
                ..ObjectMeta::default()
            },
            container_running: false,
        }
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

    /// K9: a CR appearing or leaving is an arrival; a change to one already seen is not.
    #[test]
    fn k9_cr_arrivals() {
        let mut cr = CocoonHibernation::new(
            "web-0",
            crate::api::CocoonHibernationSpec {
                pod_ref: crate::api::PodRef {
                    name: "web-0".into(),
                },
                desire: crate::api::Desire::Hibernate,
                hibernate_timeout: None,
                wake_timeout: None,
            },
        );
        cr.metadata.namespace = Some("shop".into());
        let arrival = Some(Arrival::Cr {
            namespace: "shop".into(),
        });
        assert_eq!(of_cr(false, Some(&cr), false), arrival, "appeared");
        assert_eq!(of_cr(true, Some(&cr), true), arrival, "left");
        assert_eq!(of_cr(true, Some(&cr), false), None, "changed");
    }

    /// K9: the tap compares with the store before it applies the event, and a receiver
    /// that lags hears that it lagged rather than nothing.
    #[tokio::test]
    async fn k9_tap_publishes_before_the_store_applies_and_lag_is_reported() {
        let (store, mut writer) = kube::runtime::reflector::store::<PodSlice>();
        let (sender, mut rx) = broadcast::channel(2);
        let tap = Tap { store, sender };
        let web = pod(&[("tier", "web")], Some("vm-1"));
        let first = Ok(watcher::Event::Apply(web.clone()));
        tap.see(&first);
        writer.apply_watcher_event(&watcher::Event::Apply(web.clone()));
        tap.see(&first); // the store holds it now: unchanged, quiet
        assert!(matches!(rx.try_recv(), Ok(Arrival::Pod { .. })));
        assert!(rx.try_recv().is_err(), "an unchanged pod is quiet");
        for tier in ["a", "b", "c"] {
            let moved = pod(&[("tier", tier)], Some("vm-1"));
            tap.see(&Ok(watcher::Event::Apply(moved.clone())));
            writer.apply_watcher_event(&watcher::Event::Apply(moved));
        }
        assert!(matches!(
            rx.try_recv(),
            Err(broadcast::error::TryRecvError::Lagged(_))
        ));
    }
}
