//! The lock kinds beyond the exclusive lock: read-write locks, semaphores and multi-locks.
//!
//! Each is the exclusive lock's machinery (plan, attempts, wait loop, guard, renewal) with a
//! different [`LockMode`]; a multi-lock is several exclusive locks taken in one canonical order.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;

use crate::core::{Error, ErrorKind, Lease, LockKey, LockMode, Result};
use crate::guard::LockGuard;
use crate::multi_guard::MultiGuard;

use super::options::{LockOptions, ToLockKey};
use super::state::LockManager;

impl LockManager {
    /// Takes the read side of the read-write lock `key`, waiting as [`LockManager::lock`] does.
    ///
    /// Readers hold together; a writer (the exclusive lock of the same key: [`LockManager::lock`],
    /// [`LockManager::try_lock`]) holds alone. A writer that waits keeps new readers out, so a steady
    /// stream of readers cannot starve it. Each reader's hold is its own owner-checked lease: a
    /// crashed reader frees its share at its own TTL.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use leasehold::{Holder, LockOptions};
    /// let locks = leasehold::LockManager::builder().client_id("docs").farm_id("f1").build()?;
    /// let first = locks.read("catalog").await?;
    /// let second = locks.read_with("catalog", LockOptions::new().holder(Holder::new())).await?;
    /// // Another holder's write waits for both readers (this task's own write would be refused
    /// // as a ModeConflict: a write under its own read could only deadlock).
    /// let writer = LockOptions::new().holder(Holder::new());
    /// assert!(locks.try_lock_with("catalog", writer).await.unwrap_err().is_unavailable());
    /// assert_eq!(locks.inspect("catalog").await?.unwrap().holders.len(), 2);
    /// first.release().await?;
    /// second.release().await?;
    /// let writer = locks.try_lock("catalog").await?; // the write side
    /// assert!(writer.fencing_token().is_some());
    /// # Ok(()) }
    /// ```
    pub async fn read(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.read_with(key, LockOptions::new()).await
    }

