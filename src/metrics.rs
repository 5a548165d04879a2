//! Prometheus metrics (O1). Every label is a small fixed set: never an object name.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use std::fmt::Write as _;
use std::sync::Arc;

// The plan's own types are the labels: one Transition, no mapping between two. They live
// in cocoon-core, which knows no metrics crate, so the labels wrap them (`Label`).
pub use crate::controller::plan::{Ending, Transition};
use crate::registry::RegistryObserver;

/// A plan type as a label value, by its own `as_str`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct Label<T>(pub T);

impl EncodeLabelValue for Label<Transition> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0.as_str())
    }
}

impl EncodeLabelValue for Label<Ending> {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
        encoder.write_str(self.0.as_str())
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub transition: Label<Transition>,
    pub result: Label<Ending>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReactionLabels {
    pub transition: Label<Transition>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseGaugeLabels {
    pub phase: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ErrorLabels {
    pub error: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeferralLabels {
    pub reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct AdmissionLabels {
    pub operation: &'static str,
    pub result: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RegistryLabels {
    pub operation: &'static str,
    pub outcome: &'static str,
}

/// All metric families, registered once under the `cocoon_hibernation` prefix.
#[derive(Clone)]
pub struct Metrics {
    pub reconcile_passes: Counter,
    pub reconcile_errors: Family<ErrorLabels, Counter>,
    /// Passes that stopped early to look again soon: the cache had not yet seen our own
    /// pod write (`own_pod_write`) or the CR's latest version (`stale_view`), or every
    /// registry slot stayed busy.
    pub pass_deferrals: Family<DeferralLabels, Counter>,
    pub phase_duration: Family<PhaseLabels, Histogram>,
    pub admission_decisions: Family<AdmissionLabels, Counter>,
    pub registry_calls: Family<RegistryLabels, Counter>,
    /// Tag deletes left undone because another tag shares the digest.
    pub snapshot_tags_kept: Counter,
    /// 1 while this replica holds the lease and reconciles.
    pub leader: Gauge,
    /// S5: woken CRs whose tag delete is still owed (failed, refused or kept).
    pub snapshot_deletes_owed: Gauge,
    /// CRs in the cache by phase; every replica reports it (alerts take the max).
    pub crs: Family<PhaseGaugeLabels, Gauge>,
    /// CRs in Hibernating or Waking past their timeout plus a pass: the controller is not
    /// acting on them.
    pub crs_overdue: Gauge,
    /// From the pod change that completed a transition (vk's write, as the watch delivered
    /// it) to the CR's terminal status write.
    pub reaction_seconds: Family<ReactionLabels, Histogram>,
    /// K8: boundaries schedules applied, by the desire they set.
    pub schedule_boundaries: Family<ScheduleLabels, Counter>,
    /// K8: CR writes by schedules, by kind (create, flip, mark, release).
    pub schedule_writes: Family<ScheduleWriteLabels, Counter>,
    /// K8: pods whose manual override schedules are keeping now, over all schedules.
    pub schedule_overrides: Gauge,
    /// I6: idle hibernates by how the fenced decision ended (hibernated, fenced_out: a
    /// report landed between the read and the take, cr_changed: the CR moved on).
    pub idle_decisions: Family<IdleDecisionLabels, Counter>,
    /// I6: writes by idle policies, by kind (lease_create, cr_create, take, flip, release).
    pub idle_writes: Family<IdleWriteLabels, Counter>,
    /// S10: 1 while another install's owner marker is under this install's registry base.
    pub registry_base_shared: Gauge,
    registry: Arc<Registry>,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScheduleLabels {
    pub desire: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScheduleWriteLabels {
    pub kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IdleDecisionLabels {
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IdleWriteLabels {
    pub kind: &'static str,
}

/// Opaque: the families would print every series.
impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics").finish_non_exhaustive()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("cocoon_hibernation");
        let reconcile_passes = Counter::default();
        let reconcile_errors = Family::<ErrorLabels, Counter>::default();
        let pass_deferrals = Family::<DeferralLabels, Counter>::default();
        let phase_duration = Family::<PhaseLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([1.0, 5.0, 15.0, 30.0, 60.0, 120.0, 180.0, 300.0, 600.0])
        });
        let admission_decisions = Family::<AdmissionLabels, Counter>::default();
        let registry_calls = Family::<RegistryLabels, Counter>::default();
        let snapshot_tags_kept = Counter::default();
        let leader = Gauge::default();
        let snapshot_deletes_owed = Gauge::default();
        let crs = Family::<PhaseGaugeLabels, Gauge>::default();
        let crs_overdue = Gauge::default();
        let reaction_seconds = Family::<ReactionLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0])
        });
        registry.register(
            "crs",
            "CocoonHibernations in this replica's cache, by phase",
            crs.clone(),
        );
        registry.register(
            "crs_overdue",
            "CocoonHibernations in Hibernating or Waking past their timeout",
            crs_overdue.clone(),
        );
        registry.register(
            "reaction_seconds",
            "Time from the pod change that completed a transition to the terminal status write",
            reaction_seconds.clone(),
        );
        registry.register(
            "snapshot_deletes_owed",
            "CocoonHibernations whose snapshot tag delete is still owed after a wake",
            snapshot_deletes_owed.clone(),
        );
        registry.register(
            "reconcile_passes",
            "Reconcile passes run",
            reconcile_passes.clone(),
        );
        registry.register(
            "pass_deferrals",
            "Reconcile passes deferred to look again soon, by reason",
            pass_deferrals.clone(),
        );
        registry.register(
            "reconcile_errors",
            "Reconcile passes that returned an error",
            reconcile_errors.clone(),
        );
        registry.register(
            "phase_duration_seconds",
            "Time from entering Hibernating or Waking to its end",
            phase_duration.clone(),
        );
        registry.register(
            "admission_decisions",
            "Admission reviews answered",
            admission_decisions.clone(),
        );
        registry.register(
            "registry_calls",
            "OCI registry calls",
            registry_calls.clone(),
        );
        registry.register(
            "snapshot_tags_kept",
            "Snapshot tags not deleted because another tag shares their manifest digest",
            snapshot_tags_kept.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the leader lease",
            leader.clone(),
        );
        let schedule_boundaries = Family::<ScheduleLabels, Counter>::default();
        let schedule_writes = Family::<ScheduleWriteLabels, Counter>::default();
        let schedule_overrides = Gauge::default();
        registry.register(
            "schedule_boundaries_applied",
            "Schedule boundaries applied, by the desire they set",
            schedule_boundaries.clone(),
        );
        registry.register(
            "schedule_writes",
            "CocoonHibernation writes by schedules, by kind",
            schedule_writes.clone(),
        );
        registry.register(
            "schedule_overrides",
            "Pods whose manual override the schedules keep now",
            schedule_overrides.clone(),
        );
        let idle_decisions = Family::<IdleDecisionLabels, Counter>::default();
        let idle_writes = Family::<IdleWriteLabels, Counter>::default();
        registry.register(
            "idle_decisions",
            "Idle hibernates decided, by how the fenced decision ended",
            idle_decisions.clone(),
        );
        registry.register(
            "idle_writes",
            "Writes by idle policies, by kind",
            idle_writes.clone(),
        );
        let registry_base_shared = Gauge::default();
        registry.register(
            "registry_base_shared",
            "1 while another install's owner marker is under this install's registry base",
            registry_base_shared.clone(),
        );
        Self {
            idle_decisions,
            idle_writes,
            registry_base_shared,
            schedule_boundaries,
            schedule_writes,
            schedule_overrides,
            reconcile_passes,
            pass_deferrals,
            reconcile_errors,
            phase_duration,
            admission_decisions,
            registry_calls,
            snapshot_tags_kept,
            leader,
            snapshot_deletes_owed,
            crs,
            crs_overdue,
            reaction_seconds,
            registry: Arc::new(registry),
        }
    }

    pub fn deferral(&self, reason: &'static str) {
        self.pass_deferrals
            .get_or_create(&DeferralLabels { reason })
            .inc();
    }

    pub fn registry_call(&self, operation: &'static str, outcome: &'static str) {
        self.registry_calls
            .get_or_create(&RegistryLabels { operation, outcome })
            .inc();
    }

    pub fn admission(&self, operation: &'static str, result: &'static str) {
        self.admission_decisions
            .get_or_create(&AdmissionLabels { operation, result })
            .inc();
    }

    pub fn phase_done(&self, transition: Transition, result: Ending, seconds: f64) {
        self.phase_duration
            .get_or_create(&PhaseLabels {
                transition: Label(transition),
                result: Label(result),
            })
            .observe(seconds);
    }

    pub fn reaction(&self, transition: Transition, seconds: f64) {
        self.reaction_seconds
            .get_or_create(&ReactionLabels {
                transition: Label(transition),
            })
            .observe(seconds);
    }

    /// I6: one idle hibernate decided, by outcome.
    pub fn idle_decision(&self, outcome: &'static str) {
        self.idle_decisions
            .get_or_create(&IdleDecisionLabels { outcome })
            .inc();
    }

    /// I6: one write an idle policy made, by kind.
    pub fn idle_write(&self, kind: &'static str) {
        self.idle_writes
            .get_or_create(&IdleWriteLabels { kind })
            .inc();
    }

    /// OpenMetrics text exposition.
    pub fn encode(&self) -> Result<String, std::fmt::Error> {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The operator's registry client reports here; the plugin's reports nowhere.
impl RegistryObserver for Metrics {
    fn call(&self, operation: &'static str, outcome: &'static str) {
        self.registry_call(operation, outcome);
    }

    fn tag_kept(&self) {
        self.snapshot_tags_kept.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC O1.
    #[test]
    fn o1_families_are_exposed_with_low_cardinality_labels() {
        let m = Metrics::new();
        m.reconcile_passes.inc();
        m.registry_call("probe", "present");
        m.admission("CREATE", "denied");
        m.phase_done(Transition::Hibernate, Ending::Done, 3.0);
        let text = m.encode().unwrap();
        assert!(text.contains("cocoon_hibernation_reconcile_passes_total 1"));
        assert!(text.contains(
            r#"cocoon_hibernation_registry_calls_total{operation="probe",outcome="present"} 1"#
        ));
        assert!(text.contains(
            r#"cocoon_hibernation_admission_decisions_total{operation="CREATE",result="denied"} 1"#
        ));
        assert!(text.contains(r#"cocoon_hibernation_phase_duration_seconds_count{transition="hibernate",result="ok"} 1"#));
    }

    /// SPEC I6: idle decisions by outcome and idle writes by kind, labels from a fixed set.
    #[test]
    fn i6_idle_families_are_exposed() {
        let m = Metrics::new();
        m.idle_decision("fenced_out");
        m.idle_write("lease_create");
        m.idle_write("lease_create");
        let text = m.encode().unwrap();
        assert!(
            text.contains(r#"cocoon_hibernation_idle_decisions_total{outcome="fenced_out"} 1"#),
            "{text}"
        );
        assert!(
            text.contains(r#"cocoon_hibernation_idle_writes_total{kind="lease_create"} 2"#),
            "{text}"
        );
    }
}
