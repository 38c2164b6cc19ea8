//! The builder: the manager's settings, which scenario layers it assembles, and how they stack.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::backoff::Backoff;
use crate::core::{
    validate_at_most, validate_ttl, BoxStore, Either, Error, Layer, Lifecycle, LockKey, LockLevel,
    LockStore, Observer, Observers, Result, MAX_TTL,
};
use crate::failover::{Failover, Retry};
use crate::handle::Handle;
use crate::layers::{
    GracefulShutdownLayer, LocalCompetitionLayer, ReadbackLayer, ReentrancyLayer,
    UnlockWindowLayer, WiredLayer, Wiring,
};
use crate::scenario::{LayerSetting, LayerStack, ScenarioRegistry};
use crate::waiters::Waiters;
use crate::MemoryStore;

use super::options::{
    DEFAULT_LOCK_TTL, DEFAULT_MIN_BACKOFF, DEFAULT_RELEASE_RETRY, DEFAULT_RETRY_INTERVAL,
    DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_WAIT_FOR_LOCK,
};
use super::state::{Config, Inner, LockManager, Renewal};

/// Builds a [`LockManager`]. Obtain one with [`LockManager::builder`].
///
/// `LockManager::builder().client_id(..).farm_id(..).build()` gives the recommended setup: the
/// embedded store, every scenario layer (readback, unlock window, local competition, reentrancy,
/// graceful shutdown), reentrancy per tokio task, and a renewal watchdog for guards taken without
/// an explicit TTL. Opting out is explicit: [`without_layers`](Self::without_layers), a layer
/// method given `false`, [`task_holders(false)`](Self::task_holders),
/// [`renewal(false)`](Self::renewal). docs/DESIGN.md compares these defaults with the Java lock
/// manager's.
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
    release_retry: Duration,
    shutdown_timeout: Duration,
    observers: Observers,
    task_holders: bool,
    renewal: Renewal,
    scenario: Arc<str>,
    registry: ScenarioRegistry,
    layers: LayerStack,
}

/// Wraps `store` in the enabled layers of `layers`, inner → outer: readback, (the manager's
/// failover retry of releases, always), unlock window, graceful shutdown, local competition,
/// reentrancy (see `crate::layers` and `crate::failover` for the reasons). Every layer gets the
/// manager's wiring (observers and lifecycle). The stack stays generic and is erased (boxed)
/// once, at the end.
fn assemble<S: LockStore>(
    layers: &LayerStack,
    store: S,
    wiring: &Wiring,
    retry: Retry,
) -> BoxStore {
    let store = wired(&layers.readback, store, wiring);
    let store = Failover::new(store, retry, wiring.observers().clone());
    let store = wired(&layers.unlock_window, store, wiring);
    let store = wired(&layers.graceful_shutdown, store, wiring);
    let store = wired(&layers.local_competition, store, wiring);
    BoxStore::new(wired(&layers.reentrancy, store, wiring))
}

/// `store` wrapped in `layer` when it is on, as it is when it is off.
fn wired<S: LockStore, L: WiredLayer<S>>(
    layer: &Option<L>,
    store: S,
    wiring: &Wiring,
) -> Either<L::Store, S> {
    match layer {
        Some(layer) => Either::Left(layer.layer_wired(store, wiring)),
        None => Either::Right(store),
    }
}

impl LockManagerBuilder {
    pub(super) fn new() -> Self {
        LockManagerBuilder {
            client_id: None,
            farm_id: None,
            default_level: LockLevel::Dc,
            store: None,
            lock_ttl: DEFAULT_LOCK_TTL,
            wait_for_lock: DEFAULT_WAIT_FOR_LOCK,
            retry_interval: DEFAULT_RETRY_INTERVAL,
            min_backoff: DEFAULT_MIN_BACKOFF,
            release_retry: DEFAULT_RELEASE_RETRY,
            shutdown_timeout: DEFAULT_SHUTDOWN_TIMEOUT,
            observers: Observers::default(),
            task_holders: true,
            renewal: Renewal::Watchdog,
            scenario: Arc::from("default"),
            registry: ScenarioRegistry::new(),
            layers: LayerStack::all(),
        }
    }

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
    /// Custom layers always sit directly around the store, inside the scenario layers (so, for
    /// example, the in-doubt errors of a timeout layer are read back by the readback layer); see
    /// [`crate::layers`].
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

