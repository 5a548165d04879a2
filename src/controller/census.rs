//! What the phase gauges report, from the cache alone: CRs by phase, and those overdue.

use super::plan::{Settings, Transition};
use crate::api::conditions::{self, READY};
use crate::api::{CocoonHibernation, Desire, Phase};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use std::time::Duration;

pub const PHASES: [Phase; 6] = Phase::ALL;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Census {
    /// Counts in the order of [`PHASES`]; CRs with no phase yet count as Pending.
    pub by_phase: [i64; 6],
    /// In Hibernating or Waking longer than their timeout plus one pass: a controller
    /// that works would have failed them by now.
    pub overdue: i64,
    /// S5: settled Wake CRs whose tag delete is still owed (W3). From the cache, so every
    /// replica reports it and it survives a failover.
    pub deletes_owed: i64,
}

pub fn census<'a>(
    crs: impl IntoIterator<Item = &'a CocoonHibernation>,
    now: &Time,
    settings: &Settings,
) -> Census {
    let mut out = Census::default();
    for cr in crs {
        let phase = cr.phase().unwrap_or(Phase::Pending);
        if phase == Phase::Active
            && cr.spec.desire == Desire::Wake
            && !cr.is_deleting()
            && super::plan::owes_tag_delete(cr)
        {
            out.deletes_owed += 1;
        }
        if let Some(i) = PHASES.iter().position(|p| *p == phase) {
            out.by_phase[i] += 1;
        }
        let transition = match phase {
            Phase::Hibernating => Transition::Hibernate,
            Phase::Waking => Transition::Wake,
            _ => continue,
        };
        let since = cr
            .status
            .as_ref()
            .and_then(|s| conditions::find(&s.conditions, READY))
            .map(|c| c.last_transition_time.0);
        let timeout = settings
            .timeout_for(cr, transition)
            .unwrap_or(Duration::ZERO);
        let allowed = timeout.saturating_add(settings.transition_poll);
        let elapsed = since
            .map(|t| now.0.duration_since(t))
            .and_then(|d| Duration::try_from(d).ok());
        if elapsed.is_some_and(|e| e > allowed) {
            out.overdue += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::conditions::Update;
    use crate::api::{CocoonHibernationSpec, CocoonHibernationStatus, Desire, PodRef};

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(1_700_000_000 + secs).unwrap())
    }

    fn cr(phase: Phase, since: i64, timeout: Option<&str>) -> CocoonHibernation {
        let mut cr = CocoonHibernation::new(
            "p",
            CocoonHibernationSpec {
                pod_ref: PodRef { name: "p".into() },
                desire: Desire::Hibernate,
                hibernate_timeout: timeout.map(str::to_owned),
                wake_timeout: None,
            },
        );
        let mut status = CocoonHibernationStatus {
            phase: Some(phase),
            ..Default::default()
        };
        let ready = Update {
            type_: READY,
            status: false,
            reason: "Pending",
            message: "",
            observed_generation: None,
        };
        conditions::upsert(&mut status.conditions, ready, at(since), true);
        cr.status = Some(status);
        cr
    }

    /// O1: the phase gauge and the overdue gauge behind the stuck-CR alert; a CR's own
    /// timeout counts, not only the flag's.
    #[test]
    fn o1_census_counts_phases_and_overdue_transitions() {
        let settings = Settings::default(); // 180 s hibernate, 15 s poll
        let crs = [
            cr(Phase::Hibernating, 0, None),        // 100 s in: fine
            cr(Phase::Hibernating, -200, None),     // 300 s in: overdue
            cr(Phase::Hibernating, 0, Some("30s")), // own 30 s + 15 s poll < 100 s
            cr(Phase::Hibernated, -10_000, None),   // settled: never overdue
            cr(Phase::Failed, 0, None),
        ];
        let c = census(crs.iter(), &at(100), &settings);
        assert_eq!(c.by_phase, [0, 3, 1, 0, 0, 1]);
        assert_eq!(c.overdue, 2);
    }
}
