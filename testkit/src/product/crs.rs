//! CocoonHibernations made, changed and waited for; the polling every test uses.

use cocoon_hibernation::api::{CocoonHibernation, CocoonHibernationSpec, Desire, Phase, PodRef};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use std::future::Future;
use std::time::{Duration, Instant};

pub fn new_cr(name: &str, pod: &str, desire: Desire) -> CocoonHibernation {
    CocoonHibernation::new(
        name,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    )
}

pub async fn create_cr(
    api: &Api<CocoonHibernation>,
    name: &str,
    pod: &str,
    desire: Desire,
) -> CocoonHibernation {
    let cr = new_cr(name, pod, desire);
    api.create(&PostParams::default(), &cr)
        .await
        .unwrap_or_else(|e| panic!("create CocoonHibernation {name}: {e}"))
}

pub async fn set_desire(api: &Api<CocoonHibernation>, name: &str, desire: Desire) {
    let patch = serde_json::json!({ "spec": { "desire": desire } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap_or_else(|e| panic!("flip desire of {name}: {e}"));
}

pub fn phase(cr: &CocoonHibernation) -> Option<Phase> {
    cr.status.as_ref().and_then(|s| s.phase)
}

/// Polls `probe` every 100 ms until it yields `Some`, or panics after `timeout`.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits for the CR to reach `want`, recording every phase seen on the way. A watch sees
/// every write in order, so a phase that lasts only milliseconds is still recorded.
pub async fn wait_phase(
    api: &Api<CocoonHibernation>,
    name: &str,
    want: Phase,
    timeout: Duration,
    seen: &mut Vec<Phase>,
) -> CocoonHibernation {
    use futures::StreamExt;
    use kube::runtime::{WatchStreamExt, watcher};
    let cfg = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = watcher(api.clone(), cfg).applied_objects();
    futures::pin_mut!(stream);
    let found = tokio::time::timeout(timeout, async {
        while let Some(item) = stream.next().await {
            let Ok(cr) = item else { continue };
            if let Some(p) = phase(&cr) {
                if seen.last() != Some(&p) {
                    seen.push(p);
                }
                if p == want {
                    return Some(cr);
                }
            }
        }
        None
    })
    .await;
    match found {
        Ok(Some(cr)) => cr,
        _ => panic!("{name} did not reach {want} within {timeout:?}; phases seen: {seen:?}"),
    }
}

/// Deletes a CR and waits until it is gone (finalizers done).
pub async fn delete_and_wait_gone(api: &Api<CocoonHibernation>, name: &str, timeout: Duration) {
    api.delete(name, &Default::default())
        .await
        .unwrap_or_else(|e| panic!("delete {name}: {e}"));
    wait_gone(api, name, timeout).await;
}

pub async fn wait_gone(api: &Api<CocoonHibernation>, name: &str, timeout: Duration) {
    eventually(&format!("{name} gone"), timeout, || async {
        api.get_opt(name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// Asserts the CR stays out of `forbidden` for `hold`.
pub async fn never_phase(
    api: &Api<CocoonHibernation>,
    name: &str,
    forbidden: Phase,
    hold: Duration,
) {
    let deadline = Instant::now() + hold;
    while Instant::now() < deadline {
        let cr = api.get(name).await.expect("get CR");
        assert_ne!(
            phase(&cr),
            Some(forbidden),
            "{name} reached {forbidden} too early"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Reasons of the events recorded for one CR, oldest first.
pub async fn event_reasons(client: &kube::Client, namespace: &str, name: &str) -> Vec<String> {
    let api: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(client.clone(), namespace);
    let mut events: Vec<_> = api
        .list(&Default::default())
        .await
        .expect("list events")
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .collect();
    events.sort_by_key(|e| e.event_time.clone().map(|t| t.0));
    events.into_iter().filter_map(|e| e.reason).collect()
}
