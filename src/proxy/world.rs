//! The proxy's view of the cluster (Q8: reads pods, CocoonHibernations and idle policies;
//! writes CR desires): one informer per kind and served namespace, a signal on every
//! change for held requests, the route table rebuilt when a policy changes, and the
//! desire flip.

use super::IDLE_DESIRE;
use super::decide::{CrFacts, PodFacts, Verdict, decide};
use super::hold::{WakeError, World};
use super::routes::{Namespaces, PolicyInput, RouteTable, Target};
use crate::api::CocoonHibernation;
use crate::api::annotations::PodView;
use crate::idle::CocoonIdlePolicy;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use parking_lot::RwLock;
use serde_json::json;
use std::sync::Arc;
use tokio::sync::Notify;

/// The informers of one namespace (or of all).
struct Scope {
    pods: Store<Pod>,
    crs: Store<CocoonHibernation>,
    policies: Store<CocoonIdlePolicy>,
}

pub struct Cluster {
    client: kube::Client,
    namespaces: Namespaces,
    scopes: Vec<Scope>,
    routes: RwLock<Arc<RouteTable>>,
    changed: Notify,
}

impl Cluster {
    /// Starts the informers of `namespaces` on the current runtime: `watch` lists and
    /// watches, `client` writes.
    pub fn start_with(
        watch_client: kube::Client,
        client: kube::Client,
        namespaces: Namespaces,
    ) -> Arc<Self> {
        let apis: Vec<Option<String>> = match &namespaces {
            Namespaces::All => vec![None],
            Namespaces::Only(list) => list.iter().cloned().map(Some).collect(),
        };
        let mut scopes = Vec::new();
        let mut streams = Vec::new();
        for ns in &apis {
            let (pods, pw) = reflector::store();
            let (crs, cw) = reflector::store();
            let (policies, polw) = reflector::store();
            streams.push(
                changes(reflector::reflector(pw, watch(&watch_client, ns)))
                    .map(|()| false)
                    .boxed(),
            );
            streams.push(
                changes(reflector::reflector(cw, watch(&watch_client, ns)))
                    .map(|()| false)
                    .boxed(),
            );
            let policy_events = changes(reflector::reflector(polw, watch(&watch_client, ns)));
            streams.push(policy_events.map(|()| true).boxed());
            scopes.push(Scope {
                pods,
                crs,
                policies,
            });
        }
        let me = Arc::new(Self {
            client,
            namespaces,
            scopes,
            routes: RwLock::new(Arc::new(RouteTable::default())),
            changed: Notify::new(),
        });
        let weak = Arc::downgrade(&me);
        tokio::spawn(async move {
            let mut all = futures::stream::select_all(streams);
            while let Some(policy) = all.next().await {
                let Some(me) = weak.upgrade() else { return };
                if policy {
                    me.rebuild_routes();
                }
                me.changed.notify_waiters();
            }
        });
        me
    }

    /// Waits until every informer has listed once.
    pub async fn wait_synced(&self) {
        for s in &self.scopes {
            let _ = s.pods.wait_until_ready().await;
            let _ = s.crs.wait_until_ready().await;
            let _ = s.policies.wait_until_ready().await;
        }
        self.rebuild_routes();
    }

    pub fn routes(&self) -> Arc<RouteTable> {
        self.routes.read().clone()
    }

    fn rebuild_routes(&self) {
        let policies: Vec<Arc<CocoonIdlePolicy>> = self
            .scopes
            .iter()
            .flat_map(|s| s.policies.state())
            .collect();
        let inputs: Vec<PolicyInput<'_>> = policies
            .iter()
            .filter_map(|p| {
                Some(PolicyInput {
                    namespace: p.metadata.namespace.as_deref()?,
                    name: p.metadata.name.as_deref()?,
                    spec: &p.spec,
                })
            })
            .collect();
        let table = RouteTable::build(&inputs, &self.namespaces);
        for why in &table.skipped {
            tracing::warn!(route = %why, "route left out");
        }
        *self.routes.write() = Arc::new(table);
    }

    fn scope(&self, ns: &str) -> Option<&Scope> {
        match &self.namespaces {
            Namespaces::All => self.scopes.first(),
            Namespaces::Only(list) => {
                let i = list.iter().position(|n| n == ns)?;
                self.scopes.get(i)
            }
        }
    }

    fn pod_facts(&self, scope: &Scope, target: &Target) -> Option<PodFacts> {
        let pod = scope
            .pods
            .get(&ObjectRef::new(&target.pod).within(target.namespace()))?;
        let empty = std::collections::BTreeMap::new();
        let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
        let selected =
            Selector::try_from(target.policy.selector.clone()).is_ok_and(|s| s.matches(labels));
        let view = PodView::of(&pod);
        let awake = view.woken() && !view.hibernate_requested && pod_ready(&pod);
        let ip = pod
            .status
            .as_ref()
            .and_then(|s| s.pod_ip.as_deref())
            .and_then(|ip| ip.parse().ok());
        Some(PodFacts {
            uid: pod.metadata.uid.clone().unwrap_or_default(),
            ip,
            selected,
            awake,
        })
    }

    fn cr_facts(&self, scope: &Scope, target: &Target) -> Option<CrFacts> {
        let ns = target.namespace();
        scope
            .crs
            .state()
            .iter()
            .find(|cr| {
                cr.metadata.namespace.as_deref() == Some(ns) && cr.spec.pod_ref.name == target.pod
            })
            .map(|cr| CrFacts::of(cr))
    }
}

impl World for Cluster {
    fn verdict(&self, target: &Target) -> Verdict {
        let Some(scope) = self.scope(target.namespace()) else {
            return decide(None, None);
        };
        let pod = self.pod_facts(scope, target);
        // The warm path looks at the pod only.
        if let Some(p) = &pod
            && p.selected
            && p.awake
            && p.ip.is_some()
        {
            return decide(Some(p), None);
        }
        decide(pod.as_ref(), self.cr_facts(scope, target).as_ref())
    }

    async fn wake(
        &self,
        target: &Target,
        cr: &str,
        resource_version: Option<&str>,
    ) -> Result<(), WakeError> {
        let api: Api<CocoonHibernation> = Api::namespaced(self.client.clone(), target.namespace());
        let patch = json!({
            "metadata": {
                "resourceVersion": resource_version,
                "annotations": { IDLE_DESIRE: "Wake" },
            },
            "spec": { "desire": "Wake" },
        });
        api.patch(cr, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| {
                tracing::info!(ns = %target.namespace(), pod = %target.pod, %cr, "woken on request");
            })
            .map_err(|e| match e {
                kube::Error::Api(s) if s.code == 409 => WakeError::Conflict,
                e => WakeError::Other(e.to_string()),
            })
    }

    fn changed(&self) -> &Notify {
        &self.changed
    }
}

fn watch<K>(
    client: &kube::Client,
    ns: &Option<String>,
) -> impl Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    K::DynamicType: Default,
{
    let api: Api<K> = match ns {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    watcher(api, watcher::Config::default()).default_backoff()
}

/// One unit per event that reached the store; watch errors are logged (the watcher
/// retries with backoff).
fn changes<K, S>(events: S) -> impl Stream<Item = ()> + Send + 'static
where
    S: Stream<Item = watcher::Result<watcher::Event<K>>> + Send + 'static,
{
    events.filter_map(|ev| {
        futures::future::ready(match ev {
            Ok(_) => Some(()),
            Err(e) => {
                tracing::warn!(error = %e, "watch error");
                None
            }
        })
    })
}

fn pod_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}