    /// [`LockManager::read`] with per-call options.
    pub async fn read_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        self.lock_with(key, opts.mode(LockMode::Shared)).await
    }

    /// One attempt at the read side of `key`: fails at once while a writer holds or waits.
    pub async fn try_read(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.try_read_with(key, LockOptions::new()).await
    }

    /// [`LockManager::try_read`] with per-call options.
    pub async fn try_read_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        self.try_lock_with(key, opts.mode(LockMode::Shared)).await
    }

    /// Takes one of `permits` permits of the semaphore `key`, waiting as [`LockManager::lock`]
    /// does: at most `permits` holders at once.
    ///
    /// Every permit is its own owner-checked lease with its own expiry (Redisson's
    /// permit-expirable semaphore): a crashed holder's permit comes back at its TTL, never
    /// leaks. `permits` is part of the lock's definition: a caller that asks with another count
    /// while the semaphore is held gets [`ErrorKind::ModeConflict`](crate::ErrorKind::ModeConflict).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::LockManager::builder().client_id("docs").farm_id("f1").build()?;
    /// let a = locks.try_semaphore("encoders", 2).await?;
    /// let b = locks.try_semaphore("encoders", 2).await?;
    /// assert!(locks.try_semaphore("encoders", 2).await.unwrap_err().is_unavailable());
    /// let other_count = locks.try_semaphore("encoders", 5).await.unwrap_err();
    /// assert_eq!(other_count.kind(), leasehold::ErrorKind::ModeConflict);
    /// a.release().await?;
    /// let c = locks.try_semaphore("encoders", 2).await?;
    /// # drop((b, c));
    /// # Ok(()) }
    /// ```
    pub async fn semaphore(&self, key: impl ToLockKey, permits: u32) -> Result<LockGuard> {
        self.semaphore_with(key, permits, LockOptions::new()).await
    }

    /// [`LockManager::semaphore`] with per-call options.
    pub async fn semaphore_with(
        &self,
        key: impl ToLockKey,
        permits: u32,
        opts: LockOptions,
    ) -> Result<LockGuard> {
        self.lock_with(key, opts.mode(LockMode::semaphore(permits)?))
            .await
    }

    /// One attempt at a permit of the semaphore `key` of `permits` permits.
    pub async fn try_semaphore(&self, key: impl ToLockKey, permits: u32) -> Result<LockGuard> {
        self.try_semaphore_with(key, permits, LockOptions::new())
            .await
    }

    /// [`LockManager::try_semaphore`] with per-call options.
    pub async fn try_semaphore_with(
        &self,
        key: impl ToLockKey,
        permits: u32,
        opts: LockOptions,
    ) -> Result<LockGuard> {
        self.try_lock_with(key, opts.mode(LockMode::semaphore(permits)?))
            .await
    }

    /// Runs `work` under a read hold of `key` and always releases it (as
    /// [`LockManager::with_lock`] does).
    pub async fn with_read<F, Fut, T>(&self, key: impl ToLockKey, work: F) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.read(key).await?;
        run_and_release(guard, work).await
    }

    /// Runs `work` holding one permit of the semaphore `key` and always releases it.
    pub async fn with_permit<F, Fut, T>(
        &self,
        key: impl ToLockKey,
        permits: u32,
        work: F,
    ) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.semaphore(key, permits).await?;
        run_and_release(guard, work).await
    }

    /// Runs `work` holding every key of `keys` (as [`LockManager::lock_all`]) and always releases
    /// them all.
    pub async fn with_all<K, F, Fut, T>(
        &self,
        keys: impl IntoIterator<Item = K>,
        work: F,
    ) -> Result<T>
    where
        K: ToLockKey,
        F: FnOnce(Vec<Lease>) -> Fut,
        Fut: Future<Output = T>,
    {
        let all = self.lock_all(keys).await?;
        let leases = all.guards().iter().map(LockGuard::lease).collect();
        let outcome = AssertUnwindSafe(work(leases)).catch_unwind().await;
        if let Err(error) = all.release().await {
            tracing::warn!(error = %error.chain(), "could not release a multi-lock after the work; its keys expire at their TTL");
        }
        match outcome {
            Ok(value) => Ok(value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Takes every key of `keys` exclusively, all or nothing, waiting up to the default wait in
    /// all.
    ///
    /// Keys are taken one by one in one canonical order (their storage keys, sorted, duplicates
    /// removed), so two multi-locks over overlapping keys never deadlock: whoever holds the
    /// lowest shared key proceeds. If any key cannot be had before the deadline, the keys taken
    /// so far are released before the error is returned. One [`MultiGuard`] releases them all.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::LockManager::builder().client_id("bank").farm_id("f1").build()?;
    /// let both = locks.lock_all(["acct-2", "acct-1"]).await?;
    /// assert_eq!(both.len(), 2);
    /// let other = leasehold::LockOptions::new().holder(leasehold::Holder::new());
    /// assert!(locks.try_lock_with("acct-1", other).await.unwrap_err().is_unavailable());
    /// assert!(both.release().await?);
    /// assert!(locks.try_lock_all(["acct-1", "acct-2"]).await.is_ok());
    /// # Ok(()) }
    /// ```
    pub async fn lock_all<K: ToLockKey>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<MultiGuard> {
        self.lock_all_with(keys, LockOptions::new()).await
    }

    /// [`LockManager::lock_all`] with per-call options (applied to every key; `wait` is the
    /// budget for all of them together).
    pub async fn lock_all_with<K: ToLockKey>(
        &self,
        keys: impl IntoIterator<Item = K>,
        opts: LockOptions,
    ) -> Result<MultiGuard> {
        let wait = opts.wait.unwrap_or(self.inner.config.wait_for_lock);
        self.take_all(keys, opts, Some(wait)).await
    }

    /// One attempt at every key of `keys`: all of them, or none and the first refusal.
    pub async fn try_lock_all<K: ToLockKey>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<MultiGuard> {
        self.take_all(keys, LockOptions::new(), None).await
    }

    async fn take_all<K: ToLockKey>(
        &self,
        keys: impl IntoIterator<Item = K>,
        opts: LockOptions,
        wait: Option<Duration>,
    ) -> Result<MultiGuard> {
        if opts.mode.is_some_and(|mode| mode != LockMode::Exclusive) {
            return Err(Error::invalid_argument(
                "a multi-lock takes exclusive locks; take shared holds or permits one by one",
            ));
        }
        if opts.hold_at_least.is_some() {
            // Giving back the keys of a failed multi-lock must free them, which a hold period
            // would not.
            return Err(Error::invalid_argument(
                "a multi-lock cannot keep a hold period (hold_at_least): its keys are given back \
                 together when one cannot be had; take job locks one key at a time",
            ));
        }
        // Exclusive whatever a matching scenario's `lock` mode says: a multi-lock's promise is
        // that its holder is alone on every key.
        let opts = opts.mode(LockMode::Exclusive);
        // Every key is resolved and every option checked before the first acquisition.
        let mut resolved: Vec<LockKey> = keys
            .into_iter()
            .map(|key| key.to_lock_key(self))
            .collect::<Result<_>>()?;
        resolved.sort();
        resolved.dedup();
        if resolved.is_empty() {
            return Err(Error::invalid_argument(
                "a multi-lock needs at least one key",
            ));
        }
        let plans = resolved
            .iter()
            .map(|key| self.plan(key, &opts))
            .collect::<Result<Vec<_>>>()?;
        let deadline = wait.map(|wait| crate::core::instant_after(Instant::now(), wait));
        let mut held = Vec::with_capacity(plans.len());
        for plan in plans {
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            match self.execute(plan, left).await {
                Ok(guard) => held.push(guard),
                Err(error) => {
                    let taken = held.len();
                    let given_back = MultiGuard::new(held).release().await;
                    if let Err(undo) = &given_back {
                        tracing::warn!(undo = %undo.chain(), "a multi-lock could not give back \
                            the keys it took before failing; they expire at their TTL");
                    }
                    return Err(with_progress(error, taken, given_back.err()));
                }
            }
        }
        // A key taken early can be lost while the later ones are waited for (its lease ran out
        // unrenewed, or renewal found it broken): all of them at once, or none.
        // During a shutdown no guard reads held: a key the store really lost is named first.
        let lost = held
            .iter()
            .find(|guard| !guard.is_held() && !guard.let_go_by_shutdown())
            .or_else(|| held.iter().find(|guard| !guard.is_held()));
        if let Some(lost) = lost {
            let key = lost.key().clone();
            let ttl = lost.lease().ttl();
            // Read before the keys are given back (a release marks a guard let go).
            let by_shutdown = lost.let_go_by_shutdown();
            let given_back = MultiGuard::new(held).release().await;
            let outcome = match &given_back {
                Ok(_) => "every key was given back".to_owned(),
                Err(undo) => format!(
                    "giving the keys back failed too, so they expire at their TTL: {}",
                    undo.chain()
                ),
            };
            // A shutdown ends every renewal and marks its guard lost: that is the shutdown's
            // doing, not a lease too short for the wait, and the caller is told so.
            let error = if by_shutdown {
                Error::new(
                    ErrorKind::ShutDown,
                    format!(
                        "the lock manager shut down while a multi-lock took its keys, so it no \
                         longer keeps {key}; {outcome}"
                    ),
                )
            } else {
                Error::not_held(format!(
                    "a multi-lock lost {key} (its lease of {ttl:?} ran out, or was broken) while \
                     it waited for the keys after it; {outcome}; ask for a TTL longer than the \
                     wait, or leave it unset so that renewal keeps the keys taken"
                ))
            }
            .with_key(key.as_str());
            return Err(match given_back {
                Ok(_) => error,
                Err(undo) => error.with_source(undo),
            });
        }
        Ok(MultiGuard::new(held))
    }
}

/// Says how far a failed multi-lock got (its error's key names the key that failed), and
/// whether the keys it had taken were given back (`undo_failed`: the first release that failed;
/// those keys then expire at their TTL).
fn with_progress(error: Error, taken: usize, undo_failed: Option<Error>) -> Error {
    if taken == 0 || (error.kind() == ErrorKind::ShutDown && undo_failed.is_none()) {
        return error;
    }
    let given_back = match &undo_failed {
        None => "and released them".to_owned(),
        Some(undo) => format!(
            "and could not release all of them, so they expire at their TTL: {}",
            undo.chain()
        ),
    };
    let message = format!(
        "{} (a multi-lock had taken {taken} key(s) before this one {given_back})",
        error.message()
    );
    let mut rebuilt = Error::new(error.kind(), message);
    if let Some(key) = error.key() {
        rebuilt = rebuilt.with_key(key.to_owned());
    }
    if let Some(operation) = error.operation() {
        rebuilt = rebuilt.with_operation(operation);
    }
    rebuilt.with_source(error)
}

/// Runs `work` with the guard's lease, then releases the guard whatever happened (the panic, if
/// any, continues after the release).
pub(super) async fn run_and_release<F, Fut, T>(guard: LockGuard, work: F) -> Result<T>
where
    F: FnOnce(Lease) -> Fut,
    Fut: Future<Output = T>,
{
    let outcome = AssertUnwindSafe(work(guard.lease())).catch_unwind().await;
    let key = guard.key().clone();
    if let Err(error) = guard.release().await {
        tracing::warn!(key = %key, error = %error.chain(), "could not release after the work; the lock expires at its TTL");
    }
    match outcome {
        Ok(value) => Ok(value),
        Err(panic) => std::panic::resume_unwind(panic),
    }
}
