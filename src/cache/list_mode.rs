//! How the caches take a full list: one streamed watch (`sendInitialEvents`, the
//! apiserver's WatchList) where the apiserver offers it, else paged LISTs.
//!
//! A streamed list decodes one object at a time and costs one request. Paged LISTs must
//! keep pages small, because each page is decoded whole and the allocator keeps that peak
//! as RSS: 10k pods were 200 sequential requests of 50, most of a start-up.

use crate::api::pod::PodSlice;
use futures::StreamExt;
use kube::Api;
use kube::api::{WatchEvent, WatchParams};
use std::time::Duration;

/// Pods per list request when the pod cache lists in pages.
pub const POD_LIST_PAGE: u32 = 50;

/// How long the probe waits for the apiserver's answer.
const PROBE_WAIT: Duration = Duration::from_secs(10);

/// The annotation on the bookmark that ends a streamed list.
const INITIAL_EVENTS_END: &str = "k8s.io/initial-events-end";

/// `--initial-list`: how the caches list.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ListChoice {
    /// Stream where the apiserver answers a probe with a streamed list, else pages.
    #[default]
    Auto,
    Stream,
    Pages,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListMode {
    Stream,
    Pages,
}

impl ListChoice {
    pub async fn resolve(self, pods: &Api<PodSlice>) -> ListMode {
        match self {
            Self::Stream => ListMode::Stream,
            Self::Pages => ListMode::Pages,
            Self::Auto => probe(pods).await,
        }
    }
}

/// Asks for a streamed list that matches no pod. An apiserver that streams lists ends it
/// with the initial-events-end bookmark at once; one with the feature off refuses the
/// request; one that predates it ignores the parameter and never sends that bookmark,
/// which is why the answer must be the bookmark and nothing else.
async fn probe(pods: &Api<PodSlice>) -> ListMode {
    let params = WatchParams {
        label_selector: Some("cocoonset.cocoonstack.io/list-probe=none".into()),
        timeout: Some(PROBE_WAIT.as_secs() as u32),
        bookmarks: true,
        send_initial_events: true,
        ..WatchParams::default()
    };
    let answer = tokio::time::timeout(PROBE_WAIT, async {
        let mut events = pods.watch(&params, "").await.ok()?.boxed();
        events.next().await?.ok()
    })
    .await;
    let mode = match answer {
        Ok(Some(event)) if ends_initial_events(&event) => ListMode::Stream,
        _ => ListMode::Pages,
    };
    tracing::info!(?mode, "caches list by {}", describe(mode));
    mode
}

fn ends_initial_events(event: &WatchEvent<PodSlice>) -> bool {
    matches!(event, WatchEvent::Bookmark(b)
        if b.metadata.annotations.get(INITIAL_EVENTS_END).map(String::as_str) == Some("true"))
}

fn describe(mode: ListMode) -> String {
    match mode {
        ListMode::Stream => "streamed watch (sendInitialEvents)".into(),
        ListMode::Pages => format!("paged LISTs of {POD_LIST_PAGE} pods"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::watch::{Bookmark, BookmarkMeta};
    use std::collections::BTreeMap;

    fn bookmark(annotations: &[(&str, &str)]) -> WatchEvent<PodSlice> {
        WatchEvent::Bookmark(Bookmark {
            types: Default::default(),
            metadata: BookmarkMeta {
                resource_version: "7".into(),
                annotations: annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            },
        })
    }

    #[test]
    fn p1_only_the_initial_events_end_bookmark_means_the_apiserver_streams() {
        assert!(ends_initial_events(&bookmark(&[(
            INITIAL_EVENTS_END,
            "true"
        )])));
        assert!(!ends_initial_events(&bookmark(&[])));
        assert!(!ends_initial_events(&bookmark(&[(
            INITIAL_EVENTS_END,
            "false"
        )])));
        assert!(!ends_initial_events(
            &WatchEvent::Added(PodSlice::default())
        ));
    }
}
