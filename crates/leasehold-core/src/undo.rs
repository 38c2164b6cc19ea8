//! Undo work in the background, counted process-wide so a shutdown can wait for it.
//!
//! A caller that stops waiting (a dropped `lock()` future, a service stopping on a signal)
//! leaves the store work that undoes its attempt to a task of its own: the owner-checked release
//! of what an acquire in flight may have taken, a waiter leaving the line it joined. If the
//! process exits right after, its runtime drops those tasks unfinished, and the lock or the place
//! in line stays in the store until its TTL or waiter timeout — the next in line waits that out.
//! So such work is counted here from the moment it is handed over, on the caller's task
//! ([`undo_started`]: an [`UndoGuard`] the work drops once the part worth waiting for is done;
//! a store may let longer looks for a request that could still land go on uncounted), and
//! [`LockManager::shutdown`] waits (within its timeout) for the work begun before each of its
//! two waits (before and after it sweeps the stores), whichever store or manager it belongs to:
//! work that managers going on in the process begin later cannot keep it waiting.
//!
//! [`LockManager::shutdown`]: https://docs.rs/leasehold/latest/leasehold/struct.LockManager.html#method.shutdown

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{LazyLock, Mutex, PoisonError};

use tokio::runtime::Handle;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The process's undo work.
static UNDO: LazyLock<Tracker> = LazyLock::new(Tracker::default);

/// The undo work running, each piece by the number it started with, so that a wait can be for
/// the work begun before it only: a process whose other managers go on working (and cancelling)
/// must not keep a shutdown waiting for work that started after it.
#[derive(Debug, Default)]
struct Tracker {
    running: Mutex<Running>,
    ended: Notify,
}

#[derive(Debug, Default)]
struct Running {
    next: u64,
    ids: BTreeSet<u64>,
}

impl Tracker {
    fn start(&'static self) -> UndoGuard {
        let mut running = self.lock();
        let id = running.next;
        running.next += 1;
        running.ids.insert(id);
        UndoGuard { tracker: self, id }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Running> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits until every piece begun before this call (not the first poll) has ended.
    fn finished(&self) -> impl Future<Output = ()> + Send + '_ {
        let before = self.lock().next;
        async move {
            loop {
                let ended = self.ended.notified();
                tokio::pin!(ended);
                // Registered before the check, so an end between the two still wakes it.
                ended.as_mut().enable();
                if self
                    .lock()
                    .ids
                    .first()
                    .is_none_or(|oldest| *oldest >= before)
                {
                    return;
                }
                ended.await;
            }
        }
    }

    fn running(&self) -> usize {
        self.lock().ids.len()
    }
}

/// Counts one piece of undo work (see the module docs) while it lives: drop it when the part a
/// shutdown should wait for is done (a store's first attempt; later looks for a request that may
/// still land need not hold a shutdown up), or let it go with the task that holds it — it is
/// dropped too when its runtime drops the task unfinished.
#[must_use = "the work is counted only while the guard lives"]
#[derive(Debug)]
pub struct UndoGuard {
    tracker: &'static Tracker,
    id: u64,
}

impl Drop for UndoGuard {
    fn drop(&mut self) {
        self.tracker.lock().ids.remove(&self.id);
        self.tracker.ended.notify_waiters();
    }
}

/// Starts counting a piece of undo work: [`undo_finished`] waits for it while the guard lives.
pub fn undo_started() -> UndoGuard {
    UNDO.start()
}

/// Spawns `work` on `runtime`, counted as undo work (see [`undo_started`]) until it ends.
pub fn spawn_undo<F>(runtime: &Handle, work: F) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    let counted = undo_started();
    runtime.spawn(async move {
        let _counted = counted;
        work.await;
    })
}

/// Waits until the undo work begun before this call (see [`undo_started`]) has ended, however
/// much begins meanwhile (the call, not the first poll of its future, draws the line). Bound it with a timeout: work against a store that does not answer
/// takes as long as its requests do.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() {
/// let runtime = tokio::runtime::Handle::current();
/// let (tx, rx) = tokio::sync::oneshot::channel();
/// leasehold_core::spawn_undo(&runtime, async move {
///     let _ = tx.send("left the line");
/// });
/// leasehold_core::undo_finished().await;
/// assert_eq!(rx.await.unwrap(), "left the line");
/// # }
/// ```
pub fn undo_finished() -> impl Future<Output = ()> + Send {
    UNDO.finished()
}

/// How many pieces of undo work are being counted in this process now.
pub fn undo_running() -> usize {
    UNDO.running()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A tracker of the test's own: the process's is shared by every test running at once.
    fn tracker() -> &'static Tracker {
        Box::leak(Box::default())
    }

    #[tokio::test]
    async fn a_wait_ends_when_the_work_begun_before_it_has_ended() {
        let tracker = tracker();
        let earlier = tracker.start();
        let finished = tokio::spawn(tracker.finished());
        tokio::task::yield_now().await;
        // Work begun after the wait does not hold it up.
        let later = tracker.start();
        assert_eq!(tracker.running(), 2);
        assert!(!finished.is_finished(), "waits while earlier work runs");
        drop(earlier);
        finished.await.unwrap();
        drop(later);
        assert_eq!(tracker.running(), 0);
    }

    #[test]
    fn a_guard_its_runtime_drops_unfinished_is_no_longer_counted() {
        let tracker = tracker();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let counted = tracker.start();
        runtime.spawn(async move {
            let _counted = counted;
            std::future::pending::<()>().await;
        });
        assert_eq!(tracker.running(), 1);
        drop(runtime);
        assert_eq!(tracker.running(), 0);
    }
}
