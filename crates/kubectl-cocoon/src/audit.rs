//! The orphan audit's decisions (pure): which snapshot tags no CocoonHibernation holds,
//! and whether one may still be deleted right now.
//!
//! A CR holds a VM when its `status.vmName` is that VM, or when the pod it targets names
//! that VM (a CR not yet reconciled, or one blocked behind another: it will want the
//! snapshot). Any CR counts, in any namespace, even one being deleted: its own cleanup
//! decides about the tag (G1). A tag whose VM is still named by a pod, with no CR, is
//! listed but never deleted: it may be that VM's only copy.

use super::view::CrView;
use std::collections::{BTreeMap, BTreeSet};

/// A pod and the VM it names (`vm.cocoonstack.io/name`), if any.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodVm {
    pub namespace: String,
    pub name: String,
    pub vm: Option<String>,
}

/// Who holds which VM, from one read of every CR and every pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Claims {
    /// VM → the CRs (`namespace/name`) holding it.
    crs: BTreeMap<String, BTreeSet<String>>,
    /// VM → the pods (`namespace/name`) naming it.
    pods: BTreeMap<String, BTreeSet<String>>,
}

impl Claims {
    pub fn build(crs: &[CrView], pods: &[PodVm]) -> Self {
        let mut claims = Claims::default();
        let pod_vm: BTreeMap<(&str, &str), &str> = pods
            .iter()
            .filter_map(|p| Some(((p.namespace.as_str(), p.name.as_str()), p.vm.as_deref()?)))
            .collect();
        for pod in pods {
            if let Some(vm) = &pod.vm {
                claims
                    .pods
                    .entry(vm.clone())
                    .or_default()
                    .insert(format!("{}/{}", pod.namespace, pod.name));
            }
        }
        for cr in crs {
            let through_pod = pod_vm
                .get(&(cr.namespace.as_str(), cr.pod.as_str()))
                .copied();
            for vm in cr.vm_name.as_deref().into_iter().chain(through_pod) {
                claims
                    .crs
                    .entry(vm.to_string())
                    .or_default()
                    .insert(cr.key());
            }
        }
        claims
    }

    /// The CRs holding `vm`.
    pub fn holders(&self, vm: &str) -> Vec<String> {
        self.crs
            .get(vm)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The pods naming `vm`.
    pub fn pods(&self, vm: &str) -> Vec<String> {
        self.pods
            .get(vm)
            .map(|s| s.iter().cloned().collect())
            .unwrap_or_default()
    }
}

/// A `:hibernate` tag found in the registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    pub vm: String,
    /// `host/prefix/vm:hibernate`.
    pub location: String,
    pub digest: String,
}

/// A tag no CR holds.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Orphan {
    pub tag: Tag,
    /// Pods naming its VM: while there are any, the tag is kept.
    pub pods: Vec<String>,
}

impl Orphan {
    pub fn deletable(&self) -> bool {
        self.pods.is_empty()
    }
}

/// The tags no CR holds, in the order given.
pub fn orphans(tags: Vec<Tag>, claims: &Claims) -> Vec<Orphan> {
    tags.into_iter()
        .filter(|t| claims.holders(&t.vm).is_empty())
        .map(|tag| Orphan {
            pods: claims.pods(&tag.vm),
            tag,
        })
        .collect()
}

/// What a fresh look, just before a delete, says.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Recheck {
    Delete,
    /// A CR holds it now.
    Held(Vec<String>),
    /// A pod names its VM now.
    Named(Vec<String>),
    /// The tag is gone already.
    Gone,
    /// The tag points at another manifest: a new snapshot, not the one listed.
    Moved {
        now: String,
    },
}

