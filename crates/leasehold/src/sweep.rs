//! Background sweeps: the embedded store and shutdown tracking each reclaim expired or unused
//! entries every so often, without anyone having to touch the key again. (Local competition
//! needs none: its moka cache expires entries by itself.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// Starts one periodic sweep task for a shared structure, lazily: on the first call made inside
/// a tokio runtime (a structure can be built outside one).
#[derive(Debug, Default)]
pub(crate) struct Sweeper {
    /// Whether a sweep task is alive. Cleared again when the task is dropped (its runtime shut
    /// down), so a structure that outlives one runtime is swept from the next one.
    running: Arc<AtomicBool>,
}

/// Held by the sweep task; clears [`Sweeper::running`] when the task ends or is dropped.
struct Running(Arc<AtomicBool>);

impl Drop for Running {
    fn drop(&mut self) {
        // A task that panicked (a runtime built without `enable_time` has no timer) is not
        // restarted: it would panic again on every call. Entries are then reclaimed only when
        // touched, as expiry is checked on every access anyway.
        if !std::thread::panicking() {
            self.0.store(false, Ordering::Release);
        }
    }
}

impl Sweeper {
    /// Calls `sweep(target, now)` (which returns how many entries it removed) every `every`
    /// from a task on the current runtime, started on the first call; outside a runtime it tries
    /// again at the next call. The task holds only a weak reference, so it ends once `target` is
    /// dropped. Once started, this is one relaxed load.
    pub(crate) fn ensure<T: Send + Sync + 'static>(
        &self,
        target: &Arc<T>,
        every: Duration,
        sweep: fn(&T, Instant) -> usize,
    ) {
        if self.running.load(Ordering::Relaxed) || self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let running = Running(self.running.clone());
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // `running` is dropped: the next call tries again.
        };
        let weak: Weak<T> = Arc::downgrade(target);
        runtime.spawn(async move {
            let _running = running;
            let mut ticker = tokio::time::interval(every);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let Some(target) = weak.upgrade() else { break };
                sweep(&target, Instant::now());
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;

    use super::*;

    #[derive(Default)]
    struct Target {
        sweeper: Sweeper,
        sweeps: AtomicUsize,
    }

    fn count(target: &Target, _: Instant) -> usize {
        target.sweeps.fetch_add(1, Ordering::Relaxed);
        0
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    #[test]
    fn outside_a_runtime_nothing_starts_and_the_next_call_retries() {
        let target = Arc::new(Target::default());
        target
            .sweeper
            .ensure(&target, Duration::from_secs(1), count);
        assert!(!target.sweeper.running.load(Ordering::Acquire));
        runtime().block_on(async {
            target
                .sweeper
                .ensure(&target, Duration::from_secs(1), count);
            tokio::time::sleep(Duration::from_millis(3500)).await;
        });
        assert_eq!(target.sweeps.load(Ordering::Relaxed), 3);
    }

    #[test]
    fn a_sweep_whose_runtime_shut_down_starts_again_on_the_next_runtime() {
        let target = Arc::new(Target::default());
        for _ in 0..2 {
            runtime().block_on(async {
                target
                    .sweeper
                    .ensure(&target, Duration::from_secs(1), count);
                target
                    .sweeper
                    .ensure(&target, Duration::from_secs(1), count);
                tokio::time::sleep(Duration::from_millis(2500)).await;
            });
        }
        // Two sweeps per runtime, one task per runtime (the second `ensure` started nothing).
        assert_eq!(target.sweeps.load(Ordering::Relaxed), 4);
        assert!(!target.sweeper.running.load(Ordering::Acquire));
    }

    #[test]
    fn a_runtime_without_timers_gets_one_failed_sweep_not_one_per_call() {
        let target = Arc::new(Target::default());
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        runtime.block_on(async {
            for _ in 0..3 {
                target
                    .sweeper
                    .ensure(&target, Duration::from_secs(1), count);
                tokio::task::yield_now().await;
            }
        });
        assert!(
            target.sweeper.running.load(Ordering::Acquire),
            "not restarted"
        );
        assert_eq!(target.sweeps.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn the_task_ends_once_its_target_is_dropped() {
        let target = Arc::new(Target::default());
        let running = target.sweeper.running.clone();
        runtime().block_on(async {
            target
                .sweeper
                .ensure(&target, Duration::from_secs(1), count);
            assert!(running.load(Ordering::Acquire));
            drop(target);
            tokio::time::sleep(Duration::from_millis(2500)).await;
            assert!(!running.load(Ordering::Acquire), "task still running");
        });
    }
}
