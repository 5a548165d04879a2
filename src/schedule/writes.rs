//! The schedule's writes to CocoonHibernations (K4): create, flip, mark, release. Every
//! patch carries the resourceVersion the plan read, so a person's change in between wins
//! (409) and the next pass sees it. Nothing here deletes a CR.

use super::plan::{
    Action, OVERRIDE_UNTIL, SCHEDULE_BOUNDARY, SCHEDULE_DESIRE, SCHEDULE_LABEL, SCHEDULE_UID,
};
use crate::api::{CocoonHibernation, CocoonHibernationSpec, Desire, PodRef};
use jiff::Timestamp;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// Who writes, and for which boundary.
pub struct Writer<'a> {
    pub api: &'a Api<CocoonHibernation>,
    pub schedule: &'a str,
    pub uid: &'a str,
    pub boundary: Timestamp,
}

pub fn desire_str(d: Desire) -> &'static str {
    match d {
        Desire::Hibernate => "Hibernate",
        _ => "Wake",
    }
}

impl Writer<'_> {
    /// `resource_version`: of the CR the plan read (None for a create). `Ok(false)`: a
    /// create found the CR already there, and wrote nothing.
    pub async fn execute(
        &self,
        action: &Action,
        resource_version: Option<String>,
    ) -> Result<bool, kube::Error> {
        match action {
            Action::Create { pod, desire } => self.create(pod, *desire).await,
            Action::Flip { cr, desire } | Action::Mark { cr, desire } => {
                let patch = self.mark_patch(*desire, resource_version);
                self.patch(cr, patch).await.map(|()| true)
            }
            Action::Release { cr, wake } => {
                let patch = release_patch(*wake, resource_version);
                self.patch(cr, patch).await.map(|()| true)
            }
        }
    }

    async fn create(&self, pod: &str, desire: Desire) -> Result<bool, kube::Error> {
        let mut cr = CocoonHibernation::new(
            pod,
            CocoonHibernationSpec {
                pod_ref: PodRef { name: pod.into() },
                desire,
                hibernate_timeout: None,
                wake_timeout: None,
            },
        );
        cr.metadata = ObjectMeta {
            name: Some(pod.into()),
            labels: Some([(SCHEDULE_LABEL.into(), self.schedule.into())].into()),
            annotations: Some(
                self.mark_values(desire)
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v))
                    .collect(),
            ),
            ..ObjectMeta::default()
        };
        match self.api.create(&PostParams::default(), &cr).await {
            // Someone else's CR: the next pass counts it as overridden (never adopted).
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            other => other.map(|_| true),
        }
    }

    async fn patch(&self, cr: &str, patch: Value) -> Result<(), kube::Error> {
        self.api
            .patch(cr, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
    }

    fn mark_values(&self, desire: Desire) -> [(&'static str, String); 3] {
        [
            (SCHEDULE_UID, self.uid.to_owned()),
            (SCHEDULE_DESIRE, desire_str(desire).to_owned()),
            (SCHEDULE_BOUNDARY, self.boundary.to_string()),
        ]
    }

    /// K2 K5: the desire and the mark in one write; an ended `--until` goes with it.
    fn mark_patch(&self, desire: Desire, resource_version: Option<String>) -> Value {
        let mut annotations: serde_json::Map<String, Value> = self
            .mark_values(desire)
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Value::String(v)))
            .collect();
        annotations.insert(OVERRIDE_UNTIL.into(), Value::Null);
        json!({
            "metadata": {
                "resourceVersion": resource_version,
                "labels": { SCHEDULE_LABEL: self.schedule },
                "annotations": annotations,
            },
            "spec": { "desire": desire_str(desire) },
        })
    }
}

/// K4: forget the CR (never delete it); `wake` wakes it in the same write.
pub fn release_patch(wake: bool, resource_version: Option<String>) -> Value {
    let mut patch = json!({
        "metadata": {
            "resourceVersion": resource_version,
            "labels": { SCHEDULE_LABEL: null },
            "annotations": {
                SCHEDULE_UID: null, SCHEDULE_DESIRE: null, SCHEDULE_BOUNDARY: null,
                OVERRIDE_UNTIL: null,
            },
        },
    });
    if wake {
        patch["spec"] = json!({ "desire": "Wake" });
    }
    patch
}

#[cfg(test)]
mod tests {
    use super::*;

    /// K4: a release removes only the schedule's keys; with onDelete: Wake it wakes too.
    #[test]
    fn k4_release_patch_removes_the_mark_and_never_deletes() {
        let p = release_patch(false, Some("7".into()));
        assert_eq!(p["metadata"]["resourceVersion"], "7");
        assert_eq!(p["metadata"]["labels"][SCHEDULE_LABEL], Value::Null);
        assert_eq!(p["metadata"]["annotations"][SCHEDULE_UID], Value::Null);
        assert!(p.get("spec").is_none());
        assert_eq!(release_patch(true, None)["spec"]["desire"], "Wake");
    }
}
