//! Riding out a store failover: which store errors are temporary, how long each operation retries
//! them, and the layer that retries releases.
//!
//! A store in the middle of a failover (connection refused or reset, no node for a partition, a
//! leader election, `READONLY`, `TRYAGAIN`, `CLUSTERDOWN`) answers with
//! [`ErrorKind::Connection`], [`ErrorKind::RetriesExhausted`] or [`ErrorKind::InDoubt`]: the
//! stores map those answers so (see `leasehold_core::error`). Each operation retries them with
//! the manager's jittered backoff ([`LockManagerBuilder::min_backoff`] up to
//! [`LockManagerBuilder::retry_interval`]) within its own budget:
//!
//! | operation | budget | when it runs out |
//! |---|---|---|
//! | blocking acquire (`lock`) | the caller's wait | the last store error (a refusal last: `Timeout`) |
//! | try-lock | none: one attempt | that attempt's error, at once |
//! | release (every path: a guard's, a dropped guard's, an undo) | until the lease expires, at most [`LockManagerBuilder::release_retry`] | an error saying the lock is left to expire, and [`LockEvent::LeftToExpire`] (also for an error retrying cannot cure, returned at once) |
//! | [`LockGuard::extend`](crate::LockGuard::extend) | until the lease expires, at most the release budget | the last store error |
//! | renewal | until the lease expires | the guard is marked lost |
//!
//! The acquire's retries live in the manager's wait loop (which owns the wait), renewal's in its
//! task; releases are retried by [`Failover`], a layer directly above the store (and its readback
//! layer), so every layer above it sees one outcome per release: their own bookkeeping (a
//! reentrant count, a local hand-off's store token) is never replayed.
//!
//! Retrying is safe: every acquire attempt has a fresh owner token (an attempt in doubt is undone
//! by an owner-checked release of that token), and releases and extends are owner-checked. A
//! release that reaches the store after an earlier attempt was in doubt and finds the lock gone
//! reports `true` while the lease cannot have expired yet (our earlier delete removed it), as the
//! readback layer does.
//!
//! [`LockManagerBuilder::min_backoff`]: crate::LockManagerBuilder::min_backoff
//! [`LockManagerBuilder::retry_interval`]: crate::LockManagerBuilder::retry_interval
//! [`LockManagerBuilder::release_retry`]: crate::LockManagerBuilder::release_retry

use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::Backoff;
use crate::core::{
    instant_after, Error, ErrorKind, Lease, LockEvent, LockStore, Observers, Result,
};

/// Whether an error means the store could not be reached or answer for now (what a failover
/// looks like, and what `on_store_down` is about): a connection failure, a store's retries
/// exhausted, or an outcome left in doubt. Retrying later can succeed.
pub(crate) fn is_store_down(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Connection | ErrorKind::RetriesExhausted | ErrorKind::InDoubt
    )
}

/// Whether a failed write may still have been applied: its outcome is in doubt, or the readback
/// layer gave up on an in-doubt write (retries exhausted, the in-doubt error as its cause) — a
/// write delayed past its readback can still land. Such an acquire attempt is undone.
pub(crate) fn may_have_applied(error: &Error) -> bool {
    match error.kind() {
        ErrorKind::InDoubt => true,
        ErrorKind::RetriesExhausted => std::error::Error::source(error)
            .and_then(|cause| cause.downcast_ref::<Error>())
            .is_some_and(Error::is_in_doubt),
        _ => false,
    }
}

/// How the manager retries a store that is down: the backoff between attempts, and the longest a
/// release (or an explicit extend) keeps trying.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Retry {
    backoff: Backoff,
    release_budget: Duration,
}

impl Retry {
    pub(crate) fn new(backoff: Backoff, release_budget: Duration) -> Self {
        Retry {
            backoff,
            release_budget,
        }
    }

    /// The pause before the next attempt after `failures` consecutive store failures (from 1).
    pub(crate) fn delay(&self, failures: u32) -> Duration {
        self.backoff.delay(failures)
    }

    /// When an operation on `lease` started `now` stops retrying: when the lease expires (after
    /// that the lock is the store's to let go, and nothing we send can matter), at most the
    /// release budget from now.
    pub(crate) fn give_up_at(&self, lease: &Lease, now: Instant) -> Instant {
        lease
            .expires_at()
            .min(instant_after(now, self.release_budget))
    }

