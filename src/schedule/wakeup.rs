//! K9: the schedules an arrival concerns, so a selected pod or CR appearing is acted on
//! within seconds, not at the resync. Pure mapping; [`triggers`] turns the cache's
//! arrivals into the controller's reconcile requests.

use super::spec::CocoonHibernationSchedule;
use crate::cache::arrivals::Arrival;
use futures::Stream;
use kube::ResourceExt;
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::{ObjectRef, Store};
use std::sync::Arc;
use tokio::sync::broadcast;

/// The schedules of the arrival's namespace it may concern: for a pod, those selecting it
/// before or after; for a CR, all of them (its pod may be selected, or the CR marked).
pub fn schedules_for(
    arrival: &Arrival,
    schedules: &[Arc<CocoonHibernationSchedule>],
) -> Vec<ObjectRef<CocoonHibernationSchedule>> {
    let (namespace, labels) = match arrival {
        Arrival::Pod { namespace, labels } => (namespace, Some(labels)),
        Arrival::Cr { namespace } => (namespace, None),
    };
    schedules
        .iter()
        .filter(|s| s.namespace().as_ref() == Some(namespace))
        .filter(|s| {
            let Some(labels) = labels else {
                return true;
            };
            // An invalid selector selects nothing; its own pass reports it.
            Selector::try_from(s.spec.selector.clone())
                .is_ok_and(|sel| labels.iter().any(|l| sel.matches(l)))
        })
        .map(|s| ObjectRef::from_obj(s.as_ref()))
        .collect()
}

/// Reconcile requests from the cache's arrivals. A receiver that lagged lost some, so it
/// asks for every schedule instead; the stream ends with the cache.
pub fn triggers(
    arrivals: broadcast::Receiver<Arrival>,
    schedules: Store<CocoonHibernationSchedule>,
) -> impl Stream<Item = ObjectRef<CocoonHibernationSchedule>> + Send + 'static {
    let batches = futures::stream::unfold(arrivals, move |mut rx| {
        let schedules = schedules.clone();
        async move {
            let refs = match rx.recv().await {
                Ok(arrival) => schedules_for(&arrival, &schedules.state()),
                Err(broadcast::error::RecvError::Lagged(_)) => schedules
                    .state()
                    .iter()
                    .map(|s| ObjectRef::from_obj(s.as_ref()))
                    .collect(),
                Err(broadcast::error::RecvError::Closed) => return None,
            };
            Some((futures::stream::iter(refs), rx))
        }
    });
    futures::StreamExt::flatten(batches)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cache::arrivals::Labels;
    use crate::schedule::spec::CocoonHibernationScheduleSpec;
    use futures::StreamExt;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    use kube::runtime::watcher;
    use std::collections::BTreeMap;

    fn schedule(ns: &str, name: &str, tier: Option<&str>) -> Arc<CocoonHibernationSchedule> {
        let mut s = CocoonHibernationSchedule::new(
            name,
            CocoonHibernationScheduleSpec::always_asleep(LabelSelector {
                match_labels: tier.map(|t| BTreeMap::from([("tier".to_owned(), t.to_owned())])),
                ..LabelSelector::default()
            }),
        );
        s.metadata.namespace = Some(ns.into());
        Arc::new(s)
    }

    fn tier(t: &str) -> Labels {
        BTreeMap::from([("tier".to_owned(), t.to_owned())])
    }

    fn names(refs: &[ObjectRef<CocoonHibernationSchedule>]) -> Vec<String> {
        let mut names: Vec<String> = refs.iter().map(|r| r.name.clone()).collect();
        names.sort();
        names
    }

    fn all() -> Vec<Arc<CocoonHibernationSchedule>> {
        vec![
            schedule("shop", "web", Some("web")),
            schedule("shop", "db", Some("db")),
            schedule("shop", "everything", None),
            schedule("other", "web-there", Some("web")),
        ]
    }

    /// K9: a pod arrival wakes the schedules of its namespace that select it, before or
    /// after a relabel; a CR arrival wakes every schedule of its namespace; another
    /// namespace's schedules are never woken.
    #[rstest::rstest]
    #[case::k9_new_pod(Arrival::Pod { namespace: "shop".into(), labels: vec![tier("web")] }, &["everything", "web"])]
    #[case::k9_relabelled_pod(Arrival::Pod { namespace: "shop".into(), labels: vec![tier("web"), tier("db")] }, &["db", "everything", "web"])]
    #[case::k9_unselected_pod(Arrival::Pod { namespace: "shop".into(), labels: vec![tier("cache")] }, &["everything"])]
    #[case::k9_new_cr(Arrival::Cr { namespace: "shop".into() }, &["db", "everything", "web"])]
    #[case::k9_other_namespace(Arrival::Pod { namespace: "elsewhere".into(), labels: vec![tier("web")] }, &[])]
    fn k9_schedules_for(#[case] arrival: Arrival, #[case] want: &[&str]) {
        assert_eq!(names(&schedules_for(&arrival, &all())), want);
    }

    /// K9: arrivals become reconcile requests as they come; after a lag, every schedule
    /// is asked for; the stream ends with the sender.
    #[tokio::test]
    async fn k9_triggers_follow_arrivals_and_a_lag_asks_for_all() {
        let (store, mut writer) = kube::runtime::reflector::store();
        writer.apply_watcher_event(&watcher::Event::Init);
        for s in all() {
            writer.apply_watcher_event(&watcher::Event::InitApply((*s).clone()));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        let (tx, rx) = broadcast::channel(2);
        let mut stream = Box::pin(triggers(rx, store));
        tx.send(Arrival::Pod {
            namespace: "shop".into(),
            labels: vec![tier("db")],
        })
        .unwrap();
        let mut got = vec![stream.next().await.unwrap(), stream.next().await.unwrap()];
        assert_eq!(names(&got), ["db", "everything"]);
        for _ in 0..3 {
            tx.send(Arrival::Cr {
                namespace: "other".into(),
            })
            .unwrap();
        }
        drop(tx);
        got.clear();
        while let Some(r) = stream.next().await {
            got.push(r);
        }
        // The lag asks for all four; the two arrivals kept each add web-there.
        assert_eq!(
            names(&got),
            [
                "db",
                "everything",
                "web",
                "web-there",
                "web-there",
                "web-there"
            ]
        );
    }
}
