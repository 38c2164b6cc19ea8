//! Per-call options, the defaults they fall back to, and how a call is resolved into a plan.

use std::sync::Arc;
use std::time::Duration;

use crate::core::{
    validate_ttl, Error, HolderId, LockKey, LockMode, OwnerToken, Result, TokenLabel, TraceConfig,
    MAX_TTL,
};
use crate::handle::Handle;
use crate::scenario::{AcquireMode, StoreDownPolicy};
use crate::Holder;

use super::state::{LockManager, Renewal};

/// Default lock TTL, as the seed lock manager: 90 s. Without an explicit per-call TTL it is also
/// the watchdog's lease, renewed every 30 s while the guard lives.
pub const DEFAULT_LOCK_TTL: Duration = Duration::from_secs(90);
/// Default wait of a blocking [`LockManager::lock`], as the seed lock manager: 90 s.
pub const DEFAULT_WAIT_FOR_LOCK: Duration = Duration::from_secs(90);
/// Default longest sleep between attempts of a blocking acquire, the seed's 1 s (leasehold starts
/// at [`DEFAULT_MIN_BACKOFF`] and backs off with jitter up to this).
pub const DEFAULT_RETRY_INTERVAL: Duration = Duration::from_secs(1);
/// Default first sleep between attempts of a blocking acquire.
pub const DEFAULT_MIN_BACKOFF: Duration = Duration::from_millis(10);
/// Default longest time a release keeps retrying a store that is down (a failover, a refused
/// connection), never past the lease's expiry: see
/// [`LockManagerBuilder::release_retry`](crate::LockManagerBuilder::release_retry).
pub const DEFAULT_RELEASE_RETRY: Duration = Duration::from_secs(10);
/// Default time [`LockManager::shutdown`] waits for in-flight acquisitions and background
/// releases.
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
    pub(super) ttl: Option<Duration>,
    pub(super) wait: Option<Duration>,
    holder: Option<Holder>,
    renew: Option<bool>,
    renew_every: Option<Duration>,
    pub(super) mode: Option<LockMode>,
    scenario: Option<Arc<str>>,
    trace: Option<Option<TraceConfig>>,
    pub(super) hold_at_least: Option<Duration>,
    label: Option<Arc<str>>,
    announce: bool,
}

impl LockOptions {
    /// The manager's defaults.
    pub fn new() -> Self {
        LockOptions::default()
    }

    /// The lease TTL for this acquisition. An explicit TTL keeps the Java lock manager's
    /// semantics: the lease is not renewed (unless [`renew`](Self::renew) says so) and simply
    /// expires if not released. It must be longer than the unlock window's margin (150 ms by
    /// default) of the stack the call goes through, or the call is refused before any I/O: every
    /// release of such a lease would be skipped.
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long a blocking [`LockManager::lock_with`] waits (ignored by `try_lock_with`).
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// The holder identity, for reentrancy. Default: the current tokio task (see
    /// [`LockManagerBuilder::task_holders`](crate::LockManagerBuilder::task_holders)).
    pub fn holder(mut self, holder: Holder) -> Self {
        self.holder = Some(holder);
        self
    }

    /// Keep the lease alive while the guard lives (see [`LockGuard::lost`](crate::LockGuard::lost)),
    /// or not. Default: the manager's [`renewal`](crate::LockManagerBuilder::renewal) setting,
    /// which renews (a watchdog) exactly the guards taken without an explicit [`ttl`](Self::ttl).
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

    /// The scenario of this call (`"checkout"`, `"nightly-job"`): a registered
    /// [`Scenario`](crate::scenario::Scenario)'s name gives the call its settings (explicit options
    /// here still win); any other name is only a label on spans and metrics, or an error where the
    /// registry is [strict](crate::scenario::ScenarioRegistry::strict). Default: the first
    /// scenario whose key pattern matches the entity, else the manager's scenario label.
    pub fn scenario(mut self, name: impl Into<Arc<str>>) -> Self {
        self.scenario = Some(name.into());
        self
    }

    /// Record this acquisition, its release and renewals in the key's lock history in the store
    /// (`Some`), or not (`None`), whatever the scenario says. Stores without
    /// [`Capabilities::history`](crate::Capabilities::history) ignore it.
    pub fn trace(mut self, trace: Option<TraceConfig>) -> Self {
        self.trace = Some(trace);
        self
    }

