//! Local competition (Bond 3.4, fast-fail): contenders for one key inside this process meet in
//! memory first, so only one of them talks to the store at a time.
//!
//! # What it guarantees
//! Every key being acquired or held through the layer has an entry in a [moka] cache: key → the
//! local holder (its token, and once granted, the store lease). Each entry expires with its lease
//! (per-entry expiry through moka's `Expiry` trait, recomputed on every lookup), and the local
//! holder is removed from it on release, on error and on cancellation (drop guards), so a crashed
//! or cancelled task never blocks the process beyond its lease. Validity is also checked against
//! the lease's own expiry (in `tokio::time`) on every access, so a holder never outlives its lease
//! even before moka reclaims the entry. An emptied entry stays cached until the lease it last
//! carried would have expired (a lookup of an emptied entry keeps it for the key's last TTL, at
//! least one second): a hot key pays no cache insert per acquisition, and the contender that takes
//! an emptied entry needs no second cache operation.
//!
//! - **try-lock** ([`Acquire::deadline`] `None`): if another local holder has the key (or is
//!   acquiring or releasing it), the call fails at once with `LockUnavailable` and no store I/O
//!   ([`LockEvent::FastFailed`]).
//! - **blocking lock** (deadline set): the caller waits locally, and is woken as soon as the local
//!   holder releases (or at its lease's expiry, or at the deadline) — no polling of the store.
//! - **One store talker per key**: the contender that finds the key free locally marks it as
//!   acquiring before sending; everyone else waits or fails fast in memory. A store-level
//!   `LockUnavailable` (another process holds it) frees the local entry and wakes one local waiter,
//!   which then tries the store in turn: at most one request per key per process in flight.
//!
//! # Local hand-off (opt-in: [`LocalCompetitionConfig::hand_off`])
//! When a local holder releases while other local contenders wait, the store lease is handed
//! straight to the next local waiter: no store release, no store acquire. The waiter extends the
//! lease in the store first if less than half of its requested TTL is left. This turns a hot key
//! from network-bound into memory-bound. To stay fair to other processes, hand-offs are bounded:
//! after [`max_hand_offs`](LocalCompetitionConfig::max_hand_offs) consecutive hand-offs of one
//! store lease, or once it has been held (across hand-offs) for
//! [`max_hand_off_hold`](LocalCompetitionConfig::max_hand_off_hold), the next release is a real
//! one and every contender, local or remote, competes in the store again.
//!
//! **Tokens across a hand-off.** The store record keeps the first holder's owner token and its
//! fencing token. Each local holder's lease carries its own owner token (the layer maps it to the
//! store lease for release and extend), but the *fencing token is the same for every local holder
//! of one store lease*. Local holders never overlap in time (a hand-off happens after the previous
//! holder released), and fencing still orders this process against every other process; it does
//! not tell two consecutive local holders apart. If a downstream system must distinguish them
//! (for example because a released holder may still have writes in flight), leave hand-off off.
//!
//! # Where it belongs
//! Below reentrancy (a holder re-taking its own key must count up, not fail fast on itself) and
//! above everything that does I/O (shutdown tracking, unlock window, readback), so a local
//! fast-fail costs no I/O and a hand-off is invisible below: they see one store lease.
//!
//! # Cost
//! Uncontended: one cache lookup on acquire (plus an insert the first time a key is seen), one on
//! release, and a few short mutex sections (≈ 0.6 µs per acquire + release; docs/LAYERS.md).
//! Contended: no store I/O at all for fast-fails and local waits.
//!
//! [moka]: https://docs.rs/moka

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use moka::notification::RemovalCause;
use moka::sync::Cache;
use moka::Expiry;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::{
    Acquire, Capabilities, Error, ErrorKind, Layer, Lease, LockEvent, LockInfo, LockKey, LockStore,
    Observers, OwnerToken, Result,
};

