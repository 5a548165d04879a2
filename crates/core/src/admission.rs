//! Admission rules V1–V4 as a pure function of the request and a view of the cache.

use cocoon_api::CocoonHibernation;

/// Another CR that targets the same pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Claim {
    pub name: String,
    pub terminating: bool,
}

/// Another live CR that already holds the VM a pod names, through a different pod (S2).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmHolder {
    pub vm: String,
    /// The holding CR; a denial names it only from its own namespace (S12).
    pub namespace: String,
    pub name: String,
}

/// What validation reads from the shared informer cache (V3).
pub trait ClaimView {
    fn synced(&self) -> bool;
    fn claims(&self, namespace: &str, pod: &str) -> Vec<Claim>;
    /// S2: a live CR on another pod holding the VM that `namespace/pod` names. Views
    /// without pods (test fakes) know of none.
    fn vm_holder(&self, _namespace: &str, _pod: &str) -> Option<VmHolder> {
        None
    }
}

pub use kube::core::admission::Operation;

/// A denial's message, shown to the user by kubectl; `unsynced` marks the V3 denial of
/// a cache that has not synced (counted apart, for alerts).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denial {
    pub message: String,
    pub unsynced: bool,
}

impl From<String> for Denial {
    fn from(message: String) -> Self {
        Self {
            message,
            unsynced: false,
        }
    }
}

fn deny<T>(message: impl Into<String>) -> Result<T, Denial> {
    Err(Denial::from(message.into()))
}

pub fn validate(
    op: Operation,
    namespace: &str,
    object: Option<&CocoonHibernation>,
    old_object: Option<&CocoonHibernation>,
    view: &impl ClaimView,
) -> Result<(), Denial> {
    match op {
        Operation::Create => {
            let Some(cr) = object else {
                return deny("CREATE request carries no object");
            };
            validate_create(namespace, cr, view)
        }
        Operation::Update => match (object, old_object) {
            (Some(new), Some(old)) if new.spec.pod_ref != old.spec.pod_ref => {
                // V4: backstop for clusters whose CRD lacks the CEL rule.
                deny("spec.podRef is immutable")
            }
            (Some(_), Some(_)) => Ok(()),
            _ => deny("UPDATE request needs both object and oldObject"),
        },
        Operation::Delete | Operation::Connect => Ok(()),
    }
}

/// V3's denial while the shared cache has not synced; counted apart for the alert.
pub const UNSYNCED: &str = "cocoon-hibernation's cache has not synced yet; retry in a few seconds";

fn validate_create(
    namespace: &str,
    cr: &CocoonHibernation,
    view: &impl ClaimView,
) -> Result<(), Denial> {
    let name = cr.metadata.name.as_deref().unwrap_or_default();
    let pod = cr.spec.pod_ref.name.as_str();
    if name != pod {
        // V1: equal names make racing duplicate creates collide on name uniqueness.
        return deny(format!(
            "metadata.name {name:?} must equal spec.podRef.name {pod:?}: one CocoonHibernation per pod, named after it"
        ));
    }
    if !view.synced() {
        // V3: fail closed until the shared cache has its initial list.
        return Err(Denial {
            message: UNSYNCED.into(),
            unsynced: true,
        });
    }
    // V2: one CR per pod.
    let others: Vec<Claim> = view
        .claims(namespace, pod)
        .into_iter()
        .filter(|c| c.name != name)
        .collect();
    if let Some(live) = others.iter().find(|c| !c.terminating) {
        return deny(format!(
            "CocoonHibernation {ns}/{other} already targets pod {pod}; flip its spec.desire instead",
            ns = namespace,
            other = live.name
        ));
    }
    if let Some(dying) = others.first() {
        return deny(format!(
            "CocoonHibernation {ns}/{other} targeting pod {pod} is terminating; retry after its cleanup finishes",
            ns = namespace,
            other = dying.name
        ));
    }
    // S2: VM names are cluster-wide; a VM has one owner.
    if let Some(held) = view.vm_holder(namespace, pod) {
        let holder = cocoon_api::tenancy::name_cr(namespace, &held.namespace, &held.name);
        return deny(format!(
            "pod {pod} names vm {vm}, which {holder} already holds through another pod; one VM, one owner",
            vm = held.vm
        ));
    }
    Ok(())
}
