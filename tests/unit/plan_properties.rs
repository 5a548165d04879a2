//! Property tests over `plan()` sequences (issue 9): a simulated world (pod, vk-cocoon,
//! registry tag, clock, the CR as the apiserver holds it) steps through time. Each step is
//! either the world moving (vk progresses or fails, a tag appears or goes, the desire
//! flips, the CR is deleted or recreated, the registry fails) or the product running one
//! pass: `plan()`, then its effects carried out the way `reconcile.rs` does (fresh read
//! before a delete, status writes guarded by resourceVersion). The invariants are checked
//! at the moment the product acts, against the world's truth:
//! - S1/W2/W3/G1: no tag delete while a live CR of that VM is `Hibernated`, or
//!   `Hibernating` with vk done; and no wake's delete while the tag is the VM's only copy;
//! - H3: no `Hibernated` without the tag in the registry at that moment;
//! - W2: no `Active` while vk reports `hibernating` or `hibernated`;
//! - the phase graph: no skipped states, a new transition only on its desire (D1);
//! - C3: no status write on a settled CR.
//!
//! The world model is `mod world` below: the one place to adapt when plan()'s inputs or
//! outputs change.

use proptest::prelude::*;

mod world {
    use cocoon_hibernation::api::annotations::PodView;
    use cocoon_hibernation::api::conditions::SNAPSHOT_DELETED;
    use cocoon_hibernation::api::{
        CocoonHibernation, CocoonHibernationSpec, Desire, FINALIZER, Phase, PodRef,
    };
    use cocoon_hibernation::controller::plan::{
        self, Debt, DeleteResult, Ownership, Probe, Settings,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
    use std::time::Duration;

    pub const VM: &str = "vm-a";
    const BASE: i64 = 1_700_000_000;

    /// One step of a run.
    #[derive(Clone, Debug)]
    pub enum Step {
        /// The clock moves on.
        Tick(u16),
        /// vk-cocoon takes one step towards what the annotation asks.
        Vk,
        /// vk-cocoon fails the hibernate in progress (a push that fails): state `failed`,
        /// the VM keeps running. Cleared by the next Vk step that retries.
        VkPushFails,
        /// The CocoonSet operator starts a new round: the lifecycle pair is now stale.
        NewRound,
        /// A tag from an earlier cycle appears (only while the VM runs: not a snapshot).
        StaleTag,
        /// Someone removes a leftover tag (only while the VM runs).
        TagGone,
        /// The registry fails (or heals).
        RegistryDown(bool),
        /// The user flips `spec.desire`.
        Flip,
        /// The user deletes the CR.
        Delete,
        /// The user creates a CR (when there is none) with this desire.
        Create(bool),
        /// The product runs one pass; `stale` plans from the CR as the cache last showed it.
        Pass { stale: bool },
    }

    /// What vk-cocoon is doing with the VM.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    enum Vm {
        /// Running, with this VMID.
        Running(u32),
        /// Snapshot pushed, VM removed: the tag is its only copy.
        Gone,
        /// Discarded with its snapshot (a deleted CR, S6): nothing to wake.
        Lost,
    }

    pub struct World {
        pub now: i64,
        pub settings: Settings,
        // The pod's annotations and status, as vk-cocoon and the operator write them.
        hibernate_annotation: bool,
        lifecycle: Option<&'static str>,
        observed_generation: i64,
        cocoonset_generation: i64,
        vm: Vm,
        next_vmid: u32,
        vk_failing: bool,
        // The registry: the tag, and whether it is this VM's snapshot or a leftover.
        pub tag: Option<Tag>,
        registry_down: bool,
        // The CR as the apiserver holds it, with its resourceVersion; the cache's copy.
        pub cr: Option<CocoonHibernation>,
        rv: u64,
        cached: Option<CocoonHibernation>,
        next_uid: u32,
        /// A leftover tag was added at some point (the product never looks for those
        /// while settled, so the end-of-run "no tag left" check is skipped).
        pub stale_tag_added: bool,
        pub steps: Vec<String>,
    }

    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub enum Tag {
        Snapshot,
        Leftover,
    }