    /// Keep the lock taken until at least `period` after it was granted, even if the guard is
    /// released (or dropped) sooner: a job lock, like ShedLock's `lockAtLeastFor`. A release
    /// within the period shortens the lease to the rest of the period (an owner-checked extend)
    /// instead of deleting it, so a job that finishes early still keeps the rest of the fleet
    /// out until the period ends, and then the lock expires in the store; a release after the
    /// period releases normally. [`LockGuard::release_outcome`](crate::LockGuard::release_outcome)
    /// says which happened and how long the lock is kept.
    ///
    /// Pair it with renewal (the default without an explicit [`ttl`](Self::ttl)) so a job that
    /// runs longer than its TTL never loses the lock midway: this covers ShedLock's
    /// `lockAtMostFor` too, the TTL being how long a crashed holder keeps the lock. The rest of the
    /// period is counted on the store's clock (see `release_outcome`), never on the clients'
    /// wall clocks. A lock released into its hold period stays taken through a manager's
    /// [`shutdown`](crate::LockManager::shutdown) (a cron process may exit right after its
    /// job); a guard still held when the manager shuts down (the job interrupted) is released
    /// at once.
    ///
    /// A lock taken with a hold period is never reentrant (its [`holder`](Self::holder) is
    /// ignored): the same task or holder taking it again within the period is refused like any
    /// other instance of the job.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold::LockOptions;
    /// // The nightly job runs at most once per 10-minute window across the fleet.
    /// let opts = LockOptions::new().hold_at_least(Duration::from_secs(600));
    /// # let _ = opts;
    /// ```
    pub fn hold_at_least(mut self, period: Duration) -> Self {
        self.hold_at_least = Some(period);
        self
    }

