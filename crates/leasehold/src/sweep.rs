//! Background sweeps: the embedded store, shutdown tracking and local competition each reclaim
//! expired or unused entries every so often, without anyone having to touch the key again.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

/// Starts one periodic sweep task for a shared structure, lazily: on the first call made inside
/// a tokio runtime (a structure can be built outside one).
#[derive(Debug, Default)]
pub(crate) struct Sweeper {
    started: AtomicBool,
}

impl Sweeper {
    /// Calls `sweep(target, now)` (which returns how many entries it removed) every `every` from a task on the current runtime, started on the
    /// first call; outside a runtime it tries again at the next call. The task holds only a weak
    /// reference, so it ends once `target` is dropped. One relaxed load once started.
    pub(crate) fn ensure<T: Send + Sync + 'static>(
        &self,
        target: &Arc<T>,
        every: Duration,
        sweep: fn(&T, Instant) -> usize,
    ) {
        if self.started.load(Ordering::Relaxed) || self.started.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            self.started.store(false, Ordering::Release);
            return;
        };
        let weak: Weak<T> = Arc::downgrade(target);
        runtime.spawn(async move {
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
