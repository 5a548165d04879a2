//! What the CRD schema cannot check in a `CocoonIdlePolicy` (I1, Q1–Q5): durations that
//! parse and their bounds, routes that name exactly one pod, unique TCP listen ports and
//! a valid selector. Every reason at once, each naming its field.

use super::spec::{CocoonIdlePolicySpec, HttpRoute};
use crate::api::parse_duration;
use std::collections::HashSet;
use std::time::Duration;

/// I1: the shortest `idleAfter` accepted.
pub const MIN_IDLE_AFTER: Duration = Duration::from_secs(60);
/// I1: `minAwake` when the spec has none.
pub const DEFAULT_MIN_AWAKE: Duration = Duration::from_secs(5 * 60);
/// The stand-in for the pod's name in an HTTP route's host.
pub const POD_PLACEHOLDER: &str = "{pod}";

/// The spec's durations, read once it is valid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    pub idle_after: Duration,
    pub min_awake: Duration,
}

/// The spec as settings, or every reason it is not valid.
pub fn settings(spec: &CocoonIdlePolicySpec) -> Result<Settings, Vec<String>> {
    let mut errors = Vec::new();
    let mut duration = |field: &str, raw: Option<&str>, default: Duration| match raw {
        None => Some(default),
        Some(raw) => parse_duration(raw)
            .map_err(|e| errors.push(format!("spec.{field}: {raw:?} is not a duration: {e}")))
            .ok(),
    };
    let idle_after = duration("idleAfter", Some(&spec.idle_after), MIN_IDLE_AFTER);
    let min_awake = duration("minAwake", spec.min_awake.as_deref(), DEFAULT_MIN_AWAKE);
    let max_wait = spec
        .wake_on_request
        .as_ref()
        .and_then(|w| w.max_wait.as_deref());
    if let Some(Duration::ZERO) = duration("wakeOnRequest.maxWait", max_wait, Duration::MAX) {
        errors.push("spec.wakeOnRequest.maxWait: must be more than 0s".into());
    }
    if idle_after.is_some_and(|d| d < MIN_IDLE_AFTER) {
        errors.push(format!(
            "spec.idleAfter: {:?} is shorter than the minimum, 1m",
            spec.idle_after
        ));
    }
    if let Err(e) = kube::core::Selector::try_from(spec.selector.clone()) {
        errors.push(format!("spec.selector: {e}"));
    }
    if let Some(w) = &spec.wake_on_request {
        for (i, route) in w.http.iter().enumerate() {
            errors.extend(http_route(route).map(|e| format!("spec.wakeOnRequest.http[{i}]: {e}")));
        }
        let mut ports = HashSet::new();
        for (i, route) in w.tcp.iter().enumerate() {
            if !ports.insert(route.listen_port) {
                errors.push(format!(
                    "spec.wakeOnRequest.tcp[{i}].listenPort: {} is used by an earlier route",
                    route.listen_port
                ));
            }
            if route.pod.is_empty() {
                errors.push(format!("spec.wakeOnRequest.tcp[{i}].pod: must name a pod"));
            }
        }
        for (i, path) in w.probe_paths.iter().enumerate() {
            if !path.starts_with('/') {
                errors.push(format!(
                    "spec.wakeOnRequest.probePaths[{i}]: {path:?} must start with /"
                ));
            }
        }
    }
    match (idle_after, min_awake) {
        (Some(idle_after), Some(min_awake)) if errors.is_empty() => Ok(Settings {
            idle_after,
            min_awake,
        }),
        _ => Err(errors),
    }
}

/// A route names its pod one way: a host with one `{pod}`, or a fixed host and `pod`.
fn http_route(route: &HttpRoute) -> Option<String> {
    let placeholders = route.host.matches(POD_PLACEHOLDER).count();
    if route.host.contains(':') {
        return Some(format!("host {:?} must not carry a port", route.host));
    }
    if route
        .path_prefix
        .as_deref()
        .is_some_and(|p| !p.starts_with('/'))
    {
        return Some("pathPrefix must start with /".into());
    }
    match (placeholders, route.pod.as_deref()) {
        (1, None) => None,
        (0, Some(pod)) if !pod.is_empty() => None,
        (0, _) => Some(format!(
            "host {:?} has no {POD_PLACEHOLDER}: set pod to the pod it serves",
            route.host
        )),
        (1, Some(_)) => Some(format!(
            "host {:?} has {POD_PLACEHOLDER} and pod is set too: keep one",
            route.host
        )),
        _ => Some(format!(
            "host {:?} has {POD_PLACEHOLDER} more than once",
            route.host
        )),
    }
}
