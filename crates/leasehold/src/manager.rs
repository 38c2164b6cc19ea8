//! The lock manager: the public API.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::backoff::Backoff;
use crate::core::{
    instant_after, validate_ttl, Acquire, BoxStore, Error, ErrorKind, Layer, Lease, Lifecycle,
    LockEvent, LockInfo, LockKey, LockLevel, LockStore, Observer, Observers, OwnerToken, Result,
};
use crate::guard::LockGuard;
use crate::layers::{
    GracefulShutdownConfig, LocalCompetition, LocalCompetitionLayer, ReadbackConfig, ReadbackLayer,
    ReentrancyConfig, ReentrancyLayer, ShutdownLayer, UnlockWindowConfig, UnlockWindowLayer,
};
use crate::waiters::Waiters;
use crate::{Holder, MemoryStore};

/// Default lock TTL, as the seed lock manager: 90 s.
pub const DEFAULT_LOCK_TTL: Duration = Duration::from_secs(90);
/// Default wait of a blocking [`LockManager::lock`], as the seed lock manager: 90 s.
pub const DEFAULT_WAIT_FOR_LOCK: Duration = Duration::from_secs(90);
/// Default longest sleep between attempts of a blocking acquire, the seed's 1 s (leasehold starts
/// at [`DEFAULT_MIN_BACKOFF`] and backs off with jitter up to this).
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// Default first sleep between attempts of a blocking acquire.
pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(10);
/// Default time [`LockManager::shutdown`] waits for in-flight acquisitions.
pub const DEFAULT_SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Anything that names a lock: an entity id (`&str`, `String`, locked at the manager's default
/// level with its client and farm ids) or a ready [`LockKey`].
pub trait ToLockKey {
    /// Builds the key in the manager's scope.
    fn to_lock_key(&self, manager: &LockManager) -> Result<LockKey>;
}

impl ToLockKey for str {
    fn to_lock_key(&self, manager: &LockManager) -> Result<LockKey> {
        manager.key(self)
    }
}

impl ToLockKey for String {
    fn to_lock_key(&self, manager: &LockManager) -> Result<LockKey> {
        manager.key(self)
    }
}

impl ToLockKey for LockKey {
    fn to_lock_key(&self, _: &LockManager) -> Result<LockKey> {
        Ok(self.clone())
    }
}

impl<T: ToLockKey + ?Sized> ToLockKey for &T {
    fn to_lock_key(&self, manager: &LockManager) -> Result<LockKey> {
        (**self).to_lock_key(manager)
    }
}

/// Per-call overrides of the manager's defaults.
///
/// ```
/// use std::time::Duration;
/// use leasehold::{Holder, LockOptions};
/// let opts = LockOptions::new().ttl(Duration::from_secs(2)).wait(Duration::from_millis(500)).holder(Holder::new());
/// # let _ = opts;
/// ```
#[derive(Debug, Clone, Default)]
pub struct LockOptions {
    ttl: Option<Duration>,
    wait: Option<Duration>,
    holder: Option<Holder>,
    renew: Option<bool>,
    renew_every: Option<Duration>,
    scenario: Option<&'static str>,
}

impl LockOptions {
    /// The manager's defaults.
    pub fn new() -> Self {
        LockOptions::default()
    }

    /// The lease TTL for this acquisition.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long a blocking [`LockManager::lock_with`] waits (ignored by `try_lock_with`).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The holder identity, for reentrancy.
    pub fn holder(mut self, holder: Holder) -> Self {
        self.holder = Some(holder);
        self
    }

    /// Keep the lease alive while the guard lives (see [`LockGuard::lost`]). Default: the
    /// manager's [`LockManagerBuilder::renewal`] setting (off unless set).
    pub fn renew(mut self, on: bool) -> Self {
        self.renew = Some(on);
        self
    }

    /// Renew every `every` instead of every third of the TTL (implies `renew(true)`). Must be
    /// shorter than the TTL.
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew = Some(true);
        self.renew_every = Some(every);
        self
    }

    /// A label for this kind of lock use (`"checkout"`, `"nightly-job"`), recorded on the tracing
    /// span so lock scenarios can be told apart. Default: the manager's scenario name.
    pub fn scenario(mut self, name: &'static str) -> Self {
        self.scenario = Some(name);
        self
    }
}

/// What an acquisition was asked to do, resolved against the manager's defaults.
struct Plan {
    key: LockKey,
    ttl: Duration,
    holder: Option<crate::core::HolderId>,
    /// `Some(every)` when the guard renews its lease (`every = None`: a third of the TTL).
    renew: Option<Option<Duration>>,
    scenario: &'static str,
}

