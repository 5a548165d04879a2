//! What the process gives a policy controller (schedules, idle policies): filled once in
//! `server.rs`, cloned for each.

use crate::cache::SharedCache;
use crate::metrics::Metrics;
use crate::runtime::gate::Gate;
use crate::schedule::Clock;
use kube::Resource;
use kube::api::Api;
use kube::runtime::watcher;

#[derive(Clone)]
pub struct Wiring {
    /// For the policy watches: its read timeout outlasts the watch the apiserver is asked
    /// to end (S8), unlike `client`'s, which would cut a quiet watch every few seconds.
    pub watch_client: kube::Client,
    /// For reads and writes: every request times out.
    pub client: kube::Client,
    pub cache: SharedCache,
    pub metrics: Metrics,
    pub clock: Clock,
    pub gate: Gate,
    /// Where to watch policies; empty: every namespace.
    pub namespace: String,
    /// Seconds after which the apiserver ends each policy watch (the cache's own).
    pub watch_timeout: u32,
}

impl Wiring {
    /// `K` where policies are watched, on the watch client.
    pub fn watched<K>(&self) -> Api<K>
    where
        K: Resource<Scope = k8s_openapi::NamespaceResourceScope>,
        K::DynamicType: Default,
    {
        if self.namespace.is_empty() {
            Api::all(self.watch_client.clone())
        } else {
            Api::namespaced(self.watch_client.clone(), &self.namespace)
        }
    }

    pub fn watch_config(&self) -> watcher::Config {
        watch_config(self.watch_timeout)
    }
}

/// S8: a policy watch is ended by the apiserver, on time, like the cache's.
pub fn watch_config(watch_timeout: u32) -> watcher::Config {
    watcher::Config::default().timeout(watch_timeout)
}