    /// Default lease TTL, and the watchdog's lease for guards taken without an explicit TTL.
    /// Default 90 s.
    pub fn lock_ttl(mut self, ttl: Duration) -> Self {
        self.lock_ttl = ttl;
        self
    }

    /// Default wait of a blocking acquire. Default 90 s.
    pub fn wait_for_lock(mut self, wait: Duration) -> Self {
        self.wait_for_lock = wait;
        self
    }

    /// Longest sleep between attempts of a blocking acquire; above zero, at most 30 days.
    /// Default 1 s.
    pub fn retry_interval(mut self, interval: Duration) -> Self {
        self.retry_interval = interval;
        self
    }

    /// First sleep between attempts of a blocking acquire; above zero. Default 10 ms.
    pub fn min_backoff(mut self, backoff: Duration) -> Self {
        self.min_backoff = backoff;
        self
    }

    /// The longest a release keeps retrying a store that is down (connection refused or reset,
    /// a failover, an outcome in doubt), with the acquire's backoff between attempts; never past
    /// the lease's expiry, after which the store lets the lock go by itself. When it gives up,
    /// the release's error says the lock is left to expire, and a
    /// [`LockEvent::LeftToExpire`](crate::LockEvent::LeftToExpire) is emitted. An explicit
    /// [`LockGuard::extend`](crate::LockGuard::extend) retries within the same bound. Zero: one
    /// attempt; at most 30 days. Default 10 s
    /// ([`DEFAULT_RELEASE_RETRY`](crate::DEFAULT_RELEASE_RETRY)).
    pub fn release_retry(mut self, budget: Duration) -> Self {
        self.release_retry = budget;
        self
    }

    /// How long [`LockManager::shutdown`] waits for in-flight acquisitions and background
    /// releases. Default 5 s.
    pub fn shutdown_timeout(mut self, timeout: Duration) -> Self {
        self.shutdown_timeout = timeout;
        self
    }

    /// Adds an observer of lock events.
    pub fn observer(mut self, observer: impl Observer) -> Self {
        self.observers = self.observers.with(observer);
        self
    }

    /// When no explicit [`Holder`](crate::Holder) is given, use the current tokio task as the
    /// holder identity (outside any task, as in the body of `#[tokio::main]`, the thread the
    /// future is blocked on), so that a task re-taking a key it holds counts up (with the
    /// reentrancy layer) instead of waiting for itself. Default **on**, as a Redisson lock is
    /// reentrant per thread; `false`: an acquisition without a holder is always a new holder.
    pub fn task_holders(mut self, on: bool) -> Self {
        self.task_holders = on;
        self
    }

    /// Lease renewal for every guard (`true`) or none (`false`, the Java lock manager's
    /// semantics). Unset, the default is a watchdog (Redisson's): guards taken without an
    /// explicit [`LockOptions::ttl`](crate::LockOptions::ttl) are renewed every third of the
    /// manager's TTL while they live and report loss; an explicit TTL is not renewed. A call can
    /// always say otherwise ([`LockOptions::renew`](crate::LockOptions::renew)).
    pub fn renewal(mut self, on: bool) -> Self {
        self.renewal = if on { Renewal::Always } else { Renewal::Never };
        self
    }

    /// The scenario label on spans and metrics of lock calls no registered scenario covers (see
    /// [`LockOptions::scenario`](crate::LockOptions::scenario)). Default `"default"`.
    pub fn scenario(mut self, name: impl Into<Arc<str>>) -> Self {
        self.scenario = name.into();
        self
    }

    /// The scenarios lock calls are resolved against (see [`crate::scenario`]): registered in
    /// code or loaded from a file with
    /// [`ScenarioRegistry::from_toml_file`]. A scenario that sets any layer
    /// ([`LayerSettings`](crate::scenario::LayerSettings)) gets its own layer stack over the same
    /// store: the layers it leaves alone as configured here, the ones it turns on with `true` with
    /// the configuration given here (or their default), the ones it configures with its own
    /// settings; every layer reports to this builder's observers and shuts down with the manager.
    /// Default: none (every call gets the manager's settings).
    pub fn scenarios(mut self, registry: ScenarioRegistry) -> Self {
        self.registry = registry;
        self
    }

