//! The lock manager: the public API.
//!
//! Split by job: [`options`] (per-call options, defaults, the plan a call resolves to),
//! [`builder`] (settings and the layer stack), [`acquire`] (one attempt, the wait loop, undoing
//! an abandoned attempt), [`shutdown`] (the lifecycle's end, and signals), [`kinds`] (read,
//! semaphore and multi-locks), over [`state`] (the manager type and its resolved settings, which
//! every part reads). Here: the exclusive lock's calls and inspection. Guards and renewal
//! tasks hold a [`Handle`](crate::handle::Handle), never the manager.

use std::future::Future;

use crate::core::{
    BoxStore, Error, HistoryEntry, Lease, LockInfo, LockKey, LockLevel, LockStore, Result,
};
use crate::guard::LockGuard;
use crate::scenario::{AcquireMode, ScenarioRegistry};

mod acquire;
mod attempt;
mod builder;
mod kinds;
mod options;
mod shutdown;
mod state;

pub use builder::LockManagerBuilder;
pub use options::{
    LockOptions, ToLockKey, DEFAULT_LOCK_TTL, DEFAULT_MIN_BACKOFF, DEFAULT_RELEASE_RETRY,
    DEFAULT_RETRY_INTERVAL, DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_WAIT_FOR_LOCK,
};
#[cfg(feature = "signal")]
pub use shutdown::{SignalOutcome, SignalShutdown};
pub use state::LockManager;

