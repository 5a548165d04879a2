//! The `CocoonHibernationSchedule` API (K1, K8) and the labels and annotations it writes
//! on the CRs it drives; cocoon-core reads a spec into a calendar.

use crate::{Condition, Time};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label on every CR a schedule drives: the schedule's name.
pub const SCHEDULE_LABEL: &str = "cocoonset.cocoonstack.io/schedule";
/// The uid of the schedule that created the CR: a CR without ours is never adopted (K4).
pub const SCHEDULE_UID: &str = "cocoonset.cocoonstack.io/schedule-uid";
/// The desire the schedule last wrote (K5).
pub const SCHEDULE_DESIRE: &str = "cocoonset.cocoonstack.io/schedule-desire";
/// The boundary (RFC 3339 instant) that write was for (K2, K5).
pub const SCHEDULE_BOUNDARY: &str = "cocoonset.cocoonstack.io/schedule-boundary";
/// A manual override's end (RFC 3339), set by `kubectl cocoon wake --until` (K5).
pub const OVERRIDE_UNTIL: &str = "cocoonset.cocoonstack.io/override-until";

// The schedule's Ready reasons (K8).
/// `spec.suspend` is set: nothing is written.
pub const REASON_SUSPENDED: &str = "Suspended";
/// Some writes wait for a transition to end or for `maxInFlight`.
pub const REASON_APPLYING: &str = "Applying";
/// Every managed pod has the calendar's desire.
pub const REASON_APPLIED: &str = "Applied";
/// The spec is not a calendar (admission was bypassed or the webhook was down).
pub const REASON_INVALID_SPEC: &str = "InvalidSpec";

/// Wakes and hibernates the selected pods on a weekly calendar, through their
/// CocoonHibernations.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cocoonset.cocoonstack.io",
    version = "v1alpha1",
    kind = "CocoonHibernationSchedule",
    plural = "cocoonhibernationschedules",
    shortname = "chs",
    category = "cocoon",
    namespaced,
    status = "CocoonHibernationScheduleStatus",
    printcolumn = r#"{"name":"Zone","type":"string","jsonPath":".spec.timeZone"}"#,
    printcolumn = r#"{"name":"Window","type":"string","jsonPath":".status.window"}"#,
    printcolumn = r#"{"name":"Next","type":"string","jsonPath":".status.nextBoundary"}"#,
    printcolumn = r#"{"name":"Managed","type":"integer","jsonPath":".status.managed"}"#,
    printcolumn = r#"{"name":"Overridden","type":"integer","jsonPath":".status.overridden"}"#,
    printcolumn = r#"{"name":"Conflicting","type":"integer","jsonPath":".status.conflicting"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CocoonHibernationScheduleSpec {
    /// Pods in this namespace, naming a VM, that the schedule drives.
    pub selector: LabelSelector,
    /// IANA time zone of the windows, such as `Europe/London`; checked at admission.
    #[schemars(length(min = 1, max = 64))]
    pub time_zone: String,
    /// When pods should be awake (their union); outside every window they hibernate.
    /// Empty only with `alwaysAsleep: true`.
    #[schemars(length(max = 64))]
    pub awake: Vec<AwakeWindow>,
    /// Keep the selected pods hibernated for ever: the explicit consent an empty `awake`
    /// needs (K9); refused with any window.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub always_asleep: bool,
    /// Start waking this long before a window opens, as a duration (0s to 24h).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    #[x_kube(validation = Rule::new("duration(self) <= duration('24h')").message("must be at most 24h"))]
    pub wake_lead: Option<String>,
    /// At most this many of the schedule's CocoonHibernations hibernating or waking at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub max_in_flight: Option<u32>,
    /// Pause the automation; boundaries passed meanwhile are caught up on resume.
    #[serde(default)]
    pub suspend: bool,
    /// What becomes of the CocoonHibernations the schedule made when it is deleted.
    #[serde(default)]
    pub on_delete: OnDelete,
}

/// One awake window in civil time.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct AwakeWindow {
    /// The days the window opens on; empty means every day.
    #[serde(default)]
    pub days: Vec<Day>,
    /// `HH:MM`, when the window opens.
    #[schemars(regex(pattern = r"^([01][0-9]|2[0-3]):[0-5][0-9]$"))]
    pub from: String,
    /// `HH:MM` or `24:00`; before `from` (or equal), the window spans midnight.
    #[schemars(regex(pattern = r"^(([01][0-9]|2[0-3]):[0-5][0-9]|24:00)$"))]
    pub to: String,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
pub enum Day {
    Mon,
    Tue,
    Wed,
    Thu,
    Fri,
    Sat,
    Sun,
}

#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OnDelete {
    /// Release the CRs as they are.
    #[default]
    Orphan,
    /// Wake each CR, then release it.
    Wake,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CocoonHibernationScheduleStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Awake` or `Asleep`: what the calendar asks for now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<String>,
    /// The next boundary; unset when the calendar never changes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_boundary: Option<Time>,
    /// The latest boundary applied: never applied twice (K2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_boundary: Option<Time>,
    /// Selected pods whose CR the schedule drives.
    #[serde(default)]
    pub managed: u32,
    /// Selected pods whose CR a person changed since the last boundary, or that the
    /// schedule did not create.
    #[serde(default)]
    pub overridden: u32,
    /// Selected pods an older schedule drives (K6).
    #[serde(default)]
    pub conflicting: u32,
    /// Some of the conflicting pods, with the schedule that drives each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conflicts: Vec<String>,
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// A schedule that keeps the pods it selects asleep, in UTC: for tests whose subject is
/// not the calendar (public so the operator's tests, in another crate, share it).
impl CocoonHibernationScheduleSpec {
    pub fn always_asleep(selector: LabelSelector) -> Self {
        CocoonHibernationScheduleSpec {
            selector,
            time_zone: "UTC".into(),
            awake: Vec::new(),
            always_asleep: true,
            wake_lead: None,
            max_in_flight: None,
            suspend: false,
            on_delete: OnDelete::default(),
        }
    }
}
