//! The simulator's runtime knobs and counters, shared with tests through an `Arc`.

use super::timing::Timings;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::net::Ipv4Addr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

/// Runtime-adjustable behaviour, shared with tests through an `Arc`.
#[derive(Debug, Default)]
pub struct SimKnobs {
    hibernate_delay_ms: AtomicU64,
    wake_delay_ms: AtomicU64,
    fail_push: AtomicBool,
    never_complete: AtomicBool,
    hibernating_first: AtomicBool,
    /// Hostile vk: how long after the push the VM is removed (0: at once).
    removal_delay_ms: AtomicU64,
    restore_replacements: AtomicBool,
    /// Share of wakes that delete the tag, per million.
    wake_drops_tag_ppm: AtomicU32,
    drop_seed: AtomicU64,
    pub(super) pushes: AtomicUsize,
    pub(super) hibernations: AtomicUsize,
    pub(super) wakes: AtomicUsize,
    pub(super) tag_drops: AtomicUsize,
    pub(super) restores_without_snapshot: AtomicUsize,
    /// The VMs of those restores, with the pod, in order.
    pub(super) lost: Mutex<Vec<String>>,
    pub(super) replacement_restores: AtomicUsize,
    pub(super) late_removals: AtomicUsize,
    pub(super) withdrawn_removals: AtomicUsize,
    /// Wakes so far per VM: with the seed, what decides whether a wake drops the tag.
    wake_rounds: Mutex<HashMap<String, u64>>,
    /// 0: the default, [`super::RESYNC`].
    resync_ms: AtomicU64,
    timings: Timings,
    /// The ports each awake VM serves HTTP and a TCP echo on; `None`: VMs serve nothing.
    serve_ports: Mutex<Option<(u16, u16)>>,
    /// Where the serving VMs take their addresses; `None`: loopback (127.64.0.0/10).
    serve_net: Mutex<Option<(Ipv4Addr, u8)>>,
}

