//! End-to-end: the controllers' event recorder (`src/runtime/events.rs`) against the real
//! apiserver: a repeated event grows one Event's series (the merge patch the apiserver's
//! validation accepts), another note is another Event.

use cocoon_hibernation::runtime::events::{Event, EventType, Recorder, Reporter};
use k8s_openapi::api::core::v1::{ConfigMap, ObjectReference};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{ListParams, PostParams};
use kube::{Api, Resource};
use testkit::cluster;

fn event(note: &str) -> Event {
    Event {
        type_: EventType::Normal,
        reason: "Hibernated".into(),
        note: Some(note.into()),
        action: "Reconcile".into(),
        secondary: None,
    }
}

/// O1 (issue 38, memory): the same event three times is one Event with `series.count` 3,
/// also after its object's resourceVersion changed; another note is an Event of its own;
/// an Event deleted under its series is written anew.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn e2e_o1_a_repeated_event_is_one_event_with_a_series() {
    let c = cluster::cluster();
    let client = c.client().await;
    let ns = c.fresh_namespace(&client, "events").await;
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
    let mut cm = ConfigMap::default();
    cm.metadata.name = Some("about".into());
    let cm = maps.create(&PostParams::default(), &cm).await.unwrap();
    let mut reference: ObjectReference = cm.object_ref(&());
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: "cocoon-hibernation-e2e".into(),
            instance: None,
        },
    );
    recorder.publish(&event("done"), &reference).await.unwrap();
    reference.resource_version = Some("999999".into());
    recorder.publish(&event("done"), &reference).await.unwrap();
    recorder.publish(&event("done"), &reference).await.unwrap();
    recorder.publish(&event("other"), &reference).await.unwrap();

    let events: Api<K8sEvent> = Api::namespaced(client, &ns);
    let ours = || async {
        let mut seen: Vec<(Option<String>, Option<i32>, String)> = events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| e.reporting_controller.as_deref() == Some("cocoon-hibernation-e2e"))
            .map(|e| (e.note, e.series.map(|s| s.count), e.metadata.name.unwrap()))
            .collect();
        seen.sort();
        seen
    };
    let seen = ours().await;
    let counts: Vec<_> = seen.iter().map(|(n, c, _)| (n.as_deref(), *c)).collect();
    assert_eq!(
        counts,
        [(Some("done"), Some(3)), (Some("other"), None)],
        "one Event per note, the repeats in its series"
    );

    // An Event deleted under its series: the next repeat is written anew.
    events
        .delete(&seen[0].2, &Default::default())
        .await
        .unwrap();
    recorder.publish(&event("done"), &reference).await.unwrap();
    let again = ours().await;
    let counts: Vec<_> = again.iter().map(|(n, c, _)| (n.as_deref(), *c)).collect();
    assert_eq!(counts, [(Some("done"), None), (Some("other"), None)]);
}