/// Builds a [`LockManager`]. Obtain one with [`LockManager::builder`].
#[derive(Debug)]
pub struct LockManagerBuilder {
    client_id: Option<String>,
    farm_id: Option<String>,
    default_level: LockLevel,
    store: Option<BoxStore>,
    lock_ttl: Duration,
    wait_for_lock: Duration,
    retry_interval: Duration,
    min_backoff: Duration,
    shutdown_timeout: Duration,
    observers: Observers,
    task_holders: bool,
    renew: bool,
    scenario: &'static str,
    scenarios: ScenarioLayers,
}

/// Which scenario layers the builder assembles, and how (see [`crate::layers`]).
#[derive(Debug, Clone, Default)]
struct ScenarioLayers {
    readback: Option<ReadbackConfig>,
    unlock_window: Option<UnlockWindowConfig>,
    local: Option<LocalCompetitionLayer>,
    reentrancy: Option<ReentrancyConfig>,
    shutdown: Option<GracefulShutdownConfig>,
}

impl LockManagerBuilder {
    /// The client id: every lock id is `<client_id>#<entity>`. Required.
    pub fn client_id(mut self, client_id: impl Into<String>) -> Self {
        self.client_id = Some(client_id.into());
        self
    }

    /// The farm (data center) id, required for DC locks (the default level).
    pub fn farm_id(mut self, farm_id: impl Into<String>) -> Self {
        self.farm_id = Some(farm_id.into());
        self
    }

    /// The level of locks named by an entity id alone. Default [`LockLevel::Dc`].
    pub fn default_level(mut self, level: LockLevel) -> Self {
        self.default_level = level;
        self
    }

    /// The store. Default: a new [`MemoryStore`].
    pub fn store(mut self, store: impl LockStore) -> Self {
        self.store = Some(BoxStore::new(store));
        self
    }

    /// Wraps the store (as configured so far) in a layer. The first layer added is the innermost.
    ///
    /// Custom layers always sit directly around the store, inside the scenario layers enabled with
    /// [`LockManagerBuilder::default_layers`] and friends (so, for example, the in-doubt errors of a
    /// timeout layer are read back by the readback layer); see [`crate::layers`].
    pub fn layer<L>(mut self, layer: L) -> Self
    where
        L: Layer<BoxStore>,
        L::Store: LockStore,
    {
        let store = self
            .store
            .take()
            .unwrap_or_else(|| BoxStore::new(MemoryStore::new()));
        self.store = Some(BoxStore::new(layer.layer(store)));
        self
    }

    /// Default lease TTL. Default 90 s.
    pub fn lock_ttl(mut self, ttl: Duration) -> Self {
        self.lock_ttl = ttl;
        self
    }

    /// Default wait of a blocking acquire. Default 90 s.
    pub fn wait_for_lock(mut self, wait: Duration) -> Self {
        self.wait_for_lock = wait;
        self
    }

    /// Longest sleep between attempts of a blocking acquire. Default 1 s.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// First sleep between attempts of a blocking acquire. Default 10 ms.
    pub fn min_backoff(mut self, backoff: Duration) -> Self {
        self.min_backoff = backoff;
        self
    }

