//! What guards and renewal tasks keep of their manager: the layered store, the observers, the
//! local waiters to wake, and the lifecycle their background work is tracked by.
//!
//! A small handle instead of the whole manager, so `guard` and `renewal` depend on this module
//! only and the manager depends on them, never the other way round.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::core::{BoxStore, Lease, Lifecycle, LockEvent, LockStore, Observers, Result};
use crate::failover::Retry;
use crate::schedule::Schedule;
use crate::waiters::Waiters;

/// Shared by a manager and every guard and renewal task it hands out.
#[derive(Debug)]
pub(crate) struct Handle {
    pub(crate) store: BoxStore,
    pub(crate) observers: Observers,
    pub(crate) waiters: Waiters,
    pub(crate) lifecycle: Lifecycle,
    /// The watchdog's renewals not due yet (see [`crate::renewal`]).
    pub(crate) renewals: Arc<Schedule>,
    /// How a down store is retried (see [`crate::failover`]).
    pub(crate) retry: Retry,
    /// The margin of this stack's unlock window, if it has one: a lock whose TTL is not longer
    /// would have every release skipped, so such a call is refused before it is sent.
    pub(crate) unlock_margin: Option<Duration>,
}

impl Handle {
    /// Refuses a lease TTL the stack's unlock window cannot work with: a window whose margin is
    /// not shorter than the lease closes before the lock is taken, so every release of it would
    /// be skipped, leaving the lock until it expires.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<()> {
        match self.unlock_margin {
            Some(margin) if margin >= ttl => Err(crate::core::Error::invalid_argument(format!(
                "the TTL ({ttl:?}) is not longer than the unlock window's margin ({margin:?}): \
                 the window would close before the lock is taken and every release would be \
                 skipped, leaving the lock until it expires; ask for a longer TTL or narrow the \
                 margin (UnlockWindowLayer::margin, or layers.unlock_window.margin in a scenario)"
            ))),
            _ => Ok(()),
        }
    }

    /// Releases `lease` through the whole stack in a tracing span, wakes this process's waiters
    /// on its key, and reports the outcome.
    pub(crate) async fn release(&self, lease: &Lease, scenario: &Arc<str>) -> Result<bool> {
        crate::observe::in_scenario(scenario.clone(), self.release_in_scenario(lease, scenario))
            .await
    }

    async fn release_in_scenario(&self, lease: &Lease, scenario: &str) -> Result<bool> {
        let span = tracing::info_span!(
            "leasehold.release",
            key = %lease.key(),
            store = self.store.name(),
            scenario,
            outcome = tracing::field::Empty,
        );
        let result = self.store.release(lease).instrument(span.clone()).await;
        span.record(
            "outcome",
            match &result {
                Ok(true) => "released",
                Ok(false) => "not_held",
                Err(e) => e.kind().as_str(),
            },
        );
        // The head of this process's line may take the key now (or the lease, handed off),
        // unless the store granted it while other processes queued: the store names the next
        // one, and this process's turn comes after theirs.
        if !lease.is_contended() {
            self.waiters.wake(lease.key());
        }
        if let Ok(was_held) = result {
            self.observers.emit(|| LockEvent::Released {
                key: lease.key().clone(),
                held_for: lease.acquired_at().elapsed(),
                was_held,
            });
        }
        result
    }

    /// Sends an owner-checked release of `lease` straight to the store in the background, as a
    /// task the lifecycle tracks (a shutdown waits for it). `why` says, in the logs, whose lease
    /// it was. Outside a runtime nothing can be sent: logged, and the lock expires at its TTL.
    pub(crate) fn release_in_background(&self, lease: Lease, why: &'static str) {
        let store = self.store.clone();
        let key = lease.key().clone();
        let spawned = self.lifecycle.spawn(async move {
            match store.release(&lease).await {
                Ok(true) => tracing::debug!(key = %lease.key(), why, "released in the background"),
                Ok(false) => {}
                Err(error) => tracing::warn!(key = %lease.key(), error = %error.chain(), why,
                    "a background release failed; if the lock was taken, it expires at its TTL"),
            }
        });
        if spawned.is_none() {
            tracing::warn!(%key, why, "no tokio runtime to release on; the lock expires at its TTL");
        }
    }

    /// Releases a guard's lease the library gave up itself (an extend answered too late), and
    /// wakes this process's waiters on its key as the guard's release would have: the guard's
    /// own release then sends nothing ([`LeaseState::give_up`](crate::renewal::LeaseState)).
    pub(crate) async fn release_given_up(&self, lease: &Lease, why: &'static str) {
        match self.store.release(lease).await {
            Ok(true) => tracing::debug!(key = %lease.key(), why, "given up and released"),
            Ok(false) => {}
            Err(error) => tracing::warn!(key = %lease.key(), error = %error.chain(), why,
                "releasing a lease given up failed; the lock expires at its TTL"),
        }
        if !lease.is_contended() {
            self.waiters.wake(lease.key());
        }
    }

    /// [`Handle::release_given_up`] in the background, as a task the lifecycle tracks.
    pub(crate) fn release_given_up_in_background(
        self: &Arc<Self>,
        lease: Lease,
        why: &'static str,
    ) {
        let handle = self.clone();
        let key = lease.key().clone();
        let spawned = self
            .lifecycle
            .spawn(async move { handle.release_given_up(&lease, why).await });
        if spawned.is_none() {
            tracing::warn!(%key, why, "no tokio runtime to release on; the lock expires at its TTL");
        }
    }
}
