//! Bounding requests in flight without a timer for each.
//!
//! Every request sent to one member is bounded by the member timeout. The client's own
//! per-request timeout (tonic's) sets a tokio timer per request, and a timer whose deadline comes
//! before every other the runtime holds wakes the runtime's driver when it is set: an `eventfd`
//! write, and a worker woken to wait again with the new deadline. A store with no other timer due
//! sooner paid that on every request, about one wake-up per request (counted with a probe on
//! mio's waker): 2–3 % of an uncontended lock cycle on loopback.
//!
//! Here one ticker task per store wakes the requests in flight every [`TICKS_PER_TIMEOUT`]th of
//! the timeout, and each looks at its own deadline. A request's bound is its timeout plus at most
//! one tick. While the ticker runs its own timer is always due within one tick, so a timer due
//! later (a hedge's, with the default timeout) does not wake the driver either.
//!
//! The ticker runs on the runtime of the request that started it. If that runtime shuts down
//! (a store shared between runtimes), the ticker's end wakes the requests in flight, and the next
//! to look starts a new one on its own runtime.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::{Instant, MissedTickBehavior};

/// How many times per timeout the ticker wakes the requests in flight: a request may run up to
/// this fraction of the timeout past it.
pub(crate) const TICKS_PER_TIMEOUT: u32 = 8;

/// The deadlines of one store's requests, kept by one ticker.
#[derive(Debug)]
pub(crate) struct Deadlines {
    timeout: Duration,
    shared: Arc<Shared>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Notified every tick, and when the ticker ends.
    tick: Notify,
    /// A ticker is running (or being started).
    ticking: AtomicBool,
}

impl Deadlines {
    /// Deadlines `timeout` after each request starts.
    pub(crate) fn new(timeout: Duration) -> Self {
        Deadlines {
            timeout,
            shared: Arc::new(Shared::default()),
        }
    }

    /// `request`'s output, or `None` if it did not finish within the timeout (plus at most one
    /// tick). The request is dropped then, as a timer's timeout would drop it.
    pub(crate) async fn bound<F: Future>(&self, request: F) -> Option<F::Output> {
        let deadline = Instant::now() + self.timeout;
        tokio::select! {
            biased;
            output = request => Some(output),
            () = self.passed(deadline) => None,
        }
    }

    /// Resolves at the first tick at or after `deadline`.
    async fn passed(&self, deadline: Instant) {
        loop {
            // Made before the look, so a tick between the two is not missed: `notify_waiters`
            // reaches every `Notified` made before it, polled or not.
            let tick = self.shared.tick.notified();
            if Instant::now() >= deadline {
                return;
            }
            self.start_ticker();
            tick.await;
        }
    }

    /// Starts the ticker on the current runtime unless one runs.
    fn start_ticker(&self) {
        if self.shared.ticking.swap(true, Ordering::AcqRel) {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // Only reachable from a request polled outside a runtime, which the client cannot
            // send anyway; the next look tries again.
            self.shared.ticking.store(false, Ordering::Release);
            return;
        };
        let every = (self.timeout / TICKS_PER_TIMEOUT).max(Duration::from_millis(1));
        runtime.spawn(tick(Arc::downgrade(&self.shared), every));
    }
}

/// Wakes the requests in flight every `every`, while their store lives.
async fn tick(shared: Weak<Shared>, every: Duration) {
    // Runs when this task ends, however it ends: with its store, or dropped with its runtime.
    let _ended = Ended(shared.clone());
    let mut ticks = tokio::time::interval_at(Instant::now() + every, every);
    ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        shared.tick.notify_waiters();
    }
}

/// Marks the ticker stopped and wakes the requests in flight, so the next look starts another.
struct Ended(Weak<Shared>);

impl Drop for Ended {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade() {
            shared.ticking.store(false, Ordering::Release);
            shared.tick.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(2);

    #[tokio::test(start_paused = true)]
    async fn a_request_that_answers_is_not_bounded() {
        let deadlines = Deadlines::new(TIMEOUT);
        assert_eq!(deadlines.bound(async { 7 }).await, Some(7));
        let slow = async {
            tokio::time::sleep(TIMEOUT / 2).await;
            8
        };
        assert_eq!(deadlines.bound(slow).await, Some(8));
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_never_answers_ends_within_a_tick_of_its_timeout() {
        let deadlines = Deadlines::new(TIMEOUT);
        let started = Instant::now();
        assert_eq!(deadlines.bound(std::future::pending::<()>()).await, None);
        let took = started.elapsed();
        assert!(took >= TIMEOUT, "ended early: {took:?}");
        assert!(
            took <= TIMEOUT + TIMEOUT / TICKS_PER_TIMEOUT,
            "ended late: {took:?}"
        );
    }

    #[test]
    fn a_ticker_lost_with_its_runtime_is_started_again_on_the_next() {
        let deadlines = Deadlines::new(TIMEOUT);
        let paused = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .start_paused(true)
                .build()
                .unwrap()
        };
        // The first request starts the ticker on this runtime, which then goes away with it.
        let first = paused();
        first.block_on(async {
            let quick = async {
                tokio::time::sleep(TIMEOUT / 4).await;
            };
            assert_eq!(deadlines.bound(quick).await, Some(()));
        });
        drop(first);
        assert!(!deadlines.shared.ticking.load(Ordering::Acquire));
        // A request on another runtime is still bounded.
        paused().block_on(async {
            let started = Instant::now();
            assert_eq!(deadlines.bound(std::future::pending::<()>()).await, None);
            assert!(started.elapsed() <= TIMEOUT + TIMEOUT / TICKS_PER_TIMEOUT);
        });
    }
}