    fn at(secs: i64) -> Time {
        Time(jiff::Timestamp::from_second(secs).expect("in range"))
    }

    impl World {
        pub fn new(desire: Option<bool>) -> Self {
            let mut w = World {
                now: BASE,
                settings: Settings {
                    hibernate_timeout: Duration::from_secs(60),
                    wake_timeout: Duration::from_secs(90),
                    ..Settings::default()
                },
                hibernate_annotation: false,
                lifecycle: Some("ready"),
                observed_generation: 1,
                cocoonset_generation: 1,
                vm: Vm::Running(1),
                next_vmid: 2,
                vk_failing: false,
                tag: None,
                registry_down: false,
                cr: None,
                rv: 1,
                cached: None,
                next_uid: 1,
                stale_tag_added: false,
                steps: Vec::new(),
            };
            if let Some(hibernate) = desire {
                w.create(hibernate);
            }
            w
        }

        fn create(&mut self, hibernate: bool) {
            let desire = if hibernate {
                Desire::Hibernate
            } else {
                Desire::Wake
            };
            let mut cr = CocoonHibernation::new(
                "web-0",
                CocoonHibernationSpec {
                    pod_ref: PodRef {
                        name: "web-0".into(),
                    },
                    desire,
                    hibernate_timeout: None,
                    wake_timeout: None,
                },
            );
            cr.metadata.namespace = Some("ns".into());
            cr.metadata.uid = Some(format!("uid-{}", self.next_uid));
            cr.metadata.generation = Some(1);
            cr.metadata.creation_timestamp = Some(at(self.now));
            self.next_uid += 1;
            self.cr = Some(cr);
            self.bump();
        }

        fn bump(&mut self) {
            self.rv += 1;
            if let Some(cr) = &mut self.cr {
                cr.metadata.resource_version = Some(self.rv.to_string());
            }
        }

        pub fn view(&self) -> PodView {
            PodView {
                uid: Some("pod-uid".into()),
                vm_name: Some(VM.into()),
                hibernate_requested: self.hibernate_annotation,
                lifecycle_state: self.lifecycle.map(str::to_owned),
                observed_generation: self.observed_generation,
                cocoonset_generation: self.cocoonset_generation,
                vm_id: match self.vm {
                    Vm::Running(id) => Some(format!("id-{id}")),
                    _ => None,
                },
                container_running: matches!(self.vm, Vm::Running(_)),
            }
        }

        fn vk_reports_hibernate(&self) -> bool {
            matches!(self.lifecycle, Some("hibernating" | "hibernated"))
        }

        /// The VM exists only as the tag: a wake's delete would destroy it.
        fn only_copy(&self) -> bool {
            self.vm == Vm::Gone && self.tag == Some(Tag::Snapshot)
        }

        /// Whether every fault has stopped and the VM can still be woken.
        pub fn vm_lost(&self) -> bool {
            self.vm == Vm::Lost
        }

        /// W2: a hibernate request vk let go of without removing the VM (it never began
        /// on it, or its push failed and it went back to `ready`): the pod runs on the very
        /// VMID the CR recorded at the request, which W2 never takes for a wake, so the CR
        /// waits by design.
        pub fn hibernate_dropped(&self) -> bool {
            let recorded = self.cr.as_ref().and_then(|cr| cr.pre_hibernate_vm_id());
            let view = self.view();
            recorded.is_some() && view.vm_id.as_deref() == recorded && !self.hibernate_annotation
        }

