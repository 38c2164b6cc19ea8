//! The blocking guard of a multi-lock: several keys held together, released together.

use std::sync::Arc;
use std::time::Duration;

use crate::core::{Error, Lease, LockKey, Result};

use super::runtime::{not_in_async, Shared};

/// Several locks taken all-or-nothing by
/// [`blocking::LockManager::lock_all`](super::LockManager::lock_all), in canonical key order: the
/// blocking twin of [`crate::MultiGuard`]. Released together by [`MultiGuard::release`];
/// dropping it releases every key in the background, on the manager's runtime. Each key's lease
/// is renewed while it lives.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// let locks = leasehold::blocking::LockManager::new(
///     leasehold::LockManager::builder().client_id("bank").farm_id("f1"),
/// )?;
/// let pair = locks.try_lock_all(["acct-9", "acct-3"])?;
/// let keys: Vec<_> = pair.keys().map(|k| k.entity_id().to_owned()).collect();
/// assert_eq!(keys, ["acct-3", "acct-9"]); // canonical order
/// // Each key's lease: its fencing token and time left.
/// assert!(pair.leases().iter().all(|lease| lease.fencing_token().is_some()));
/// assert!(pair.is_held());
/// assert!(pair.release()?);
/// # Ok(()) }
/// ```
#[must_use = "if unused the locks are released immediately"]
#[derive(Debug)]
pub struct MultiGuard {
    /// `None` only once released or dropped.
    inner: Option<crate::MultiGuard>,
    /// The keys as taken; they never change while held.
    keys: Vec<LockKey>,
    shared: Arc<Shared>,
}

impl MultiGuard {
    pub(super) fn new(guard: crate::MultiGuard, shared: Arc<Shared>) -> Self {
        MultiGuard {
            keys: guard.keys().cloned().collect(),
            inner: Some(guard),
            shared,
        }
    }

    /// The keys held, in the order they were taken.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        self.keys.iter()
    }

    /// The lease of each key, in the order they were taken (fencing tokens, time left), as last
    /// acquired or renewed.
    pub fn leases(&self) -> Vec<Lease> {
        self.inner.as_ref().map_or_else(Vec::new, |inner| {
            inner.guards().iter().map(crate::LockGuard::lease).collect()
        })
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether no key is held (never the case for a guard returned by the manager).
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// Whether every key is still held as far as this process knows (see
    /// [`crate::MultiGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.inner.as_ref().is_some_and(crate::MultiGuard::is_held)
    }

    /// Blocks until any of the keys is lost, at most `timeout`: `Some` with the reason (the
    /// others are still held until released), or `None` if all were still held when the timeout
    /// passed (see [`crate::MultiGuard::lost`]). From async code, `Some` with the error
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument).
    pub fn wait_lost(&self, timeout: Duration) -> Option<Error> {
        let inner = self.inner.as_ref()?;
        match self
            .shared
            // The timer is made inside: it needs the runtime's context.
            .block_on(async { tokio::time::timeout(timeout, inner.lost()).await })
        {
            Ok(Ok(lost)) => Some(lost),
            Ok(Err(_elapsed)) => None,
            Err(error) => Some(error),
        }
    }

    /// Releases every key (all are tried, concurrently). `Ok(true)`: every key was still ours.
    /// `Ok(false)`: at least one was no longer ours. `Err`: a release failed (the first error;
    /// that lock expires at its TTL). See [`crate::MultiGuard::release`].
    ///
    /// From async code: [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument), and the
    /// keys are released in the background as if the guard were dropped.
    pub fn release(mut self) -> Result<bool> {
        // Checked first: on error `self` is dropped, which releases on the manager's runtime.
        not_in_async()?;
        let Some(inner) = self.inner.take() else {
            return Ok(false);
        };
        self.shared.block_on(inner.release())?
    }
}

impl Drop for MultiGuard {
    /// Releases every key in the background on the manager's runtime; never blocks or panics.
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            self.shared.drop_inside(inner);
        }
    }
}
