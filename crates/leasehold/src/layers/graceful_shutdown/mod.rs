//! Graceful shutdown (Bond 3.5): track every live lock and release them all when the process
//! stops, so a restart does not leave locks held until their TTL.
//!
//! # What it guarantees
//! Every lease acquired through the layer is tracked (key → lease: token and expiry) until it is
//! released or expires; a background task purges expired entries every
//! [`GracefulShutdownLayer::purge_interval`]. [`LockStore::shutdown`] on this layer — which
//! [`LockManager::shutdown`](crate::LockManager::shutdown) calls after new acquisitions stopped and
//! in-flight ones finished — releases every still-live tracked lock through the layers below
//! (unlock window, readback, store), concurrently, within [`GracefulShutdownLayer::deadline`],
//! emits [`LockEvent::ReleasedAtShutdown`] for each, then shuts the inner store down. It returns
//! how many locks were released, or an error naming those it could not release (the store failed
//! them, or did not answer by the deadline), which stay in the store until their TTL. After
//! shutdown the layer refuses new acquisitions ([`ErrorKind::ShutDown`]); an acquisition that was
//! in flight and lands after the sweep is released at once.
//!
//! With the `signal` feature, [`LockManager::install_signal_handler`] runs the same shutdown on
//! SIGINT/SIGTERM.
//!
//! Bond's constraints hold: only this process's own locks are released, synchronously at shutdown;
//! a guard still alive afterwards finds its lock gone (its release answers `Ok(false)`).
//! Most useful with TTLs long enough (Bond: over 15 s) that waiting them out after a restart hurts.
//!
//! # Where it belongs
//! Below local competition (so it sees each real store lease exactly once: local hand-offs and
//! reentrant levels share one store lease), above the unlock window and readback (so a shutdown
//! release is window-checked and its in-doubt reply read back).
//!
//! # Cost
//! One concurrent-map insert per acquisition and one remove per release; a purge sweep per
//! interval.
//!
//! [`LockManager::install_signal_handler`]: crate::LockManager

use std::sync::atomic::{fence, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::core::{
    instant_after, Acquire, Attempt, Error, ErrorKind, Layer, Lease, Lifecycle, LockEvent,
    LockStore, Observers, OwnerToken, Result,
};
use crate::sweep::Sweeper;

use super::wiring::{WiredLayer, Wiring};

/// Default time the shutdown sweep may take to release every live lock.
pub const DEFAULT_SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);
/// Default interval of the purge of expired entries.
pub const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(1);

/// The graceful-shutdown layer: its configuration, and the [`Layer`] that wraps a store in
/// [`GracefulShutdown`].
///
/// ```
/// use std::time::Duration;
/// use leasehold::layers::GracefulShutdownLayer;
/// let layer = GracefulShutdownLayer::new().deadline(Duration::from_secs(2));
/// assert_eq!(layer.deadline, Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct GracefulShutdownLayer {
    /// How long the release sweep may take. Locks not released by then expire at their TTL, and
    /// the shutdown's error names them.
    /// Default [`DEFAULT_SHUTDOWN_DEADLINE`].
    pub deadline: Duration,
    /// How often expired entries are purged. Default [`DEFAULT_PURGE_INTERVAL`].
    pub purge_interval: Duration,
    /// The exit status a signal-triggered shutdown reports for the process
    /// (`SignalShutdown::exit_code`, with the `signal` feature). Default 130 (128 + SIGINT;
    /// `ctrlc` does not say whether SIGINT or SIGTERM arrived).
    pub exit_code: i32,
}

impl Default for GracefulShutdownLayer {
    fn default() -> Self {
        GracefulShutdownLayer {
            deadline: DEFAULT_SHUTDOWN_DEADLINE,
            purge_interval: DEFAULT_PURGE_INTERVAL,
            exit_code: 130,
        }
    }
}

impl GracefulShutdownLayer {
    /// The default: a 5 s sweep deadline, a purge every second, exit status 130.
    pub fn new() -> Self {
        GracefulShutdownLayer::default()
    }