        pub fn apply(&mut self, step: &Step) -> Result<(), String> {
            self.steps.push(format!("{step:?}"));
            match *step {
                Step::Tick(s) => self.now += i64::from(s),
                Step::Vk => self.vk_step(),
                Step::VkPushFails => {
                    if self.lifecycle == Some("hibernating") && matches!(self.vm, Vm::Running(_)) {
                        self.lifecycle = Some("failed");
                        self.vk_failing = true;
                    }
                }
                Step::NewRound => self.cocoonset_generation += 1,
                Step::StaleTag => {
                    if matches!(self.vm, Vm::Running(_)) && self.tag.is_none() {
                        self.tag = Some(Tag::Leftover);
                        self.stale_tag_added = true;
                    }
                }
                Step::TagGone => {
                    if matches!(self.vm, Vm::Running(_)) {
                        self.tag = None;
                    }
                }
                Step::RegistryDown(down) => self.registry_down = down,
                Step::Flip => {
                    if let Some(cr) = &mut self.cr
                        && !cr.is_deleting()
                    {
                        cr.spec.desire = match cr.spec.desire {
                            Desire::Hibernate => Desire::Wake,
                            _ => Desire::Hibernate,
                        };
                        cr.metadata.generation = cr.metadata.generation.map(|g| g + 1);
                        self.bump();
                    }
                }
                Step::Delete => {
                    if let Some(cr) = &mut self.cr {
                        if cr.has_finalizer() {
                            cr.metadata.deletion_timestamp = Some(at(self.now));
                            self.bump();
                        } else {
                            self.cr = None;
                        }
                    }
                }
                Step::Create(hibernate) => {
                    if self.cr.is_none() {
                        self.create(hibernate);
                    }
                }
                Step::Pass { stale } => return self.pass(stale),
            }
            Ok(())
        }

        /// vk-cocoon: hibernate in three observable steps (hibernating; push and remove the
        /// VM; report hibernated for the round), wake in two (pull; a new VMID, running).
        fn vk_step(&mut self) {
            if self.hibernate_annotation {
                match (self.lifecycle, self.vm) {
                    (Some("failed"), Vm::Running(_)) if self.vk_failing => {
                        self.vk_failing = false; // the next attempt
                        self.lifecycle = Some("hibernating");
                    }
                    (Some("hibernating"), Vm::Running(_)) => {
                        self.tag = Some(Tag::Snapshot);
                        self.vm = Vm::Gone;
                    }
                    (Some("hibernating"), Vm::Gone) => {
                        // One patch: state and observed generation together.
                        self.lifecycle = Some("hibernated");
                        self.observed_generation = self.cocoonset_generation;
                    }
                    // A new round on a hibernated VM: vk reports it for that round too.
                    (Some("hibernated"), Vm::Gone)
                        if self.observed_generation < self.cocoonset_generation =>
                    {
                        self.observed_generation = self.cocoonset_generation;
                    }
                    (Some("hibernated"), _) | (_, Vm::Lost) => {}
                    (_, Vm::Running(_)) => self.lifecycle = Some("hibernating"),
                    (_, Vm::Gone) => self.lifecycle = Some("hibernating"),
                }
            } else {
                match (self.lifecycle, self.vm) {
                    // A hibernate in progress is finished before a wake (vk's own order).
                    (Some("hibernating"), Vm::Running(_)) => {
                        self.tag = Some(Tag::Snapshot);
                        self.vm = Vm::Gone;
                    }
                    (Some("hibernating"), Vm::Gone) => {
                        self.lifecycle = Some("hibernated");
                        self.observed_generation = self.cocoonset_generation;
                    }
                    (Some("hibernated"), Vm::Gone) if self.tag.is_some() => {
                        self.lifecycle = Some("creating"); // pulling the snapshot
                    }
                    (Some("creating"), Vm::Gone) if self.tag.is_some() => {
                        self.vm = Vm::Running(self.next_vmid);
                        self.next_vmid += 1;
                        self.lifecycle = Some("ready");
                    }
                    (Some("failed"), Vm::Running(_)) => self.lifecycle = Some("ready"),
                    _ => {}
                }
            }
        }

