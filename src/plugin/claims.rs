//! One read of every CocoonHibernation and every pod's VM name, cluster-wide (VM names
//! are cluster-wide, so a claim may come from any namespace).

use super::audit::{Claims, PodVm};
use super::error::PluginError;
use super::resources;
use super::view::CrView;
use crate::api::annotations::VM_NAME;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::ListParams;

/// Pods per list page; only their metadata is read.
const POD_PAGE: u32 = 500;

pub async fn gather(client: &kube::Client) -> Result<Claims, PluginError> {
    let crs: Vec<CrView> = resources::all_crs(client)
        .list(&ListParams::default())
        .await
        .map_err(|e| PluginError::api("listing CocoonHibernations in every namespace", e))?
        .items
        .iter()
        .map(resources::view)
        .collect();
    let pods = pod_vms(client).await?;
    Ok(Claims::build(&crs, &pods))
}

async fn pod_vms(client: &kube::Client) -> Result<Vec<PodVm>, PluginError> {
    let api: Api<Pod> = Api::all(client.clone());
    let mut params = ListParams::default().limit(POD_PAGE);
    let mut pods = Vec::new();
    loop {
        let page = api
            .list_metadata(&params)
            .await
            .map_err(|e| PluginError::api("listing pods in every namespace", e))?;
        pods.extend(page.items.iter().map(|pod| {
            PodVm {
                namespace: pod.metadata.namespace.clone().unwrap_or_default(),
                name: pod.metadata.name.clone().unwrap_or_default(),
                vm: pod
                    .metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(VM_NAME))
                    .filter(|v| !v.is_empty())
                    .cloned(),
            }
        }));
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(pods),
        }
    }
}
