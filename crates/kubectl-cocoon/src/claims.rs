//! One read of every CocoonHibernation and every pod's VM name, cluster-wide (VM names
//! are cluster-wide, so a claim may come from any namespace).

use super::audit::{Claims, PodVm};
use super::error::PluginError;
use super::resources;
use super::view::CrView;
use cocoon_api::pod::list_vm_names;
use kube::Api;
use kube::api::ListParams;

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
    let pods = list_vm_names(&Api::all(client.clone()))
        .await
        .map_err(|e| PluginError::api("listing pods in every namespace", e))?;
    Ok(pods
        .into_iter()
        .map(|p| PodVm {
            namespace: p.namespace,
            name: p.name,
            vm: p.vm,
        })
        .collect())
}