/// Default bound of consecutive local hand-offs of one store lease.
pub const DEFAULT_MAX_HAND_OFFS: u32 = 8;
/// Default bound of how long one store lease may be passed around by local hand-offs.
pub const DEFAULT_MAX_HAND_OFF_HOLD: Duration = Duration::from_millis(500);
/// Shortest time an entry nobody holds stays in the cache after a lookup.
const IDLE_GRACE: Duration = Duration::from_secs(1);
/// `keep_until` marker: local waiters, keep the entry long.
const KEEP_WAITED: u64 = u64::MAX;
/// `keep_until` marker: nobody holds it; a lookup keeps it for the key's last TTL.
const KEEP_IDLE: u64 = u64::MAX - 1;
/// How long an entry with local waiters stays (re-armed on every touch).
const WAITED_ON: Duration = Duration::from_secs(3600);

/// Configuration of local competition.
///
/// ```
/// use std::time::Duration;
/// use leasehold::layers::LocalCompetitionConfig;
/// let config = LocalCompetitionConfig::new()
///     .hand_off(true)
///     .max_hand_offs(16)
///     .max_hand_off_hold(Duration::from_secs(1));
/// assert!(config.hand_off);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct LocalCompetitionConfig {
    /// Hand a released lease straight to a local waiter. Default off (see the module docs on
    /// fencing tokens).
    pub hand_off: bool,
    /// Consecutive hand-offs of one store lease before a real release. Default
    /// [`DEFAULT_MAX_HAND_OFFS`].
    pub max_hand_offs: u32,
    /// Longest time one store lease is passed around by hand-offs before a real release. Default
    /// [`DEFAULT_MAX_HAND_OFF_HOLD`].
    pub max_hand_off_hold: Duration,
}

impl Default for LocalCompetitionConfig {
    fn default() -> Self {
        LocalCompetitionConfig {
            hand_off: false,
            max_hand_offs: DEFAULT_MAX_HAND_OFFS,
            max_hand_off_hold: DEFAULT_MAX_HAND_OFF_HOLD,
        }
    }
}

impl LocalCompetitionConfig {
    /// The default: fast-fail and local waiting, no hand-off.
    pub fn new() -> Self {
        LocalCompetitionConfig::default()
    }

    /// Turns local hand-off on or off.
    pub fn hand_off(mut self, on: bool) -> Self {
        self.hand_off = on;
        self
    }

    /// Sets the bound of consecutive hand-offs.
    pub fn max_hand_offs(mut self, max: u32) -> Self {
        self.max_hand_offs = max;
        self
    }

    /// Sets the bound of hold time across hand-offs.
    pub fn max_hand_off_hold(mut self, max: Duration) -> Self {
        self.max_hand_off_hold = max;
        self
    }
}

/// Wraps a store in [`LocalCompetition`].
#[derive(Debug, Clone, Default)]
pub struct LocalCompetitionLayer {
    config: LocalCompetitionConfig,
    observers: Observers,
}

impl LocalCompetitionLayer {
    /// A layer with `config` and no observers.
    pub fn new(config: LocalCompetitionConfig) -> Self {
        LocalCompetitionLayer {
            config,
            observers: Observers::default(),
        }
    }

    /// Reports events to `observers`.
    pub fn with_observers(mut self, observers: Observers) -> Self {
        self.observers = observers;
        self
    }
}

impl<S: LockStore> Layer<S> for LocalCompetitionLayer {
    type Store = LocalCompetition<S>;

    fn layer(&self, inner: S) -> LocalCompetition<S> {
        let epoch = Instant::now();
        let cache = Cache::builder()
            .expire_after(SlotExpiry { epoch })
            .eviction_listener(|_key, slot: Arc<Slot>, cause| {
                if matches!(cause, RemovalCause::Expired | RemovalCause::Size) {
                    lock(&slot).dead = true;
                    slot.wake.notify_waiters();
                }
            })
            .build();
        LocalCompetition {
            inner: Arc::new(inner),
            shared: Arc::new(Shared {
                cache,
                epoch,
                closed: AtomicBool::new(false),
            }),
            config: self.config,
            observers: self.observers.clone(),
        }
    }
}

/// A store where local contenders meet in memory first (see the [module docs](self)).
pub struct LocalCompetition<S> {
    inner: Arc<S>,
    shared: Arc<Shared>,
    config: LocalCompetitionConfig,
    observers: Observers,
}

