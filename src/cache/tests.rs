use super::driver::EventHandler;
use super::*;
use crate::api::annotations::PodView;
use crate::api::annotations::{self, HIBERNATE, LIFECYCLE_STATE, VM_ID, VM_NAME};
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;

fn realistic_pod() -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "name": "web-0", "namespace": "ns", "uid": "u-1", "resourceVersion": "7",
            "labels": { "app": "web", "pod-template-hash": "abc" },
            "annotations": {
                VM_NAME: "vm-a", VM_ID: "id-1", LIFECYCLE_STATE: "ready",
                HIBERNATE: "true",
                "kubectl.kubernetes.io/last-applied-configuration": "x".repeat(4000),
            },
            "ownerReferences": [{ "apiVersion": "apps/v1", "kind": "ReplicaSet",
                                  "name": "web", "uid": "o-1" }],
        },
        "spec": { "containers": [{ "name": "vm", "image": "vm:1" }] },
        "status": {
            "phase": "Running",
            "containerStatuses": [
                { "name": "vm", "image": "vm:1", "imageID": "sha256:1", "ready": true,
                  "restartCount": 0, "state": { "running": { "startedAt": "2026-01-01T00:00:00Z" } } },
                { "name": "side", "image": "s:1", "imageID": "sha256:2", "ready": false,
                  "restartCount": 3, "state": { "waiting": { "reason": "CrashLoopBackOff" } } },
            ],
        },
    })
}

/// SPEC C3 (issue: memory): the stripped pod reads the same to every pass and to the
/// webhook, and the patches built from it still apply to the real pod.
#[test]
fn c3_stripped_pod_keeps_everything_a_pass_reads() {
    let json = realistic_pod();
    let full: Pod = serde_json::from_value(json.clone()).unwrap();
    let stripped: PodSlice = serde_json::from_value(json.clone()).unwrap();
    assert_eq!(
        PodView::from_pod(&stripped),
        PodView::from_pod(&PodSlice::from(&full))
    );
    assert!(stripped.container_running);
    // K1: schedules select pods by label.
    assert_eq!(stripped.label("app"), Some("web"));
    assert!(stripped.metadata.owner_references.is_none());
    assert!(
        stripped
            .annotation("kubectl.kubernetes.io/last-applied-configuration")
            .is_none()
    );
    let full_len = serde_json::to_vec(&full).unwrap().len();
    let stripped_len = serde_json::to_vec(&stripped.metadata).unwrap().len();
    assert!(
        stripped_len * 5 < full_len,
        "{stripped_len} of {full_len} bytes"
    );
    for patch in [
        annotations::clear_hibernate_patch(&stripped),
        annotations::set_hibernate_patch(&stripped),
    ] {
        let mut doc = json.clone();
        json_patch::patch(&mut doc, &patch.0).unwrap();
    }
}

// ---------------------------------------------------------------------------------------
// S4: relists, cut short or not, and no going back in time.

use crate::api::{CocoonHibernationSpec, Desire, PodRef};
use crate::controller::{CrPolicy, Trigger};
use tokio::sync::mpsc::UnboundedReceiver;
use watcher::Event;

/// Issue 38 (memory): the cached CR drops what no pass reads (managedFields, kubectl's
/// last-applied copy) and keeps every other annotation, and the map itself.
#[test]
fn the_cached_cr_drops_only_what_no_pass_reads() {
    let mut c = cr("a", "web-0", "1", Desire::Wake);
    c.metadata.managed_fields = Some(vec![Default::default()]);
    c.metadata.annotations = Some(
        [
            (LAST_APPLIED.to_owned(), "x".repeat(500)),
            (
                "cocoonset.cocoonstack.io/idle-uid".to_owned(),
                "u".to_owned(),
            ),
        ]
        .into(),
    );
    strip_cr(&mut c);
    assert_eq!(c.metadata.managed_fields, None);
    assert_eq!(
        c.annotations().keys().collect::<Vec<_>>(),
        ["cocoonset.cocoonstack.io/idle-uid"]
    );
    c.metadata.annotations = Some([(LAST_APPLIED.to_owned(), "{}".to_owned())].into());
    strip_cr(&mut c);
    assert_eq!(c.metadata.annotations, Some(Default::default()));
}