    /// The [readback layer](crate::layers::readback) (Bond 3.1): an in-doubt acquire or release
    /// is resolved by reading the record back. On by default.
    ///
    /// Every layer method takes a [`LayerSetting`], the same type a scenario uses: `false` (off),
    /// `true` (on, with the configuration the layer has here, else its default) or a
    /// configuration (on, with that one).
    ///
    /// ```
    /// use leasehold::layers::ReadbackLayer;
    /// use leasehold::LockManager;
    /// let builder = LockManager::builder()
    ///     .readback(ReadbackLayer::new().retries(2)) // on, configured
    ///     .unlock_window(false)                      // off
    ///     .reentrancy(true);                         // on
    /// # let _ = builder;
    /// ```
    pub fn readback(mut self, layer: impl Into<LayerSetting<ReadbackLayer>>) -> Self {
        self.layers.readback = layer.into().resolve(self.layers.readback.as_ref());
        self
    }

    /// The [unlock window](crate::layers::unlock_window) (Bond 3.2): a release is sent only while
    /// the lease can still be ours. On by default.
    pub fn unlock_window(mut self, layer: impl Into<LayerSetting<UnlockWindowLayer>>) -> Self {
        self.layers.unlock_window = layer.into().resolve(self.layers.unlock_window.as_ref());
        self
    }

    /// [Local competition](crate::layers::local_competition) (Bond 3.4): contenders of this
    /// process are refused in memory while another of its tasks holds the key (fast-fail), with
    /// optional hand-off of a released lease to the next waiter. On by default.
    pub fn local_competition(
        mut self,
        layer: impl Into<LayerSetting<LocalCompetitionLayer>>,
    ) -> Self {
        self.layers.local_competition =
            layer.into().resolve(self.layers.local_competition.as_ref());
        self
    }

    /// The [reentrancy layer](crate::layers::reentrancy) (Bond 3.6): a holder re-taking a key it
    /// holds counts up. Holders are explicit [`Holder`](crate::Holder)s, or tasks (see
    /// [`task_holders`](Self::task_holders)). On by default.
    pub fn reentrancy(mut self, layer: impl Into<LayerSetting<ReentrancyLayer>>) -> Self {
        self.layers.reentrancy = layer.into().resolve(self.layers.reentrancy.as_ref());
        self
    }

    /// [Graceful shutdown](crate::layers::graceful_shutdown) (Bond 3.5): live locks are tracked
    /// and [`LockManager::shutdown`] releases them all. On by default.
    pub fn graceful_shutdown(
        mut self,
        layer: impl Into<LayerSetting<GracefulShutdownLayer>>,
    ) -> Self {
        self.layers.graceful_shutdown =
            layer.into().resolve(self.layers.graceful_shutdown.as_ref());
        self
    }

    /// Turns every scenario layer on with its default configuration (the default; useful after
    /// [`without_layers`](Self::without_layers)). Layers configured with their own method keep
    /// that configuration. Outer → inner: reentrancy, local competition, graceful shutdown,
    /// unlock window, readback; see [`crate::layers`] for why.
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// let locks = leasehold::LockManager::builder().client_id("c").farm_id("f").default_layers().build()?;
    /// let guard = locks.try_lock("k").await?;
    /// let other = locks.clone();
    /// let contender = tokio::spawn(async move { other.try_lock("k").await.map(drop) });
    /// assert!(contender.await.unwrap().unwrap_err().is_unavailable()); // fast-failed locally
    /// guard.release().await?;
    /// # Ok(()) }
    /// ```
    pub fn default_layers(mut self) -> Self {
        self.layers.fill_defaults();
        self
    }

    /// Turns every scenario layer off: the bare manager over the store (plus any custom
    /// [`layer`](Self::layer)s). Layer methods called afterwards turn single layers back on.
    pub fn without_layers(mut self) -> Self {
        self.layers = LayerStack::none();
        self
    }