impl<S: LockStore> std::fmt::Debug for LocalCompetition<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCompetition")
            .field("store", &self.inner.name())
            .field("keys", &self.shared.cache.entry_count())
            .field("config", &self.config)
            .finish()
    }
}

struct Shared {
    cache: Cache<LockKey, Arc<Slot>>,
    epoch: Instant,
    closed: AtomicBool,
}

/// One key's local state.
#[derive(Debug)]
struct Slot {
    state: Mutex<State>,
    wake: Notify,
    /// When the cache may drop the entry, in nanoseconds since the layer's epoch, or
    /// [`KEEP_WAITED`] / [`KEEP_IDLE`].
    keep_until: AtomicU64,
    /// TTL of the key's last acquisition, in nanoseconds: a lookup of an idle entry keeps it that
    /// long, so the contender that takes it needs no second cache operation.
    last_ttl: AtomicU64,
}

#[derive(Debug, Default)]
struct State {
    /// Removed from the cache: whoever finds this looks the key up again.
    dead: bool,
    holder: Option<LocalHolder>,
    /// A store lease handed off by a releasing holder, reserved for a local waiter.
    offer: Option<Offer>,
    waiting: u32,
}

#[derive(Debug)]
struct LocalHolder {
    token: OwnerToken,
    /// The store lease; `None` while the acquire is in flight.
    store: Option<Lease>,
    expires_at: Instant,
    hand_offs: u32,
    /// When the store lease was first acquired (for the hand-off hold bound).
    since: Instant,
}

#[derive(Debug)]
struct Offer {
    store: Lease,
    hand_offs: u32,
    since: Instant,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn lock(slot: &Slot) -> MutexGuard<'_, State> {
    slot.state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Slot {
    fn new(ttl: Duration) -> Self {
        Slot {
            state: Mutex::new(State::default()),
            wake: Notify::new(),
            keep_until: AtomicU64::new(KEEP_IDLE),
            last_ttl: AtomicU64::new(nanos(ttl)),
        }
    }

    fn set_keep(&self, epoch: Instant, until: Option<Instant>) {
        let nanos = until.map_or(KEEP_WAITED, |t| {
            nanos(t.saturating_duration_since(epoch)).min(KEEP_IDLE - 1)
        });
        self.keep_until.store(nanos, Ordering::Relaxed);
    }

    /// Records the TTL of a new acquisition; `true` if a lookup already kept the entry that long.
    fn covers(&self, ttl: Duration) -> bool {
        nanos(ttl) <= self.last_ttl.swap(nanos(ttl), Ordering::Relaxed)
    }

    /// Recomputes how long the cache keeps the entry, from the state.
    fn refresh(&self, epoch: Instant, st: &State) {
        let until = if st.waiting > 0 {
            None
        } else if let Some(holder) = &st.holder {
            Some(holder.expires_at)
        } else if let Some(offer) = &st.offer {
            Some(offer.store.expires_at())
        } else {
            self.keep_until.store(KEEP_IDLE, Ordering::Relaxed);
            return;
        };
        self.set_keep(epoch, until);
    }
}

struct SlotExpiry {
    epoch: Instant,
}

impl SlotExpiry {
    fn keep_for(&self, slot: &Slot) -> Option<Duration> {
        match slot.keep_until.load(Ordering::Relaxed) {
            KEEP_WAITED => Some(WAITED_ON),
            KEEP_IDLE => {
                Some(Duration::from_nanos(slot.last_ttl.load(Ordering::Relaxed)).max(IDLE_GRACE))
            }
            until => Some(
                (self.epoch + Duration::from_nanos(until))
                    .saturating_duration_since(Instant::now()),
            ),
        }
    }
}

impl Expiry<LockKey, Arc<Slot>> for SlotExpiry {
    fn expire_after_create(
        &self,
        _: &LockKey,
        slot: &Arc<Slot>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        self.keep_for(slot)
    }

    fn expire_after_read(
        &self,
        _: &LockKey,
        slot: &Arc<Slot>,
        _: std::time::Instant,
        _: Option<Duration>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        self.keep_for(slot)
    }