/// `digest_now`: what `<vm>:hibernate` resolves to now (None: absent).
pub fn recheck(orphan: &Orphan, claims: &Claims, digest_now: Option<&str>) -> Recheck {
    let vm = &orphan.tag.vm;
    let holders = claims.holders(vm);
    if !holders.is_empty() {
        return Recheck::Held(holders);
    }
    let pods = claims.pods(vm);
    if !pods.is_empty() {
        return Recheck::Named(pods);
    }
    match digest_now {
        None => Recheck::Gone,
        Some(now) if now != orphan.tag.digest => Recheck::Moved {
            now: now.to_string(),
        },
        Some(_) => Recheck::Delete,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn cr(ns: &str, name: &str, pod: &str, vm: Option<&str>) -> CrView {
        CrView::from_json(&json!({
            "metadata": {"namespace": ns, "name": name},
            "spec": {"podRef": {"name": pod}, "desire": "Hibernate"},
            "status": {"vmName": vm}
        }))
    }

    fn pod(ns: &str, name: &str, vm: Option<&str>) -> PodVm {
        PodVm {
            namespace: ns.into(),
            name: name.into(),
            vm: vm.map(str::to_string),
        }
    }

    fn tag(vm: &str) -> Tag {
        Tag {
            vm: vm.into(),
            location: format!("reg/{vm}:hibernate"),
            digest: format!("sha256:{vm}"),
        }
    }

    /// S9: a CR whose pod now names another VM still holds the one in its status: that
    /// tag is never an orphan.
    #[test]
    fn s9_a_tag_named_in_status_is_held_though_the_pod_names_another_vm() {
        let crs = [cr("a", "web-0", "web-0", Some("vm-old"))];
        let pods = [pod("a", "web-0", Some("vm-new"))];
        let claims = Claims::build(&crs, &pods);
        assert_eq!(claims.holders("vm-old"), ["a/web-0"]);
        let found = orphans(vec![tag("vm-old")], &claims);
        assert!(found.is_empty(), "{found:?}");
    }

    /// G1 S2: a CR in any namespace holds a VM by status.vmName, or through its pod
    /// before it has one; only tags nobody holds are orphans.
    #[test]
    fn g1_s2_tags_held_by_any_cr_are_not_orphans() {
        let crs = [
            cr("a", "web-0", "web-0", Some("vm-held")),
            // Never reconciled: no vmName, but its pod names vm-pending.
            cr("b", "db-0", "db-0", None),
        ];
        let pods = [
            pod("b", "db-0", Some("vm-pending")),
            pod("c", "lone", Some("vm-named")),
            pod("c", "plain", None),
        ];
        let claims = Claims::build(&crs, &pods);
        assert_eq!(claims.holders("vm-held"), ["a/web-0"]);
        assert_eq!(claims.holders("vm-pending"), ["b/db-0"]);
        let found = orphans(
            vec![
                tag("vm-held"),
                tag("vm-pending"),
                tag("vm-free"),
                tag("vm-named"),
            ],
            &claims,
        );
        let vms: Vec<&str> = found.iter().map(|o| o.tag.vm.as_str()).collect();
        assert_eq!(vms, ["vm-free", "vm-named"]);
        assert!(found[0].deletable());
        assert_eq!(found[1].pods, ["c/lone"]);
        assert!(
            !found[1].deletable(),
            "a pod still names it: maybe the VM's only copy"
        );
    }

    /// A CR's pod in another namespace with the same name does not hold the VM.
    #[test]
    fn g1_pods_are_matched_in_the_crs_own_namespace() {
        let claims = Claims::build(&[cr("a", "x", "p", None)], &[pod("b", "p", Some("vm-1"))]);
        assert!(claims.holders("vm-1").is_empty());
    }

    /// S1 (for the audit): just before a delete, a CR or pod that appeared, or a tag that
    /// moved or vanished, stops it.
    #[test]
    fn s1_the_recheck_stops_a_delete_that_is_no_longer_safe() {
        let orphan = Orphan {
            tag: tag("vm-1"),
            pods: vec![],
        };
        let empty = Claims::default();
        assert_eq!(
            recheck(&orphan, &empty, Some("sha256:vm-1")),
            Recheck::Delete
        );
        assert_eq!(recheck(&orphan, &empty, None), Recheck::Gone);
        assert_eq!(
            recheck(&orphan, &empty, Some("sha256:new")),
            Recheck::Moved {
                now: "sha256:new".into()
            }
        );
        let held = Claims::build(&[cr("n", "late", "p", Some("vm-1"))], &[]);
        assert_eq!(
            recheck(&orphan, &held, Some("sha256:vm-1")),
            Recheck::Held(vec!["n/late".into()])
        );
        let named = Claims::build(&[], &[pod("n", "p", Some("vm-1"))]);
        assert_eq!(
            recheck(&orphan, &named, Some("sha256:vm-1")),
            Recheck::Named(vec!["n/p".into()])
        );
    }
}