    /// How long [`LockManager::shutdown`] waits for in-flight acquisitions. Default 5 s.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Adds an observer of lock events.
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observers = self.observers.with(observer);
        self
    }

    /// When no explicit [`Holder`] is given, use the current tokio task as the holder identity, so
    /// that with the reentrancy layer a task re-taking a key it holds counts up. Default off: an
    /// acquisition without a holder is a new holder.
    pub fn task_holders(mut self, on: bool) -> Self {
        self.task_holders = on;
        self
    }

    /// Renew every lock's lease while its guard lives, unless a call says otherwise
    /// ([`LockOptions::renew`]). Default off.
    pub fn renewal(mut self, on: bool) -> Self {
        self.renew = on;
        self
    }

    /// The default scenario label on tracing spans (see [`LockOptions::scenario`]). Default
    /// `"default"`.
    pub fn scenario(mut self, name: &'static str) -> Self {
        self.scenario = name;
        self
    }

    /// Enables the [readback layer](crate::layers::readback) (Bond 3.1): an in-doubt acquire or
    /// release is resolved by reading the record back.
    pub fn readback(mut self, config: ReadbackConfig) -> Self {
        self.scenarios.readback = Some(config);
        self
    }

    /// Enables the [unlock window](crate::layers::unlock_window) (Bond 3.2): a release is sent only
    /// while the lease can still be ours.
    pub fn unlock_window(mut self, config: UnlockWindowConfig) -> Self {
        self.scenarios.unlock_window = Some(config);
        self
    }

    /// Enables [local competition](crate::layers::local_competition) (Bond 3.4): contenders of
    /// this process meet in memory first (fast-fail, local wake-up, optional hand-off).
    pub fn local_competition(mut self, layer: LocalCompetitionLayer) -> Self {
        self.scenarios.local = Some(layer);
        self
    }

    /// Enables (`true`, or a [`ReentrancyConfig`]) or disables (`false`) the
    /// [reentrancy layer](crate::layers::reentrancy) (Bond 3.6). Holders are explicit
    /// [`Holder`]s, or tasks with [`LockManagerBuilder::task_holders`].
    pub fn reentrancy(mut self, config: impl Into<ReentrancyToggle>) -> Self {
        self.scenarios.reentrancy = config.into().0;
        self
    }

    /// Enables [graceful shutdown](crate::layers::shutdown) (Bond 3.5): live locks are tracked and
    /// [`LockManager::shutdown`] releases them all.
    pub fn graceful_shutdown(mut self, config: GracefulShutdownConfig) -> Self {
        self.scenarios.shutdown = Some(config);
        self
    }

    /// Enables every scenario layer with its default configuration, in the documented order
    /// (outer → inner: reentrancy, local competition, shutdown tracking, unlock window, readback;
    /// see [`crate::layers`] for why). Layers enabled with their own method before or after keep
    /// that configuration.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::LockManager::builder().client_id("c").farm_id("f").default_layers().build()?;
    /// let guard = locks.try_lock("k").await?;
    /// assert!(locks.try_lock("k").await.unwrap_err().is_unavailable()); // fast-failed locally
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn default_layers(mut self) -> Self {
        let s = &mut self.scenarios;
        s.readback.get_or_insert_with(ReadbackConfig::default);
        s.unlock_window
            .get_or_insert_with(UnlockWindowConfig::default);
        s.local.get_or_insert_with(LocalCompetitionLayer::default);
        s.reentrancy.get_or_insert_with(ReentrancyConfig::default);
        s.shutdown
            .get_or_insert_with(GracefulShutdownConfig::default);
        self
    }

    /// The observers configured so far (for layers added by later issues' builder methods).
    pub fn observers(&self) -> &Observers {
        &self.observers
    }

    /// Validates the configuration and builds the manager. No store I/O.
    pub fn build(self) -> Result<LockManager> {
        let client_id = self.client_id.ok_or_else(|| {
            Error::invalid_argument(
                "a client id is required: LockManager::builder().client_id(\"orders\")",
            )
        })?;
        // Validate ids now, with a sample entity, so a bad id fails at build, not at first lock.
        LockKey::new(LockLevel::Xdc, None, &client_id, "probe")?;
        if let Some(farm) = &self.farm_id {
            LockKey::dc(farm, &client_id, "probe")?;
        } else if self.default_level == LockLevel::Dc {
            return Err(Error::invalid_argument(
                "DC locks (the default level) need a farm id: .farm_id(\"farm1\"), or \
                 .default_level(LockLevel::Xdc)",
            ));
        }
        validate_ttl(self.lock_ttl)?;
        if self.wait_for_lock > crate::core::MAX_TTL {
            return Err(Error::invalid_argument(
                "wait_for_lock is longer than 30 days",
            ));
        }
        if self.retry_interval.is_zero() {
            return Err(Error::invalid_argument(
                "retry_interval must be greater than zero (default 1s)",
            ));
        }
        // The default store stays concrete, so the layer stack over it is erased (boxed) once.
        let (store, closers) = match self.store {
            Some(store) => self.scenarios.assemble(store, &self.observers),
            None => self.scenarios.assemble(MemoryStore::new(), &self.observers),
        };
        Ok(LockManager {
            inner: Arc::new(ManagerInner {
                client_id,
                farm_id: self.farm_id,
                default_level: self.default_level,
                store,
                lock_ttl: self.lock_ttl,
                wait_for_lock: self.wait_for_lock,
                backoff: Backoff::new(self.min_backoff, self.retry_interval),
                shutdown_timeout: self.shutdown_timeout,
                observers: self.observers,
                task_holders: self.task_holders,
                renew: self.renew,
                scenario: self.scenario,
                waiters: Waiters::default(),
                closed: AtomicBool::new(false),
                closing: Notify::new(),
                in_flight: AtomicUsize::new(0),
                in_flight_done: Notify::new(),
                closers,
                graceful: self.scenarios.shutdown,
            }),
        })
    }
}