    fn expire_after_update(
        &self,
        _: &LockKey,
        slot: &Arc<Slot>,
        _: std::time::Instant,
        _: Option<Duration>,
    ) -> Option<Duration> {
        self.keep_for(slot)
    }
}

impl Shared {
    fn slot(&self, key: &LockKey, ttl: Duration) -> Arc<Slot> {
        if let Some(slot) = self.cache.get(key) {
            return slot;
        }
        self.cache
            .entry(key.clone())
            .or_insert_with(|| Arc::new(Slot::new(ttl)))
            .into_value()
    }

    /// Lets the cache recompute the entry's expiry after a state change.
    fn touch(&self, key: &LockKey) {
        let _ = self.cache.get(key);
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for (_, slot) in self.cache.iter() {
            slot.wake.notify_waiters();
        }
    }
}

/// What the acquire loop decided, acted on after the slot's wake-up registration is dropped.
enum Next {
    FromStore(Arc<Slot>),
    HandedOff(Arc<Slot>, Lease),
}

impl<S: LockStore> LocalCompetition<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, config: LocalCompetitionConfig) -> Self {
        LocalCompetitionLayer::new(config).layer(inner)
    }

    /// Keys with a local entry (approximate: the cache counts lazily).
    pub fn local_keys(&self) -> u64 {
        self.shared.cache.run_pending_tasks();
        self.shared.cache.entry_count()
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A handle that wakes every local waiter and makes them fail with
    /// [`ErrorKind::ShutDown`]; the manager calls it when its shutdown starts, so waiters do not
    /// hold the shutdown up.
    pub(crate) fn closer(&self) -> impl Fn() + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.close()
    }

    /// Frees the slot if `token` still holds it and wakes a waiter. The emptied entry stays
    /// cached for a short grace (see the module docs), so a hot key is not re-inserted each time.
    fn vacate(&self, slot: &Arc<Slot>, token: &OwnerToken) {
        let wake = {
            let mut st = lock(slot);
            if st.holder.as_ref().is_some_and(|h| &h.token == token) {
                st.holder = None;
            }
            slot.refresh(self.shared.epoch, &st);
            st.waiting > 0
        };
        if wake {
            slot.wake.notify_one();
        }
    }

    fn release_in_background(&self, lease: Lease) {
        let inner = self.inner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = inner.release(&lease).await {
                        tracing::warn!(key = %lease.key(), %error,
                            "releasing an unclaimed hand-off failed; the lock expires at its TTL");
                    }
                });
            }
            Err(_) => tracing::warn!(key = %lease.key(),
                "unclaimed hand-off outside a runtime; the lock expires at its TTL"),
        }
    }

    async fn acquire_from_store(&self, slot: &Arc<Slot>, req: &Acquire) -> Result<Lease> {
        let mut vacate = Vacate {
            layer: self,
            slot,
            token: &req.token,
            armed: true,
        };
        let lease = self.inner.try_acquire(req).await?;
        vacate.armed = false;
        {
            let mut st = lock(slot);
            if let Some(h) = st.holder.as_mut().filter(|h| h.token == req.token) {
                h.expires_at = lease.expires_at();
                h.since = lease.acquired_at();
                h.hand_offs = 0;
                h.store = Some(lease.clone());
            }
            slot.refresh(self.shared.epoch, &st);
        }
        Ok(lease)
    }

    async fn take_hand_off(&self, slot: &Arc<Slot>, req: &Acquire, store: Lease) -> Result<Lease> {
        let store = if store.remaining() < req.ttl / 2 {
            let mut vacate = Vacate {
                layer: self,
                slot,
                token: &req.token,
                armed: true,
            };
            let extended = self.inner.extend(&store, req.ttl).await;
            vacate.armed = false;
            match extended {
                Ok(renewed) => renewed,
                Err(error) if error.kind() == ErrorKind::NotHeld => {
                    // The lease was lost under us: acquire afresh, still as the one store talker.
                    {
                        let mut st = lock(slot);
                        if let Some(h) = st.holder.as_mut().filter(|h| h.token == req.token) {
                            h.store = None;
                            h.expires_at = Instant::now() + req.ttl;
                        }
                    }
                    return self.acquire_from_store(slot, req).await;
                }
                // Unknown: it is still ours for its remaining time.
                Err(_) => store,
            }
        } else {
            store
        };
        {
            let mut st = lock(slot);
            if let Some(h) = st.holder.as_mut().filter(|h| h.token == req.token) {
                h.expires_at = store.expires_at();
                h.store = Some(store.clone());
            }
            slot.refresh(self.shared.epoch, &st);
        }
        self.shared.touch(&req.key);
        Ok(store.with_token(req.token.clone()))
    }

    /// The holder's store lease, if `lease` is the local holder's.
    fn store_lease_of(&self, lease: &Lease) -> Option<(Arc<Slot>, Lease)> {
        let slot = self.shared.cache.get(lease.key())?;
        let store = lock(&slot)
            .holder
            .as_ref()
            .filter(|h| &h.token == lease.token())
            .and_then(|h| h.store.clone())?;
        Some((slot, store))
    }
}

