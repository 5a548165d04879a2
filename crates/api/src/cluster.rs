//! The cluster's identity, which an install's owner marker names (S10).

use k8s_openapi::api::core::v1::Namespace;

/// The uid of namespace kube-system, which lives as long as the cluster does.
pub async fn cluster_id(client: &kube::Client) -> Result<String, kube::Error> {
    let namespaces: kube::Api<Namespace> = kube::Api::all(client.clone());
    let kube_system = namespaces.get("kube-system").await?;
    Ok(kube_system.metadata.uid.unwrap_or_default())
}