/// The lock manager: acquire, wait for, release and inspect distributed locks.
///
/// Cheap to clone (one `Arc`); share one per process. Built over a store (the embedded
/// [`MemoryStore`] by default) wrapped in a stack of layers.
///
/// ```
/// use std::time::Duration;
/// use leasehold::LockManager;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let locks = LockManager::builder().client_id("orders").farm_id("farm1").build()?;
///
/// let guard = locks.try_lock("order-42").await?;         // one attempt
/// assert!(locks.try_lock("order-42").await.unwrap_err().is_unavailable());
/// assert!(guard.release().await?);                       // true: it was still ours
///
/// let total = locks.with_lock("order-42", |_lease| async { 40 + 2 }).await?;
/// assert_eq!(total, 42);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LockManager {
    pub(crate) inner: Arc<ManagerInner>,
}

#[derive(Debug)]
pub(crate) struct ManagerInner {
    client_id: String,
    farm_id: Option<String>,
    default_level: LockLevel,
    pub(crate) store: BoxStore,
    lock_ttl: Duration,
    wait_for_lock: Duration,
    backoff: Backoff,
    shutdown_timeout: Duration,
    pub(crate) observers: Observers,
    task_holders: bool,
    renew: bool,
    scenario: &'static str,
    pub(crate) waiters: Waiters,
    closed: AtomicBool,
    /// Wakes waiting `lock()` calls when shutdown starts, so they end at once.
    closing: Notify,
    in_flight: AtomicUsize,
    in_flight_done: Notify,
    /// Called when shutdown starts (local competition wakes its waiters).
    closers: Closers,
    #[cfg_attr(not(feature = "signal"), allow(dead_code))]
    graceful: Option<GracefulShutdownConfig>,
}

/// Counts an acquisition in flight, so shutdown can wait for it.
struct InFlight<'a>(&'a ManagerInner);

impl<'a> InFlight<'a> {
    fn enter(inner: &'a ManagerInner) -> Result<Self> {
        inner.in_flight.fetch_add(1, Ordering::SeqCst);
        if inner.closed.load(Ordering::SeqCst) {
            drop(InFlight(inner));
            return Err(Error::shut_down());
        }
        Ok(InFlight(inner))
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        // Only a shutdown waits for this: if `closed` reads false here, the shutdown's own check
        // of `in_flight` comes later in the SeqCst order and sees the decrement.
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1
            && self.0.closed.load(Ordering::SeqCst)
        {
            self.0.in_flight_done.notify_waiters();
        }
    }
}

impl LockManager {
    /// Starts building a manager.
    pub fn builder() -> LockManagerBuilder {
        LockManagerBuilder {
            client_id: None,
            farm_id: None,
            default_level: LockLevel::Dc,
            store: None,
            lock_ttl: DEFAULT_LOCK_TTL,
            wait_for_lock: DEFAULT_WAIT_FOR_LOCK,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            min_backoff: DEFAULT_MIN_BACKOFF,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            observers: Observers::default(),
            task_holders: false,
            renew: false,
            scenario: "default",
            scenarios: ScenarioLayers::default(),
        }
    }

    /// The key of `entity` at the manager's default level (the seed's `getLockInstance`). No I/O.
    pub fn key(&self, entity: &str) -> Result<LockKey> {
        self.key_at(entity, self.inner.default_level)
    }

    /// The key of `entity` at `level`. No I/O.
    pub fn key_at(&self, entity: &str, level: LockLevel) -> Result<LockKey> {
        LockKey::new(
            level,
            self.inner.farm_id.as_deref(),
            &self.inner.client_id,
            entity,
        )
    }

    /// The layered store this manager talks to.
    pub fn store(&self) -> &BoxStore {
        &self.inner.store
    }

    /// One attempt to acquire `key` with the default TTL: a guard, or
    /// [`ErrorKind::LockUnavailable`] at once if another owner holds it. No retry.
    pub async fn try_lock(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.try_lock_with(key, LockOptions::new()).await
    }

