//! The idle policy's writes (I2–I4): activity Leases created, the fence taken, CRs
//! created, hibernated and released. Every patch of an existing object carries the
//! resourceVersion read, so a change in between makes it fail (409) and nothing else is
//! written. Nothing here deletes anything.

use super::plan::{IDLE_AT, IDLE_DESIRE, IDLE_LABEL, IDLE_UID};
use crate::api::activity::{ACTIVITY_FOR, IDLE_DECISION, lease_name};
use crate::api::{CocoonHibernation, CocoonHibernationSpec, Desire, PodRef};
use jiff::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, OwnerReference};
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The holder a Lease the policy creates names.
pub const HOLDER: &str = "cocoon-hibernation";
/// Label values stop at 63 characters; a longer pod name leaves the label empty (the
/// Lease's name is the link, the label only selects the activity Leases).
const MAX_LABEL: usize = 63;

/// I2: the pod's activity Lease, its last activity `now`, owned by the pod so it goes
/// with it.
pub fn lease(pod: &str, pod_uid: &str, now: Timestamp) -> Option<Lease> {
    let label = if pod.len() <= MAX_LABEL { pod } else { "" };
    Some(Lease {
        metadata: ObjectMeta {
            name: Some(lease_name(pod)?),
            labels: Some([(ACTIVITY_FOR.to_owned(), label.to_owned())].into()),
            owner_references: Some(vec![OwnerReference {
                api_version: "v1".into(),
                kind: "Pod".into(),
                name: pod.into(),
                uid: pod_uid.into(),
                ..OwnerReference::default()
            }]),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(HOLDER.into()),
            renew_time: Some(MicroTime(now)),
            ..LeaseSpec::default()
        }),
    })
}

/// I3: the fence. Written on the resourceVersion the decision read, it fails (409) if
/// any report landed since; it leaves `renewTime` alone, so it is not activity itself.
pub fn take_patch(resource_version: &str, now: Timestamp) -> Value {
    json!({
        "metadata": {
            "resourceVersion": resource_version,
            "annotations": { IDLE_DECISION: now.to_string() },
        },
    })
}

/// I4: the desire and our mark in one write, on the CR's version read.
pub fn hibernate_patch(policy: &str, uid: &str, now: Timestamp, resource_version: &str) -> Value {
    json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": { IDLE_LABEL: policy },
            "annotations": {
                IDLE_UID: uid,
                IDLE_DESIRE: "Hibernate",
                IDLE_AT: now.to_string(),
            },
        },
        "spec": { "desire": "Hibernate" },
    })
}

/// I4: forget the CR: our label and mark go, its desire stays.
pub fn release_patch(resource_version: &str) -> Value {
    json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": { IDLE_LABEL: null },
            "annotations": { IDLE_UID: null, IDLE_DESIRE: null, IDLE_AT: null },
        },
    })
}

/// I4: a new CR for a selected pod, awake, marked ours.
pub fn new_cr(pod: &str, policy: &str, uid: &str, now: Timestamp) -> CocoonHibernation {
    let mut cr = CocoonHibernation::new(
        pod,
        CocoonHibernationSpec {
            pod_ref: PodRef { name: pod.into() },
            desire: Desire::Wake,
            hibernate_timeout: None,
            wake_timeout: None,
        },
    );
    cr.metadata.labels = Some([(IDLE_LABEL.to_owned(), policy.to_owned())].into());
    cr.metadata.annotations = Some(
        [
            (IDLE_UID.to_owned(), uid.to_owned()),
            (IDLE_DESIRE.to_owned(), "Wake".to_owned()),
            (IDLE_AT.to_owned(), now.to_string()),
        ]
        .into(),
    );
    cr
}

/// Creates `obj`; `Ok(false)` when it exists already (someone else's: never adopted).
pub async fn create<K>(api: &Api<K>, obj: &K) -> Result<bool, kube::Error>
where
    K: kube::Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.create(&PostParams::default(), obj).await {
        Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
        other => other.map(|_| true),
    }
}

/// A merge patch; its embedded resourceVersion makes it conditional.
pub async fn patch<K>(api: &Api<K>, name: &str, patch: &Value) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> Timestamp {
        "2026-06-10T12:00:00Z".parse().unwrap()
    }

    /// SPEC I3: the take is conditional on the version read and is not activity: it
    /// carries the resourceVersion and touches no field of the Lease's spec.
    #[test]
    fn i3_take_is_conditional_and_not_activity() {
        let p = take_patch("41", at());
        assert_eq!(p["metadata"]["resourceVersion"], "41");
        assert_eq!(
            p["metadata"]["annotations"][IDLE_DECISION],
            "2026-06-10T12:00:00Z"
        );
        assert!(p.get("spec").is_none(), "{p}");
    }

    /// SPEC I4: the flip carries the CR's version and our mark; a release removes only
    /// our keys and never changes the desire.
    #[test]
    fn i4_flip_and_release_patches() {
        let p = hibernate_patch("sleepy", "u-1", at(), "7");
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(p["spec"]["desire"], "Hibernate");
        assert_eq!(p["metadata"]["annotations"][IDLE_UID], "u-1");
        let r = release_patch("8");
        assert_eq!(r["metadata"]["annotations"][IDLE_UID], Value::Null);
        assert!(r.get("spec").is_none());
    }

    /// SPEC I2: a new Lease is named after its pod, owned by it, and starts the count.
    #[test]
    fn i2_new_lease_is_the_pods() {
        let l = lease("web-0", "pod-uid", at()).unwrap();
        assert_eq!(l.metadata.name.as_deref(), Some("cocoon-activity-web-0"));
        assert_eq!(l.metadata.owner_references.unwrap()[0].uid, "pod-uid");
        assert_eq!(l.spec.unwrap().renew_time, Some(MicroTime(at())));
        let long = "p".repeat(100);
        let l = lease(&long, "u", at()).unwrap();
        assert_eq!(l.metadata.labels.unwrap()[ACTIVITY_FOR], "");
    }
}