        /// One product pass, as reconcile.rs carries it out.
        fn pass(&mut self, stale: bool) -> Result<(), String> {
            let cr = if stale {
                self.cached.clone()
            } else {
                self.cr.clone()
            };
            self.cached = self.cr.clone();
            let Some(cr) = cr else { return Ok(()) };
            if self.cr.as_ref().map(|c| &c.metadata.uid) != Some(&cr.metadata.uid) {
                return Ok(()); // the cache still shows a CR that is gone
            }
            let now = at(self.now);
            if cr.is_deleting() {
                return self.cleanup(&cr);
            }
            let view = self.view();
            let mut p = plan::plan(
                &cr,
                Some(&view),
                &Ownership::Sole,
                &Probe::NotProbed,
                now.clone(),
                &self.settings,
            );
            if p.needs_probe {
                let probe = if self.registry_down {
                    Probe::Failed("503 Service Unavailable".into())
                } else if self.tag.is_some() {
                    Probe::Present
                } else {
                    Probe::Absent
                };
                p = plan::plan(
                    &cr,
                    Some(&view),
                    &Ownership::Sole,
                    &probe,
                    now.clone(),
                    &self.settings,
                );
                if p.needs_probe {
                    return Err("H3: plan asked for a probe twice".into());
                }
            }
            // C3: a settled CR, planned from a fresh cache, writes nothing.
            if !stale && self.settled(&cr) && p.status.is_some() {
                return Err(format!("C3: status write on a settled CR: {:?}", p.status));
            }
            if p.add_finalizer {
                if let Some(truth) = &mut self.cr {
                    truth
                        .metadata
                        .finalizers
                        .get_or_insert_with(Vec::new)
                        .push(FINALIZER.into());
                    self.bump();
                }
                return Ok(());
            }
            // F2: the pod is patched only after a fresh read shows the planned version.
            if p.pod_patch.is_some()
                && self.cr.as_ref().map(|c| &c.metadata.resource_version)
                    != Some(&cr.metadata.resource_version)
            {
                return Ok(()); // deferred: the pass looks again from a newer view
            }
            match p.pod_patch {
                Some(plan::PodPatch::SetHibernate) => self.hibernate_annotation = true,
                Some(plan::PodPatch::ClearHibernate) => self.hibernate_annotation = false,
                None => {}
            }
            let mut status = p.status.clone();
            let mut base_rv = cr.metadata.resource_version.clone();
            if let (true, Some(vm), Some(planned)) = (p.delete_first, &p.delete_tag, &mut status) {
                let fresh = self.cr.clone().ok_or("the CR vanished")?;
                if fresh.metadata.resource_version != cr.metadata.resource_version {
                    return Ok(()); // deferred: a newer CR needs a new plan (F2, D1)
                }
                if plan::still_owes(&fresh, cr.metadata.uid.as_deref(), vm, Debt::EndOfWake) {
                    let result = self.delete_tag(vm, Debt::EndOfWake)?;
                    *planned = plan::after_delete(planned, vm, &result, now.clone());
                    base_rv = fresh.metadata.resource_version.clone();
                } else {
                    // Not this CR's tag to delete: nothing deleted, nothing owed.
                    planned.conditions.retain(|c| c.type_ != SNAPSHOT_DELETED);
                }
            }
            if let Some(status) = status {
                let Some(truth) = self.cr.as_ref() else {
                    return Ok(());
                };
                if truth.metadata.resource_version != base_rv {
                    return Ok(()); // 409 Conflict: the pass is retried later
                }
                self.check_write(truth, &status)?;
                if let Some(truth) = &mut self.cr {
                    truth.status = Some(status);
                }
                self.bump();
            }
            if let (Some(vm), false) = (&p.delete_tag, p.delete_first) {
                // W3: the settled CR's debt, with S1's fresh read.
                let fresh = self.cr.clone().ok_or("the CR vanished")?;
                if plan::still_owes(&fresh, cr.metadata.uid.as_deref(), vm, Debt::AfterWake) {
                    let result = self.delete_tag(vm, Debt::AfterWake)?;
                    let written = fresh.status.clone().unwrap_or_default();
                    let next = plan::after_delete(&written, vm, &result, now);
                    if next != written {
                        if let Some(truth) = &mut self.cr {
                            truth.status = Some(next);
                        }
                        self.bump();
                    }
                }
            }
            Ok(())
        }

