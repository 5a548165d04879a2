//! `--pod-selector`: the cache holds only the pods inside it, so a pod it lacks is read
//! fresh before any rule acts on "missing" (R2), and a deletion's delete checks its own
//! pod's selection on the apiserver (G1, S6).
//!
//! Selection is asked of the apiserver (a list by name and selector), not matched here:
//! kube-core parses no selector strings, and the apiserver's answer is the one its watch
//! applies, set-based expressions included.

use super::context::Context;
use crate::error::Result;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

/// R2: the pod the cache lacks exists, outside `--pod-selector`. False without a
/// selector (the cache then holds every pod, so a pod it lacks is missing) and for a pod
/// inside it (the cache lags, and its watch brings the pod and wakes the CR).
pub(super) async fn outside_selector(ctx: &Context, ns: &str, name: &str) -> Result<bool> {
    if ctx.settings.pod_selector.is_empty() {
        return Ok(false);
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    if api.get_metadata_opt(name).await?.is_none() {
        return Ok(false);
    }
    Ok(!selected(ctx, ns, name).await?)
}

/// Whether pod `name` in `ns` matches `--pod-selector` now; an empty one matches every pod.
pub(super) async fn selected(ctx: &Context, ns: &str, name: &str) -> Result<bool> {
    let selector = &ctx.settings.pod_selector;
    if selector.is_empty() {
        return Ok(true);
    }
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let params = ListParams::default()
        .fields(&format!("metadata.name={name}"))
        .labels(selector);
    Ok(!api.list_metadata(&params).await?.items.is_empty())
}