    /// A short note of the holder's own, carried by the lock's owner token
    /// ([`OwnerToken::label`](crate::OwnerToken::label)): what [`LockManager::inspect`],
    /// `leasehold inspect`, [`LockManager::leader`] and [`LockManager::observe`] show besides
    /// the holder's host and process id. An election's candidates label themselves with the
    /// address to reach them (etcd's `Campaign(value)`, Curator's participant id); a job lock
    /// with the run's id.
    ///
    /// Written with the grant in the same store request, so it can never name another holder,
    /// and gone with the lock. At most [`MAX_LABEL_LEN`](crate::core::MAX_LABEL_LEN) bytes, not
    /// empty, no control characters: checked before any store I/O
    /// ([`ErrorKind::InvalidArgument`](crate::ErrorKind::InvalidArgument)).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use leasehold::{LockManager, LockOptions};
    /// let locks = LockManager::builder().client_id("billing").farm_id("f1").build()?;
    /// let guard = locks.lock_with("report", LockOptions::new().label("run 2026-11-26")).await?;
    /// let holder = locks.inspect("report").await?.and_then(|info| info.token).unwrap();
    /// assert_eq!(holder.label(), Some("run 2026-11-26"));
    /// # guard.release().await?; Ok(()) }
    /// ```
    ///
    /// [`LockManager::inspect`]: crate::LockManager::inspect
    /// [`LockManager::leader`]: crate::LockManager::leader
    /// [`LockManager::observe`]: crate::LockManager::observe
    pub fn label(mut self, label: impl Into<Arc<str>>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// The same options, announcing the lock's grants and releases to observers (an election's
    /// lock: see [`Acquire::announce`](crate::core::Acquire::announce)).
    pub(crate) fn announced(mut self) -> Self {
        self.announce = true;
        self
    }

    /// The same options without a hold period (an election's lock is given up at once).
    pub(crate) fn without_hold_at_least(mut self) -> Self {
        self.hold_at_least = None;
        self
    }

    /// The period of [`hold_at_least`](Self::hold_at_least), checked: at most 30 days.
    pub(super) fn hold_period(&self) -> Result<Option<Duration>> {
        match self.hold_at_least {
            Some(period) if period > MAX_TTL => Err(Error::invalid_argument(format!(
                "hold_at_least ({period:?}) is longer than the maximum of 30 days"
            ))),
            hold => Ok(hold.filter(|period| !period.is_zero())),
        }
    }

    /// The kind of hold: [`LockMode::Exclusive`] (the default; a read-write lock's write side),
    /// [`LockMode::Shared`] (a reader) or a semaphore permit. The manager's
    /// [`read`](crate::LockManager::read) and [`semaphore`](crate::LockManager::semaphore) set it
    /// for you.
    pub fn mode(mut self, mode: LockMode) -> Self {
        self.mode = Some(mode);
        self
    }
}

/// What an acquisition was asked to do, resolved against the manager's defaults.
#[derive(Debug)]
pub(super) struct Plan {
    pub(super) key: LockKey,
    pub(super) ttl: Duration,
    pub(super) holder: Option<HolderId>,
    /// `Some(every)` when the guard renews its lease (`every = None`: a third of the TTL).
    pub(super) renew: Option<Option<Duration>>,
    pub(super) scenario: Arc<str>,
    /// The layer stack (and observers, waiters) this scenario's locks go through.
    pub(super) handle: Arc<Handle>,
    /// How long a blocking call waits (the call's, the scenario's, or the manager's).
    pub(super) wait: Duration,
    /// Whether an `acquire` call tries once or waits (the scenario's mode).
    pub(super) acquire_mode: AcquireMode,
    /// The kind of hold: exclusive, shared or a semaphore permit.
    pub(super) mode: LockMode,
    pub(super) on_store_down: StoreDownPolicy,
    pub(super) trace: Option<TraceConfig>,
    /// [`LockOptions::hold_at_least`], checked: what the guard's release keeps.
    pub(super) hold_at_least: Option<Duration>,
    /// [`LockOptions::label`], checked: carried by every owner token of this acquisition.
    pub(super) label: Option<TokenLabel>,
    /// Whether the store announces this lock's grant and release to observers.
    pub(super) announce: bool,
}

impl Plan {
    /// A fresh owner token for one attempt, with the acquisition's label.
    pub(super) fn new_token(&self) -> OwnerToken {
        match &self.label {
            Some(label) => OwnerToken::generate_labelled(label),
            None => OwnerToken::generate(),
        }
    }
}

impl LockManager {
    /// Resolves `key` and `opts` into a plan, rejecting bad input before any store I/O.
    pub(super) fn plan(&self, key: &impl ToLockKey, opts: &LockOptions) -> Result<Plan> {
        let config = &self.inner.config;
        let key = key.to_lock_key(self)?;
        let registry = &config.registry;
        let scenario =
            match &opts.scenario {
                Some(name) => {
                    match registry.get(name) {
                        Some(s) => Some(s),
                        None if registry.is_strict() => {
                            return Err(Error::invalid_argument(format!(
                        "no scenario named `{name}` is registered and the registry is strict; \
                         register it or name one of: {}",
                        registry.iter().map(|s| s.name()).collect::<Vec<_>>().join(", ")
                    ))
                            .with_key(key.as_str()))
                        }
                        None => None,
                    }
                }
                None => match registry.matching(key.entity_id()) {
                    Some(s) => Some(s),
                    None if registry.is_strict() => {
                        return Err(Error::invalid_argument(format!(
                            "entity `{}` matches no scenario's keys and the registry is strict; \
                         add a scenario covering it or name one with LockOptions::scenario",
                            key.entity_id()
                        ))
                        .with_key(key.as_str()))
                    }
                    None => None,
                },
            };
        let ttl_given = opts.ttl.or(scenario.and_then(|s| s.ttl));
        let ttl = ttl_given.unwrap_or(config.lock_ttl);
        validate_ttl(ttl)?;
        if let Some(wait) = opts.wait {
            if wait > MAX_TTL {
                return Err(Error::invalid_argument("wait is longer than 30 days"));
            }
        }
        let renew_every = opts.renew_every.or(scenario.and_then(|s| s.renew_every));
        if let Some(every) = renew_every {
            if every.is_zero() || every >= ttl {
                return Err(Error::invalid_argument(format!(
                    "renew_every ({every:?}) must be greater than zero and shorter than the TTL \
                     ({ttl:?}); a third of the TTL is the default"
                )));
            }
        }
        let mode = opts.mode.or(scenario.map(|s| s.lock)).unwrap_or_default();
        mode.validate()?;
        let label = opts.label.clone().map(TokenLabel::new).transpose()?;
        // A job lock is never reentrant: its holder re-taking it within the hold period (a cron
        // loop in one task) must be refused like anyone else, not counted up on the kept lease.
        let holder = match opts.hold_at_least {
            Some(_) => None,
            None => opts
                .holder
                .map(|h| h.id())
                .or_else(|| config.task_holders.then(HolderId::current)),
        };
        let renew = opts
            .renew
            .or(scenario.and_then(|s| s.renew))
            .unwrap_or(match config.renewal {
                Renewal::Watchdog => ttl_given.is_none(),
                Renewal::Always => true,
                Renewal::Never => false,
            });
        let name = match (scenario, &opts.scenario) {
            (Some(s), _) => s.name.clone(),
            (None, Some(label)) => label.clone(),
            (None, None) => config.scenario.clone(),
        };
        let handle = config
            .stacks
            .get(&name)
            .unwrap_or(&self.inner.handle)
            .clone();
        // The builder checked the manager's and every scenario's TTL against their stack's
        // window; a TTL given with the call is checked here.
        handle
            .check_ttl(ttl)
            .map_err(|e| e.with_key(key.as_str()))?;
        Ok(Plan {
            key,
            ttl,
            holder,
            renew: renew.then_some(renew_every),
            wait: opts
                .wait
                .or(scenario.and_then(|s| s.wait))
                .unwrap_or(config.wait_for_lock),
            acquire_mode: scenario.map_or(AcquireMode::Blocking, |s| s.mode),
            mode,
            on_store_down: scenario.map_or(StoreDownPolicy::Fail, |s| s.on_store_down),
            trace: opts.trace.unwrap_or(scenario.and_then(|s| s.trace)),
            hold_at_least: opts.hold_period()?,
            label,
            announce: opts.announce,
            scenario: name,
            handle,
        })
    }
}