        /// G1, G2, S6: the deleted CR is the only one on this VM, so it deletes the tag.
        fn cleanup(&mut self, cr: &CocoonHibernation) -> Result<(), String> {
            let c = plan::plan_cleanup(cr, [], []);
            if let Some(vm) = &c.delete_tag {
                let fresh = self.cr.clone().ok_or("the CR vanished")?;
                if plan::still_owes(&fresh, cr.metadata.uid.as_deref(), vm, Debt::OnDeletion) {
                    self.delete_tag(vm, Debt::OnDeletion)?;
                }
            }
            if c.remove_finalizer {
                // G2: even when the registry failed.
                self.cr = None;
                self.cached = None;
            }
            Ok(())
        }

        /// The registry DELETE, with S1's invariants checked against the world's truth.
        fn delete_tag(&mut self, vm: &str, debt: Debt) -> Result<DeleteResult, String> {
            if vm != VM {
                return Err(format!("delete of another VM's tag {vm}"));
            }
            if let Some(cr) = self.cr.as_ref().filter(|c| !c.is_deleting()) {
                let vk_done = self.lifecycle == Some("hibernated")
                    && self.observed_generation >= self.cocoonset_generation;
                match cr.phase() {
                    Some(Phase::Hibernated) => {
                        return Err("S1: tag delete while the live CR is Hibernated".into());
                    }
                    Some(Phase::Hibernating) if vk_done => {
                        return Err(
                            "S1: tag delete while the live CR is Hibernating with vk done".into(),
                        );
                    }
                    _ => {}
                }
            }
            if debt != Debt::OnDeletion && self.only_copy() {
                return Err(format!(
                    "S1/W2: {debt:?} delete of the tag that is the VM's only copy"
                ));
            }
            if self.registry_down {
                return Ok(DeleteResult::Failed {
                    message: "503 Service Unavailable".into(),
                });
            }
            if self.only_copy() {
                self.vm = Vm::Lost; // S6: discarded with its CR
            }
            self.tag = None;
            Ok(DeleteResult::Gone)
        }

        /// H3, W2 and the phase graph, at the moment a status is written.
        fn check_write(
            &self,
            truth: &CocoonHibernation,
            next: &cocoon_hibernation::api::CocoonHibernationStatus,
        ) -> Result<(), String> {
            let before = truth.phase();
            let after = next.phase;
            if after == before {
                return Ok(());
            }
            let desire = truth.spec.desire;
            if after == Some(Phase::Hibernated) && self.tag.is_none() {
                return Err("H3: Hibernated written without the tag in the registry".into());
            }
            if after == Some(Phase::Hibernated)
                && !(self.lifecycle == Some("hibernated")
                    && self.observed_generation >= self.cocoonset_generation)
            {
                return Err("H3: Hibernated written before vk reported this round".into());
            }
            if after == Some(Phase::Active) && self.vk_reports_hibernate() {
                return Err(format!(
                    "W2: Active written while vk reports {:?}",
                    self.lifecycle
                ));
            }
            let ok = match after {
                Some(Phase::Pending) => !matches!(before, Some(Phase::Hibernated | Phase::Waking)),
                Some(Phase::Hibernating) => {
                    desire == Desire::Hibernate
                        && matches!(
                            before,
                            None | Some(Phase::Pending | Phase::Active | Phase::Failed)
                        )
                }
                Some(Phase::Hibernated) => before == Some(Phase::Hibernating),
                Some(Phase::Waking) => {
                    desire == Desire::Wake
                        && matches!(
                            before,
                            None | Some(Phase::Pending | Phase::Hibernated | Phase::Failed)
                        )
                }
                Some(Phase::Active) => {
                    before == Some(Phase::Waking)
                        || (desire == Desire::Wake && matches!(before, None | Some(Phase::Pending)))
                }
                Some(Phase::Failed) => matches!(before, Some(Phase::Hibernating | Phase::Waking)),
                None => false,
            };
            if ok {
                Ok(())
            } else {
                Err(format!(
                    "phase graph: {before:?} -> {after:?} with desire {desire:?}"
                ))
            }
        }

        /// The desire's terminal phase, the pod agreeing, the generation observed.
        fn settled(&self, cr: &CocoonHibernation) -> bool {
            let Some(status) = &cr.status else {
                return false;
            };
            cr.has_finalizer()
                && status.observed_generation == cr.metadata.generation
                && match (status.phase, cr.spec.desire) {
                    (Some(Phase::Hibernated), Desire::Hibernate) => self.hibernate_annotation,
                    (Some(Phase::Active), Desire::Wake) => !self.hibernate_annotation,
                    _ => false,
                }
        }

