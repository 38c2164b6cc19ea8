//! The guard of a multi-lock: several keys held together, released together.

use crate::core::{Error, LockKey, Result};
use crate::guard::LockGuard;

/// Several locks taken all-or-nothing by [`LockManager::lock_all`](crate::LockManager::lock_all),
/// in canonical key order. Released together by [`MultiGuard::release`]; dropping it releases
/// every key in the background.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let locks = leasehold::LockManager::builder().client_id("bank").farm_id("f1").build()?;
/// let pair = locks.try_lock_all(["acct-9", "acct-3"]).await?;
/// let keys: Vec<_> = pair.keys().map(|k| k.entity_id().to_owned()).collect();
/// assert_eq!(keys, ["acct-3", "acct-9"]); // canonical order
/// assert!(pair.is_held());
/// assert!(pair.release().await?);
/// # Ok(()) }
/// ```
#[must_use = "if unused the locks are released immediately"]
#[derive(Debug)]
pub struct MultiGuard {
    guards: Vec<LockGuard>,
}

impl MultiGuard {
    pub(crate) fn new(guards: Vec<LockGuard>) -> Self {
        MultiGuard { guards }
    }

    /// The keys held, in the order they were taken.
    pub fn keys(&self) -> impl Iterator<Item = &LockKey> {
        self.guards.iter().map(LockGuard::key)
    }

    /// The guard of each key, in the order they were taken (fencing tokens, leases).
    pub fn guards(&self) -> &[LockGuard] {
        &self.guards
    }

    /// How many keys are held.
    pub fn len(&self) -> usize {
        self.guards.len()
    }

    /// Whether no key is held (never the case for a guard returned by the manager).
    pub fn is_empty(&self) -> bool {
        self.guards.is_empty()
    }

    /// Whether every key is still held as far as this process knows (see
    /// [`LockGuard::is_held`]).
    pub fn is_held(&self) -> bool {
        self.guards.iter().all(LockGuard::is_held)
    }

    /// Resolves when any of the keys is lost (see [`LockGuard::lost`]: renewal could not keep it,
    /// or its lease ran out with no renewal), with the reason; the others are still held until
    /// released. Pending while all are held.
    pub async fn lost(&self) -> Error {
        let lost = self.guards.iter().map(|guard| Box::pin(guard.lost()));
        futures::future::select_all(lost).await.0
    }

    /// Releases every key (all are tried, concurrently). `Ok(true)`: every key was still ours.
    /// `Ok(false)`: at least one was no longer ours. `Err`: a release failed (the first error;
    /// that lock expires at its TTL).
    pub async fn release(self) -> Result<bool> {
        let releases = self.guards.into_iter().map(LockGuard::release);
        let mut all_ours = true;
        let mut first_error = None;
        for outcome in futures::future::join_all(releases).await {
            match outcome {
                Ok(ours) => all_ours &= ours,
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) => Err(error),
            None => Ok(all_ours),
        }
    }
}
