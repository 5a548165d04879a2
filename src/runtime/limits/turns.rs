//! Worker turns: how many passes run at once, and in what order.
//!
//! kube-runtime's own limit is not used: at its limit the runner parks ready CRs in a
//! HashSet and takes them back in hash order, so under load one CR could wait half a
//! minute while later ones ran. Here every ready pass waits on tokio's semaphores, which
//! serve first come, first served, and a pass that may end a transition already under
//! way (vk's answer is in) never queues behind more than `workers - 2` others: passes of
//! any other kind hold one of `workers - 2` permits (at least one) before they queue for a
//! worker.
//!
//! A pass that may start a transition (its first write, the pod patch) has a lane of its
//! own besides (C2, issue 38): passes ending other VMs' transitions or paying their tag
//! deletes hold workers through fresh reads and registry calls, and a new wake queued
//! behind them waited seconds. Such a pass takes a lane permit or a turn like the others,
//! whichever comes first, so starts still use idle workers and never wait for busy ones.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often a waiting pass asks whether it may now end a transition. Our own writes
/// count at once, so this only catches a transition the cache shows late; with 10k passes
/// waiting at a first start, asking every 100 ms cost 100k cache reads a second.
const RECHECK: Duration = Duration::from_secs(1);

#[derive(Clone)]
pub struct Turns {
    workers: Arc<Semaphore>,
    /// For passes that do not end a transition: [`ENDINGS_KEPT`] workers fewer.
    others: Arc<Semaphore>,
    /// Only for passes that may start a transition: they never call the registry
    /// (`plan::may_start_a_transition`), so nothing in this lane waits for a registry slot.
    intake: Arc<Semaphore>,
}

/// A worker, held for the length of a pass.
pub struct Turn {
    _worker: OwnedSemaphorePermit,
    _other: Option<OwnedSemaphorePermit>,
}

impl Turns {
    /// `concurrency` passes at most, the lane's included (C1): the lane is one of them,
    /// not one more. Each pass in flight slows the others on the shared apiserver, so a
    /// fifth pass beside four workers made every ending slower (docs/performance.md).
    /// With one, the lane is still a second pass: a start must never wait for it.
    pub fn new(concurrency: usize) -> Self {
        let workers = concurrency.saturating_sub(INTAKE_LANE).max(1);
        Self {
            workers: Arc::new(Semaphore::new(workers)),
            others: Arc::new(Semaphore::new(workers.saturating_sub(ENDINGS_KEPT).max(1))),
            intake: Arc::new(Semaphore::new(INTAKE_LANE)),
        }
    }

    /// C2 (issue 38): a turn for a pass that may start a transition: a permit of the
    /// intake lane, or a turn as [`Turns::take`] gives one, whichever comes first. The lane
    /// is held only by such passes, which call no registry, so a start never queues
    /// behind passes ending other VMs' transitions or paying their registry debt.
    pub async fn take_intake(&self, ending: impl Fn() -> bool) -> Option<Turn> {
        let lane = self.intake.clone().acquire_owned();
        tokio::select! {
            // A free lane permit first, so a start leaves the workers to the others.
            biased;
            permit = lane => permit.ok().map(|p| Turn { _worker: p, _other: None }),
            turn = self.take(ending) => turn,
        }
    }

    /// Waits for a worker; a pass for which `ending()` holds skips the queue of the
    /// others. `ending` is asked again while the pass waits: kube-runtime holds back a
    /// CR's new triggers while an earlier pass of it waits here, so a pass queued before
    /// its transition started must move up once it has. None only if the semaphores were
    /// closed, which nothing does.
    pub async fn take(&self, ending: impl Fn() -> bool) -> Option<Turn> {
        if !ending() {
            let other = self.take_other();
            tokio::pin!(other);
            loop {
                tokio::select! {
                    turn = &mut other => return turn,
                    _ = tokio::time::sleep(RECHECK) => if ending() { break },
                }
            }
        }
        let worker = self.workers.clone().acquire_owned().await.ok()?;
        Some(Turn {
            _worker: worker,
            _other: None,
        })
    }

