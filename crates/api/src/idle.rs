//! The `CocoonIdlePolicy` API (I1, I6) and its wake-on-request settings (Q1–Q5), read by
//! the idle controller and the wake proxy.

use crate::{Condition, Time};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Label on every CR an idle policy created or hibernated: the policy's name.
pub const IDLE_LABEL: &str = "cocoonset.cocoonstack.io/idle-policy";
/// The uid of the idle policy that created or last hibernated the CR (I4).
pub const IDLE_UID: &str = "cocoonset.cocoonstack.io/idle-policy-uid";
/// The desire the idle policy last wrote (I4, like K5); the wake proxy
/// records its `Wake` here too, so a person's later change is told from it.
pub const IDLE_DESIRE: &str = "cocoonset.cocoonstack.io/idle-desire";
/// When it wrote it (RFC 3339): one idle hibernate per pod per `minAwake` (I5).
pub const IDLE_AT: &str = "cocoonset.cocoonstack.io/idle-at";

/// Hibernates the selected pods when nobody has used them for `idleAfter`, through their
/// CocoonHibernations; optionally wakes them on the first request (the wake proxy).
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "cocoonset.cocoonstack.io",
    version = "v1alpha1",
    kind = "CocoonIdlePolicy",
    plural = "cocoonidlepolicies",
    shortname = "cip",
    category = "cocoon",
    namespaced,
    status = "CocoonIdlePolicyStatus",
    printcolumn = r#"{"name":"Idle After","type":"string","jsonPath":".spec.idleAfter"}"#,
    printcolumn = r#"{"name":"Managed","type":"integer","jsonPath":".status.managed"}"#,
    printcolumn = r#"{"name":"Idle","type":"integer","jsonPath":".status.idle"}"#,
    printcolumn = r#"{"name":"Awake","type":"integer","jsonPath":".status.awake"}"#,
    printcolumn = r#"{"name":"Held","type":"integer","jsonPath":".status.heldRequests"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct CocoonIdlePolicySpec {
    /// Pods in this namespace, naming a VM, that the policy puts to sleep when idle.
    pub selector: LabelSelector,
    /// How long without activity before a pod hibernates, as a duration (at least 1m).
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1m')").message("must be at least 1m"))]
    pub idle_after: String,
    /// No idle hibernate sooner than this after a wake (default 5m).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub min_awake: Option<String>,
    /// Pause the policy: nothing is hibernated or woken by it meanwhile.
    #[serde(default)]
    pub suspend: bool,
    /// Waking on the first request through the wake proxy; off when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub wake_on_request: Option<WakeOnRequest>,
}

/// How the wake proxy reaches the selected pods and holds requests while one wakes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WakeOnRequest {
    /// HTTP routes, matched by host (and path prefix).
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub http: Vec<HttpRoute>,
    /// Raw TCP routes (SSH, RDP), matched by the proxy's listening port.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub tcp: Vec<TcpRoute>,
    /// How long a held request waits for the wake before 503 (default 60s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 32), regex(pattern = r"^([0-9]+(ms|s|m|h))+$"))]
    pub max_wait: Option<String>,
    /// Held requests per pod beyond which new ones get 503 at once (default 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 10000))]
    pub max_pending: Option<u32>,
    /// Paths answered with a fixed 200 that never wake a pod nor count as activity (Q5).
    #[serde(default)]
    #[schemars(length(max = 32))]
    pub probe_paths: Vec<String>,
    /// Let a request wake a pod that a schedule keeps asleep (I4); off by default.
    #[serde(default)]
    pub wake_during_scheduled_sleep: bool,
}

/// One HTTP route: requests whose host matches go to the pod's `port`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    /// The request's host (no port). With `{pod}` in it (`{pod}.dev.example.com`), the pod
    /// is the part it stands for; without, `pod` names the pod.
    #[schemars(length(min = 1, max = 253))]
    pub host: String,
    /// Only paths starting with this (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_prefix: Option<String>,
    /// The pod, when `host` has no `{pod}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The pod's port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

/// One TCP route: connections to the proxy's `listenPort` go to the pod's `port`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TcpRoute {
    /// The proxy's port; one route per port across the proxy.
    #[schemars(range(min = 1, max = 65535))]
    pub listen_port: u16,
    pub pod: String,
    /// The pod's port.
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
}

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CocoonIdlePolicyStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Selected pods whose CR the policy drives.
    #[serde(default)]
    pub managed: u32,
    /// Managed pods idle now (hibernated or about to be).
    #[serde(default)]
    pub idle: u32,
    /// Managed pods awake now.
    #[serde(default)]
    pub awake: u32,
    /// Requests the wake proxy holds now for the policy's pods.
    #[serde(default)]
    pub held_requests: u32,
    /// The next instant a managed pod would become idle; the policy's next pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_idle: Option<Time>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}