        /// The desire's terminal phase, or no CR at all.
        pub fn converged(&self) -> bool {
            match &self.cr {
                None => true,
                Some(cr) => matches!(
                    (cr.phase(), cr.spec.desire),
                    (Some(Phase::Hibernated), Desire::Hibernate)
                        | (Some(Phase::Active), Desire::Wake)
                ),
            }
        }

        /// Faults stop: the registry heals and the world only moves on its own.
        pub fn settle(&mut self, rounds: usize) -> Result<(), String> {
            self.apply(&Step::RegistryDown(false))?;
            for _ in 0..rounds {
                if self.converged() && self.quiet()? {
                    return Ok(());
                }
                self.apply(&Step::Pass { stale: false })?;
                self.apply(&Step::Vk)?;
                self.apply(&Step::Tick(5))?;
            }
            Err(format!(
                "did not converge: cr {:?}, lifecycle {:?}, vm {:?}, tag {:?}",
                self.cr.as_ref().map(|c| (c.spec.desire, c.status.clone())),
                self.lifecycle,
                self.vm,
                self.tag
            ))
        }

        /// A pass changes nothing more (its owed delete, if any, is paid).
        fn quiet(&mut self) -> Result<bool, String> {
            let rv = self.rv;
            let (ann, tag) = (self.hibernate_annotation, self.tag);
            self.apply(&Step::Pass { stale: false })?;
            Ok(rv == self.rv && ann == self.hibernate_annotation && tag == self.tag)
        }
    }
}

use world::{Step, Tag, World};

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => (1u16..40).prop_map(Step::Tick),
        4 => Just(Step::Vk),
        1 => Just(Step::VkPushFails),
        1 => Just(Step::NewRound),
        1 => Just(Step::StaleTag),
        1 => Just(Step::TagGone),
        1 => any::<bool>().prop_map(Step::RegistryDown),
        2 => Just(Step::Flip),
        1 => Just(Step::Delete),
        1 => any::<bool>().prop_map(Step::Create),
        6 => any::<bool>().prop_map(|s| Step::Pass { stale: s }),
    ]
}

fn run(initial: Option<bool>, steps: &[Step]) -> Result<World, String> {
    let mut w = World::new(initial);
    for s in steps {
        w.apply(s)
            .map_err(|e| format!("{e}\nafter steps: {:?}", w.steps))?;
    }
    Ok(w)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// SPEC S1, W2, W3, G1, H3, D1, C3: under random world moves and product passes (some
    /// from a stale cache), no needed tag is deleted, no CR is Hibernated without its tag
    /// or Active while vk reports a hibernate, phases follow the graph, and settled CRs
    /// write nothing.
    #[test]
    fn s1_h3_w2_d1_c3_invariants_hold_under_random_steps(
        initial in proptest::option::of(any::<bool>()),
        steps in proptest::collection::vec(step(), 1..120),
    ) {
        if let Err(e) = run(initial, &steps) {
            prop_assert!(false, "{}", e);
        }
    }

    /// SPEC F2, H5, W4, W3: once the faults stop, the CR reaches its desire's terminal
    /// phase (timeouts fail and retry, owed deletes are paid), with the invariants still
    /// holding; then no snapshot tag is left for a woken CR.
    #[test]
    fn f2_w3_converge_once_the_faults_stop(
        initial in proptest::option::of(any::<bool>()),
        steps in proptest::collection::vec(step(), 1..80),
    ) {
        let mut w = match run(initial, &steps) {
            Ok(w) => w,
            Err(e) => return Err(TestCaseError::fail(e)),
        };
        prop_assume!(!w.vm_lost());
        if let Err(e) = w.settle(400) {
            prop_assume!(!w.hibernate_dropped());
            prop_assert!(false, "{}\nafter steps: {:?}", e, w.steps);
        }
        // G2 may leave a deleted CR's tag behind when the registry failed, so only a
        // woken CR is held to it.
        let woken = w.cr.as_ref().is_some_and(|cr| {
            cr.phase() == Some(cocoon_hibernation::api::Phase::Active)
        });
        if woken && !w.stale_tag_added {
            prop_assert!(
                w.tag != Some(Tag::Snapshot),
                "W3: snapshot tag left behind after the wake\nafter steps: {:?}", w.steps
            );
        }
    }
}