    async fn take_other(&self) -> Option<Turn> {
        let other = self.others.clone().acquire_owned().await.ok()?;
        let worker = self.workers.clone().acquire_owned().await.ok()?;
        Some(Turn {
            _worker: worker,
            _other: Some(other),
        })
    }
}

/// Workers that passes of other kinds never hold. An ending pass runs a registry probe and
/// S7's fresh pod read before its status write; with one kept, a burst of 1,000 left
/// endings waiting behind starts (docs/performance.md).
pub const ENDINGS_KEPT: usize = 2;

/// The intake lane's permits: one, whatever the workers. The apiserver is the limit
/// (docs/performance.md: more workers made every pass slower): with half the workers as
/// the lane, the bench's reaction p50 was 136–151 ms against 89 ms with one, for the
/// same intake p99.
pub const INTAKE_LANE: usize = 1;

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    type Ending = Arc<dyn Fn() -> bool + Send + Sync>;

    fn fixed(ending: bool) -> Ending {
        Arc::new(move || ending)
    }

    /// Queues `passes` in this order while `held` keeps the workers busy, runs
    /// `meanwhile`, lets `held` go, and returns the order in which the passes ran.
    async fn run_order(
        turns: &Turns,
        held: Option<Turn>,
        passes: Vec<(&'static str, Ending)>,
        meanwhile: impl Future<Output = ()>,
    ) -> Vec<&'static str> {
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, ending) in passes {
            let (turns, order) = (turns.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let turn = turns.take(|| ending()).await;
                order.lock().map(|mut o| o.push(name)).ok();
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(turn);
            }));
            tokio::task::yield_now().await;
        }
        meanwhile.await;
        drop(held);
        for t in tasks {
            t.await.ok();
        }
        order.lock().map(|o| o.clone()).unwrap_or_default()
    }

    /// C4: with every worker busy and others queued, an ending pass runs next.
    #[tokio::test(start_paused = true)]
    async fn c4_an_ending_pass_goes_before_queued_others() {
        let turns = Turns::new(2);
        let held = turns.take(|| false).await;
        let passes = vec![
            ("other-1", fixed(false)),
            ("other-2", fixed(false)),
            ("ending", fixed(true)),
        ];
        let order = run_order(&turns, held, passes, async {}).await;
        assert_eq!(order, ["ending", "other-1", "other-2"]);
    }

    /// C4: passes of one kind run in the order they came.
    #[tokio::test(start_paused = true)]
    async fn c4_passes_of_one_kind_are_first_come_first_served() {
        let turns = Turns::new(1);
        let held = turns.take(|| true).await;
        let names = ["p0", "p1", "p2", "p3", "p4"];
        let passes = names.iter().map(|n| (*n, fixed(true))).collect();
        let order = run_order(&turns, held, passes, async {}).await;
        assert_eq!(order, names);
    }

    /// C4: a pass queued before its transition started moves up once it has.
    #[tokio::test(start_paused = true)]
    async fn c4_a_queued_pass_moves_up_when_its_transition_starts() {
        let turns = Turns::new(2);
        let held = turns.take(|| false).await;
        let started = Arc::new(AtomicBool::new(false));
        let late: Ending = {
            let started = started.clone();
            Arc::new(move || started.load(Ordering::SeqCst))
        };
        // Every pass waits for the others' one permit, "late" last in line.
        let passes = vec![
            ("other-1", fixed(false)),
            ("other-2", fixed(false)),
            ("late", late),
        ];
        let meanwhile = async {
            started.store(true, Ordering::SeqCst);
            tokio::time::sleep(RECHECK * 2).await;
        };
        let order = run_order(&turns, held, passes, meanwhile).await;
        assert_eq!(order[0], "late", "{order:?}");
    }

    /// SPEC C2 (issue 38): a burst of 1,000 starts all get their turn while every worker
    /// is held by passes stuck in registry calls (ends of other VMs' wakes, a W3 retry) and
    /// more of those queue: no start waits for a worker they hold.
    #[tokio::test(start_paused = true)]
    async fn c2_a_burst_of_1000_starts_never_waits_behind_registry_work() {
        let turns = Turns::new(4);
        let mut held = Vec::new();
        // Every worker: 4 passes in all, one of them the lane's.
        for ending in [true, true, false] {
            held.push(turns.take(move || ending).await.expect("a worker"));
        }
        let queued: Vec<_> = (0..8)
            .map(|i| {
                let turns = turns.clone();
                tokio::spawn(async move { turns.take(move || i % 2 == 0).await.is_some() })
            })
            .collect();
        let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let starts: Vec<_> = (0..1000)
            .map(|_| {
                let (turns, done) = (turns.clone(), done.clone());
                tokio::spawn(async move {
                    let turn = turns.take_intake(|| false).await;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    drop(turn);
                    done.fetch_add(1, Ordering::SeqCst);
                })
            })
            .collect();
        // 1,000 passes of 10 ms on the lane's one permit: 10 s.
        let all = tokio::time::timeout(Duration::from_secs(15), futures::future::join_all(starts));
        let finished = all.await.is_ok();
        assert!(
            finished,
            "C2: {} of 1000 starts ran while registry work held every worker",
            done.load(Ordering::SeqCst)
        );
        drop(held);
        for q in queued {
            assert!(
                q.await.unwrap(),
                "the queued passes run once the workers free up"
            );
        }
    }

    /// C2 (issue 38): starts still use idle workers besides their lane, so a burst of
    /// starts runs on more than the lane.
    #[tokio::test(start_paused = true)]
    async fn c2_starts_use_idle_workers_besides_their_lane() {
        let turns = Turns::new(4);
        let mut running = Vec::new();
        for _ in 0..6 {
            let take = turns.take_intake(|| false);
            match tokio::time::timeout(Duration::from_millis(1), take).await {
                Ok(Some(turn)) => running.push(turn),
                _ => break,
            }
        }
        // The lane's one, then the others' one (C4 keeps two of the 3 workers for endings).
        assert_eq!(running.len(), INTAKE_LANE + 1);
    }

    /// C4 (issue 38): however many passes of other kinds queue, two workers stay for
    /// passes that end a transition.
    #[tokio::test(start_paused = true)]
    async fn c4_two_workers_stay_for_ending_passes() {
        let turns = Turns::new(4);
        let mut held = Vec::new();
        for _ in 0..8 {
            let take = turns.take_intake(|| false);
            if let Ok(Some(turn)) = tokio::time::timeout(Duration::from_millis(1), take).await {
                held.push(turn);
            }
        }
        let others = held.len();
        for _ in 0..2 {
            let take = turns.take(|| true);
            let turn = tokio::time::timeout(Duration::from_millis(1), take).await;
            let Ok(Some(turn)) = turn else {
                panic!(
                    "C4: an ending pass waits with {others} others and {} endings running",
                    held.len() - others
                );
            };
            held.push(turn);
        }
    }

    /// C1: `--concurrency` bounds every pass in flight, the intake lane's included.
    #[rstest::rstest]
    #[case::one(1, 2)]
    #[case::two(2, 2)]
    #[case::four(4, 4)]
    #[case::eight(8, 8)]
    #[tokio::test(start_paused = true)]
    async fn c1_concurrency_bounds_every_pass_the_lane_included(
        #[case] concurrency: usize,
        #[case] at_most: usize,
    ) {
        let turns = Turns::new(concurrency);
        let mut running = Vec::new();
        for i in 0..3 * at_most {
            let turn: std::pin::Pin<Box<dyn Future<Output = Option<Turn>>>> = match i % 3 {
                0 => Box::pin(turns.take_intake(|| false)),
                1 => Box::pin(turns.take(|| true)),
                _ => Box::pin(turns.take(|| false)),
            };
            if let Ok(Some(turn)) = tokio::time::timeout(Duration::from_millis(1), turn).await {
                running.push(turn);
            }
        }
        // One is the least that keeps a lane: a start never waits for the worker.
        assert_eq!(
            running.len(),
            at_most,
            "passes in flight at --concurrency {concurrency}"
        );
    }
}
