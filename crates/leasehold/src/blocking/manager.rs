//! The blocking lock manager: exclusive locks, the manager's life, and how calls block.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;

use crate::core::{LockKey, Result};
use crate::{LockManagerBuilder, LockOptions, ToLockKey};

use super::guard::LockGuard;
use super::multi_guard::MultiGuard;
use super::runtime::Shared;

/// A lock manager whose calls block the calling thread: the blocking twin of
/// [`crate::LockManager`] (see the [module docs](crate::blocking)).
///
/// Cheap to clone (one `Arc`); clones share the manager and its runtime. Dropping the last clone
/// (and the last guard) shuts the manager down — waiting for releases still in the background,
/// bounded by the [shutdown timeout](LockManagerBuilder::shutdown_timeout) — and then its runtime.
///
/// Besides exclusive locks it offers every lock kind of the async manager: read-write locks
/// ([`read`](Self::read); the write side is [`lock`](Self::lock)), semaphores ([`semaphore`](Self::semaphore))
/// and multi-locks ([`lock_all`](Self::lock_all)).
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// let builder = leasehold::LockManager::builder().client_id("jobs").farm_id("f1");
/// let locks = leasehold::blocking::LockManager::new(builder)?;
/// let guard = locks.try_lock("invoice-7")?;
/// assert_eq!(guard.fencing_token(), Some(1)); // the embedded store fences
/// drop(guard);
///
/// let reader = locks.read("catalog")?;        // readers share, a writer holds alone
/// let permit = locks.semaphore("encoder", 3)?; // one of 3 permits
/// let both = locks.lock_all(["acct-1", "acct-2"])?; // all or nothing
/// assert!(reader.release()? && permit.release()? && both.release()?);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LockManager {
    pub(super) shared: Arc<Shared>,
}

impl LockManager {
    /// Starts the manager's runtime and builds `builder` on it (no store I/O: the embedded store,
    /// or a store connected already — but see [`connect`](Self::connect) for network stores).
    ///
    /// # Errors
    /// The builder's errors; [`ErrorKind::Internal`](crate::ErrorKind::Internal) if the runtime
    /// cannot start; [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) from async
    /// code.
    pub fn new(builder: LockManagerBuilder) -> Result<Self> {
        Self::connect(move || async move { Ok(builder) })
    }

    /// Starts the manager's runtime, runs `make` on it to connect the store and configure the
    /// builder, and builds the manager: the store's connections live on the runtime that serves
    /// the manager's calls.
    ///
    /// ```no_run
    /// # mod leasehold_redis { // a stand-in: leasehold-redis depends on leasehold
    /// #     pub struct RedisConfig;
    /// #     impl RedisConfig { pub fn new(_: &str) -> Self { RedisConfig } }
    /// #     pub struct RedisStore;
    /// #     impl RedisStore {
    /// #         pub async fn connect(_: RedisConfig) -> leasehold::Result<leasehold::MemoryStore> {
    /// #             Ok(leasehold::MemoryStore::new())
    /// #         }
    /// #     }
    /// # }
    /// use leasehold_redis::{RedisConfig, RedisStore};
    ///
    /// # fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::blocking::LockManager::connect(|| async {
    ///     let store = RedisStore::connect(RedisConfig::new("redis://127.0.0.1:6379/0")).await?;
    ///     Ok(leasehold::LockManager::builder().client_id("cli").farm_id("eu1").store(store))
    /// })?;
    /// let guard = locks.lock("invoice-7")?;
    /// # drop(guard);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The errors of `make` and of the builder;
    /// [`ErrorKind::Internal`](crate::ErrorKind::Internal) if the runtime cannot start;
    /// [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) from async code.
    pub fn connect<F, Fut>(make: F) -> Result<Self>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<LockManagerBuilder>>,
    {
        Ok(LockManager {
            shared: Arc::new(Shared::start(make)?),
        })
    }

    /// The key of `entity` at the manager's default level. No I/O.
    pub fn key(&self, entity: &str) -> Result<LockKey> {
        self.shared.manager.key(entity)
    }