impl SimKnobs {
    pub fn new(hibernate_delay: Duration, wake_delay: Duration) -> Self {
        let knobs = Self::default();
        knobs.set_hibernate_delay(hibernate_delay);
        knobs.set_wake_delay(wake_delay);
        knobs
    }
    pub fn hibernate_delay(&self) -> Duration {
        Duration::from_millis(self.hibernate_delay_ms.load(Ordering::Relaxed))
    }
    pub fn set_hibernate_delay(&self, d: Duration) {
        self.hibernate_delay_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }
    pub fn wake_delay(&self) -> Duration {
        Duration::from_millis(self.wake_delay_ms.load(Ordering::Relaxed))
    }
    pub fn set_wake_delay(&self, d: Duration) {
        self.wake_delay_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }
    /// While set, every snapshot push fails: nothing is written and the push is retried.
    pub fn fail_push(&self) -> bool {
        self.fail_push.load(Ordering::Relaxed)
    }
    pub fn set_fail_push(&self, on: bool) {
        self.fail_push.store(on, Ordering::Relaxed);
    }
    /// While set, hibernate and wake requests are ignored (a stuck vk).
    pub fn never_complete(&self) -> bool {
        self.never_complete.load(Ordering::Relaxed)
    }
    pub fn set_never_complete(&self, on: bool) {
        self.never_complete.store(on, Ordering::Relaxed);
    }
    /// While set, a hibernate first writes `lifecycle-state=hibernating` in a patch of its
    /// own (a write more per hibernate, so off by default: the bench measures speed).
    pub fn hibernating_first(&self) -> bool {
        self.hibernating_first.load(Ordering::Relaxed)
    }
    pub fn set_hibernating_first(&self, on: bool) {
        self.hibernating_first.store(on, Ordering::Relaxed);
    }
    /// A slow vk: after the push, the VM is removed (VMID cleared, `hibernated` written)
    /// only this long later, and a hibernate annotation removed meanwhile is ignored: vk
    /// finishes the hibernate, then restores the VM from its tag. A large VM whose push
    /// outlasts the product's hibernate timeout looks like this.
    pub fn removal_delay(&self) -> Duration {
        Duration::from_millis(self.removal_delay_ms.load(Ordering::Relaxed))
    }
    pub fn set_removal_delay(&self, d: Duration) {
        self.removal_delay_ms
            .store(d.as_millis() as u64, Ordering::Relaxed);
    }
    /// While set, a new pod that names a VM and has no VMID and no lifecycle state (a
    /// replacement the CocoonSet operator created for a hibernated VM) is started, restored
    /// from `<vm>:hibernate` when that tag exists.
    pub fn restore_replacements(&self) -> bool {
        self.restore_replacements.load(Ordering::Relaxed)
    }
    pub fn set_restore_replacements(&self, on: bool) {
        self.restore_replacements.store(on, Ordering::Relaxed);
    }
    /// Restores of a removed VM that found no `<vm>:hibernate` in the registry: each one is
    /// a VM lost for good. Every safety test expects 0.
    pub fn restores_without_snapshot(&self) -> usize {
        self.restores_without_snapshot.load(Ordering::Relaxed)
    }
    /// VMs removed late ([`Self::set_removal_delay`]).
    pub fn late_removals(&self) -> usize {
        self.late_removals.load(Ordering::Relaxed)
    }
    /// Of those, removals of a VM whose hibernate request was withdrawn meanwhile (the
    /// world where a wake could end on the pre-hibernate VMID).
    pub fn withdrawn_removals(&self) -> usize {
        self.withdrawn_removals.load(Ordering::Relaxed)
    }
    /// "namespace/pod vm" of each restore that found no tag.
    pub fn lost_vms(&self) -> Vec<String> {
        self.lost.lock().map(|l| l.clone()).unwrap_or_default()
    }
    /// Replacement pods restored from an existing tag.
    pub fn replacement_restores(&self) -> usize {
        self.replacement_restores.load(Ordering::Relaxed)
    }
    /// The share (0..=1) of wakes that delete the manifest they restored from once the new
    /// VMID is written. 0 (the default) never, 1 always; a pod's
    /// [`super::WAKE_DROPS_TAG_ANNOTATION`] overrides it.
    pub fn wake_drops_tag(&self) -> f64 {
        f64::from(self.wake_drops_tag_ppm.load(Ordering::Relaxed)) / 1e6
    }
    pub fn set_wake_drops_tag(&self, share: f64) {
        let ppm = (share.clamp(0.0, 1.0) * 1e6).round() as u32;
        self.wake_drops_tag_ppm.store(ppm, Ordering::Relaxed);
    }
    /// Seeds the choice of the wakes that drop their tag (per VM and wake round), so a
    /// seeded run makes the same choices.
    pub fn set_seed(&self, seed: u64) {
        self.drop_seed.store(seed, Ordering::Relaxed);
    }
    /// Whether this wake of `vm` drops its tag: the pod's annotation, else the share.
    pub(super) fn drops_tag(&self, vm: &str, annotation: Option<&str>) -> bool {
        match annotation {
            Some("true") => return true,
            Some("false") => return false,
            _ => {}
        }
        let ppm = self.wake_drops_tag_ppm.load(Ordering::Relaxed);
        if ppm == 0 {
            return false;
        }
        let round = {
            let Ok(mut rounds) = self.wake_rounds.lock() else {
                return false;
            };
            let r = rounds.entry(vm.to_owned()).or_default();
            *r += 1;
            *r
        };
        // DefaultHasher::new() has fixed keys: the same seed gives the same choices.
        let mut h = DefaultHasher::new();
        (self.drop_seed.load(Ordering::Relaxed), vm, round).hash(&mut h);
        h.finish() % 1_000_000 < u64::from(ppm)
    }
    /// Successful snapshot pushes so far (staged stale tags included).
    pub fn pushes(&self) -> usize {
        self.pushes.load(Ordering::Relaxed)
    }
    /// Completed hibernations (the lifecycle patch landed).
    pub fn hibernations(&self) -> usize {
        self.hibernations.load(Ordering::Relaxed)
    }
    /// Wakes that wrote a new VMID (the Running report follows it).
    pub fn wakes(&self) -> usize {
        self.wakes.load(Ordering::Relaxed)
    }
    /// Wakes that deleted the tag they restored from (the DELETE was answered 202).
    pub fn tag_drops(&self) -> usize {
        self.tag_drops.load(Ordering::Relaxed)
    }
    /// How often every known pod is re-checked (300 ms by default). The capacity bench
    /// sets it longer: a re-check of 50k pods every 300 ms would take cores from what it
    /// measures.
    pub fn resync(&self) -> Duration {
        match self.resync_ms.load(Ordering::Relaxed) {
            0 => super::RESYNC,
            ms => Duration::from_millis(ms),
        }
    }
    pub fn set_resync(&self, d: Duration) {
        self.resync_ms
            .store(d.as_millis().max(1) as u64, Ordering::Relaxed);
    }
    /// With `Some((http, tcp))`, every awake VM serves HTTP on `http` and a TCP echo on
    /// `tcp` at a loopback address of its own, reported as the pod's IP, and refuses
    /// while hibernated (see `serve.rs`). Off by default: most tests need no traffic.
    pub fn set_serve(&self, ports: Option<(u16, u16)>) {
        if let Ok(mut p) = self.serve_ports.lock() {
            *p = ports;
        }
    }
    pub fn serve_ports(&self) -> Option<(u16, u16)> {
        self.serve_ports.lock().ok().and_then(|p| *p)
    }
    /// Serving VMs take their addresses in `net` (base, prefix length) instead of on
    /// loopback: on a real node, a range the host owns on the pods' bridge (hack/node.sh
    /// routes the bridge's top /26 to the host), so a pod such as the wake proxy reaches them.
    pub fn set_serve_net(&self, net: Option<(Ipv4Addr, u8)>) {
        if let Ok(mut n) = self.serve_net.lock() {
            *n = net;
        }
    }
    pub fn serve_net(&self) -> Option<(Ipv4Addr, u8)> {
        self.serve_net.lock().ok().and_then(|n| *n)
    }
    /// When the simulator saw each request and finished its own work, per VM.
    pub fn timings(&self) -> &Timings {
        &self.timings
    }
}
