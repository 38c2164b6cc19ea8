//! A blocking API, for code that has no async runtime (a CLI tool, a synchronous service).
//!
//! Modelled on `reqwest::blocking`: a [`blocking::LockManager`](LockManager) owns a small tokio
//! runtime (one worker thread, named `leasehold-blocking`) and drives the async
//! [`crate::LockManager`] on it. Each call blocks the calling thread until it completes; the
//! background work of the manager (the renewal watchdog, releases of dropped guards, store
//! connections) runs on the worker thread between calls.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::{blocking, LockOptions};
//!
//! # fn main() -> leasehold::Result<()> {
//! let locks = blocking::LockManager::new(
//!     leasehold::LockManager::builder().client_id("cli").farm_id("f1"),
//! )?;
//! let guard = locks.try_lock("nightly-report")?;
//! assert!(guard.is_held());
//!
//! // Another thread fails fast, or waits up to a deadline.
//! std::thread::scope(|s| {
//!     s.spawn(|| assert!(locks.try_lock("nightly-report").unwrap_err().is_unavailable()));
//! });
//! assert!(guard.release()?); // true: it was still ours
//!
//! let wait = LockOptions::new().wait(Duration::from_secs(5));
//! let guard = locks.lock_with("nightly-report", wait)?;
//! println!("fencing token {:?}", guard.fencing_token());
//! drop(guard); // released in the background
//!
//! let total = locks.with_lock("nightly-report", |_guard| 40 + 2)?; // released after, even on panic
//! assert_eq!(total, 42);
//! locks.shutdown()?;
//! # Ok(()) }
//! ```
//!
//! # Network stores
//! Connecting a network store is async, and its connection must live on the manager's runtime:
//! build the builder inside it with [`LockManager::connect`].
//!
//! # Threads, not tasks
//! A call runs on the calling thread, so the holder of a lock (for reentrancy, see
//! [`LockManagerBuilder::task_holders`]) is that thread: the same thread locking a key twice
//! counts up, another thread contends. Pass a [`Holder`](crate::Holder) in
//! [`LockOptions::holder`] to share a hold across threads.
//!
//! # Not from async code
//! Blocking a thread of an async runtime would stall it (and tokio refuses to start a runtime
//! inside another): every call made where a tokio runtime is current — inside a task, a
//! `block_on`, or a `spawn_blocking` closure — returns
//! [`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument) instead. Use
//! [`crate::LockManager`] there.

use std::future::Future;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use crate::core::{Error, Lease, LockKey, OwnerToken, Result};
use crate::{LockManagerBuilder, LockOptions, ToLockKey};

/// The name of the runtime's worker thread.
const THREAD_NAME: &str = "leasehold-blocking";
/// How long dropping the last handle waits for the runtime's blocking threads.
const RUNTIME_SHUTDOWN: Duration = Duration::from_secs(1);

/// A lock manager whose calls block the calling thread: the blocking twin of
/// [`crate::LockManager`] (see the [module docs](self)).
///
/// Cheap to clone (one `Arc`); clones share the manager and its runtime. Dropping the last clone
/// (and the last guard) shuts the manager down — waiting for releases still in the background,
/// bounded by the [shutdown timeout](LockManagerBuilder::shutdown_timeout) — and then its runtime.
///
/// ```
/// # fn main() -> leasehold::Result<()> {
/// let builder = leasehold::LockManager::builder().client_id("jobs").farm_id("f1");
/// let locks = leasehold::blocking::LockManager::new(builder)?;
/// let guard = locks.try_lock("invoice-7")?;
/// assert_eq!(guard.fencing_token(), Some(1)); // the embedded store fences
/// drop(guard);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LockManager {
    shared: Arc<Shared>,
}

/// What a manager and its guards share: the async manager and the runtime it runs on.
#[derive(Debug)]
struct Shared {
    manager: crate::LockManager,
    handle: tokio::runtime::Handle,
    /// Kept for its `Drop`, after the manager's: the runtime stops last.
    _runtime: OwnedRuntime,
}

impl Shared {
    /// Runs `work` to completion on the calling thread, the runtime driving its background tasks.
    fn block_on<F: Future>(&self, work: F) -> Result<F::Output> {
        not_in_async()?;
        Ok(self.handle.block_on(work))
    }
}

impl Drop for Shared {
    /// Shuts the manager down, so releases of dropped guards finish before the runtime stops.
    fn drop(&mut self) {
        if not_in_async().is_ok() {
            if let Err(error) = self.handle.block_on(self.manager.shutdown()) {
                tracing::warn!(%error, "shutting the blocking lock manager down failed");
            }
        }
    }
}

/// The runtime, shut down without panicking wherever the last handle is dropped.
#[derive(Debug)]
struct OwnedRuntime(Option<tokio::runtime::Runtime>);

impl Drop for OwnedRuntime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            if not_in_async().is_ok() {
                runtime.shutdown_timeout(RUNTIME_SHUTDOWN);
            } else {
                runtime.shutdown_background();
            }
        }
    }
}

/// The error of a blocking call made where a tokio runtime is current.
fn not_in_async() -> Result<()> {
    if tokio::runtime::Handle::try_current().is_ok() {
        return Err(Error::invalid_argument(
            "the blocking API cannot be called from async code: use leasehold::LockManager",
        ));
    }
    Ok(())
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
        not_in_async()?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name(THREAD_NAME)
            .enable_all()
            .build()
            .map_err(|e| {
                Error::internal("could not start the blocking lock manager's runtime")
                    .with_source(e)
            })?;
        let handle = runtime.handle().clone();
        // Dropped without panicking if connecting fails.
        let runtime = OwnedRuntime(Some(runtime));
        let manager = handle.block_on(async move { make().await?.build() })?;
        Ok(LockManager {
            shared: Arc::new(Shared {
                manager,
                handle,
                _runtime: runtime,
            }),
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

    /// [`LockManager::try_lock`] with per-call options.
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

    /// [`LockManager::lock`] with per-call options (the wait: [`LockOptions::wait`]).
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
        // The panic is resumed below, after the release: nothing observes a broken invariant.
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| work(&guard)));
        let key = guard.key().clone();
        if let Err(error) = guard.release() {
            tracing::warn!(key = %key, %error,
                "could not release after the work; the lock expires at its TTL");
        }
        match outcome {
            Ok(value) => Ok(value),
            Err(payload) => panic::resume_unwind(payload),
        }
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

    fn wrap(&self, guard: crate::LockGuard) -> LockGuard {
        LockGuard {
            acquired: guard.lease(),
            inner: Some(guard),
            shared: self.shared.clone(),
        }
    }
}

/// A held lock, from a [`blocking::LockManager`](LockManager): the blocking twin of
/// [`crate::LockGuard`]. Release it with [`LockGuard::release`] to learn whether it was still
/// ours; dropping it releases it in the background, on the manager's runtime.
///
/// It can be sent to, and released or dropped on, another thread.
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
    /// The lock key.
    pub fn key(&self) -> &LockKey {
        self.acquired.key()
    }

    /// The owner token written to the store.
    pub fn token(&self) -> &OwnerToken {
        self.acquired.token()
    }

    /// The fencing token of this acquisition, where the store gives one: pass it with every write
    /// the lock protects (see [`crate::LockGuard::fencing_token`]).
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
    /// store before it expired.
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
    /// still held when the timeout passed (see [`crate::LockGuard::lost`]; only renewal notices a
    /// loss). From async code, `Some` with the error
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
            let _runtime = self.shared.handle.enter();
            drop(inner);
        }
    }
}
