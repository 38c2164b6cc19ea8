//! Bounding requests in flight without a timer for each.
//!
//! Every request sent to one member is bounded by the member timeout. The client's own
//! per-request timeout (tonic's) sets a tokio timer per request, and a timer whose deadline comes
//! before every other the runtime holds wakes the runtime's driver when it is set: an `eventfd`
//! write, and a worker woken to wait again with the new deadline. On a store with no other timer
//! due sooner that is about one wake-up per request (counted with a probe on mio's waker), 2–3 %
//! of an uncontended lock cycle on loopback.
//!
//! Here one ticker task per store wakes the requests in flight every [`TICKS_PER_TIMEOUT`]th of
//! the timeout, and each looks at its own deadline. A request's bound is its timeout plus at most
//! one tick. While the ticker runs its own timer is always due within one tick, so a timer due
//! later (a hedge's, with the default timeout) does not wake the driver either.
//!
//! The ticker runs on the runtime of the request that started it. A request on another runtime
//! (a store shared between runtimes) sets a timer of its own, since the ticker's runtime may not
//! be running while it waits. If the ticker's runtime shuts down, the ticker's end wakes the
//! requests in flight, and the next to look starts a new one on its own runtime.

use std::future::Future;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use tokio::runtime::{Handle, Id};
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
    /// The runtime the ticker runs on, while it runs.
    ticker: Mutex<Option<Id>>,
}

/// Where the ticker runs, seen from a request's runtime.
enum Ticker {
    /// On this runtime: the request waits for its ticks.
    Here,
    /// On another runtime, which may not be running this one's tasks: the request sets a timer
    /// of its own.
    Elsewhere,
}

impl Deadlines {
    /// Deadlines `timeout` after each request starts.
    pub(crate) fn new(timeout: Duration) -> Self {
        Deadlines {
            timeout,
            shared: Arc::new(Shared::default()),
        }
    }

    /// How long a request may take (it may run up to a tick more).
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
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
        let Ok(runtime) = Handle::try_current() else {
            // Outside a runtime no timer can run, and the client cannot send either.
            return std::future::pending().await;
        };
        loop {
            // Made before the look, so a tick between the two is not missed: `notify_waiters`
            // reaches every `Notified` made before it, polled or not.
            let tick = self.shared.tick.notified();
            if Instant::now() >= deadline {
                return;
            }
            match self.ticker_on(&runtime) {
                Ticker::Here => tick.await,
                Ticker::Elsewhere => return tokio::time::sleep_until(deadline).await,
            }
        }
    }

    /// Where the ticker runs; started on `runtime` if none runs.
    fn ticker_on(&self, runtime: &Handle) -> Ticker {
        {
            let mut ticker = self
                .shared
                .ticker
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            match *ticker {
                Some(id) if id == runtime.id() => return Ticker::Here,
                Some(_) => return Ticker::Elsewhere,
                None => *ticker = Some(runtime.id()),
            }
        }
        // Made before the task, so that it runs even if the task is dropped unpolled; spawned
        // with the lock released, as a runtime shutting down drops the task (and runs `Ended`,
        // which takes the lock) within `spawn`.
        let ended = Ended(Arc::downgrade(&self.shared));
        let every = (self.timeout / TICKS_PER_TIMEOUT).max(Duration::from_millis(1));
        let task = runtime.spawn(tick(Arc::downgrade(&self.shared), every, ended));
        if task.is_finished() {
            // Dropped at once: this runtime is shutting down. A timer of the request's own
            // bounds it meanwhile, rather than starting tickers that end as they start.
            return Ticker::Elsewhere;
        }
        Ticker::Here
    }
}

/// Wakes the requests in flight every `every`, while their store lives.
async fn tick(shared: Weak<Shared>, every: Duration, _ended: Ended) {
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

/// Runs when the ticker's task ends, however it ends (with its store, or dropped with its
/// runtime, polled or not): marks the ticker stopped and wakes the requests in flight, so the
/// next to look starts another.
struct Ended(Weak<Shared>);

impl Drop for Ended {
    fn drop(&mut self) {
        if let Some(shared) = self.0.upgrade() {
            *shared.ticker.lock().unwrap_or_else(PoisonError::into_inner) = None;
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

    /// Bounds a request that never answers on the current runtime, and checks it ends within a
    /// tick of its timeout.
    async fn never_answers_within_a_tick(deadlines: &Deadlines) {
        let started = Instant::now();
        // A request left unbounded fails here rather than hanging the test.
        let bounded =
            tokio::time::timeout(2 * TIMEOUT, deadlines.bound(std::future::pending::<()>()))
                .await
                .expect("the request was never bounded");
        assert_eq!(bounded, None);
        let took = started.elapsed();
        assert!(took >= TIMEOUT, "ended early: {took:?}");
        assert!(
            took <= TIMEOUT + TIMEOUT / TICKS_PER_TIMEOUT,
            "ended late: {took:?}"
        );
    }

    /// A runtime of its own, on paused time.
    fn paused_runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .start_paused(true)
            .build()
            .unwrap()
    }

    /// Starts the ticker on `runtime` with a request that answers after a quarter of the timeout.
    fn start_ticker_on(runtime: &tokio::runtime::Runtime, deadlines: &Deadlines) {
        runtime.block_on(async {
            let quick = tokio::time::sleep(TIMEOUT / 4);
            assert_eq!(deadlines.bound(quick).await, Some(()));
        });
    }

    #[tokio::test(start_paused = true)]
    async fn a_request_that_never_answers_ends_within_a_tick_of_its_timeout() {
        never_answers_within_a_tick(&Deadlines::new(TIMEOUT)).await;
    }

    #[test]
    fn a_ticker_lost_with_its_runtime_is_started_again_on_the_next() {
        let deadlines = Deadlines::new(TIMEOUT);
        let first = paused_runtime();
        start_ticker_on(&first, &deadlines);
        drop(first);
        assert!(deadlines.shared.ticker.lock().unwrap().is_none());
        paused_runtime().block_on(never_answers_within_a_tick(&deadlines));
    }

    #[test]
    fn a_request_on_another_runtime_than_the_tickers_sets_its_own_timer() {
        let deadlines = Deadlines::new(TIMEOUT);
        // The ticker's runtime lives on, but runs nothing while the other one waits.
        let idle = paused_runtime();
        start_ticker_on(&idle, &deadlines);
        assert!(deadlines.shared.ticker.lock().unwrap().is_some());
        paused_runtime().block_on(never_answers_within_a_tick(&deadlines));
        drop(idle);
    }
}