fn cr(name: &str, pod: &str, rv: &str, desire: Desire) -> CocoonHibernation {
    let mut cr = CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.namespace = Some("ns".into());
    cr.metadata.uid = Some(format!("uid-{name}"));
    cr.metadata.resource_version = Some(rv.into());
    cr
}

fn pod(name: &str, rv: &str, vm: &str, hibernate: bool) -> PodSlice {
    let mut annotations = std::collections::BTreeMap::from([(VM_NAME.to_owned(), vm.to_owned())]);
    if hibernate {
        annotations.insert(HIBERNATE.to_owned(), "true".to_owned());
    }
    let meta = kube::api::ObjectMeta {
        name: Some(name.into()),
        namespace: Some("ns".into()),
        uid: Some(format!("uid-{name}")),
        resource_version: Some(rv.into()),
        annotations: Some(annotations),
        ..Default::default()
    };
    PodSlice::new(meta, false)
}

/// An event handler on an empty cache, as the driver builds it, and the triggers the
/// CocoonHibernation controller's policy makes of its changes.
fn harness() -> (EventHandler, UnboundedReceiver<Trigger>) {
    let (cache, writers) = SharedCache::empty(Progress::new());
    let rx = crate::runtime::trigger::subscribe(&cache, CrPolicy);
    (EventHandler::new(cache, writers), rx)
}

fn drain(rx: &mut UnboundedReceiver<Trigger>) -> Vec<String> {
    let mut names = Vec::new();
    while let Ok(t) = rx.try_recv() {
        names.push(t.name);
    }
    names.sort();
    names.dedup();
    names
}

/// Both informers' first list: `a` on pod `pa`, `b` on pod `pb`.
fn first_list(h: &mut EventHandler, rx: &mut UnboundedReceiver<Trigger>) {
    list_of_the_first_state(h);
    assert_eq!(drain(rx), ["a", "b"], "the first list triggers every CR");
}

/// A whole list of both informers showing the first state (again, for a lagging one).
fn list_of_the_first_state(h: &mut EventHandler) {
    h.on_cr(Event::Init);
    h.on_cr(Event::InitApply(cr("a", "pa", "10", Desire::Hibernate)));
    h.on_cr(Event::InitApply(cr("b", "pb", "11", Desire::Hibernate)));
    h.on_cr(Event::InitDone);
    h.on_pod(Event::Init);
    h.on_pod(Event::InitApply(pod("pa", "12", "vm-a", false)));
    h.on_pod(Event::InitApply(pod("pb", "13", "vm-b", false)));
    h.on_pod(Event::InitDone);
}

/// SPEC S4: a relist cut short (a streamed list cut before its end bookmark, a later page
/// failing) and retried loses nothing: a CR changed while the watch was down, and a CR
/// whose pod changed, are triggered once the retried list is done, though the cut
/// attempt had already shown them.
#[test]
fn s4_a_relist_cut_short_and_retried_still_triggers_what_changed() {
    let (mut h, mut rx) = harness();
    first_list(&mut h, &mut rx);
    let changed_cr = || cr("a", "pa", "20", Desire::Wake);
    let changed_pod = || pod("pb", "21", "vm-b", true);

    // The cut attempt: kube starts over with a fresh Init.
    h.on_cr(Event::Init);
    h.on_cr(Event::InitApply(changed_cr()));
    h.on_pod(Event::Init);
    h.on_pod(Event::InitApply(changed_pod()));
    // The retried list shows the same objects again.
    h.on_cr(Event::Init);
    h.on_cr(Event::InitApply(changed_cr()));
    h.on_cr(Event::InitApply(cr("b", "pb", "11", Desire::Hibernate)));
    h.on_pod(Event::Init);
    h.on_pod(Event::InitApply(pod("pa", "12", "vm-a", false)));
    h.on_pod(Event::InitApply(changed_pod()));
    assert!(
        drain(&mut rx).is_empty(),
        "held until the store has the new list"
    );
    h.on_cr(Event::InitDone);
    h.on_pod(Event::InitDone);
    assert_eq!(
        drain(&mut rx),
        ["a", "b"],
        "a: the CR changed; b: its pod changed"
    );
}

fn rv_of_cr(h: &EventHandler, name: &str) -> Option<String> {
    h.cache.cr("ns", name)?.resource_version()
}

