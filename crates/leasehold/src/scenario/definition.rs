//! One scenario: the settings a group of keys gets (TTL, wait, acquire mode, lock kind, layers,
//! history), and how its locks are taken.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::core::{validate_ttl, TraceConfig, MAX_TTL};

use super::glob::KeyPattern;
use super::layers::LayerSettings;

/// How a scenario's locks are taken.
///
/// Which kind of lock is taken is the scenario's [`lock`](Scenario::lock), not its mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum AcquireMode {
    /// One attempt, fail fast ([`LockManager::try_lock`](crate::LockManager::try_lock)); a
    /// blocking [`LockManager::lock`](crate::LockManager::lock) of such a key is an error.
    Try,
    /// Wait up to the scenario's wait for the holder to let go
    /// ([`LockManager::lock`](crate::LockManager::lock)); `try_lock` still makes one attempt.
    #[default]
    Blocking,
}

impl AcquireMode {
    /// The file's name of the mode: `try`, `blocking`.
    pub fn as_str(self) -> &'static str {
        match self {
            AcquireMode::Try => "try",
            AcquireMode::Blocking => "blocking",
        }
    }
}

impl fmt::Display for AcquireMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an acquisition does when the store cannot be reached (a connection error, retries
/// exhausted, or an outcome left in doubt).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[non_exhaustive]
pub enum StoreDownPolicy {
    /// Fail closed (the default): the error is returned and the work does not run.
    #[default]
    Fail,
    /// Fail open: the call returns a guard that holds nothing
    /// ([`LockGuard::is_unprotected`](crate::LockGuard::is_unprotected)), so the work runs
    /// without mutual exclusion. Every time, a
    /// [`LockEvent::ProceededWithoutLock`](crate::LockEvent::ProceededWithoutLock) alert is
    /// emitted (the `leasehold.store_down.proceeded` metric) and a warning logged. Only for work
    /// that is safe to run twice.
    Proceed,
}

impl StoreDownPolicy {
    /// The file's name of the policy: `fail`, `proceed`.
    pub fn as_str(self) -> &'static str {
        match self {
            StoreDownPolicy::Fail => "fail",
            StoreDownPolicy::Proceed => "proceed",
        }
    }
}

impl fmt::Display for StoreDownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A named business use of locks and its lock model. See the [module docs](crate::scenario).
///
/// ```
/// use std::time::Duration;
/// use leasehold::scenario::{AcquireMode, Scenario};
/// let checkout = Scenario::new("checkout").keys("order-*").mode(AcquireMode::Blocking)
///     .ttl(Duration::from_secs(5)).wait(Duration::from_millis(200));
/// assert!(checkout.covers("order-7"));
/// assert_eq!(checkout.name(), "checkout");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct Scenario {
    pub(crate) name: Arc<str>,
    pub(crate) keys: Option<KeyPattern>,
    pub(crate) mode: AcquireMode,
    /// The kind of lock: exclusive (the default), read side, or a semaphore permit.
    pub(crate) lock: crate::core::LockMode,
    pub(crate) ttl: Option<Duration>,
    pub(crate) wait: Option<Duration>,
    pub(crate) renew: Option<bool>,
    pub(crate) renew_every: Option<Duration>,
    pub(crate) layers: LayerSettings,
    pub(crate) on_store_down: StoreDownPolicy,
    pub(crate) trace: Option<TraceConfig>,
}