    /// The observers configured so far (for layers that report to them, added by other builder methods).
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
        if self.wait_for_lock > MAX_TTL {
            return Err(Error::invalid_argument(
                "wait_for_lock is longer than 30 days",
            ));
        }
        if self.retry_interval.is_zero() {
            return Err(Error::invalid_argument(
                "retry_interval must be greater than zero (default 1s)",
            ));
        }
        validate_at_most("retry_interval", self.retry_interval, MAX_TTL)?;
        if self.min_backoff.is_zero() {
            return Err(Error::invalid_argument(
                "min_backoff must be greater than zero (default 10ms): a waiter would ask the \
                 store again at once, in a loop",
            ));
        }
        // A release never retries past its lease's expiry, so the longest TTL is the most any
        // budget can use.
        validate_at_most("release_retry", self.release_retry, MAX_TTL)?;
        // A layer that cannot work with the TTL (an unlock window wider than the lease skips
        // every release) fails here, as it does in a scenario file.
        self.layers.check(self.lock_ttl).map_err(|(field, why)| {
            Error::invalid_argument(format!(
                "{}: {why} (lock_ttl is {:?})",
                field.trim_start_matches("layers."),
                self.lock_ttl
            ))
        })?;
        // Every scenario's locks against the stack they go through (its own, or the manager's),
        // at the scenario's TTL (or the manager's, for one without).
        for scenario in self.registry.iter() {
            let layers = self.layers.with_overrides(scenario.layer_settings());
            let ttl = scenario.ttl.unwrap_or(self.lock_ttl);
            layers.check(ttl).map_err(|(field, why)| {
                Error::invalid_argument(format!("scenario `{}`: {field}: {why}", scenario.name))
            })?;
            // A scenario without a TTL of its own renews the manager's: every call of it would
            // fail if its period were not shorter (the scenario alone checked its own TTL).
            if let Some(every) = scenario.renew_every.filter(|every| *every >= ttl) {
                return Err(Error::invalid_argument(format!(
                    "scenario `{}`: renew_every ({every:?}) is not shorter than the TTL its locks \
                     get (the manager's lock_ttl, {ttl:?}): give the scenario a ttl, or a \
                     shorter renew_every",
                    scenario.name
                )));
            }
        }
        let lifecycle = Lifecycle::new();
        let wiring = Wiring::new(self.observers.clone(), lifecycle.clone());
        let backoff = Backoff::new(self.min_backoff, self.retry_interval);
        let retry = Retry::new(backoff, self.release_retry);
        let own_stacks: Vec<_> = self
            .registry
            .iter()
            .filter(|s| s.layer_settings().overrides_any())
            .collect();
        let mut stacks = HashMap::new();
        let deadline_of = |layers: &LayerStack| {
            layers
                .graceful_shutdown
                .as_ref()
                .map_or(Duration::ZERO, |g| g.deadline)
        };
        let mut sweep_deadline = deadline_of(&self.layers);
        // The default store stays concrete, so the layer stack over it is erased (boxed) once;
        // scenarios with their own layers share one boxed base store.
        let store = match (self.store, own_stacks.is_empty()) {
            (Some(store), true) => assemble(&self.layers, store, &wiring, retry),
            (None, true) => assemble(&self.layers, MemoryStore::new(), &wiring, retry),
            (base, false) => {
                let base = base.unwrap_or_else(|| BoxStore::new(MemoryStore::new()));
                for scenario in own_stacks {
                    let layers = self.layers.with_overrides(scenario.layer_settings());
                    sweep_deadline = sweep_deadline.max(deadline_of(&layers));
                    let store = assemble(&layers, base.clone(), &wiring, retry);
                    stacks.insert(
                        scenario.name.clone(),
                        Arc::new(Handle {
                            store,
                            observers: self.observers.clone(),
                            waiters: Waiters::default(),
                            lifecycle: lifecycle.clone(),
                            renewals: Arc::default(),
                            retry,
                            layers: layers.clone(),
                        }),
                    );
                }
                assemble(&self.layers, base, &wiring, retry)
            }
        };
        Ok(LockManager {
            inner: Arc::new(Inner {
                handle: Arc::new(Handle {
                    store,
                    observers: self.observers,
                    waiters: Waiters::default(),
                    lifecycle,
                    renewals: Arc::default(),
                    retry,
                    layers: self.layers.clone(),
                }),
                config: Config {
                    client_id,
                    farm_id: self.farm_id,
                    default_level: self.default_level,
                    lock_ttl: self.lock_ttl,
                    wait_for_lock: self.wait_for_lock,
                    backoff,
                    shutdown_timeout: self.shutdown_timeout,
                    task_holders: self.task_holders,
                    renewal: self.renewal,
                    scenario: self.scenario,
                    registry: self.registry,
                    stacks,
                    graceful: self.layers.graceful_shutdown,
                    sweep_deadline,
                },
            }),
        })
    }
}
