//! The CocoonHibernation controller's trigger policy: which CRs a change in the cache
//! wakes. A CR's own change wakes it; a pod's relevant change (C3) wakes the CRs that
//! target it, through the podRef index; a CR gone or a VM released wakes the CRs that may
//! have deferred to it (S2). An arrival (for label selectors) wakes nothing here.

use crate::api::CocoonHibernation;
use crate::cache::SharedCache;
use crate::cache::change::Change;
use crate::runtime::trigger::Policy;
use kube::runtime::reflector::ObjectRef;

/// A reconcile request for one CR.
pub type Trigger = ObjectRef<CocoonHibernation>;

pub struct CrPolicy;

impl Policy for CrPolicy {
    type Kind = CocoonHibernation;

    fn wakes(&self, change: &Change, cache: &SharedCache) -> Vec<Trigger> {
        match change {
            Change::Cr(key) => vec![ObjectRef::new(key.name()).within(key.namespace())],
            Change::Pod(key) => of_pod(cache, key.namespace(), key.name()),
            Change::CrGone { namespace, pod, vm } => {
                let mut woken = of_pod(cache, namespace, pod);
                if let Some(vm) = vm {
                    woken.extend(waiting_on_vm(cache, vm));
                }
                woken
            }
            Change::VmReleased(vm) => waiting_on_vm(cache, vm),
            Change::Arrival(_) => Vec::new(),
        }
    }
}

fn of_pod(cache: &SharedCache, ns: &str, pod: &str) -> Vec<Trigger> {
    cache
        .cr_names_for_pod(ns, pod)
        .into_iter()
        .map(|name| ObjectRef::new(&name).within(ns))
        .collect()
}

/// The CRs of every pod naming `vm`: the ones a holder of `vm` may have kept waiting.
fn waiting_on_vm(cache: &SharedCache, vm: &str) -> Vec<Trigger> {
    cache
        .pods_naming(vm)
        .iter()
        .flat_map(|(ns, pod)| of_pod(cache, ns, pod))
        .collect()
}