    /// Sets the sweep deadline.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets the purge interval (at least 1 ms).
    pub fn purge_interval(mut self, interval: Duration) -> Self {
        self.purge_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Sets the exit status a signal-triggered shutdown reports.
    pub fn exit_code(mut self, code: i32) -> Self {
        self.exit_code = code;
        self
    }
}

impl<S: LockStore> Layer<S> for GracefulShutdownLayer {
    type Store = GracefulShutdown<S>;

    fn layer(&self, inner: S) -> GracefulShutdown<S> {
        self.layer_wired(inner, &Wiring::default())
    }
}

/// The store shares the wiring's lifecycle (the manager's): once it is closing, acquisitions are
/// refused and one landing late is given back. Used alone, the layer has a lifecycle of its own,
/// closed by its [`LockStore::shutdown`].
impl<S: LockStore> WiredLayer<S> for GracefulShutdownLayer {
    fn layer_wired(&self, inner: S, wiring: &Wiring) -> GracefulShutdown<S> {
        GracefulShutdown {
            inner,
            live: Arc::new(Live::default()),
            deadline: self.deadline,
            purge_interval: self.purge_interval,
            observers: wiring.observers().clone(),
            purger: Sweeper::default(),
            lifecycle: wiring.lifecycle().clone(),
        }
    }
}

/// Live leases by owner token: tokens are unique per acquisition, and a key may have several
/// live leases in this process at once (readers, semaphore permits).
type Live = dashmap::DashMap<OwnerToken, Lease, foldhash::fast::RandomState>;

/// A store that tracks live locks and releases them at shutdown (see the [module docs](self)).
#[derive(Debug)]
pub struct GracefulShutdown<S> {
    inner: S,
    live: Arc<Live>,
    deadline: Duration,
    purge_interval: Duration,
    observers: Observers,
    purger: Sweeper,
    lifecycle: Lifecycle,
}

fn purge(live: &Live, now: Instant) -> usize {
    let before = live.len();
    live.retain(|_, lease| now < lease.expires_at());
    before.saturating_sub(live.len())
}

impl<S: LockStore> GracefulShutdown<S> {
    /// Tracked locks, including expired ones not purged yet.
    pub fn tracked(&self) -> usize {
        self.live.len()
    }

