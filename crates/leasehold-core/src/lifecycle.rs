//! One lifecycle for a manager and every layer under it: a cancellation token that says "closing"
//! and a task tracker that knows every background job still running.

use std::future::Future;

use tokio::task::JoinHandle;
use tokio_util::sync::{CancellationToken, WaitForCancellationFuture};
use tokio_util::task::task_tracker::TaskTrackerToken;
use tokio_util::task::TaskTracker;

/// Whether the manager (or a layer used alone) is closing, and the background work it must wait
/// for before it is done.
///
/// Cheap to clone; clones share one state. A manager builds one and hands it to every layer it
/// assembles, so shutdown is one signal, not a flag per layer:
///
/// 1. [`close`](Self::close) — stop new work: closing layers refuse acquisitions and wake their
///    local waiters ([`closing`](Self::closing) resolves);
/// 2. [`wait`](Self::wait) — wait for tracked work (background releases, acquisitions in flight);
/// 3. the manager then releases live locks and shuts the store down.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use leasehold_core::Lifecycle;
/// let lifecycle = Lifecycle::new();
/// lifecycle.spawn(async { /* a background release */ });
/// lifecycle.close();
/// assert!(lifecycle.is_closing());
/// lifecycle.wait().await; // the release has run
/// # }
/// ```
#[derive(Debug, Clone, Default)]
pub struct Lifecycle {
    closing: CancellationToken,
    tracker: TaskTracker,
}

impl Lifecycle {
    /// A lifecycle that is open and tracks nothing yet.
    pub fn new() -> Self {
        Lifecycle::default()
    }

    /// Whether [`close`](Self::close) was called.
    pub fn is_closing(&self) -> bool {
        self.closing.is_cancelled()
    }

    /// Resolves once [`close`](Self::close) is called (at once if it was). Cancel safe.
    pub fn closing(&self) -> WaitForCancellationFuture<'_> {
        self.closing.cancelled()
    }

    /// Starts closing: [`closing`](Self::closing) resolves everywhere, and [`wait`](Self::wait)
    /// returns once no tracked work is left. Idempotent.
    pub fn close(&self) {
        self.closing.cancel();
        self.tracker.close();
    }

    /// Runs `work` in the background on the current tokio runtime, tracked so that
    /// [`wait`](Self::wait) waits for it. Returns its handle (dropping it detaches the task), or
    /// `None` (and drops `work`) outside a runtime: the caller then says what was not done.
    pub fn spawn<F>(&self, work: F) -> Option<JoinHandle<()>>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        Some(self.tracker.spawn_on(work, &runtime))
    }

    /// Counts a piece of foreground work (an acquisition in flight) as tracked until the returned
    /// token is dropped.
    pub fn track(&self) -> TaskTrackerToken {
        self.tracker.token()
    }

    /// How much tracked work is still running.
    pub fn in_flight(&self) -> usize {
        self.tracker.len()
    }

    /// Waits until the lifecycle is closed and no tracked work is left. Cancel safe.
    pub async fn wait(&self) {
        self.tracker.wait().await;
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn wait_covers_work_started_just_before_close() {
        let lifecycle = Lifecycle::new();
        let done = Arc::new(AtomicBool::new(false));
        let flag = done.clone();
        let spawned = lifecycle.spawn(async move {
            tokio::time::sleep(Duration::from_millis(50)).await;
            flag.store(true, Ordering::SeqCst);
        });
        assert!(spawned.is_some());
        lifecycle.close();
        lifecycle.wait().await;
        assert!(
            done.load(Ordering::SeqCst),
            "nothing runs after wait returns"
        );
        assert_eq!(lifecycle.in_flight(), 0);
    }

    #[tokio::test]
    async fn closing_wakes_everyone_once_closed() {
        let lifecycle = Lifecycle::new();
        let watcher = lifecycle.clone();
        let woken = tokio::spawn(async move { watcher.closing().await });
        tokio::task::yield_now().await;
        assert!(!lifecycle.is_closing());
        lifecycle.close();
        tokio::time::timeout(Duration::from_secs(5), woken)
            .await
            .expect("woken by close")
            .unwrap();
        lifecycle.closing().await; // already closed: at once
    }

    #[tokio::test]
    async fn tracked_foreground_work_holds_wait_until_dropped() {
        let lifecycle = Lifecycle::new();
        let token = lifecycle.track();
        lifecycle.close();
        let waiting = lifecycle.clone();
        let wait = tokio::spawn(async move { waiting.wait().await });
        tokio::task::yield_now().await;
        assert!(!wait.is_finished());
        drop(token);
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("wait ends when the token is dropped")
            .unwrap();
    }

    #[test]
    fn spawn_outside_a_runtime_says_so() {
        assert!(Lifecycle::new().spawn(async {}).is_none());
    }
}
