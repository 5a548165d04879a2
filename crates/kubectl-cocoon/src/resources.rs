//! CocoonHibernations as untyped objects, so a status field this build does not know is
//! still read (see `view.rs`), and pods' metadata.

use super::view::CrView;
use cocoon_api::CocoonHibernation;
use kube::Api;
use kube::api::{ApiResource, DynamicObject};

fn resource() -> ApiResource {
    ApiResource::erase::<CocoonHibernation>(&())
}

pub fn crs(client: &kube::Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &resource())
}

pub fn all_crs(client: &kube::Client) -> Api<DynamicObject> {
    Api::all_with(client.clone(), &resource())
}

/// The object as JSON, then the lenient view of it.
pub fn view(object: &DynamicObject) -> CrView {
    serde_json::to_value(object)
        .map(|json| CrView::from_json(&json))
        .unwrap_or_default()
}

/// A new CocoonHibernation as JSON: named after its pod, as the webhook requires.
pub fn new_cr(
    namespace: &str,
    pod: &str,
    desire: &str,
) -> Result<DynamicObject, serde_json::Error> {
    use kube::Resource as _;
    serde_json::from_value(serde_json::json!({
        "apiVersion": CocoonHibernation::api_version(&()),
        "kind": CocoonHibernation::kind(&()),
        "metadata": { "name": pod, "namespace": namespace },
        "spec": { "podRef": { "name": pod }, "desire": desire },
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_cr_is_named_after_its_pod() {
        let cr = new_cr("ns", "web-0", "Hibernate").unwrap();
        let view = view(&cr);
        assert_eq!(view.key(), "ns/web-0");
        assert_eq!(view.pod, "web-0");
        assert_eq!(view.desire, "Hibernate");
        let json = serde_json::to_value(&cr).unwrap();
        assert_eq!(json["apiVersion"], "cocoonset.cocoonstack.io/v1");
        assert_eq!(json["kind"], "CocoonHibernation");
    }
}