fn rv_of_pod(h: &EventHandler, name: &str) -> Option<String> {
    h.cache.pod("ns", name)?.resource_version()
}

/// SPEC S4: no going back in time. A relist from an apiserver lagging behind the one the
/// cache watched shows older copies: they trigger nothing, and the stores, the podRef
/// index and the pod views keep the newer ones. Stale watch events and deletes likewise.
#[test]
fn s4_a_lagging_list_or_stale_event_never_takes_the_cache_back() {
    let (mut h, mut rx) = harness();
    first_list(&mut h, &mut rx);
    // The cache moves on: a wakes, pb names another VM.
    h.on_cr(Event::Apply(cr("a", "pa", "30", Desire::Wake)));
    h.on_pod(Event::Apply(pod("pb", "31", "vm-b2", false)));
    assert_eq!(drain(&mut rx), ["a", "b"]);

    // A relist from a lagging apiserver shows them as they were.
    list_of_the_first_state(&mut h);
    assert!(drain(&mut rx).is_empty(), "older copies are no change");
    assert_eq!(rv_of_cr(&h, "a").as_deref(), Some("30"));
    assert_eq!(
        h.cache.cr("ns", "a").map(|c| c.spec.desire),
        Some(Desire::Wake)
    );
    assert_eq!(rv_of_pod(&h, "pb").as_deref(), Some("31"));
    assert_eq!(
        h.cache.crs_for_pod("ns", "pa").len(),
        1,
        "a is still listed"
    );
    let naming = h.cache.pod_views.read().pods_naming("vm-b2");
    assert_eq!(naming, [super::index::Key::new("ns", "pb")]);

    // Stale events from a lagging watch: an older copy, and deletes older than the copies
    // held (of objects since moved on).
    h.on_cr(Event::Apply(cr("a", "pa", "29", Desire::Hibernate)));
    h.on_pod(Event::Apply(pod("pb", "14", "vm-b", false)));
    h.on_cr(Event::Delete(cr("b", "pb", "5", Desire::Hibernate)));
    h.on_pod(Event::Delete(pod("pa", "6", "vm-a", false)));
    assert!(drain(&mut rx).is_empty());
    assert_eq!(rv_of_cr(&h, "a").as_deref(), Some("30"));
    assert_eq!(rv_of_pod(&h, "pb").as_deref(), Some("31"));
    assert_eq!(rv_of_cr(&h, "b").as_deref(), Some("11"), "b not deleted");
    assert_eq!(rv_of_pod(&h, "pa").as_deref(), Some("12"), "pa not deleted");

    // The lagging apiserver catches up and moves on.
    h.on_cr(Event::Apply(cr("a", "pa", "40", Desire::Hibernate)));
    assert_eq!(drain(&mut rx), ["a"]);
    assert_eq!(rv_of_cr(&h, "a").as_deref(), Some("40"));
}

/// SPEC S4: a list cut short showed a newer copy that never reached the store; the retry,
/// from a lagging apiserver, shows an older one. The store gets the newest copy it can
/// (never older than its own), the pass is triggered at the list's end, and the copy that
/// catches the store up triggers again.
#[test]
fn s4_a_cut_list_retried_on_a_lagging_apiserver_catches_up_later() {
    let (mut h, mut rx) = harness();
    first_list(&mut h, &mut rx);
    h.on_cr(Event::Init);
    h.on_cr(Event::InitApply(cr("a", "pa", "30", Desire::Wake)));
    h.on_pod(Event::Init);
    h.on_pod(Event::InitApply(pod("pa", "31", "vm-a", true)));
    // Retried on an apiserver that has seen a's and pa's first change only.
    h.on_cr(Event::Init);
    h.on_cr(Event::InitApply(cr("a", "pa", "20", Desire::Wake)));
    h.on_cr(Event::InitApply(cr("b", "pb", "11", Desire::Hibernate)));
    h.on_cr(Event::InitDone);
    h.on_pod(Event::Init);
    h.on_pod(Event::InitApply(pod("pa", "21", "vm-a", true)));
    h.on_pod(Event::InitApply(pod("pb", "13", "vm-b", false)));
    h.on_pod(Event::InitDone);
    assert_eq!(
        drain(&mut rx),
        ["a"],
        "what the cut list showed is triggered"
    );
    assert_eq!(
        rv_of_cr(&h, "a").as_deref(),
        Some("20"),
        "newer than it was"
    );
    assert_eq!(rv_of_pod(&h, "pa").as_deref(), Some("21"));
    // The watch then brings the versions the cut list showed: the stores catch up.
    h.on_cr(Event::Apply(cr("a", "pa", "30", Desire::Wake)));
    assert_eq!(drain(&mut rx), ["a"], "the CR's store caught up");
    h.on_pod(Event::Apply(pod("pa", "31", "vm-a", true)));
    assert_eq!(drain(&mut rx), ["a"], "the pod's store caught up");
    assert_eq!(rv_of_cr(&h, "a").as_deref(), Some("30"));
    assert_eq!(rv_of_pod(&h, "pa").as_deref(), Some("31"));
}