/// Frees a slot when dropped while armed: on error and on cancellation.
struct Vacate<'a, S: LockStore> {
    layer: &'a LocalCompetition<S>,
    slot: &'a Arc<Slot>,
    token: &'a OwnerToken,
    armed: bool,
}

impl<S: LockStore> Drop for Vacate<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            self.layer.vacate(self.slot, self.token);
        }
    }
}

/// A registration as a local waiter of one slot; dropping it (timeout, cancellation) unregisters,
/// and the last waiter to leave gives back an unclaimed hand-off.
struct WaitTicket<'a, S: LockStore> {
    layer: &'a LocalCompetition<S>,
    slot: Arc<Slot>,
    key: &'a LockKey,
    armed: bool,
}

impl<S: LockStore> WaitTicket<'_, S> {
    /// Unregisters while the caller holds the slot's lock.
    fn leave_locked(mut self, st: &mut State) {
        self.armed = false;
        st.waiting = st.waiting.saturating_sub(1);
    }
}

impl<S: LockStore> Drop for WaitTicket<'_, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let (orphan, last) = {
            let mut st = lock(&self.slot);
            st.waiting = st.waiting.saturating_sub(1);
            let orphan = if st.waiting == 0 && st.holder.is_none() {
                st.offer.take()
            } else {
                None
            };
            self.slot.refresh(self.layer.shared.epoch, &st);
            (orphan, st.waiting == 0)
        };
        if let Some(offer) = orphan {
            self.layer.release_in_background(offer.store);
        }
        if last {
            // No longer waited on: let the cache shorten the entry's life again.
            self.layer.shared.touch(self.key);
        }
    }
}

