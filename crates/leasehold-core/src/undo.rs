//! Undo work in the background, counted process-wide so a shutdown can wait for it.
//!
//! A caller that stops waiting (a dropped `lock()` future, a service stopping on a signal)
//! leaves the store work that undoes its attempt to a task of its own: the owner-checked release
//! of what an acquire in flight may have taken, a waiter leaving the line it joined. If the
//! process exits right after, its runtime drops those tasks unfinished, and the lock or the place
//! in line stays in the store until its TTL or waiter timeout — the next in line waits that out.
//! So every such task is counted here, and [`LockManager::shutdown`] waits for the count to reach
//! zero (within its timeout), whichever store or manager the work belongs to.
//!
//! [`LockManager::shutdown`]: https://docs.rs/leasehold/latest/leasehold/struct.LockManager.html#method.shutdown

use std::future::Future;
use std::sync::LazyLock;

use tokio::runtime::Handle;
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// The process's undo tasks.
static UNDO: LazyLock<Tracker> = LazyLock::new(Tracker::default);

/// A count of running tasks that can be waited on to reach zero.
#[derive(Debug)]
struct Tracker {
    running: watch::Sender<usize>,
}

impl Default for Tracker {
    fn default() -> Self {
        Tracker {
            running: watch::Sender::new(0),
        }
    }
}

impl Tracker {
    fn spawn<F>(&'static self, runtime: &Handle, work: F) -> JoinHandle<()>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let running = Running::start(self);
        runtime.spawn(async move {
            let _running = running;
            work.await;
        })
    }

    async fn finished(&self) {
        let mut running = self.running.subscribe();
        // The tracker holds the sender: the wait ends only at zero.
        let _ = running.wait_for(|running| *running == 0).await;
    }

    fn running(&self) -> usize {
        *self.running.borrow()
    }
}

/// Counts one task for as long as it lives: dropped when it ends, or when its runtime drops it.
struct Running(&'static Tracker);

impl Running {
    fn start(tracker: &'static Tracker) -> Self {
        tracker.running.send_modify(|running| *running += 1);
        Running(tracker)
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.0
            .running
            .send_modify(|running| *running = running.saturating_sub(1));
    }
}

/// Spawns `work`, undo work of a store (see the module docs), on `runtime`, counted until it
/// ends so that [`undo_finished`] waits for it.
pub fn spawn_undo<F>(runtime: &Handle, work: F) -> JoinHandle<()>
where
    F: Future<Output = ()> + Send + 'static,
{
    UNDO.spawn(runtime, work)
}

/// Waits until no undo work spawned with [`spawn_undo`] is running in this process. Bound it with
/// a timeout: work that keeps retrying against a store that is down runs as long as its budget.
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
pub async fn undo_finished() {
    UNDO.finished().await;
}

/// How many undo tasks spawned with [`spawn_undo`] are running in this process now.
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
    async fn a_task_is_counted_until_it_ends() {
        let tracker = tracker();
        let (go, gate) = tokio::sync::oneshot::channel::<()>();
        let task = tracker.spawn(&Handle::current(), async move {
            let _ = gate.await;
        });
        assert_eq!(tracker.running(), 1);
        let finished = tokio::spawn(tracker.finished());
        tokio::task::yield_now().await;
        assert!(!finished.is_finished(), "waits while the task runs");
        go.send(()).unwrap();
        task.await.unwrap();
        finished.await.unwrap();
        assert_eq!(tracker.running(), 0);
    }

    #[test]
    fn a_task_its_runtime_drops_unfinished_is_no_longer_counted() {
        let tracker = tracker();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        tracker.spawn(runtime.handle(), std::future::pending());
        assert_eq!(tracker.running(), 1);
        drop(runtime);
        assert_eq!(tracker.running(), 0);
    }
}