    /// Removes expired entries now; returns how many.
    pub fn purge_expired(&self) -> usize {
        purge(&self.live, Instant::now())
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Stops tracking `lease`.
    fn untrack(&self, lease: &Lease) {
        self.live.remove(lease.token());
    }

    /// Releases every live tracked lock within the deadline; returns how many were released, or
    /// an error naming the locks it could not release (they stay in the store until their TTL).
    async fn sweep(&self) -> Result<usize> {
        // The lifecycle was closed before this fence; an acquisition that inserts after the scan
        // below fences before reading it, so it sees the close and gives its lease back itself.
        fence(Ordering::SeqCst);
        let now = Instant::now();
        let leases: Vec<Lease> = self
            .live
            .iter()
            .map(|entry| entry.value().clone())
            .filter(|lease| now < lease.expires_at())
            .collect();
        for lease in &leases {
            self.untrack(lease);
        }
        if leases.is_empty() {
            return Ok(0);
        }
        let deadline = instant_after(now, self.deadline);
        let mut pending: FuturesUnordered<_> = leases
            .iter()
            .enumerate()
            .map(|(i, lease)| async move { (i, self.inner.release(lease).await) })
            .collect();
        let mut released = 0;
        // Which releases answered (released, or found the lock no longer ours): the others are
        // left in the store.
        let mut settled = vec![false; leases.len()];
        // The last release the store failed, and whether the deadline cut the others short.
        let (mut last_error, mut cut) = (None, false);
        loop {
            match tokio::time::timeout_at(deadline, pending.next()).await {
                Ok(Some((i, Ok(ours)))) => {
                    settled[i] = true;
                    if ours {
                        released += 1;
                        self.observers.emit(|| LockEvent::ReleasedAtShutdown {
                            key: leases[i].key().clone(),
                        });
                    } else {
                        tracing::debug!(key = %leases[i].key(), "at shutdown the lock was no longer ours");
                    }
                }
                Ok(Some((i, Err(error)))) => {
                    tracing::warn!(key = %leases[i].key(), error = %error.chain(),
                        "releasing at shutdown failed; the lock expires at its TTL");
                    last_error = Some(error);
                }
                Ok(None) => break,
                Err(_) => {
                    cut = true;
                    break;
                }
            }
        }
        drop(pending);
        let left: Vec<&Lease> = leases
            .iter()
            .zip(&settled)
            .filter(|(_, settled)| !**settled)
            .map(|(lease, _)| lease)
            .collect();
        if left.is_empty() {
            return Ok(released);
        }
        // At most ten named, in order, so the message stays one readable line.
        const NAMED: usize = 10;
        let mut keys: Vec<&str> = left.iter().map(|l| l.key().as_str()).collect();
        keys.sort_unstable();
        let more = keys.len().saturating_sub(NAMED);
        keys.truncate(NAMED);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        tracing::warn!(unreleased = left.len(), keys = %keys.join(", "),
            "shutdown could not release every lock; the rest expire at their TTL");
        let why = if cut {
            format!(
                "the store did not answer within the shutdown deadline ({:?})",
                self.deadline
            )
        } else {
            "the store failed the release".to_owned()
        };
        let kind = match (&last_error, cut) {
            (Some(error), false) => error.kind(),
            _ => ErrorKind::Timeout,
        };
        let error = Error::new(
            kind,
            format!(
                "shutdown released {released} lock(s) but not {}{more}: {why}; they stay in the \
                 store until their TTL runs out",
                keys.join(", ")
            ),
        );
        Err(match last_error {
            Some(cause) => error.with_source(cause),
            None => error,
        })
    }
}

impl<S: LockStore> crate::core::LayeredStore for GracefulShutdown<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        if self.lifecycle.is_closing() {
            return Err(Error::shut_down().with_key(req.key.as_str()));
        }
        self.purger.ensure(&self.live, self.purge_interval, purge);
        let lease = match self.inner.acquire(req).await? {
            Attempt::Granted(lease) => lease,
            refused => return Ok(refused),
        };
        // Tracked first, then the lifecycle read (with a fence against the sweep's, see `sweep`):
        // either the sweep sees this lease or this call sees the shutdown, never neither.
        self.live.insert(lease.token().clone(), lease.clone());
        fence(Ordering::SeqCst);
        if self.lifecycle.is_closing() {
            // Landed during the shutdown: give it back now (the sweep may too; both are
            // owner-checked, so the second is a no-op).
            self.untrack(&lease);
            if let Err(error) = self.inner.release(&lease).await {
                tracing::warn!(key = %lease.key(), error = %error.chain(),
                    "releasing a lock acquired during shutdown failed; it expires at its TTL");
            }
            return Err(Error::shut_down().with_key(req.key.as_str()));
        }
        Ok(Attempt::Granted(lease))
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        // Untracked only once the store answered: a release that fails (or is cancelled) may
        // leave the lock in the store, and then the shutdown must still release it.
        let released = self.inner.release(lease).await;
        if released.is_ok() {
            self.untrack(lease);
        }
        released
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let renewed = self.inner.extend(lease, ttl).await?;
        if crate::guard::KEEPING_FOR_HOLD_PERIOD
            .try_with(|_| ())
            .is_ok()
        {
            // A job lock released within its hold period: it stays in the store for the rest
            // of the period, and a shutdown must not cut that short.
            self.untrack(lease);
            return Ok(renewed);
        }
        // Tracked again even if the purge dropped the entry while the extend was in flight: the
        // store holds the lock for the new TTL.
        self.live.insert(lease.token().clone(), renewed.clone());
        Ok(renewed)
    }

    async fn shutdown(&self) -> Result<usize> {
        self.lifecycle.close();
        let swept = self.sweep().await;
        // The store is shut down whatever the sweep left.
        let inner = self.inner.shutdown().await;
        Ok(swept? + inner?)
    }
}

#[cfg(test)]
mod tests;
