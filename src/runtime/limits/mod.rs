//! The one place where concurrency is limited. Every wait a CocoonHibernation pass can
//! meet after kube-runtime hands it over is here, in the order a pass meets them:
//!
//! 1. [`Turns`]: a worker (`--concurrency`), first come, first served; a pass that may
//!    not end a transition first takes one of `workers - 1` "others" permits, so one
//!    that may end one never queues behind more than `workers - 1` others (C4). A pass
//!    that may start a transition may take a permit of the intake lane instead, which
//!    only such passes hold (C2): a start never queues behind other VMs' registry work.
//! 2. [`VmLocks`]: the pass's VM, so passes touching one VM run one at a time (C2).
//!    A safety rule, not a throughput limit.
//! 3. [`Limits::registry_slot`]: a registry slot, of fewer than there are workers, so a
//!    slow registry holds some workers at most; a pass waits for one at most
//!    [`REGISTRY_SLOT_WAIT`], then gives its worker up and looks again (C2).
//!
//! [`Limits::event_slot`] never waits: an event write beyond [`EVENTS_IN_FLIGHT`] is
//! sent inside its pass instead of after it. The schedule controller takes none of these:
//! its passes take no VM and call no registry, and kube-runtime keeps one pass per
//! schedule at a time. An idle policy's pass sends its writes (one pod's objects each)
//! [`IDLE_WRITES_AT_ONCE`] at a time.

mod turns;
mod vms;

pub use turns::{Turn, Turns};
pub use vms::VmLocks;

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedMutexGuard, OwnedSemaphorePermit, Semaphore};

/// I3: an idle policy pass's writes in flight at once, so pods that turn idle together
/// are flipped together, without one pass flooding the apiserver. Each pod's fence and
/// flip are two round trips one after the other, so this bounds the flips a second: at
/// 16, with writes at about 275 ms on a busy machine, a pass of 266 due pods took 9 s.
pub const IDLE_WRITES_AT_ONCE: usize = 64;

/// Event writes that may be in flight after their passes ended.
pub const EVENTS_IN_FLIGHT: usize = 64;

/// C2: how long a pass waits, holding its worker, for a registry slot (slots are served
/// in order); then it gives the worker up and looks again (`Deferral::RegistryBusy`).
pub const REGISTRY_SLOT_WAIT: Duration = Duration::from_millis(250);

/// The limits every pass of one process shares; [`Turns`] are per leader term.
#[derive(Clone)]
pub struct Limits {
    vms: VmLocks,
    registry: Arc<Semaphore>,
    events: Arc<Semaphore>,
}

impl Limits {
    /// `registry_slots` (at least one) registry calls at once.
    pub fn new(registry_slots: usize) -> Self {
        Self {
            vms: VmLocks::default(),
            registry: Arc::new(Semaphore::new(registry_slots.max(1))),
            events: Arc::new(Semaphore::new(EVENTS_IN_FLIGHT)),
        }
    }

    /// C2: waits until no other pass holds `vm` (a VM name, or a pod's key for a pod
    /// naming none).
    pub async fn vm(&self, vm: &str) -> OwnedMutexGuard<()> {
        self.vms.lock(vm).await
    }

    /// A registry slot, if one frees up within [`REGISTRY_SLOT_WAIT`] (C2): a stalled
    /// registry holds no worker beyond the slots' own for longer than that.
    pub async fn registry_slot(&self) -> Option<OwnedSemaphorePermit> {
        let slot = self.registry.clone().acquire_owned();
        tokio::time::timeout(REGISTRY_SLOT_WAIT, slot)
            .await
            .ok()?
            .ok()
    }

    /// A slot for sending events after the pass, if one is free now.
    pub fn event_slot(&self) -> Option<OwnedSemaphorePermit> {
        self.events.clone().try_acquire_owned().ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SPEC C2: with every registry slot busy, a pass gives up its wait after
    /// `REGISTRY_SLOT_WAIT` (then it is deferred and frees its worker); a slot freed
    /// within the wait is taken.
    #[tokio::test(start_paused = true)]
    async fn c2_a_registry_slot_is_waited_for_briefly_then_given_up() {
        let limits = Limits::new(1);
        let held = limits.registry_slot().await.expect("a free slot");
        let asked = tokio::time::Instant::now();
        assert!(limits.registry_slot().await.is_none(), "every slot busy");
        assert_eq!(asked.elapsed(), REGISTRY_SLOT_WAIT);

        let waiting = tokio::spawn({
            let limits = limits.clone();
            async move { limits.registry_slot().await.is_some() }
        });
        tokio::time::sleep(REGISTRY_SLOT_WAIT / 2).await;
        drop(held);
        assert!(
            waiting.await.unwrap(),
            "a slot freed within the wait is taken"
        );
    }

    /// Event slots never wait: beyond `EVENTS_IN_FLIGHT`, none is given.
    #[test]
    fn event_slots_never_wait() {
        let limits = Limits::new(1);
        let slots: Vec<_> = (0..EVENTS_IN_FLIGHT)
            .map_while(|_| limits.event_slot())
            .collect();
        assert_eq!(slots.len(), EVENTS_IN_FLIGHT);
        assert!(limits.event_slot().is_none());
        drop(slots);
        assert!(limits.event_slot().is_some());
    }
}