    /// One attempt to acquire `key`: a guard, or
    /// [`ErrorKind::LockUnavailable`](crate::ErrorKind::LockUnavailable) at once if another owner
    /// holds it (see [`crate::LockManager::try_lock`]).
    pub fn try_lock(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.try_lock_with(key, LockOptions::new())
    }

    /// [`LockManager::try_lock`] with per-call options (any lock kind: [`LockOptions::mode`]).
    pub fn try_lock_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        let guard = self
            .shared
            .block_on(self.shared.manager.try_lock_with(key, opts))??;
        Ok(self.wrap(guard))
    }

    /// Acquires `key`, blocking up to the default wait while another owner holds it; then
    /// [`ErrorKind::Timeout`](crate::ErrorKind::Timeout) (see [`crate::LockManager::lock`]).
    pub fn lock(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.lock_with(key, LockOptions::new())
    }

    /// [`LockManager::lock`] with per-call options (the wait: [`LockOptions::wait`]; any lock
    /// kind: [`LockOptions::mode`]).
    pub fn lock_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        let guard = self
            .shared
            .block_on(self.shared.manager.lock_with(key, opts))??;
        Ok(self.wrap(guard))
    }

    /// Runs `work` on the calling thread under the lock (waiting as [`LockManager::lock`] does)
    /// and always releases it before returning: after `work` returns, and after a panic inside
    /// `work` (the panic then continues). `work` receives the guard (key, fencing token,
    /// [`is_held`](LockGuard::is_held)).
    ///
    /// If the release itself fails the result of `work` is still returned, and the failure is
    /// logged at `warn` (the lock then expires at its TTL).
    pub fn with_lock<F, T>(&self, key: impl ToLockKey, work: F) -> Result<T>
    where
        F: FnOnce(&LockGuard) -> T,
    {
        let guard = self.lock(key)?;
        Ok(run_and_release(guard, work))
    }

    /// Shuts the manager down (see [`crate::LockManager::shutdown`]): new calls fail with
    /// [`ErrorKind::ShutDown`](crate::ErrorKind::ShutDown), waiting calls end, and with graceful
    /// shutdown (on by default) every live lock is released. Returns how many were. Calling it
    /// again is harmless; the runtime stops once the last clone and guard are dropped.
    pub fn shutdown(&self) -> Result<usize> {
        self.shared.block_on(self.shared.manager.shutdown())?
    }

    /// Whether [`LockManager::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.shared.manager.is_shut_down()
    }

    /// A blocking guard over an async one, sharing this manager's runtime.
    pub(super) fn wrap(&self, guard: crate::LockGuard) -> LockGuard {
        LockGuard::new(guard, self.shared.clone())
    }

    /// A blocking multi-lock guard over an async one, sharing this manager's runtime.
    pub(super) fn wrap_all(&self, guard: crate::MultiGuard) -> MultiGuard {
        MultiGuard::new(guard, self.shared.clone())
    }
}

/// A guard that can be released synchronously: what the `with_*` calls release after the work.
pub(super) trait Release {
    /// Releases now: whether every lock was still ours.
    fn release_now(self) -> Result<bool>;
    /// The keys, for the log line of a failed release.
    fn describe(&self) -> String;
}

impl Release for LockGuard {
    fn release_now(self) -> Result<bool> {
        self.release()
    }

    fn describe(&self) -> String {
        self.key().to_string()
    }
}

impl Release for MultiGuard {
    fn release_now(self) -> Result<bool> {
        self.release()
    }

    fn describe(&self) -> String {
        let keys: Vec<String> = self.keys().map(ToString::to_string).collect();
        keys.join(", ")
    }
}

/// Runs `work` on the calling thread with `guard`, then releases the guard whatever happened: a
/// failed release is logged (the lock expires at its TTL), a panic of `work` continues after the
/// release.
pub(super) fn run_and_release<G: Release, T>(guard: G, work: impl FnOnce(&G) -> T) -> T {
    // The panic is resumed below, after the release: nothing observes a broken invariant.
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| work(&guard)));
    let keys = guard.describe();
    if let Err(error) = guard.release_now() {
        tracing::warn!(keys = %keys, error = %error.chain(),
            "could not release after the work; the lock expires at its TTL");
    }
    match outcome {
        Ok(value) => value,
        Err(payload) => panic::resume_unwind(payload),
    }
}
