//! Worker turns: how many passes run at once, and in what order.
//!
//! kube-runtime's own limit is not used: at its limit the runner parks ready CRs in a
//! HashSet and takes them back in hash order, so under load one CR could wait half a
//! minute while later ones ran. Here every ready pass waits on tokio's semaphores, which
//! serve first come, first served, and a pass that may end a transition already under
//! way (vk's answer is in) never queues behind more than `workers - 1` others: passes of
//! any other kind hold one of `workers - 1` permits before they queue for a worker.

use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often a waiting pass asks whether it may now end a transition.
const RECHECK: Duration = Duration::from_millis(100);

#[derive(Clone)]
pub struct Turns {
    workers: Arc<Semaphore>,
    /// For passes that do not end a transition: one worker fewer.
    others: Arc<Semaphore>,
}

/// A worker, held for the length of a pass.
pub struct Turn {
    _worker: OwnedSemaphorePermit,
    _other: Option<OwnedSemaphorePermit>,
}

impl Turns {
    pub fn new(workers: usize) -> Self {
        let workers = workers.max(1);
        Self {
            workers: Arc::new(Semaphore::new(workers)),
            others: Arc::new(Semaphore::new(workers.saturating_sub(1).max(1))),
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

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// C4: with every worker busy and others queued, an ending pass runs next.
    #[tokio::test(start_paused = true)]
    async fn c4_an_ending_pass_goes_before_queued_others() {
        let turns = Turns::new(2);
        let first = turns.take(|| false).await;
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for (name, ending) in [("other-1", false), ("other-2", false), ("ending", true)] {
            let (turns, order) = (turns.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let turn = turns.take(|| ending).await;
                order.lock().map(|mut o| o.push(name)).ok();
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(turn);
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        for t in tasks {
            t.await.ok();
        }
        let order = order.lock().map(|o| o.clone()).unwrap_or_default();
        assert_eq!(order, ["ending", "other-1", "other-2"]);
    }

    /// C4: passes of one kind run in the order they came.
    #[tokio::test(start_paused = true)]
    async fn c4_passes_of_one_kind_are_first_come_first_served() {
        let turns = Turns::new(1);
        let first = turns.take(|| true).await;
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for i in 0..5 {
            let (turns, order) = (turns.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let turn = turns.take(|| true).await;
                order.lock().map(|mut o| o.push(i)).ok();
                drop(turn);
            }));
            tokio::task::yield_now().await;
        }
        drop(first);
        for t in tasks {
            t.await.ok();
        }
        let order = order.lock().map(|o| o.clone()).unwrap_or_default();
        assert_eq!(order, [0, 1, 2, 3, 4]);
    }

    /// C4: a pass queued before its transition started moves up once it has.
    #[tokio::test(start_paused = true)]
    async fn c4_a_queued_pass_moves_up_when_its_transition_starts() {
        let turns = Turns::new(2);
        let first = turns.take(|| false).await;
        let started = Arc::new(AtomicBool::new(false));
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for name in ["other-1", "other-2", "late"] {
            let (turns, order, started) = (turns.clone(), order.clone(), started.clone());
            tasks.push(tokio::spawn(async move {
                let ending = || name == "late" && started.load(Ordering::SeqCst);
                let turn = turns.take(ending).await;
                order.lock().map(|mut o| o.push(name)).ok();
                tokio::time::sleep(Duration::from_millis(10)).await;
                drop(turn);
            }));
            tokio::task::yield_now().await;
        }
        // Every pass waits for the others' one permit, "late" last in line.
        started.store(true, Ordering::SeqCst);
        tokio::time::sleep(RECHECK * 2).await;
        drop(first);
        for t in tasks {
            t.await.ok();
        }
        let order = order.lock().map(|o| o.clone()).unwrap_or_default();
        assert_eq!(order[0], "late", "{order:?}");
    }
}
