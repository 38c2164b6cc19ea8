//! RAII guards: a held lock that is released when dropped.

use std::sync::Arc;
use std::time::Duration;

use crate::core::{validate_ttl, Lease, LockEvent, LockKey, LockStore, OwnerToken, Result};
use crate::manager::ManagerInner;

/// A held lock. Release it with [`LockGuard::release`] to learn whether it was still ours; dropping
/// it releases it in the background.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let locks = leasehold::LockManager::builder().client_id("jobs").farm_id("f1").build()?;
/// let guard = locks.try_lock("nightly-report").await?;
/// println!("holding {} as {}", guard.key(), guard.token());
/// assert_eq!(guard.fencing_token(), Some(1)); // the embedded store fences
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released immediately"]
#[derive(Debug)]
pub struct LockGuard {
    manager: Arc<ManagerInner>,
    /// `None` once released.
    lease: Option<Lease>,
    /// A copy of the lease for the accessors after `release` took it; also what `Drop` checks.
    view: Lease,
}

impl LockGuard {
    pub(crate) fn new(manager: Arc<ManagerInner>, lease: Lease) -> Self {
        LockGuard {
            manager,
            view: lease.clone(),
            lease: Some(lease),
        }
    }

    /// The lock key.
    pub fn key(&self) -> &LockKey {
        self.view.key()
    }

    /// The owner token written to the store.
    pub fn token(&self) -> &OwnerToken {
        self.view.token()
    }

    /// The fencing token of this acquisition, where the store gives one: pass it with every write
    /// the lock protects, so the downstream system can reject a stale holder.
    pub fn fencing_token(&self) -> Option<u64> {
        self.view.fencing_token()
    }

    /// The lease as last acquired or extended.
    pub fn lease(&self) -> &Lease {
        &self.view
    }

    /// Resets the lease's TTL to `ttl`, only if the lock is still ours
    /// ([`ErrorKind::NotHeld`](crate::ErrorKind::NotHeld) otherwise).
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        validate_ttl(ttl)?;
        let Some(lease) = &self.lease else {
            return Err(crate::Error::not_held("the guard was already released"));
        };
        let renewed = self.manager.store.extend(lease, ttl).await?;
        self.view = renewed.clone();
        self.lease = Some(renewed);
        Ok(())
    }

    /// Releases the lock now. `Ok(true)`: it was still ours and is now free. `Ok(false)`: it was no
    /// longer ours (expired, broken, or taken after expiry) and nothing was deleted — the seed
    /// manager's `releaseLock` false.
    pub async fn release(mut self) -> Result<bool> {
        let Some(lease) = self.lease.take() else {
            return Ok(false);
        };
        release(&self.manager, &lease).await
    }
}

async fn release(manager: &ManagerInner, lease: &Lease) -> Result<bool> {
    let result = manager.store.release(lease).await;
    manager.waiters.wake(lease.key());
    if let Ok(was_held) = result {
        manager.observers.emit(|| LockEvent::Released {
            key: lease.key().clone(),
            held_for: lease.acquired_at().elapsed(),
            was_held,
        });
    }
    result
}

impl Drop for LockGuard {
    /// Releases in the background on the current tokio runtime; never blocks or panics. Outside a
    /// runtime nothing can be sent: the lock is logged and expires at its TTL.
    fn drop(&mut self) {
        let Some(lease) = self.lease.take() else {
            return;
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                let manager = self.manager.clone();
                runtime.spawn(async move {
                    if let Err(error) = release(&manager, &lease).await {
                        tracing::warn!(key = %lease.key(), %error,
                            "releasing a dropped guard failed; the lock expires at its TTL");
                    }
                });
            }
            Err(_) => tracing::warn!(key = %lease.key(),
                "guard dropped outside a tokio runtime; the lock expires at its TTL"),
        }
    }
}