    /// [`LockManager::try_lock`] with per-call options.
    pub async fn try_lock_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        let plan = self.plan(&key, &opts)?;
        self.acquire(plan, None).await
    }

    /// Acquires `key`, waiting up to the default wait (90 s) while another owner holds it.
    ///
    /// A task of this process waiting on a key is woken as soon as a local holder releases it;
    /// against holders in other processes it retries with jittered exponential backoff (10 ms up to
    /// the retry interval), never sleeping past the deadline. Errors other than
    /// [`ErrorKind::LockUnavailable`] end the wait at once. When the deadline passes the error is
    /// [`ErrorKind::Timeout`].
    ///
    /// # Cancel safety
    /// Dropping the future stops the wait: no lock is left held and no waiter registration is
    /// left behind. Stores' `try_acquire` is cancel safe, and an attempt dropped midway (for
    /// example during a readback) or ended in doubt is also undone by the manager: an
    /// owner-checked release of that attempt's token, sent in the background.
    pub async fn lock(&self, key: impl ToLockKey) -> Result<LockGuard> {
        self.lock_with(key, LockOptions::new()).await
    }

    /// [`LockManager::lock`] with per-call options.
    pub async fn lock_with(&self, key: impl ToLockKey, opts: LockOptions) -> Result<LockGuard> {
        let plan = self.plan(&key, &opts)?;
        let wait = opts.wait.unwrap_or(self.inner.wait_for_lock);
        self.acquire(plan, Some(wait)).await
    }

    /// One acquisition: a single attempt (`wait: None`) or a wait loop, in a tracing span, with
    /// the outcome reported to observers.
    async fn acquire(&self, plan: Plan, wait: Option<Duration>) -> Result<LockGuard> {
        let span = tracing::info_span!(
            "leasehold.acquire",
            key = %plan.key,
            store = self.inner.store.name(),
            scenario = plan.scenario,
            mode = if wait.is_some() { "wait" } else { "try" },
            outcome = tracing::field::Empty,
            attempts = tracing::field::Empty,
        );
        // The clock is read only when the time is needed: a wait's deadline, or the `waited` of
        // an event someone listens to.
        let started = (wait.is_some() || !self.inner.observers.is_empty()).then(Instant::now);
        let mut attempts = 0u32;
        let result = match InFlight::enter(&self.inner) {
            Ok(_in_flight) => {
                self.attempts(&plan, wait, started, &mut attempts)
                    .instrument(span.clone())
                    .await
            }
            Err(shut_down) => Err(shut_down),
        };
        let waited = || started.map_or(Duration::ZERO, |at| at.elapsed());
        span.record("attempts", attempts);
        match result {
            Ok(lease) => {
                span.record("outcome", "acquired");
                self.inner.observers.emit(|| LockEvent::Acquired {
                    key: lease.key().clone(),
                    token: lease.token().clone(),
                    fencing_token: lease.fencing_token(),
                    waited: waited(),
                    attempts,
                });
                Ok(LockGuard::new(self.inner.clone(), lease, plan.renew))
            }
            Err(error) => {
                span.record("outcome", error.kind().as_str());
                self.inner.observers.emit(|| LockEvent::AcquireFailed {
                    key: plan.key.clone(),
                    error: error.kind(),
                    waited: waited(),
                    attempts,
                });
                Err(error)
            }
        }
    }

    async fn attempts(
        &self,
        plan: &Plan,
        wait: Option<Duration>,
        started: Option<Instant>,
        attempts: &mut u32,
    ) -> Result<Lease> {
        let Some(wait) = wait else {
            *attempts = 1;
            let req = Acquire::new(plan.key.clone(), OwnerToken::generate(), plan.ttl)
                .with_holder(plan.holder);
            return self.attempt(req).await;
        };
        let started = started.unwrap_or_else(Instant::now);
        let deadline = started + wait;
        let subscription = self.inner.waiters.subscribe(&plan.key);
        loop {
            // Enable the wake-up before the attempt, so a release between a failed attempt and the
            // sleep is not missed.
            let woken = subscription.notify().notified();
            tokio::pin!(woken);
            woken.as_mut().enable();

            let req = Acquire::new(plan.key.clone(), OwnerToken::generate(), plan.ttl)
                .with_holder(plan.holder)
                .with_deadline(Some(deadline));
            *attempts += 1;
            match self.attempt(req).await {
                Err(e) if e.is_unavailable() => {}
                done => return done,
            }
            let now = Instant::now();
            if now >= deadline {
                return Err(Error::new(
                    ErrorKind::Timeout,
                    format!(
                        "still held by another owner after waiting {:?} ({attempts} attempts); \
                         wait longer or inspect the holder",
                        now - started
                    ),
                )
                .with_key(plan.key.as_str()));
            }
            let pause = self.inner.backoff.delay(*attempts).min(deadline - now);
            let closing = self.inner.closing.notified();
            tokio::pin!(closing);
            closing.as_mut().enable();
            if self.inner.closed.load(Ordering::SeqCst) {
                return Err(Error::shut_down());
            }
            tokio::select! {
                _ = &mut woken => {}
                _ = closing => return Err(Error::shut_down()),
                _ = tokio::time::sleep(pause) => {}
            }
        }
    }

    async fn attempt(&self, req: Acquire) -> Result<Lease> {
        let mut undo = Undo {
            manager: &self.inner,
            req: &req,
            armed: true,
        };
        let result = self.inner.store.try_acquire(&req).await;
        undo.armed = result.as_ref().is_err_and(Error::is_in_doubt);
        drop(undo);
        if let Err(error) = &result {
            if error.is_unavailable() {
                self.inner.observers.emit(|| LockEvent::Contended {
                    key: req.key.clone(),
                });
            }
        }
        result
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
        let outcome = AssertUnwindSafe(work(guard.lease())).catch_unwind().await;
        let key = guard.key().clone();
        if let Err(error) = guard.release().await {
            tracing::warn!(key = %key, %error, "with_lock could not release; the lock expires at its TTL");
        }
        match outcome {
            Ok(value) => Ok(value),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    }

    /// Who holds `key`, and for how long, or `None` if it is free.
    pub async fn inspect(&self, key: impl ToLockKey) -> Result<Option<LockInfo>> {
        let key = key.to_lock_key(self)?;
        self.inner.store.inspect(&key).await
    }

    /// Held locks whose storage key starts with `prefix`, if the store supports listing.
    pub async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.store.list(prefix).await
    }

    /// Stops taking new acquisitions (they fail with [`ErrorKind::ShutDown`]), waits up to the
    /// shutdown timeout for in-flight ones, then shuts the layered store down — with the graceful
    /// shutdown layer, that releases every live lock. Returns how many locks were released.
    pub async fn shutdown(&self) -> Result<usize> {
        self.inner.closed.store(true, Ordering::SeqCst);
        self.inner.closing.notify_waiters();
        for close in &self.inner.closers.0 {
            close();
        }
        let deadline = instant_after(Instant::now(), self.inner.shutdown_timeout);
        loop {
            let done = self.inner.in_flight_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.inner.in_flight.load(Ordering::SeqCst) == 0 {
                break;
            }
            if tokio::time::timeout_at(deadline, done).await.is_err() {
                tracing::warn!(
                    in_flight = self.inner.in_flight.load(Ordering::SeqCst),
                    "shutdown timeout passed with acquisitions still in flight"
                );
                break;
            }
        }
        self.inner.store.shutdown().await
    }

    /// Whether [`LockManager::shutdown`] was called.
    pub fn is_shut_down(&self) -> bool {
        self.inner.closed.load(Ordering::SeqCst)
    }

    fn plan(&self, key: &impl ToLockKey, opts: &LockOptions) -> Result<Plan> {
        let key = key.to_lock_key(self)?;
        let ttl = opts.ttl.unwrap_or(self.inner.lock_ttl);
        validate_ttl(ttl)?;
        if let Some(wait) = opts.wait {
            if wait > crate::core::MAX_TTL {
                return Err(Error::invalid_argument("wait is longer than 30 days"));
            }
        }
        if let Some(every) = opts.renew_every {
            if every.is_zero() || every >= ttl {
                return Err(Error::invalid_argument(format!(
                    "renew_every ({every:?}) must be greater than zero and shorter than the TTL \
                     ({ttl:?}); a third of the TTL is the default"
                )));
            }
        }
        let holder = opts.holder.map(|h| h.id()).or_else(|| {
            self.inner
                .task_holders
                .then(crate::core::HolderId::current_task)
                .flatten()
        });
        let renew = opts
            .renew
            .unwrap_or(self.inner.renew)
            .then_some(opts.renew_every);
        Ok(Plan {
            key,
            ttl,
            holder,
            renew,
            scenario: opts.scenario.unwrap_or(self.inner.scenario),
        })
    }
}