    /// The pause before trying again, or `None` if the next attempt would not start before
    /// `give_up_at`.
    fn pause(&self, failures: u32, give_up_at: Instant) -> Option<Duration> {
        let pause = self.delay(failures);
        (instant_after(Instant::now(), pause) < give_up_at).then_some(pause)
    }
}

/// Retries releases that meet a down store (see the [module docs](self)); everything else
/// passes through. Directly above the store and its readback layer.
#[derive(Debug)]
pub(crate) struct Failover<S> {
    inner: S,
    retry: Retry,
    observers: Observers,
}

impl<S> Failover<S> {
    pub(crate) fn new(inner: S, retry: Retry, observers: Observers) -> Self {
        Failover {
            inner,
            retry,
            observers,
        }
    }

    /// Reports a release that gave up with the lock possibly still held under our token: the
    /// caller of an explicit release gets the error too, but a dropped guard's or an undo's has
    /// no caller, and this event is how it is seen.
    fn left_to_expire(&self, lease: &Lease, error: &Error, attempts: u32) {
        self.observers.emit(|| LockEvent::LeftToExpire {
            key: lease.key().clone(),
            error: error.kind(),
            expires_in: lease.remaining(),
            attempts,
        });
    }
}

impl<S: LockStore> crate::core::LayeredStore for Failover<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let started = Instant::now();
        let give_up_at = self.retry.give_up_at(lease, started);
        let mut attempts = 0u32;
        // An earlier attempt may have deleted the record (sent, reply lost).
        let mut was_in_doubt = false;
        loop {
            attempts += 1;
            let error = match self.inner.release(lease).await {
                // Gone after one of our deletes was in doubt: if the lease cannot have expired
                // yet, that delete is what removed it.
                Ok(false) if was_in_doubt => return Ok(Instant::now() < lease.expires_at()),
                Ok(released) => {
                    if attempts > 1 {
                        tracing::info!(key = %lease.key(), attempts,
                            "release went through once the store was back");
                    }
                    return Ok(released);
                }
                Err(error) if is_store_down(error.kind()) => error,
                Err(error) => {
                    // Retrying cannot cure it (a permission refused, an unexpected reply): the
                    // lock may be held still, and is left to its TTL all the same.
                    tracing::warn!(key = %lease.key(), error = %error.chain(), attempts,
                        "could not release; the lock is left to expire at its TTL");
                    self.left_to_expire(lease, &error, attempts);
                    return Err(error);
                }
            };
            was_in_doubt |= error.kind() != ErrorKind::Connection;
            if let Some(pause) = self.retry.pause(attempts, give_up_at) {
                tracing::debug!(key = %lease.key(), error = %error.chain(), attempts, ?pause,
                    "release met a down store; retrying");
                tokio::time::sleep(pause).await;
                continue;
            }
            let expires_in = lease.remaining();
            tracing::warn!(key = %lease.key(), error = %error.chain(), attempts, ?expires_in,
                "could not release: the store stayed down; the lock is left to expire at its TTL");
            self.left_to_expire(lease, &error, attempts);
            return Err(Error::new(
                error.kind(),
                format!(
                    "could not release: the store stayed down for {:?} ({attempts} attempts); \
                     the lock is left to expire in {expires_in:?}",
                    started.elapsed()
                ),
            )
            .with_key(lease.key().as_str())
            .with_source(error));
        }
    }
}

/// Extends `lease` by `ttl` through `store`, retrying a down store until the lease expires (at
/// most the release budget): an explicit [`LockGuard::extend`](crate::LockGuard::extend). Other
/// errors, and the last store error once the budget is spent, are returned as they are.
pub(crate) async fn extend<S: LockStore>(
    store: &S,
    retry: &Retry,
    lease: &Lease,
    ttl: Duration,
) -> Result<Lease> {
    let give_up_at = retry.give_up_at(lease, Instant::now());
    let mut attempts = 0u32;
    loop {
        attempts += 1;
        match store.extend(lease, ttl).await {
            Err(error) if is_store_down(error.kind()) => match retry.pause(attempts, give_up_at) {
                Some(pause) => {
                    tracing::debug!(key = %lease.key(), error = %error.chain(), attempts, ?pause,
                        "extend met a down store; retrying");
                    tokio::time::sleep(pause).await;
                }
                None => return Err(error),
            },
            done => return done,
        }
    }
}

#[cfg(test)]
mod tests;
