//! cocoon-api: the contracts every part of cocoon-hibernation shares. The
//! `CocoonHibernation` API (SPEC A1–A3), the pod annotation contract (A4), the schedule's
//! CRD ([`schedule`], K1), condition reasons, the activity record (I2) and the duration
//! grammar of flags and CRD fields ([`flags`]). Types only: kube's `derive`, no client.
#![forbid(unsafe_code)]

pub mod activity;
pub mod annotations;
#[cfg(feature = "client")]
pub mod cluster;
pub mod conditions;
pub mod flags;
pub mod idle;
pub mod intern;
pub mod pod;
pub mod schedule;
pub mod tenancy;

use kube::{CustomResource, CustomResourceExt, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

pub use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// Finalizer that guards snapshot-tag cleanup (R1, G1).
pub const FINALIZER: &str = "cocoonhibernation.cocoonset.cocoonstack.io/finalizer";

/// A request to hibernate or wake one VM-backed pod.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cocoonset.cocoonstack.io",
    version = "v1",
    kind = "CocoonHibernation",
    plural = "cocoonhibernations",
    shortname = "ch",
    category = "cocoon",
    namespaced,
    status = "CocoonHibernationStatus",
    printcolumn = r#"{"name":"Pod","type":"string","jsonPath":".spec.podRef.name"}"#,
    printcolumn = r#"{"name":"Desire","type":"string","jsonPath":".spec.desire"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Progressing\")].reason"}"#,
    printcolumn = r#"{"name":"VM","type":"string","jsonPath":".status.vmName"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Digest","type":"string","priority":1,"jsonPath":".status.snapshot.digest"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CocoonHibernationSpec {
    /// The pod, in this namespace, whose VM is hibernated or woken. Immutable.
    #[x_kube(validation = Rule::new("self == oldSelf").message("spec.podRef is immutable"))]
    pub pod_ref: PodRef,
    /// What the user wants: `Hibernate` or `Wake`.
    pub desire: Desire,
    /// How long a hibernate may take before the CR fails, as a Kubernetes duration such
    /// as `90s`, `5m` or `1h30m` (1s to 24h). Unset: the controller's `--hibernate-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('24h')").message("must be between 1s and 24h"))]
    pub hibernate_timeout: Option<String>,
    /// Like `hibernateTimeout`, for a wake. Unset: the controller's `--wake-timeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1s') && duration(self) <= duration('24h')").message("must be between 1s and 24h"))]
    pub wake_timeout: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct PodRef {
    #[schemars(length(min = 1))]
    pub name: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Desire {
    Hibernate,
    Wake,
    /// A value the CRD schema should have refused (R3); never offered in the schema.
    #[serde(other)]
    #[schemars(skip)]
    Unknown,
}

impl Desire {
    /// A desire as a policy's mark on a CR spells it (`Hibernate`, `Wake`); anything else
    /// is `Unknown`.
    pub fn from_mark(raw: &str) -> Self {
        match raw {
            "Hibernate" => Self::Hibernate,
            "Wake" => Self::Wake,
            _ => Self::Unknown,
        }
    }
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Phase {
    Pending,
    Hibernating,
    Hibernated,
    Waking,
    Active,
    Failed,
}

impl Phase {
    /// Every phase, in the order a round goes through them (Failed last).
    pub const ALL: [Phase; 6] = [
        Phase::Pending,
        Phase::Hibernating,
        Phase::Hibernated,
        Phase::Waking,
        Phase::Active,
        Phase::Failed,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "Pending",
            Phase::Hibernating => "Hibernating",
            Phase::Hibernated => "Hibernated",
            Phase::Waking => "Waking",
            Phase::Active => "Active",
            Phase::Failed => "Failed",
        }
    }
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CocoonHibernationStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Phase")]
    pub phase: Option<Phase>,
    /// VM the CR acts on; the snapshot repository. Kept once set, for cleanup (G1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_name: Option<String>,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The snapshot the last completed hibernate stored; cleared once its tag is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<SnapshotStatus>,
    /// How many times the current transition was started for the current spec: 1, then
    /// one more for each retry out of `Failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<u32>,
    /// When the CR last reached `Hibernated`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hibernated_at: Option<Time>,
    /// When the CR last reached `Active`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub woken_at: Option<Time>,
    /// The last failure, kept after a retry so one that flashed past stays visible.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<Failure>,
    /// W2: the VMID the pod showed when this round's hibernate was requested. It proves no
    /// wake: vk may still be pushing or removing that VM. Dropped once vk is seen clearing
    /// the VMID, after which any VMID it writes is a fresh one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pre_hibernate_vm_id: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// Manifest digest of `<vm>:hibernate`, from the probe that completed the hibernate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Failure {
    /// A CamelCase reason such as `HibernateTimedOut`, `WakeTimedOut` or `Conflict`.
    pub reason: String,
    pub message: String,
    pub time: Time,
}

impl CocoonHibernation {
    pub fn phase(&self) -> Option<Phase> {
        self.status.as_ref().and_then(|s| s.phase)
    }

    /// Failed because another CR drives the same pod (S2): policies leave such a CR alone.
    pub fn failed_by_conflict(&self) -> bool {
        self.phase() == Some(Phase::Failed)
            && self.status.as_ref().is_some_and(|s| {
                s.conditions
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.reason == conditions::REASON_CONFLICT)
            })
    }

    pub fn vm_name(&self) -> Option<&str> {
        self.status.as_ref().and_then(|s| s.vm_name.as_deref())
    }

    /// W2: the VMID that does not prove a wake, if one is recorded.
    pub fn pre_hibernate_vm_id(&self) -> Option<&str> {
        self.status
            .as_ref()
            .and_then(|s| s.pre_hibernate_vm_id.as_deref())
    }

    pub fn is_deleting(&self) -> bool {
        self.metadata.deletion_timestamp.is_some()
    }

    pub fn has_finalizer(&self) -> bool {
        self.metadata
            .finalizers
            .as_ref()
            .is_some_and(|f| f.iter().any(|x| x == FINALIZER))
    }
}

/// A spec timeout such as `90s`, `5m` or `1h30m` (the CRD's pattern: digits and a unit,
/// repeated; humantime reads that form).
pub fn parse_duration(raw: &str) -> Result<std::time::Duration, String> {
    humantime::parse_duration(raw).map_err(|e| e.to_string())
}

/// The CRDs (CocoonHibernation, CocoonHibernationSchedule K1, CocoonIdlePolicy I1) as
/// one YAML stream, exactly as `cocoon-hibernation crd` prints it.
pub fn crd_yaml() -> Result<String, serde_norway::Error> {
    let schedule = crate::schedule::CocoonHibernationSchedule::crd();
    let idle = crate::idle::CocoonIdlePolicy::crd();
    Ok(format!(
        "{}---\n{}---\n{}",
        serde_norway::to_string(&CocoonHibernation::crd())?,
        serde_norway::to_string(&schedule)?,
        serde_norway::to_string(&idle)?
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd_json() -> serde_json::Value {
        serde_json::to_value(CocoonHibernation::crd()).unwrap()
    }

    /// SPEC A1.
    #[test]
    fn a1_names_short_name_category_and_scope() {
        let crd = crd_json();
        assert_eq!(
            crd["metadata"]["name"],
            "cocoonhibernations.cocoonset.cocoonstack.io"
        );
        assert_eq!(crd["spec"]["scope"], "Namespaced");
        assert_eq!(crd["spec"]["names"]["kind"], "CocoonHibernation");
        assert_eq!(crd["spec"]["names"]["plural"], "cocoonhibernations");
        assert_eq!(
            crd["spec"]["names"]["shortNames"],
            serde_json::json!(["ch"])
        );
        assert_eq!(
            crd["spec"]["names"]["categories"],
            serde_json::json!(["cocoon"])
        );
    }

    /// SPEC A1.
    #[test]
    fn a1_printer_columns() {
        let crd = crd_json();
        let cols = crd["spec"]["versions"][0]["additionalPrinterColumns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["name"].as_str().unwrap().to_owned(),
                    c["jsonPath"].as_str().unwrap().to_owned(),
                )
            })
            .collect::<Vec<_>>();
        let want = [
            ("Pod", ".spec.podRef.name"),
            ("Desire", ".spec.desire"),
            ("Phase", ".status.phase"),
            (
                "Reason",
                ".status.conditions[?(@.type==\"Progressing\")].reason",
            ),
            ("VM", ".status.vmName"),
            ("Age", ".metadata.creationTimestamp"),
            ("Digest", ".status.snapshot.digest"),
        ];
        assert_eq!(
            cols,
            want.map(|(a, b)| (a.to_owned(), b.to_owned())).to_vec()
        );
    }

    /// SPEC A2.
    #[test]
    fn a2_pod_ref_cel_rule_min_length_and_desire_enum() {
        let crd = crd_json();
        let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
        let pod_ref = &spec["properties"]["podRef"];
        assert_eq!(
            pod_ref["x-kubernetes-validations"][0]["rule"],
            "self == oldSelf"
        );
        assert_eq!(
            pod_ref["x-kubernetes-validations"][0]["message"],
            "spec.podRef is immutable"
        );
        assert_eq!(pod_ref["properties"]["name"]["minLength"], 1);
        assert_eq!(pod_ref["required"], serde_json::json!(["name"]));
        assert_eq!(
            spec["properties"]["desire"]["enum"],
            serde_json::json!(["Hibernate", "Wake"])
        );
        let mut required = spec["required"].as_array().unwrap().clone();
        required.sort_by_key(|v| v.to_string());
        assert_eq!(
            required,
            vec![serde_json::json!("desire"), serde_json::json!("podRef")]
        );
    }

    /// SPEC A3.
    #[test]
    fn a3_status_subresource_phases_and_condition_list_map() {
        let crd = crd_json();
        let version = &crd["spec"]["versions"][0];
        assert!(version["subresources"]["status"].is_object());
        let status = &version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"];
        assert_eq!(
            status["phase"]["enum"],
            serde_json::json!([
                "Pending",
                "Hibernating",
                "Hibernated",
                "Waking",
                "Active",
                "Failed"
            ])
        );
        assert_eq!(status["conditions"]["x-kubernetes-list-type"], "map");
        assert_eq!(
            status["conditions"]["x-kubernetes-list-map-keys"],
            serde_json::json!(["type"])
        );
        assert!(status["vmName"].is_object());
        assert!(status["observedGeneration"].is_object());
    }

    /// SPEC R3.
    #[test]
    fn r3_unknown_desire_decodes_instead_of_failing() {
        let spec: CocoonHibernationSpec = serde_json::from_value(
            serde_json::json!({"podRef": {"name": "p"}, "desire": "Explode"}),
        )
        .unwrap();
        assert_eq!(spec.desire, Desire::Unknown);
    }

    /// K4 I4: a policy's mark reads back the desire it wrote; anything else is unknown.
    #[test]
    fn k4_i4_desire_from_mark() {
        assert_eq!(Desire::from_mark("Hibernate"), Desire::Hibernate);
        assert_eq!(Desire::from_mark("Wake"), Desire::Wake);
        assert_eq!(Desire::from_mark("wake"), Desire::Unknown);
    }

    /// K4 I4: only a Failed CR whose Ready reason is Conflict counts as conflicting.
    #[test]
    fn k4_i4_failed_by_conflict() {
        let cr = |phase: &str, reason: &str| -> CocoonHibernation {
            serde_json::from_value(serde_json::json!({
                "apiVersion": "cocoonset.cocoonstack.io/v1", "kind": "CocoonHibernation",
                "metadata": { "name": "a" },
                "spec": { "podRef": { "name": "a" }, "desire": "Wake" },
                "status": { "phase": phase, "conditions": [{
                    "type": "Ready", "status": "False", "reason": reason, "message": "",
                    "lastTransitionTime": "2026-12-06T00:00:00Z" }] },
            }))
            .unwrap()
        };
        assert!(cr("Failed", "Conflict").failed_by_conflict());
        assert!(!cr("Failed", "WakeTimedOut").failed_by_conflict());
        assert!(!cr("Active", "Conflict").failed_by_conflict());
    }
}