/// What [`LockManagerBuilder::reentrancy`] accepts: `true`/`false`, or a [`ReentrancyConfig`].
#[derive(Debug, Clone, Copy)]
pub struct ReentrancyToggle(Option<ReentrancyConfig>);

impl From<bool> for ReentrancyToggle {
    fn from(on: bool) -> Self {
        ReentrancyToggle(on.then(ReentrancyConfig::default))
    }
}

impl From<ReentrancyConfig> for ReentrancyToggle {
    fn from(config: ReentrancyConfig) -> Self {
        ReentrancyToggle(Some(config))
    }
}

type Closer = Box<dyn Fn() + Send + Sync>;

/// Hooks run when shutdown starts.
#[derive(Default)]
struct Closers(Vec<Closer>);

impl std::fmt::Debug for Closers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Closers")
            .field("count", &self.0.len())
            .finish()
    }
}

impl Closers {
    /// Applies local competition and keeps a closer for its lifecycle (closing it wakes local
    /// waiters at shutdown).
    fn local<S: LockStore>(
        &mut self,
        layer: LocalCompetitionLayer,
        inner: S,
    ) -> LocalCompetition<S> {
        let local = layer.layer(inner);
        let lifecycle = local.lifecycle().clone();
        self.0.push(Box::new(move || lifecycle.close()));
        local
    }
}