// ---------------------------------------------------------------------------------------
// One way to be triggered: every controller hears the same changes through its policy.

/// K9 C3: one change reaches every controller's policy from the same driver: a new pod
/// labelled `tier: web` wakes the CR that targets it and the schedule selecting it; a
/// change to the CR's status wakes the CR and the schedule selecting its pod; a pod
/// change only a CR pass reads wakes the CR alone.
#[test]
fn k9_c3_one_change_reaches_both_controllers_policies() {
    use crate::schedule::wakeup::SchedulePolicy;
    use crate::schedule::{CocoonHibernationSchedule, CocoonHibernationScheduleSpec};
    let (mut h, mut crs) = harness();
    let (store, mut writer) = kube::runtime::reflector::store();
    let mut office = CocoonHibernationSchedule::new(
        "office",
        CocoonHibernationScheduleSpec::always_asleep(
            k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector {
                match_labels: Some([("tier".to_owned(), "web".to_owned())].into()),
                ..Default::default()
            },
        ),
    );
    office.metadata.namespace = Some("ns".into());
    writer.apply_watcher_event(&Event::Apply(office));
    let mut schedules =
        crate::runtime::trigger::subscribe(&h.cache, SchedulePolicy { schedules: store });
    let names = |rx: &mut UnboundedReceiver<ObjectRef<CocoonHibernationSchedule>>| {
        let mut names = Vec::new();
        while let Ok(t) = rx.try_recv() {
            names.push(t.name);
        }
        names
    };
    first_list(&mut h, &mut crs);
    assert!(
        names(&mut schedules).is_empty(),
        "nothing of it is labelled"
    );

    let unlabelled = pod("pa", "20", "vm-a", false);
    let mut meta = unlabelled.metadata.clone();
    meta.labels = Some([("tier".to_owned(), "web".to_owned())].into());
    meta.annotations = Some(unlabelled.annotations());
    let mut web = PodSlice::new(meta, false);
    h.on_pod(Event::Apply(web.clone()));
    assert_eq!(
        names(&mut schedules),
        ["office"],
        "relabelled into the selector"
    );
    assert!(
        drain(&mut crs).is_empty(),
        "labels are not what a CR pass reads"
    );

    let mut changed = cr("a", "pa", "21", Desire::Hibernate);
    changed.status = Some(Default::default());
    h.on_cr(Event::Apply(changed));
    assert_eq!(drain(&mut crs), ["a"]);
    assert_eq!(
        names(&mut schedules),
        ["office"],
        "a CR of a selected pod changed"
    );

    web.metadata.resource_version = Some("22".into());
    web.container_running = true;
    h.on_pod(Event::Apply(web));
    assert_eq!(drain(&mut crs), ["a"]);
    assert!(names(&mut schedules).is_empty(), "only a CR pass reads it");
}

/// S8: when the driver ends, every controller's trigger channel closes, so its
/// controller sees the cache is gone instead of waiting for ever.
#[tokio::test]
async fn s8_triggers_end_with_the_driver() {
    let (cache, writers) = SharedCache::empty(Progress::new());
    let mut rx = crate::runtime::trigger::subscribe(&cache, CrPolicy);
    let crs = futures::stream::empty();
    let pods = futures::stream::empty();
    super::driver::drive(cache, writers, crs, pods).await;
    assert!(rx.recv().await.is_none(), "the channel closed");
}