impl LockManager {
    /// Starts building a manager (see [`LockManagerBuilder`] for the defaults).
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder::new()
    }

    /// The key of `entity` at the manager's default level (the seed's `getLockInstance`). No I/O.
    pub fn key(&self, entity: &str) -> Result<LockKey> {
        self.key_at(entity, self.inner.config.default_level)
    }

    /// The key of `entity` at `level`. No I/O.
    pub fn key_at(&self, entity: &str, level: LockLevel) -> Result<LockKey> {
        let config = &self.inner.config;
        LockKey::new(level, config.farm_id.as_deref(), &config.client_id, entity)
    }

    /// The layered store this manager talks to.
    pub fn store(&self) -> &BoxStore {
        &self.inner.handle.store
    }

    /// One attempt to acquire `key` with the default TTL: a guard, or
    /// [`ErrorKind::LockUnavailable`](crate::ErrorKind::LockUnavailable) at once if another owner
    /// holds it. No retry.
    pub async fn try_lock(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.try_lock_with(key, LockOptions::new()).await
    }

    /// [`LockManager::try_lock`] with per-call options.
    pub async fn try_lock_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        let plan = self.plan(&key, &opts)?;
        self.execute(plan, None).await
    }

    /// Acquires `key`, waiting up to the default wait (90 s) while another owner holds it.
    ///
    /// Tasks of this process waiting for one key are served in the order they asked, and only
    /// the first of them asks the store meanwhile. It is woken as soon as a local holder releases
    /// the key, or the store says the key may be free; otherwise it asks again with jittered
    /// exponential backoff (10 ms up to the retry interval), never sleeping past the deadline.
    /// When the deadline passes the error is [`ErrorKind::Timeout`](crate::ErrorKind::Timeout).
    ///
    /// The call returns by its deadline even when the store stops answering (a hung or paused
    /// member, a partition): every store request of the wait ends at the deadline (or, begun at
    /// it, one shortest backoff step after it began), and an attempt cut off there is undone in
    /// the background (an owner-checked release of its own token). The error is then a store
    /// error ([`InDoubt`](crate::ErrorKind::InDoubt) for a cut attempt), as below, if the store
    /// stopped answering: the request went unanswered for longer than twice the slowest answer
    /// of the wait (plus that backoff step). A look at the deadline that a slow store could not
    /// answer in its usual time ends the wait as the last answer left it: a `Timeout` after
    /// refusals, never "the store is down" (which a scenario may proceed without the lock on).
    /// Only the first
    /// attempt, a plain try, always gets its answer, bounded by the store's own request timeout
    /// as a [`try_lock`](Self::try_lock) is, so that a wait shorter than a round trip still asks
    /// once.
    ///
    /// # A store that is down
    /// A blocking acquire rides out a failover: a store error that a failover or an outage gives
    /// ([`Connection`](crate::ErrorKind::Connection),
    /// [`RetriesExhausted`](crate::ErrorKind::RetriesExhausted),
    /// [`InDoubt`](crate::ErrorKind::InDoubt)) is retried with the same backoff, within the same
    /// wait, like a refusal. If the wait runs out while the store is still down, the error has the
    /// last store error's kind (not `Timeout`) and that error as its source. Any other error ends
    /// the wait at once. An attempt left in doubt is undone (an owner-checked release of its own
    /// token, in the background), so no lock is left held for nobody. With a scenario's
    /// `on_store_down = proceed` the call proceeds without the lock only once its wait is spent
    /// (a [`try_lock`](Self::try_lock), which never retries, at once).
    ///
    /// # Cancel safety
    /// Dropping the future stops the wait: no lock is left held and no waiter registration is
    /// left behind. Stores' `acquire` is cancel safe, and an attempt dropped midway (for
    /// example during a readback) or ended in doubt is also undone by the manager: an
    /// owner-checked release of that attempt's token, sent in the background.
    pub async fn lock(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.lock_with(key, LockOptions::new()).await
    }

    /// [`LockManager::lock`] with per-call options.
    pub async fn lock_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        let plan = self.plan(&key, &opts)?;
        if plan.acquire_mode == AcquireMode::Try {
            return Err(Error::invalid_argument(format!(
                "scenario `{}` is try-only: use try_lock (or acquire, which follows the \
                 scenario's mode), or make the scenario blocking",
                plan.scenario
            ))
            .with_key(plan.key.as_str()));
        }
        let wait = plan.wait;
        self.execute(plan, Some(wait)).await
    }

    /// Acquires `key` the way its scenario says: one attempt for a [`AcquireMode::Try`] scenario, a
    /// wait of the scenario's length for a [`AcquireMode::Blocking`] one (and for keys no scenario
    /// covers, a wait of the manager's default). See [`crate::scenario`].
    pub async fn acquire(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.acquire_with(key, LockOptions::new()).await
    }

    /// [`LockManager::acquire`] with per-call options.
    pub async fn acquire_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        let plan = self.plan(&key, &opts)?;
        let wait = match plan.acquire_mode {
            AcquireMode::Try => None,
            _ => Some(plan.wait),
        };
        self.execute(plan, wait).await
    }

    /// What every lock call checks of `key` and `opts` before any store I/O: the key, the
    /// options, and the scenario they resolve to (a strict registry that covers nothing, a
    /// renewal not shorter than the TTL, …). An `Err` is the error the call would return at once;
    /// `Ok` says nothing of the store. For a program that checks its configuration at start,
    /// before it connects, with a manager over the embedded store.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::{ErrorKind, LockOptions};
    /// # fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::LockManager::builder().client_id("docs").farm_id("f1").build()?;
    /// locks.check("report", &LockOptions::new().ttl(Duration::from_secs(30)))?;
    /// let slow_renewal = LockOptions::new().ttl(Duration::from_secs(30)).renew_every(Duration::from_secs(40));
    /// assert_eq!(locks.check("report", &slow_renewal).unwrap_err().kind(), ErrorKind::InvalidArgument);
    /// # Ok(()) }
    /// ```
    pub fn check(&self, key: impl ToLockKey, opts: &LockOptions) -> Result<()> {
        self.plan(&key, opts).map(drop)
    }

    /// The scenarios this manager resolves lock calls against.
    pub fn scenarios(&self) -> &ScenarioRegistry {
        &self.inner.config.registry
    }

    /// The lock history of `key` kept in the store, newest first (see
    /// [`TraceConfig`](crate::core::TraceConfig)): who acquired, waited, released or lost it,
    /// from which host and process. [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported)
    /// for stores without [`Capabilities::history`](crate::Capabilities::history).
    pub async fn history(&self, key: impl ToLockKey) -> Result<Vec<HistoryEntry>> {
        let key = key.to_lock_key(self)?;
        self.inner.handle.store.history(&key).await
    }

    /// Runs `work` under the lock (waiting as [`LockManager::lock`] does) and always releases it:
    /// after success, after an error returned by `work`, and after a panic inside `work` (the panic
    /// then continues). `work` receives the lease (key, token, fencing token).
    ///
    /// If the release itself fails the result of `work` is still returned, and the failure is
    /// logged at `warn` (the lock then expires at its TTL).
    pub async fn with_lock<F, Fut, T>(&self, key: impl ToLockKey, work: F) -> Result<T>
    where
        F: FnOnce(Lease) -> Fut,
        Fut: Future<Output = T>,
    {
        let guard = self.lock(key).await?;
        kinds::run_and_release(guard, work).await
    }

    /// Who holds `key`, and for how long, or `None` if it is free.
    pub async fn inspect(&self, key: impl ToLockKey) -> Result<Option<LockInfo>> {
        let key = key.to_lock_key(self)?;
        self.inner.handle.store.inspect(&key).await
    }

    /// Held locks whose storage key starts with `prefix`, if the store supports listing.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.handle.store.list(prefix).await
    }
}