impl ScenarioLayers {
    /// Wraps `store` in the enabled layers, inner → outer: readback, unlock window, shutdown
    /// tracking, local competition, reentrancy (see `crate::layers` for the reasons). The stack
    /// stays generic and is erased (boxed) once, at the end. With every layer on (the default
    /// stack) the layers nest directly; otherwise a disabled layer is a `Maybe::Off`
    /// pass-through, which costs a little on every call (docs/PERFORMANCE.md).
    fn assemble<S: LockStore>(&self, store: S, observers: &Observers) -> (BoxStore, Closers) {
        let mut closers = Closers::default();
        let readback = self
            .readback
            .map(|c| ReadbackLayer::new(c).with_observers(observers.clone()));
        let unlock_window = self
            .unlock_window
            .map(|c| UnlockWindowLayer::new(c).with_observers(observers.clone()));
        let shutdown = self
            .shutdown
            .map(|c| ShutdownLayer::new(c).with_observers(observers.clone()));
        let local = self
            .local
            .clone()
            // A lifecycle per manager: layer values cloned into two managers must not close
            // together (the manager closes it at shutdown, through `Closers::local`).
            .map(|layer| {
                layer
                    .with_observers(observers.clone())
                    .with_lifecycle(Lifecycle::new())
            });
        let reentrancy = self
            .reentrancy
            .map(|c| ReentrancyLayer::new(c).with_observers(observers.clone()));
        let store = match (readback, unlock_window, shutdown, local, reentrancy) {
            (None, None, None, None, None) => BoxStore::new(store),
            (Some(rb), Some(uw), Some(sd), Some(lc), Some(re)) => {
                BoxStore::new(re.layer(closers.local(lc, sd.layer(uw.layer(rb.layer(store))))))
            }
            (rb, uw, sd, lc, re) => {
                let store = Maybe::wrap(store, rb, |layer, inner| layer.layer(inner));
                let store = Maybe::wrap(store, uw, |layer, inner| layer.layer(inner));
                let store = Maybe::wrap(store, sd, |layer, inner| layer.layer(inner));
                let store = Maybe::wrap(store, lc, |layer, inner| closers.local(layer, inner));
                BoxStore::new(Maybe::wrap(store, re, |layer, inner| layer.layer(inner)))
            }
        };
        (store, closers)
    }
}

/// An optional layer: the wrapped store when enabled, the store itself when not.
#[derive(Debug)]
enum Maybe<S, W> {
    Off(S),
    On(W),
}

impl<S, W> Maybe<S, W> {
    fn wrap<L>(inner: S, layer: Option<L>, wrap: impl FnOnce(L, S) -> W) -> Self {
        match layer {
            Some(layer) => Maybe::On(wrap(layer, inner)),
            None => Maybe::Off(inner),
        }
    }
}

impl<S: LockStore, W: LockStore> LockStore for Maybe<S, W> {
    fn name(&self) -> &'static str {
        match self {
            Maybe::Off(s) => s.name(),
            Maybe::On(w) => w.name(),
        }
    }
    fn capabilities(&self) -> crate::Capabilities {
        match self {
            Maybe::Off(s) => s.capabilities(),
            Maybe::On(w) => w.capabilities(),
        }
    }
    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        match self {
            Maybe::Off(s) => s.try_acquire(req).await,
            Maybe::On(w) => w.try_acquire(req).await,
        }
    }
    async fn release(&self, lease: &Lease) -> Result<bool> {
        match self {
            Maybe::Off(s) => s.release(lease).await,
            Maybe::On(w) => w.release(lease).await,
        }
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        match self {
            Maybe::Off(s) => s.extend(lease, ttl).await,
            Maybe::On(w) => w.extend(lease, ttl).await,
        }
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        match self {
            Maybe::Off(s) => s.inspect(key).await,
            Maybe::On(w) => w.inspect(key).await,
        }
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        match self {
            Maybe::Off(s) => s.list(prefix).await,
            Maybe::On(w) => w.list(prefix).await,
        }
    }
    async fn shutdown(&self) -> Result<usize> {
        match self {
            Maybe::Off(s) => s.shutdown().await,
            Maybe::On(w) => w.shutdown().await,
        }
    }
}

