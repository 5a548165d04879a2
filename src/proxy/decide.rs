//! What to do with a request for one pod, from the pod and its CocoonHibernation as the
//! cache shows them (Q2, Q3, Q5, Q6). Pure.

use crate::api::conditions::{REASON_CONFLICT, REASON_VM_CHANGED};
use crate::api::{CocoonHibernation, Desire, Phase};
use std::net::IpAddr;

/// The pod as the proxy reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodFacts {
    pub uid: String,
    /// Its address; `None` until reported.
    pub ip: Option<IpAddr>,
    /// Selected by the route's idle policy.
    pub selected: bool,
    /// Awake: a VM, no hibernate asked, Ready.
    pub awake: bool,
}

/// The pod's CocoonHibernation as the proxy reads it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrFacts {
    pub name: String,
    pub resource_version: Option<String>,
    pub desire: Desire,
    pub phase: Option<Phase>,
    /// The last failure's reason and message, when the phase is Failed.
    pub failure: Option<(String, String)>,
}

impl CrFacts {
    pub fn of(cr: &CocoonHibernation) -> Self {
        let failure = cr
            .status
            .as_ref()
            .and_then(|s| s.last_failure.as_ref())
            .map(|f| (f.reason.clone(), f.message.clone()));
        Self {
            name: cr.metadata.name.clone().unwrap_or_default(),
            resource_version: cr.metadata.resource_version.clone(),
            desire: cr.spec.desire,
            phase: cr.phase(),
            failure,
        }
    }
}

/// Why a request is answered without being forwarded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No such pod among the policy's (or a namespace not served): 404, naming nothing.
    NoPod,
    /// The pod has no CocoonHibernation yet (its policy creates one): nothing to wake.
    NotManaged,
    /// Q5: Failed with Conflict or VMChanged: never woken on request.
    Conflict(String),
    /// Q6: the wake ended Failed: its reason and message.
    WakeFailed(String, String),
}

/// The decision for one look at the cache.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Q3: straight to this address, fenced by the pod's uid.
    Forward {
        ip: IpAddr,
        uid: String,
    },
    /// Q2: flip the CR's desire to Wake (`resource_version` fences the write).
    Wake {
        cr: String,
        resource_version: Option<String>,
    },
    /// A wake is under way: hold.
    Wait,
    Refuse(Refusal),
}

/// The decision for a request to `pod`, whose CR is `cr`.
pub fn decide(pod: Option<&PodFacts>, cr: Option<&CrFacts>) -> Verdict {
    let Some(pod) = pod.filter(|p| p.selected) else {
        return Verdict::Refuse(Refusal::NoPod);
    };
    if pod.awake
        && let Some(ip) = pod.ip
    {
        return Verdict::Forward {
            ip,
            uid: pod.uid.clone(),
        };
    }
    let Some(cr) = cr else {
        return Verdict::Refuse(Refusal::NotManaged);
    };
    let failure = || cr.failure.clone().unwrap_or_default();
    if cr.phase == Some(Phase::Failed) {
        let (reason, message) = failure();
        if reason == REASON_CONFLICT || reason == REASON_VM_CHANGED {
            return Verdict::Refuse(Refusal::Conflict(reason));
        }
        if cr.desire == Desire::Wake {
            return Verdict::Refuse(Refusal::WakeFailed(reason, message));
        }
    }
    match cr.desire {
        Desire::Hibernate => Verdict::Wake {
            cr: cr.name.clone(),
            resource_version: cr.resource_version.clone(),
        },
        // Waking, or Active while the pod's readiness and address catch up.
        Desire::Wake => Verdict::Wait,
        Desire::Unknown => Verdict::Refuse(Refusal::NotManaged),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rstest::rstest;

    const IP: &str = "127.64.0.9";

    fn pod(selected: bool, awake: bool, ip: bool) -> PodFacts {
        PodFacts {
            uid: "u1".into(),
            ip: ip.then(|| IP.parse().unwrap()),
            selected,
            awake,
        }
    }

    fn cr(desire: Desire, phase: Option<Phase>, reason: Option<&str>) -> CrFacts {
        CrFacts {
            name: "web-0".into(),
            resource_version: Some("7".into()),
            desire,
            phase,
            failure: reason.map(|r| (r.to_owned(), "why".to_owned())),
        }
    }

    fn forward() -> Verdict {
        Verdict::Forward {
            ip: IP.parse().unwrap(),
            uid: "u1".into(),
        }
    }

    fn wake() -> Verdict {
        Verdict::Wake {
            cr: "web-0".into(),
            resource_version: Some("7".into()),
        }
    }

    /// SPEC Q2, Q3, Q5, Q6: the decision table.
    #[rstest]
    #[case::q3_awake_pod_goes_straight_to_its_address(
        Some(pod(true, true, true)),
        Some(cr(Desire::Wake, Some(Phase::Active), None)),
        forward()
    )]
    #[case::q3_awake_without_cr_still_forwards(Some(pod(true, true, true)), None, forward())]
    #[case::q3_awake_without_address_waits(
        Some(pod(true, true, false)),
        Some(cr(Desire::Wake, Some(Phase::Active), None)),
        Verdict::Wait
    )]
    #[case::q5_missing_pod(
        None,
        Some(cr(Desire::Hibernate, Some(Phase::Hibernated), None)),
        Verdict::Refuse(Refusal::NoPod)
    )]
    #[case::q5_pod_not_selected_by_the_policy(
        Some(pod(false, true, true)),
        None,
        Verdict::Refuse(Refusal::NoPod)
    )]
    #[case::q2_hibernated_flips_desire(
        Some(pod(true, false, true)),
        Some(cr(Desire::Hibernate, Some(Phase::Hibernated), None)),
        wake()
    )]
    #[case::q2_hibernating_flips_desire(
        Some(pod(true, false, true)),
        Some(cr(Desire::Hibernate, Some(Phase::Hibernating), None)),
        wake()
    )]
    #[case::q2_waking_holds(
        Some(pod(true, false, false)),
        Some(cr(Desire::Wake, Some(Phase::Waking), None)),
        Verdict::Wait
    )]
    #[case::q2_no_cr_is_not_woken(
        Some(pod(true, false, false)),
        None,
        Verdict::Refuse(Refusal::NotManaged)
    )]
    #[case::q5_conflict_never_wakes(Some(pod(true, false, false)), Some(cr(Desire::Hibernate, Some(Phase::Failed), Some("Conflict"))), Verdict::Refuse(Refusal::Conflict("Conflict".into())))]
    #[case::q5_vm_changed_never_wakes(Some(pod(true, false, false)), Some(cr(Desire::Hibernate, Some(Phase::Failed), Some("VMChanged"))), Verdict::Refuse(Refusal::Conflict("VMChanged".into())))]
    #[case::q6_failed_wake_answers_its_reason(Some(pod(true, false, false)), Some(cr(Desire::Wake, Some(Phase::Failed), Some("WakeTimedOut"))), Verdict::Refuse(Refusal::WakeFailed("WakeTimedOut".into(), "why".into())))]
    #[case::q2_failed_hibernate_is_woken(
        Some(pod(true, false, false)),
        Some(cr(Desire::Hibernate, Some(Phase::Failed), Some("HibernateTimedOut"))),
        wake()
    )]
    fn q2_q3_q5_q6_decide(
        #[case] pod: Option<PodFacts>,
        #[case] cr: Option<CrFacts>,
        #[case] want: Verdict,
    ) {
        assert_eq!(decide(pod.as_ref(), cr.as_ref()), want);
    }
}