impl Scenario {
    /// A scenario named `name` covering no key by pattern (lock calls can still name it), blocking,
    /// with the manager's TTL, wait, renewal and layers, failing closed, not traced.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Scenario {
            name: name.into(),
            keys: None,
            mode: AcquireMode::default(),
            lock: crate::core::LockMode::Exclusive,
            ttl: None,
            wait: None,
            renew: None,
            renew_every: None,
            layers: LayerSettings::default(),
            on_store_down: StoreDownPolicy::default(),
            trace: None,
        }
    }

    /// The entity names it covers: a glob (see [`KeyPattern`]).
    pub fn keys(mut self, pattern: impl Into<String>) -> Self {
        self.keys = Some(KeyPattern::new(pattern));
        self
    }

    /// The lock mode.
    pub fn mode(mut self, mode: AcquireMode) -> Self {
        self.mode = mode;
        self
    }

    /// The lease TTL (an explicit TTL: not renewed unless [`renew`](Self::renew) says so).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// How long a blocking acquisition waits. A [`AcquireMode::Try`] scenario accepts only
    /// [`Duration::ZERO`] (what a try waits); any other wait is refused when it is registered.
    pub fn wait(mut self, wait: Duration) -> Self {
        self.wait = Some(wait);
        self
    }

    /// Renew leases while guards live, or not.
    pub fn renew(mut self, on: bool) -> Self {
        self.renew = Some(on);
        self
    }

    /// Renew every `every` (implies `renew(true)`; must be shorter than the TTL).
    pub fn renew_every(mut self, every: Duration) -> Self {
        self.renew = Some(true);
        self.renew_every = Some(every);
        self
    }

    /// Which layers run, and with which configuration (see [`LayerSettings`]).
    pub fn layers(mut self, layers: LayerSettings) -> Self {
        self.layers = layers;
        self
    }

    /// What to do when the store is unreachable.
    pub fn on_store_down(mut self, policy: StoreDownPolicy) -> Self {
        self.on_store_down = policy;
        self
    }

    /// Keep each key's lock history in the store (see [`TraceConfig`]).
    pub fn trace(mut self, trace: TraceConfig) -> Self {
        self.trace = Some(trace);
        self
    }

    /// The name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The key pattern, if any.
    pub fn key_pattern(&self) -> Option<&KeyPattern> {
        self.keys.as_ref()
    }

    /// The lock mode.
    pub fn acquire_mode(&self) -> AcquireMode {
        self.mode
    }

    /// The kind of lock its calls take (see [`Scenario::lock`]).
    pub fn lock_kind(&self) -> crate::core::LockMode {
        self.lock
    }

    /// The kind of lock its calls take: [`LockMode::Exclusive`](crate::LockMode::Exclusive) (the
    /// default, and a read-write lock's write side), [`LockMode::Shared`](crate::LockMode::Shared)
    /// (the read side) or a semaphore permit ([`LockMode::semaphore`](crate::LockMode::semaphore)).
    /// A call's own [`LockOptions::mode`](crate::LockOptions::mode) (`read`, `semaphore`) wins.
    pub fn lock(mut self, kind: crate::core::LockMode) -> Self {
        self.lock = kind;
        self
    }

    /// The TTL, if the scenario sets one.
    pub fn lock_ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// The wait, if the scenario sets one.
    pub fn wait_for_lock(&self) -> Option<Duration> {
        self.wait
    }

    /// Whether leases renew, if the scenario says.
    pub fn renewal(&self) -> Option<bool> {
        self.renew
    }

    /// The layer settings.
    pub fn layer_settings(&self) -> &LayerSettings {
        &self.layers
    }

    /// The store-down policy.
    pub fn store_down_policy(&self) -> StoreDownPolicy {
        self.on_store_down
    }

    /// The lock-history setting, if traced.
    pub fn trace_config(&self) -> Option<&TraceConfig> {
        self.trace.as_ref()
    }

    /// Whether the scenario's pattern covers `entity`.
    pub fn covers(&self, entity: &str) -> bool {
        self.keys.as_ref().is_some_and(|p| p.matches(entity))
    }

    /// Checks the settings: `Err((field, what is wrong))`.
    pub(crate) fn check(&self) -> Result<(), (&'static str, String)> {
        if self.name.trim().is_empty() {
            return Err(("name", "a scenario needs a non-empty name".to_owned()));
        }
        if self.keys.as_ref().is_some_and(|k| k.as_str().is_empty()) {
            return Err((
                "keys",
                "an empty pattern matches nothing; use \"*\" for every key".to_owned(),
            ));
        }
        if let Some(ttl) = self.ttl {
            validate_ttl(ttl).map_err(|e| ("ttl", e.message().to_owned()))?;
        }
        if self.wait.is_some_and(|w| w > MAX_TTL) {
            return Err(("wait", "wait is longer than 30 days".to_owned()));
        }
        // A zero wait is what a try is, so it is accepted; any other wait contradicts the mode.
        if self.mode == AcquireMode::Try && self.wait.is_some_and(|w| !w.is_zero()) {
            return Err((
                "wait",
                "a try-only scenario never waits; remove `wait` (or set it to \"0s\") or use \
                 mode = \"blocking\""
                    .to_owned(),
            ));
        }
        if self.renew == Some(false) && self.renew_every.is_some() {
            return Err((
                "renew_every",
                "renewal is turned off (`renew = false`): remove `renew_every`, or turn renewal on"
                    .to_owned(),
            ));
        }
        if self.renew_every.is_some_and(|every| every.is_zero()) {
            return Err((
                "renew_every",
                "renew_every must be above zero: renewing without a pause would ask the store \
                 in a loop"
                    .to_owned(),
            ));
        }
        if let (Some(every), Some(ttl)) = (self.renew_every, self.ttl) {
            if every >= ttl {
                return Err((
                    "renew_every",
                    format!("renew_every ({every:?}) must be above zero and shorter than the TTL ({ttl:?})"),
                ));
            }
        }
        self.layers.check(self.ttl)
    }
}
