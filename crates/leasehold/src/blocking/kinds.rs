//! The lock kinds beyond the exclusive lock, blocking: read-write locks, semaphores and
//! multi-locks. Each is the async manager's call of the same name, run on the manager's runtime.

use crate::core::Result;
use crate::{LockOptions, ToLockKey};

use super::guard::LockGuard;
use super::manager::{run_and_release, LockManager};
use super::multi_guard::MultiGuard;

impl LockManager {
    /// Takes the read side of the read-write lock `key`, waiting as [`LockManager::lock`] does
    /// (see [`crate::LockManager::read`]).
    ///
    /// Readers hold together; a writer (the exclusive lock of the same key: [`LockManager::lock`],
    /// [`LockManager::try_lock`]) holds alone, and a writer that waits keeps new readers out. Each
    /// reader's hold is its own owner-checked lease.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// use std::thread;
    /// let locks = leasehold::blocking::LockManager::new(
    ///     leasehold::LockManager::builder().client_id("docs").farm_id("f1"),
    /// )?;
    /// let reader = locks.read("catalog")?;
    /// assert_eq!(reader.mode(), leasehold::LockMode::Shared);
    /// thread::scope(|s| {
    ///     s.spawn(|| {
    ///         let second = locks.try_read("catalog").unwrap(); // readers hold together
    ///         assert!(second.release().unwrap());
    ///         // A writer waits for every reader (a try fails at once).
    ///         assert!(locks.try_lock("catalog").unwrap_err().is_unavailable());
    ///     });
    /// });
    /// assert!(reader.release()?);
    /// let writer = locks.try_lock("catalog")?; // the write side
    /// assert!(writer.fencing_token().is_some()); // writers are fenced, readers are not
    /// # drop(writer);
    /// # Ok(()) }
    /// ```
    pub fn read(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.read_with(key, LockOptions::new())
    }

