//! What guards and renewal tasks keep of their manager: the layered store, the observers, the
//! local waiters to wake, and the lifecycle their background work is tracked by.
//!
//! A small handle instead of the whole manager, so `guard` and `renewal` depend on this module
//! only and the manager depends on them, never the other way round.

use std::sync::Arc;
use std::time::Duration;

use tracing::Instrument;

use crate::core::{BoxStore, Lease, Lifecycle, LockEvent, LockKey, LockStore, Observers, Result};
use crate::failover::Retry;
use crate::scenario::LayerStack;
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
    /// The layers of this stack, with their configuration: what in them depends on a lock's TTL
    /// is checked against a TTL given with a call ([`Handle::check_ttl`]).
    pub(crate) layers: LayerStack,
}

impl Handle {
    /// Refuses a lease TTL this stack's layers cannot work with (an unlock window not shorter
    /// than the lease would skip every release of it), as the builder does for the manager's and
    /// the scenarios' TTLs.
    pub(crate) fn check_ttl(&self, ttl: Duration) -> Result<()> {
        self.layers.check_ttl(ttl).map_err(|(field, why)| {
            crate::core::Error::invalid_argument(format!(
                "{}: {why}; ask for a longer TTL, or narrow the margin",
                field.trim_start_matches("layers.")
            ))
        })
    }

    /// Releases `lease` through the whole stack in a tracing span, wakes this process's waiters
    /// on its key, and reports the outcome. Called in the lease's scenario (a guard's release
    /// runs in it), which its events carry.
    pub(crate) async fn release(&self, lease: &Lease, scenario: &str) -> Result<bool> {
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
        self.spawn_release(&key, why, async move {
            release_logged(&store, &lease, why).await;
        });
    }

    /// Releases a guard's lease the library gave up itself (an extend answered too late), and
    /// wakes this process's waiters on its key as the guard's release would have: the guard's
    /// own release then sends nothing ([`LeaseState::give_up`](crate::renewal::LeaseState)).
    pub(crate) async fn release_given_up(&self, lease: &Lease, why: &'static str) {
        release_logged(&self.store, lease, why).await;
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
        self.spawn_release(&key, why, async move {
            handle.release_given_up(&lease, why).await;
        });
    }

    /// Runs a release of `key` as a task the lifecycle tracks, in the caller's scenario (a task
    /// does not inherit it: the release's events would read `default`); outside a runtime, says
    /// the lock expires at its TTL.
    fn spawn_release(
        &self,
        key: &LockKey,
        why: &'static str,
        release: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        if self
            .lifecycle
            .spawn(crate::observe::keeping_scenario(release))
            .is_none()
        {
            tracing::warn!(%key, why, "no tokio runtime to release on; the lock expires at its TTL");
        }
    }
}

/// An owner-checked release of `lease` through `store`, its outcome logged (`why`: whose lease
/// it was).
async fn release_logged(store: &BoxStore, lease: &Lease, why: &'static str) {
    match store.release(lease).await {
        Ok(true) => tracing::debug!(key = %lease.key(), why, "released in the background"),
        Ok(false) => {}
        Err(error) => tracing::warn!(key = %lease.key(), error = %error.chain(), why,
            "a background release failed; if the lock was taken, it expires at its TTL"),
    }
}