/// Undoes an acquisition attempt that may have taken the lock for nobody: the caller stopped
/// waiting midway (its future was dropped, perhaps after the store applied the write), or the
/// attempt ended in doubt (reply lost, and the readback too). An owner-checked release of the
/// attempt's own token is sent in the background through the whole stack: a no-op if the lock
/// was not taken, and no other holder's lock can be touched (every token is fresh per attempt).
/// Network stores also undo their own cancelled requests; the second release then finds nothing.
struct Undo<'a> {
    manager: &'a Arc<ManagerInner>,
    req: &'a Acquire,
    armed: bool,
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let store = self.manager.store.clone();
        let maybe_held = Lease::new(
            self.req.key.clone(),
            self.req.token.clone(),
            self.req.ttl,
            Instant::now(),
        );
        runtime.spawn(async move {
            match store.release(&maybe_held).await {
                Ok(true) => tracing::debug!(key = %maybe_held.key(),
                    "an abandoned or in-doubt acquisition had taken the lock; released"),
                Ok(false) => {}
                Err(error) => tracing::warn!(key = %maybe_held.key(), %error,
                    "could not undo an abandoned or in-doubt acquisition; if it took the lock, \
                     the lock expires at its TTL"),
            }
        });
    }
}

#[cfg(feature = "signal")]
impl LockManager {
    /// Runs [`LockManager::shutdown`] when the process receives SIGINT or SIGTERM (Ctrl-C on
    /// Windows), then exits the process (feature `signal`).
    ///
    /// A `ctrlc` handler (with its `termination` feature, so SIGTERM is caught too) sends on a
    /// channel; a task spawned on the current tokio runtime receives it, runs the shutdown —
    /// which, with [graceful shutdown](LockManagerBuilder::graceful_shutdown) on, releases every
    /// live lock — bounded by the graceful-shutdown deadline plus the manager's shutdown timeout,
    /// and then calls `std::process::exit` with [`GracefulShutdownConfig::exit_code`] (default
    /// 130 = 128 + SIGINT; `ctrlc` does not say which of the two signals arrived, so both exit
    /// with the same status).
    ///
    /// # Errors
    /// [`ErrorKind::Internal`] outside a tokio runtime, if a `ctrlc` handler is already
    /// installed in this process (only one can be), or if SIGINT or SIGTERM already has another
    /// handler or is ignored: `ctrlc` never overwrites one, and neither does this method.
    pub fn install_signal_handler(&self) -> Result<()> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|e| {
            Error::internal("install_signal_handler must be called inside a tokio runtime")
                .with_source(e)
        })?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<()>();
        ctrlc::try_set_handler(move || {
            let _ = tx.send(());
        })
        .map_err(|e| {
            let what = match e {
                ctrlc::Error::MultipleHandlers => {
                    "could not install the signal handler: SIGINT/SIGTERM already has a handler \
                     in this process (an earlier install_signal_handler call or another \
                     library), or SIGINT is ignored (as for a process a non-interactive shell \
                     started with `&`); handle the signal yourself and call \
                     LockManager::shutdown"
                }
                _ => "could not install the signal handler",
            };
            Error::internal(what).with_source(e)
        })?;
        let config = self.inner.graceful.unwrap_or_default();
        let budget = config.deadline.saturating_add(self.inner.shutdown_timeout);
        let manager = self.clone();
        runtime.spawn(async move {
            if rx.recv().await.is_none() {
                return;
            }
            tracing::info!("signal received: releasing live locks before exiting");
            match tokio::time::timeout(budget, manager.shutdown()).await {
                Ok(Ok(released)) => tracing::info!(released, "locks released; exiting"),
                Ok(Err(error)) => tracing::warn!(%error, "shutdown failed; exiting"),
                Err(_) => tracing::warn!("shutdown took too long; exiting"),
            }
            std::process::exit(config.exit_code);
        });
        Ok(())
    }
}