/// SPEC H3, W2: the world model itself is live: a hibernate stores the snapshot and
/// reaches Hibernated, and the wake that follows reaches Active and deletes the tag.
/// Without this the properties above could hold only because nothing ever happens.
#[test]
fn h3_w2_the_simulated_world_hibernates_and_wakes() {
    use cocoon_hibernation::api::Phase;
    let mut w = World::new(Some(true));
    w.settle(50).unwrap();
    let phase = |w: &World| w.cr.as_ref().and_then(|cr| cr.phase());
    assert_eq!(phase(&w), Some(Phase::Hibernated));
    assert_eq!(w.tag, Some(Tag::Snapshot));
    w.apply(&Step::Flip).unwrap();
    w.settle(50).unwrap();
    assert_eq!(phase(&w), Some(Phase::Active));
    assert_eq!(w.tag, None);
}

/// SPEC F2, W3: the case proptest found. A pass planned from a stale view (the desire
/// flipped since) must not patch the pod: its status write meets a 409, but vk would
/// already hibernate the VM behind an Active CR and leave its tag behind.
#[test]
fn f2_w3_a_stale_view_never_patches_the_pod() {
    use world::Step::*;
    let steps = [
        TagGone,
        Pass { stale: false },
        Pass { stale: false },
        Create(false),
        Create(false),
        Flip,
        Pass { stale: true },
        Flip,
        Pass { stale: true },
        Vk,
        Vk,
        Flip,
        Flip,
        Create(false),
    ];
    let mut w = run(Some(false), &steps).unwrap();
    w.settle(400).unwrap();
    let woken =
        w.cr.as_ref()
            .is_some_and(|cr| cr.phase() == Some(cocoon_hibernation::api::Phase::Active));
    assert!(woken, "{:?}", w.cr.as_ref().map(|c| c.status.clone()));
    assert_ne!(w.tag, Some(Tag::Snapshot), "W3: tag left behind");
}

/// SPEC D1, W3: a wake that ends after the desire flipped back to Hibernate keeps the tag;
/// a flip back to Wake before the hibernate starts must still delete it (proptest found
/// the leak).
#[test]
fn d1_w3_a_kept_tag_is_still_owed_when_the_desire_returns_to_wake() {
    use world::Step::*;
    let steps = [
        Create(true),
        Pass { stale: false },
        Pass { stale: false },
        Vk,
        Vk,
        Vk,
        Pass { stale: false },
        Flip,
        Pass { stale: false },
        Flip,
        Vk,
        Vk,
        Pass { stale: false },
        Flip,
    ];
    let mut w = run(None, &steps).unwrap();
    w.settle(400).unwrap();
    let phase = w.cr.as_ref().and_then(|cr| cr.phase());
    assert_eq!(phase, Some(cocoon_hibernation::api::Phase::Active));
    assert_ne!(w.tag, Some(Tag::Snapshot), "W3: tag left behind");
}

/// SPEC F2, D1: a pass planned from a stale Waking view must not end the wake on top of
/// the newer Failed status the fresh read shows (proptest found a Failed -> Active jump).
#[test]
fn f2_a_stale_waking_view_does_not_overwrite_a_newer_failed_status() {
    use world::Step::*;
    let steps = [
        Create(true),
        Pass { stale: false },
        Pass { stale: false },
        Vk,
        Vk,
        Vk,
        Pass { stale: false },
        Flip,
        Pass { stale: false },
        Tick(26),
        Vk,
        Pass { stale: false },
        Tick(80),
        Pass { stale: false },
        Vk,
        RegistryDown(true),
        Pass { stale: true },
    ];
    run(None, &steps).unwrap();
}
