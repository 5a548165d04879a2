//! S2: which CR may act on a pod and its VM, from the other CRs in the cache.

use cocoon_api::CocoonHibernation;
use cocoon_api::tenancy;

/// Whether this CR may act on its pod and VM (S2), from the other CRs in the cache.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum Ownership {
    #[default]
    Sole,
    /// An older live CR targets the same pod (`namespace/name`); only the oldest acts.
    OlderOnPod(String),
    /// A live CR on another pod holds the VM this CR's pod names. `holder` is that CR
    /// as this CR's conditions may name it: never by name from another namespace (S12).
    VmHeldBy { vm: String, holder: String },
}

/// S2: one pod, one acting CR; one VM, one owner. `same_pod` and `vm_holders` may
/// include `cr` itself. Age is (creationTimestamp, name), so every replica agrees.
pub fn ownership<'a>(
    cr: &CocoonHibernation,
    pod_vm: Option<&str>,
    same_pod: impl IntoIterator<Item = &'a CocoonHibernation>,
    vm_holders: impl IntoIterator<Item = &'a CocoonHibernation>,
) -> Ownership {
    let is_self = |o: &CocoonHibernation| {
        o.metadata.namespace == cr.metadata.namespace && o.metadata.name == cr.metadata.name
    };
    let age = |o: &CocoonHibernation| {
        (
            o.metadata.creation_timestamp.clone().map(|t| t.0),
            o.metadata.name.clone(),
        )
    };
    let key = |o: &CocoonHibernation| {
        format!(
            "{}/{}",
            o.metadata.namespace.as_deref().unwrap_or_default(),
            o.metadata.name.as_deref().unwrap_or_default()
        )
    };
    let mine = age(cr);
    let older_on_pod = same_pod
        .into_iter()
        .filter(|o| !is_self(o) && !o.is_deleting() && o.spec.pod_ref == cr.spec.pod_ref)
        .filter(|o| o.metadata.namespace == cr.metadata.namespace && age(o) < mine)
        .min_by_key(|o| age(o));
    if let Some(o) = older_on_pod {
        return Ownership::OlderOnPod(key(o));
    }
    let Some(vm) = pod_vm else {
        return Ownership::Sole;
    };
    let i_hold = cr.vm_name() == Some(vm);
    let holder = vm_holders
        .into_iter()
        .filter(|o| !is_self(o) && !o.is_deleting() && o.vm_name() == Some(vm))
        .filter(|o| {
            o.metadata.namespace != cr.metadata.namespace || o.spec.pod_ref != cr.spec.pod_ref
        })
        // Two holders of one VM can only come from before this rule: the older keeps it.
        .filter(|o| !i_hold || age(o) < mine)
        .min_by_key(|o| age(o));
    match holder {
        Some(o) => Ownership::VmHeldBy {
            vm: vm.to_owned(),
            holder: tenancy::name_cr(
                cr.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.name.as_deref().unwrap_or_default(),
            ),
        },
        None => Ownership::Sole,
    }
}
