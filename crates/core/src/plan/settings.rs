//! The knobs the rules depend on, and the timeout each CR gets from them.

use super::Transition;
use cocoon_api::CocoonHibernation;
use std::time::Duration;

/// Knobs the rules depend on.
#[derive(Clone, Debug)]
pub struct Settings {
    pub hibernate_timeout: Duration,
    pub wake_timeout: Duration,
    /// R2: how often a missing pod or VM name is re-checked.
    pub pending_recheck: Duration,
    /// Longest wait between passes of an in-flight transition; the timeouts need a pass.
    pub transition_poll: Duration,
    /// S2: how often a CR blocked by another CR looks again, besides the events that
    /// usually wake it. Such a pass writes nothing while the conflict lasts.
    pub conflict_recheck: Duration,
    /// C2: registry calls at once; below the worker count so a slow registry never
    /// holds every worker.
    pub registry_slots: usize,
    /// S5: first wait after a tag delete is refused for good; doubles up to 10x.
    pub refused_delete_backoff: Duration,
    /// The namespace the product watches (empty: every namespace); G1's fresh read of the
    /// pods that name a VM covers it.
    pub watch_namespace: String,
    /// `--pod-selector` (empty: every pod). A pod outside it is not in the cache, yet it
    /// is not missing: R2 names the selector, and no G1 delete acts on such a pod.
    pub pod_selector: String,
}

impl Settings {
    /// The CR's own timeout for `transition` (spec.hibernateTimeout / spec.wakeTimeout),
    /// else the controller's default. Err names the field whose value is not a duration.
    pub fn timeout_for(
        &self,
        cr: &CocoonHibernation,
        transition: Transition,
    ) -> Result<Duration, String> {
        let (field, value, default) = match transition {
            Transition::Hibernate => (
                "spec.hibernateTimeout",
                &cr.spec.hibernate_timeout,
                self.hibernate_timeout,
            ),
            Transition::Wake => ("spec.wakeTimeout", &cr.spec.wake_timeout, self.wake_timeout),
        };
        match value {
            None => Ok(default),
            Some(raw) => cocoon_api::parse_duration(raw).map_err(|e| {
                format!("{field} {raw:?} is not a duration such as 90s, 5m or 1h30m: {e}")
            }),
        }
    }
}
impl Default for Settings {
    fn default() -> Self {
        Self {
            hibernate_timeout: Duration::from_secs(180),
            wake_timeout: Duration::from_secs(300),
            pending_recheck: Duration::from_secs(5),
            transition_poll: Duration::from_secs(15),
            conflict_recheck: Duration::from_secs(60),
            registry_slots: 3,
            refused_delete_backoff: Duration::from_secs(60),
            watch_namespace: String::new(),
            pod_selector: String::new(),
        }
    }
}