    /// [`LockManager::read`] with per-call options.
    pub fn read_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        let guard = self
            .shared
            .block_on(self.shared.manager.read_with(key, opts))??;
        Ok(self.wrap(guard))
    }

    /// One attempt at the read side of `key`: fails at once while a writer holds or waits.
    pub fn try_read(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.try_read_with(key, LockOptions::new())
    }

    /// [`LockManager::try_read`] with per-call options.
    pub fn try_read_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        let guard = self
            .shared
            .block_on(self.shared.manager.try_read_with(key, opts))??;
        Ok(self.wrap(guard))
    }

    /// Takes one of `permits` permits of the semaphore `key`, waiting as [`LockManager::lock`]
    /// does: at most `permits` holders at once (see [`crate::LockManager::semaphore`]).
    ///
    /// Every permit is its own owner-checked lease with its own expiry. `permits` is part of the
    /// lock's definition: asking with another count while the semaphore is held is
    /// [`ErrorKind::ModeConflict`](crate::ErrorKind::ModeConflict).
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::blocking::LockManager::new(
    ///     leasehold::LockManager::builder().client_id("docs").farm_id("f1"),
    /// )?;
    /// let a = locks.try_semaphore("encoders", 2)?;
    /// let b = locks.try_semaphore("encoders", 2)?;
    /// assert!(locks.try_semaphore("encoders", 2).unwrap_err().is_unavailable());
    /// let other_count = locks.try_semaphore("encoders", 5).unwrap_err();
    /// assert_eq!(other_count.kind(), leasehold::ErrorKind::ModeConflict);
    /// drop(a); // the permit comes back (released in the background)
    /// let c = locks.semaphore("encoders", 2)?; // waits for it if need be
    /// assert!(b.release()? && c.release()?);
    /// # Ok(()) }
    /// ```
    pub fn semaphore(&self, key: impl ToLockKey, permits: u32) -> Result<LockGuard> {
        self.semaphore_with(key, permits, LockOptions::new())
    }

    /// [`LockManager::semaphore`] with per-call options.
    pub fn semaphore_with(
        &self,
        key: impl ToLockKey,
        permits: u32,
        opts: LockOptions,
    ) -> Result<LockGuard> {
        let guard = self
            .shared
            .block_on(self.shared.manager.semaphore_with(key, permits, opts))??;
        Ok(self.wrap(guard))
    }

    /// One attempt at a permit of the semaphore `key` of `permits` permits.
    pub fn try_semaphore(&self, key: impl ToLockKey, permits: u32) -> Result<LockGuard> {
        self.try_semaphore_with(key, permits, LockOptions::new())
    }

    /// [`LockManager::try_semaphore`] with per-call options.
    pub fn try_semaphore_with(
        &self,
        key: impl ToLockKey,
        permits: u32,
        opts: LockOptions,
    ) -> Result<LockGuard> {
        let guard = self
            .shared
            .block_on(self.shared.manager.try_semaphore_with(key, permits, opts))??;
        Ok(self.wrap(guard))
    }

    /// Runs `work` on the calling thread under a read hold of `key` and always releases it (as
    /// [`LockManager::with_lock`] does, a panic included).
    pub fn with_read<F, T>(&self, key: impl ToLockKey, work: F) -> Result<T>
    where
        F: FnOnce(&LockGuard) -> T,
    {
        let guard = self.read(key)?;
        Ok(run_and_release(guard, work))
    }

    /// Runs `work` on the calling thread holding one permit of the semaphore `key` and always
    /// releases it (as [`LockManager::with_lock`] does, a panic included).
    pub fn with_permit<F, T>(&self, key: impl ToLockKey, permits: u32, work: F) -> Result<T>
    where
        F: FnOnce(&LockGuard) -> T,
    {
        let guard = self.semaphore(key, permits)?;
        Ok(run_and_release(guard, work))
    }

    /// Takes every key of `keys` exclusively, all or nothing, waiting up to the default wait in
    /// all (see [`crate::LockManager::lock_all`]).
    ///
    /// Keys are taken one by one in one canonical order, so two multi-locks over overlapping keys
    /// never deadlock; if any key cannot be had before the deadline, the keys taken so far are
    /// released before the error is returned.
    ///
    /// ```
    /// # fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::blocking::LockManager::new(
    ///     leasehold::LockManager::builder().client_id("bank").farm_id("f1"),
    /// )?;
    /// let both = locks.lock_all(["acct-2", "acct-1"])?;
    /// assert_eq!(both.len(), 2);
    /// std::thread::scope(|s| {
    ///     s.spawn(|| assert!(locks.try_lock("acct-1").unwrap_err().is_unavailable()));
    /// });
    /// assert!(both.release()?);
    /// let moved = locks.with_all(["acct-1", "acct-2"], |all| all.len())?;
    /// assert_eq!(moved, 2);
    /// # Ok(()) }
    /// ```
    pub fn lock_all<K: ToLockKey>(&self, keys: impl IntoIterator<Item = K>) -> Result<MultiGuard> {
        self.lock_all_with(keys, LockOptions::new())
    }

    /// [`LockManager::lock_all`] with per-call options (applied to every key; `wait` is the
    /// budget for all of them together).
    pub fn lock_all_with<K: ToLockKey>(
        &self,
        keys: impl IntoIterator<Item = K>,
        opts: LockOptions,
    ) -> Result<MultiGuard> {
        let guard = self
            .shared
            .block_on(self.shared.manager.lock_all_with(keys, opts))??;
        Ok(self.wrap_all(guard))
    }

    /// One attempt at every key of `keys`: all of them, or none and the first refusal.
    pub fn try_lock_all<K: ToLockKey>(
        &self,
        keys: impl IntoIterator<Item = K>,
    ) -> Result<MultiGuard> {
        let guard = self
            .shared
            .block_on(self.shared.manager.try_lock_all(keys))??;
        Ok(self.wrap_all(guard))
    }

    /// Runs `work` on the calling thread holding every key of `keys` (as
    /// [`LockManager::lock_all`]) and always releases them all (a panic included).
    pub fn with_all<K, F, T>(&self, keys: impl IntoIterator<Item = K>, work: F) -> Result<T>
    where
        K: ToLockKey,
        F: FnOnce(&MultiGuard) -> T,
    {
        let all = self.lock_all(keys)?;
        Ok(run_and_release(all, work))
    }
}
