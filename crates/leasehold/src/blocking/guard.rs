//! The blocking guard of one lock: exclusive, a read hold, or a semaphore permit.

use std::sync::Arc;
use std::time::Duration;

use crate::core::{Error, Lease, LockKey, LockMode, OwnerToken, Result};

use super::runtime::{not_in_async, Shared};

/// A held lock, from a [`blocking::LockManager`](super::LockManager): the blocking twin of
/// [`crate::LockGuard`]. Exclusive locks, read holds and semaphore permits all come as one
/// (see [`mode`](Self::mode)). Release it with [`LockGuard::release`] to learn whether it was
/// still ours; dropping it releases it in the background, on the manager's runtime.
///
/// While it lives, the manager's runtime renews its lease (unless renewal is off or the call gave
/// an explicit TTL), whatever the thread that holds it is doing.
///
/// It can be sent to, and released or dropped on, another thread.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// let locks = leasehold::blocking::LockManager::new(
///     leasehold::LockManager::builder().client_id("jobs").farm_id("f1"),
/// )?;
/// let guard = locks.try_lock("nightly-report")?;
/// println!("holding {} as {}", guard.key(), guard.token());
/// assert_eq!(guard.mode(), leasehold::LockMode::Exclusive);
/// assert!(guard.is_held());
/// // Moved to another thread and released there.
/// let released = std::thread::spawn(move || guard.release()).join().unwrap()?;
/// assert!(released);
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released immediately"]
#[derive(Debug)]
pub struct LockGuard {
    /// `None` only once released or dropped.
    inner: Option<crate::LockGuard>,
    /// Key, token and fencing token never change while held.
    acquired: Lease,
    shared: Arc<Shared>,
}

impl LockGuard {
    pub(super) fn new(guard: crate::LockGuard, shared: Arc<Shared>) -> Self {
        LockGuard {
            acquired: guard.lease(),
            inner: Some(guard),
            shared,
        }
    }

    /// The lock key.
    pub fn key(&self) -> &LockKey {
        self.acquired.key()
    }

    /// How this guard holds its key: exclusive (or write), shared (read), or a semaphore permit.
    pub fn mode(&self) -> LockMode {
        self.acquired.mode()
    }

    /// The scenario this lock was taken under (see [`crate::scenario`]).
    pub fn scenario(&self) -> &str {
        self.inner.as_ref().map_or("", crate::LockGuard::scenario)
    }

    /// The owner token written to the store.
    pub fn token(&self) -> &OwnerToken {
        self.acquired.token()
    }

    /// The fencing token of this acquisition, where the store gives one: pass it with every write
    /// the lock protects (see [`crate::LockGuard::fencing_token`]). Readers and permit holders
    /// get none.
    pub fn fencing_token(&self) -> Option<u64> {
        self.acquired.fencing_token()
    }

    /// The lease as last acquired, extended or renewed.
    pub fn lease(&self) -> Lease {
        self.inner
            .as_ref()
            .map_or_else(|| self.acquired.clone(), crate::LockGuard::lease)
    }

    /// Whether the lock is still ours as far as this process knows (see
    /// [`crate::LockGuard::is_held`]): `false` once renewal found it taken or could not reach the
    /// store before it expired, and once its lease ran out with no renewal.
    pub fn is_held(&self) -> bool {
        self.inner.as_ref().is_some_and(crate::LockGuard::is_held)
    }

    /// `true` when the guard was issued without the lock (the store was down and the scenario
    /// proceeds; see [`crate::LockGuard::is_unprotected`]).
    pub fn is_unprotected(&self) -> bool {
        self.inner
            .as_ref()
            .is_some_and(crate::LockGuard::is_unprotected)
    }

    /// Blocks until the lock is lost, at most `timeout`: `Some` with an
    /// [`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) error saying why, or `None` if it was
    /// still held when the timeout passed (see [`crate::LockGuard::lost`]). From async code, `Some` with the error
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

    /// Resets the lease's TTL to `ttl`, only if the lock is still ours
    /// ([`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) otherwise; see
    /// [`crate::LockGuard::extend`]).
    pub fn extend(&mut self, ttl: Duration) -> Result<()> {
        let Some(inner) = self.inner.as_mut() else {
            return Err(Error::new(
                crate::ErrorKind::NotHeld,
                "the guard was released; there is nothing to extend",
            ));
        };
        self.shared.block_on(inner.extend(ttl))?
    }

    /// Releases the lock now. `Ok(true)`: it was still ours and is now free. `Ok(false)`: it was
    /// no longer ours and nothing was deleted (see [`crate::LockGuard::release`]).
    ///
    /// From async code: [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument), and the
    /// lock is released in the background as if the guard were dropped.
    pub fn release(mut self) -> Result<bool> {
        // Checked first: on error `self` is dropped, which releases on the manager's runtime.
        not_in_async()?;
        let Some(inner) = self.inner.take() else {
            return Ok(false);
        };
        self.shared.block_on(inner.release())?
    }
}

impl Drop for LockGuard {
    /// Releases in the background on the manager's runtime; never blocks or panics.
    fn drop(&mut self) {
        if let Some(inner) = self.inner.take() {
            self.shared.drop_inside(inner);
        }
    }
}