impl<S: LockStore> LockStore for LocalCompetition<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        let mut ticket: Option<WaitTicket<'_, S>> = None;
        let next = loop {
            if self.shared.closed.load(Ordering::Acquire) {
                return Err(Error::shut_down().with_key(req.key.as_str()));
            }
            let slot = self.shared.slot(&req.key, req.ttl);
            if ticket
                .as_ref()
                .is_some_and(|t| !Arc::ptr_eq(&t.slot, &slot))
            {
                ticket = None;
            }
            let notified = slot.wake.notified();
            let mut notified = std::pin::pin!(notified);
            let now = Instant::now();
            let (wake_at, deadline) = {
                let mut st = lock(&slot);
                if st.dead {
                    continue;
                }
                if st.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
                    st.holder = None;
                }
                if st
                    .offer
                    .as_ref()
                    .is_some_and(|o| o.store.expires_at() <= now)
                {
                    st.offer = None;
                }
                if st.holder.is_none() && (st.offer.is_none() || req.deadline.is_some()) {
                    if let Some(t) = ticket.take() {
                        t.leave_locked(&mut st);
                    }
                    let offer = st.offer.take();
                    let (store, expires_at, hand_offs, since) = match &offer {
                        Some(o) => (
                            Some(o.store.clone()),
                            o.store.expires_at(),
                            o.hand_offs,
                            o.since,
                        ),
                        None => (None, now + req.ttl, 0, now),
                    };
                    st.holder = Some(LocalHolder {
                        token: req.token.clone(),
                        store,
                        expires_at,
                        hand_offs,
                        since,
                    });
                    slot.refresh(self.shared.epoch, &st);
                    drop(st);
                    break match offer {
                        Some(offer) => Next::HandedOff(slot.clone(), offer.store),
                        None => Next::FromStore(slot.clone()),
                    };
                }
                // Held locally (or a hand-off is reserved for the waiters).
                let Some(deadline) = req.deadline.filter(|d| *d > now) else {
                    drop(st);
                    if req.deadline.is_none() {
                        self.observers.emit(|| LockEvent::FastFailed {
                            key: req.key.clone(),
                        });
                    }
                    return Err(Error::unavailable(&req.key));
                };
                if ticket.is_none() {
                    st.waiting += 1;
                    slot.refresh(self.shared.epoch, &st);
                    ticket = Some(WaitTicket {
                        layer: self,
                        slot: slot.clone(),
                        key: &req.key,
                        armed: true,
                    });
                }
                notified.as_mut().enable();
                let lease_end = st
                    .holder
                    .as_ref()
                    .map(|h| h.expires_at)
                    .or_else(|| st.offer.as_ref().map(|o| o.store.expires_at()))
                    .unwrap_or(deadline);
                (deadline.min(lease_end), deadline)
            };
            self.shared.touch(&req.key);
            let _ = tokio::time::timeout_at(wake_at, notified).await;
            if Instant::now() >= deadline {
                return Err(Error::unavailable(&req.key));
            }
        };
        drop(ticket);
        let slot = match &next {
            Next::FromStore(slot) | Next::HandedOff(slot, _) => slot,
        };
        if !slot.covers(req.ttl) {
            // The lookup kept the entry for a shorter TTL: let the cache see the lease's.
            self.shared.touch(&req.key);
        }
        match next {
            Next::FromStore(slot) => self.acquire_from_store(&slot, req).await,
            Next::HandedOff(slot, store) => self.take_hand_off(&slot, req, store).await,
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let Some(slot) = self.shared.cache.get(lease.key()) else {
            return self.inner.release(lease).await;
        };
        let store = 'decide: {
            let mut st = lock(&slot);
            let Some((store, hand_offs, since)) = st
                .holder
                .as_ref()
                .filter(|h| &h.token == lease.token())
                .and_then(|h| h.store.clone().map(|s| (s, h.hand_offs, h.since)))
            else {
                break 'decide None;
            };
            let now = Instant::now();
            if self.config.hand_off
                && st.waiting > 0
                && hand_offs < self.config.max_hand_offs
                && now.saturating_duration_since(since) < self.config.max_hand_off_hold
                && now < store.expires_at()
            {
                let consecutive = hand_offs + 1;
                st.holder = None;
                st.offer = Some(Offer {
                    store,
                    hand_offs: consecutive,
                    since,
                });
                slot.refresh(self.shared.epoch, &st);
                drop(st);
                slot.wake.notify_one();
                self.observers.emit(|| LockEvent::HandedOff {
                    key: lease.key().clone(),
                    consecutive,
                });
                return Ok(true);
            }
            // A real release: the holder stays in place (the key is still held in the store)
            // until the store answered.
            Some(store)
        };
        let Some(store) = store else {
            // Not the local holder's lease (stale or foreign): the store decides.
            return self.inner.release(lease).await;
        };
        let _vacate = Vacate {
            layer: self,
            slot: &slot,
            token: lease.token(),
            armed: true,
        };
        self.inner.release(&store).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let Some((slot, store)) = self.store_lease_of(lease) else {
            return self.inner.extend(lease, ttl).await;
        };
        let renewed = self.inner.extend(&store, ttl).await?;
        {
            let mut st = lock(&slot);
            if let Some(h) = st.holder.as_mut().filter(|h| &h.token == lease.token()) {
                h.expires_at = renewed.expires_at();
                h.store = Some(renewed.clone());
            }
            slot.refresh(self.shared.epoch, &st);
        }
        self.shared.touch(lease.key());
        Ok(renewed.with_token(lease.token().clone()))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.list(prefix).await
    }

    async fn shutdown(&self) -> Result<usize> {
        self.shared.close();
        self.inner.shutdown().await
    }
}

#[cfg(test)]
mod tests;
