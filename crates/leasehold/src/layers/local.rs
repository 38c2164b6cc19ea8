//! Local competition (Bond 3.4, fast-fail): contenders for one key inside this process meet in
//! memory first, so only one of them talks to the store at a time.
//!
//! # What it guarantees
//! Every key being acquired or held through the layer has an entry in a concurrent map (a
//! dashmap): key → the local holder (its token, its expiry, and the store lease when it differs
//! from the holder's own). The local holder is removed on release, on error and on cancellation
//! (drop guards), and its expiry (in `tokio::time`, the lease's) is checked on every access, so a
//! crashed or cancelled task never blocks the process beyond its lease. A background task (one per
//! layer, holding only a weak reference) reclaims entries nobody holds, waits for or refers to,
//! every second; until then an emptied entry is reused, so a hot key pays no map insert per
//! acquisition.
//!
//! Why not a [moka] cache, which the first version used for its per-entry expiry: expiry has to
//! be checked against the lease on every access anyway (a cache evicts lazily), so moka only
//! reclaimed memory, and it cost 132 ns per lookup against 26 ns for the map (moka records every
//! read for its eviction policy): the layer added ≈ 0.67 µs to an uncontended acquire + release,
//! ≈ 0.18 µs now (docs/PERFORMANCE.md). Reclaiming with a sweep is exact and needs no eviction
//! policy: an entry in use is never evicted.
//!
//! - **try-lock** ([`Acquire::deadline`] `None`): if another local holder has the key (or is
//!   acquiring or releasing it), the call fails at once with `LockUnavailable` and no store I/O
//!   ([`LockEvent::FastFailed`]).
//! - **blocking lock** (deadline set): the caller waits locally, and is woken as soon as the local
//!   holder releases (or at its lease's expiry, or at the deadline) — no polling of the store.
//! - **One store acquirer per key**: the contender that finds the key free locally marks it as
//!   acquiring before sending; everyone else waits or fails fast in memory. A store-level
//!   `LockUnavailable` (another process holds it) frees the local entry and wakes one local waiter,
//!   which then tries the store in turn: at most one acquire per key per process in flight.
//! - **No handed lease left behind**: a store lease received by hand-off is released in the
//!   background whenever the layer stops knowing it (the taker cancelled or failed during the
//!   extend, its release cancelled, the waiters gone).
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
//! Uncontended: one map lookup on acquire (plus an insert the first time a key is seen), one on
//! release, one clock read and three short mutex sections (docs/PERFORMANCE.md has the numbers).
//! Contended: no store I/O at all for fast-fails and local waits.
//!
//! [moka]: https://docs.rs/moka

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::{
    validate_ttl, Acquire, Capabilities, Error, ErrorKind, Layer, Lease, LockEvent, LockInfo,
    LockKey, LockStore, Observers, OwnerToken, Result,
};
use crate::sweep::Sweeper;
use crate::KeyMap;

/// Default bound of consecutive local hand-offs of one store lease.
pub const DEFAULT_MAX_HAND_OFFS: u32 = 8;
/// Default bound of how long one store lease may be passed around by local hand-offs.
pub const DEFAULT_MAX_HAND_OFF_HOLD: Duration = Duration::from_millis(500);
/// How often entries nobody uses are reclaimed.
const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

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
    pub fn new() -> Self {
        LocalCompetitionLayer::default()
    }

    /// Temporary: replaced by the moka rewrite.
    pub fn with_config(config: LocalCompetitionConfig) -> Self {
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

    /// Temporary: replaced by the moka rewrite.
    pub fn with_lifecycle(self, _lifecycle: crate::core::Lifecycle) -> Self {
        self
    }

    /// Temporary: replaced by the moka rewrite.
    pub fn hand_off(mut self, on: bool) -> Self {
        self.config.hand_off = on;
        self
    }

    /// Temporary: replaced by the moka rewrite.
    pub fn max_hand_offs(mut self, max: u32) -> Self {
        self.config.max_hand_offs = max;
        self
    }

    /// Temporary: replaced by the moka rewrite.
    pub fn max_hand_off_hold(mut self, max: Duration) -> Self {
        self.config.max_hand_off_hold = max;
        self
    }
}

impl<S: LockStore> Layer<S> for LocalCompetitionLayer {
    type Store = LocalCompetition<S>;

    fn layer(&self, inner: S) -> LocalCompetition<S> {
        LocalCompetition {
            inner: Arc::new(inner),
            shared: Arc::new(Shared {
                slots: KeyMap::default(),
                closed: AtomicBool::new(false),
                sweeper: Sweeper::default(),
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
            .field("keys", &self.shared.slots.len())
            .field("config", &self.config)
            .finish()
    }
}

struct Shared {
    slots: KeyMap<Arc<Slot>>,
    closed: AtomicBool,
    sweeper: Sweeper,
}

/// One key's local state.
#[derive(Debug, Default)]
struct Slot {
    state: Mutex<State>,
    wake: Notify,
}

#[derive(Debug, Default)]
struct State {
    holder: Option<LocalHolder>,
    /// A store lease handed off by a releasing holder, reserved for a local waiter.
    offer: Option<Offer>,
    waiting: u32,
}

#[derive(Debug)]
struct LocalHolder {
    token: OwnerToken,
    /// The store lease when it carries another owner token than the holder's (received by a
    /// hand-off). `None`: the holder's own lease is the store lease (once its acquire returned).
    handed: Option<Lease>,
    /// No later than the store lease's expiry (the clock is read before the store is asked).
    expires_at: Instant,
    hand_offs: u32,
    /// When the store lease was first acquired (for the hand-off hold bound).
    since: Instant,
}

impl LocalHolder {
    /// The store lease behind `lease`, the lease this holder was given.
    fn store_lease(&self, lease: &Lease) -> Lease {
        self.handed.clone().unwrap_or_else(|| lease.clone())
    }
}

#[derive(Debug)]
struct Offer {
    store: Lease,
    hand_offs: u32,
    since: Instant,
}

fn lock(slot: &Slot) -> MutexGuard<'_, State> {
    slot.state.lock().unwrap_or_else(PoisonError::into_inner)
}

impl State {
    /// Drops a holder or an offer whose lease has run out.
    fn expire(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
            self.holder = None;
        }
        if self
            .offer
            .as_ref()
            .is_some_and(|o| o.store.expires_at() <= now)
        {
            self.offer = None;
        }
    }

    fn is_idle(&self) -> bool {
        self.holder.is_none() && self.offer.is_none() && self.waiting == 0
    }
}

impl Shared {
    fn slot(&self, key: &LockKey) -> Arc<Slot> {
        if let Some(slot) = self.slots.get(key) {
            return slot.clone();
        }
        self.slots.entry(key.clone()).or_default().clone()
    }

    /// Removes the entries nobody holds, waits for or refers to; returns how many.
    fn sweep(&self, now: Instant) -> usize {
        let before = self.slots.len();
        self.slots.retain(|_, slot| {
            // A task that holds a reference (mid-acquire or mid-release) keeps the entry; no new
            // reference can be taken while `retain` holds the shard's write lock.
            if Arc::strong_count(slot) > 1 {
                return true;
            }
            let mut st = lock(slot);
            st.expire(now);
            !st.is_idle()
        });
        before.saturating_sub(self.slots.len())
    }

    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        for slot in self.slots.iter() {
            slot.wake.notify_waiters();
        }
    }
}

impl<S: LockStore> LocalCompetition<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, config: LocalCompetitionConfig) -> Self {
        LocalCompetitionLayer::with_config(config).layer(inner)
    }

    /// Keys with a local entry, including emptied ones not reclaimed yet.
    pub fn local_keys(&self) -> usize {
        self.shared.slots.len()
    }

    /// Reclaims the entries nobody holds, waits for or refers to now (the background sweep does
    /// this every second); returns how many were removed.
    pub fn reclaim_idle(&self) -> usize {
        self.shared.sweep(Instant::now())
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A handle that wakes every local waiter and makes them fail with
    /// [`ErrorKind::ShutDown`]; the manager calls it when its shutdown starts, so waiters do not
    /// hold the shutdown up.
    #[allow(dead_code)] // replaced by the lifecycle in the moka rewrite
    pub(crate) fn closer(&self) -> impl Fn() + Send + Sync + 'static {
        let shared = self.shared.clone();
        move || shared.close()
    }

    /// Frees the slot if `token` still holds it and wakes a waiter. The emptied entry stays until
    /// the next sweep, so a hot key is not re-inserted each time.
    fn vacate(&self, slot: &Slot, token: &OwnerToken) {
        let wake = {
            let mut st = lock(slot);
            if st.holder.as_ref().is_some_and(|h| &h.token == token) {
                st.holder = None;
            }
            st.waiting > 0
        };
        if wake {
            slot.wake.notify_one();
        }
    }

    /// Releases a handed-off store lease nobody will use (owner-checked, so harmless if it is
    /// gone already).
    fn release_in_background(&self, lease: Lease) {
        let inner = self.inner.clone();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if let Err(error) = inner.release(&lease).await {
                        tracing::warn!(key = %lease.key(), %error,
                            "releasing an unused hand-off failed; the lock expires at its TTL");
                    }
                });
            }
            Err(_) => tracing::warn!(key = %lease.key(),
                "unused hand-off outside a runtime; the lock expires at its TTL"),
        }
    }

    /// Asks the store, as the key's one local store talker. The holder entry was set up (with
    /// an expiry no later than the lease's) before the request, so success needs no second
    /// update; error and cancellation free the entry.
    async fn acquire_from_store(&self, slot: &Slot, req: &Acquire) -> Result<Lease> {
        let mut vacate = Vacate::new(self, slot, &req.token);
        let lease = self.inner.try_acquire(req).await?;
        vacate.armed = false;
        Ok(lease)
    }

    /// Takes a store lease handed off by the previous local holder, extending it first if less
    /// than half of the requested TTL is left.
    async fn take_hand_off(&self, slot: &Slot, req: &Acquire, store: Lease) -> Result<Lease> {
        if store.remaining() >= req.ttl / 2 {
            // The holder entry already maps this taker to `store` (set when the slot was taken).
            return Ok(store.with_token(req.token.clone()));
        }
        // Cancelled or failed from here on: the slot is freed and the store lease given back.
        let mut vacate = Vacate::new(self, slot, &req.token);
        vacate.give_back = Some(store.clone());
        let renewed = match self.inner.extend(&store, req.ttl).await {
            Ok(renewed) => renewed,
            Err(error) if error.kind() == ErrorKind::NotHeld => {
                // The lease was lost under us: acquire afresh, still as the one store talker.
                vacate.armed = false;
                {
                    let mut st = lock(slot);
                    let Some(h) = st.holder.as_mut().filter(|h| h.token == req.token) else {
                        // Meanwhile the slot went to another contender, who asks the store.
                        return Err(Error::unavailable(&req.key));
                    };
                    let now = Instant::now();
                    h.handed = None;
                    h.expires_at = now + req.ttl;
                    h.since = now;
                    h.hand_offs = 0;
                }
                return self.acquire_from_store(slot, req).await;
            }
            // Unknown whether it still holds, and too short to hand out as asked for.
            Err(error) => return Err(error),
        };
        vacate.give_back = Some(renewed.clone());
        let mut st = lock(slot);
        let Some(h) = st.holder.as_mut().filter(|h| h.token == req.token) else {
            // The extend outlasted the old lease and the slot went to another contender: this
            // lease is known to nobody here, so it goes back (by the drop of `vacate`).
            drop(st);
            return Err(Error::unavailable(&req.key));
        };
        h.expires_at = renewed.expires_at();
        h.handed = Some(renewed.clone());
        drop(st);
        vacate.armed = false;
        Ok(renewed.with_token(req.token.clone()))
    }
}

/// Frees a slot when dropped while armed: on error and on cancellation. A store lease received
/// by hand-off (`give_back`) is released in the background then: once the slot is free nobody
/// else knows it, and it would block the key, here and elsewhere, for its whole TTL.
struct Vacate<'a, S: LockStore> {
    layer: &'a LocalCompetition<S>,
    slot: &'a Slot,
    token: &'a OwnerToken,
    give_back: Option<Lease>,
    armed: bool,
}

impl<'a, S: LockStore> Vacate<'a, S> {
    fn new(layer: &'a LocalCompetition<S>, slot: &'a Slot, token: &'a OwnerToken) -> Self {
        Vacate {
            layer,
            slot,
            token,
            give_back: None,
            armed: true,
        }
    }
}

impl<S: LockStore> Drop for Vacate<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            self.layer.vacate(self.slot, self.token);
            if let Some(lease) = self.give_back.take() {
                self.layer.release_in_background(lease);
            }
        }
    }
}

/// A registration as a local waiter of one slot; dropping it (timeout, cancellation) unregisters,
/// and the last waiter to leave gives back an unclaimed hand-off.
struct WaitTicket<'a, S: LockStore> {
    layer: &'a LocalCompetition<S>,
    slot: Arc<Slot>,
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
        let orphan = {
            let mut st = lock(&self.slot);
            st.waiting = st.waiting.saturating_sub(1);
            if st.waiting == 0 && st.holder.is_none() {
                st.offer.take()
            } else {
                None
            }
        };
        if let Some(offer) = orphan {
            self.layer.release_in_background(offer.store);
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
        // Before `now + ttl` below: used alone, this layer may be the first to see the request.
        validate_ttl(req.ttl)?;
        self.shared
            .sweeper
            .ensure(&self.shared, SWEEP_INTERVAL, Shared::sweep);
        let mut ticket: Option<WaitTicket<'_, S>> = None;
        // The slot taken, and the store lease if it came by hand-off.
        let (slot, offer) = loop {
            if self.shared.closed.load(Ordering::Acquire) {
                return Err(Error::shut_down().with_key(req.key.as_str()));
            }
            let slot = self.shared.slot(&req.key);
            if ticket
                .as_ref()
                .is_some_and(|t| !Arc::ptr_eq(&t.slot, &slot))
            {
                // The entry was reclaimed and made anew while this task was not registered.
                ticket = None;
            }
            let taken = 'attempt: {
                let notified = slot.wake.notified();
                let mut notified = std::pin::pin!(notified);
                let now = Instant::now();
                let wake_at = {
                    let mut st = lock(&slot);
                    st.expire(now);
                    if st.holder.is_none() && (st.offer.is_none() || req.deadline.is_some()) {
                        if let Some(t) = ticket.take() {
                            t.leave_locked(&mut st);
                        }
                        let offer = st.offer.take();
                        let (handed, expires_at, hand_offs, since) = match &offer {
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
                            handed,
                            expires_at,
                            hand_offs,
                            since,
                        });
                        break 'attempt Some(offer.map(|o| o.store));
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
                        ticket = Some(WaitTicket {
                            layer: self,
                            slot: slot.clone(),
                            armed: true,
                        });
                    }
                    notified.as_mut().enable();
                    // A shutdown that started after the check at the top wakes nobody who was
                    // not registered yet: checked again now that this task is.
                    if self.shared.closed.load(Ordering::Acquire) {
                        drop(st); // before the ticket, whose drop takes the lock
                        return Err(Error::shut_down().with_key(req.key.as_str()));
                    }
                    let lease_end = st
                        .holder
                        .as_ref()
                        .map(|h| h.expires_at)
                        .or_else(|| st.offer.as_ref().map(|o| o.store.expires_at()))
                        .unwrap_or(deadline);
                    deadline.min(lease_end)
                };
                // Woken or not, the slot is looked at again before giving up at the deadline: a
                // wake-up consumed here and not acted on would leave the next waiter asleep.
                let _ = tokio::time::timeout_at(wake_at, notified).await;
                None
            };
            if let Some(offer) = taken {
                break (slot, offer);
            }
        };
        // Acted on after the wait registration is gone.
        drop(ticket);
        match offer {
            Some(store) => self.take_hand_off(&slot, req, store).await,
            None => self.acquire_from_store(&slot, req).await,
        }
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let Some(slot) = self.shared.slots.get(lease.key()).map(|s| s.clone()) else {
            return self.inner.release(lease).await;
        };
        let store = 'decide: {
            let mut st = lock(&slot);
            let Some(holder) = st.holder.as_ref().filter(|h| &h.token == lease.token()) else {
                break 'decide None;
            };
            let handed = holder.handed.clone();
            let hand_off = (self.config.hand_off && st.waiting > 0)
                .then(|| (holder.store_lease(lease), holder.hand_offs, holder.since))
                .filter(|(store, hand_offs, since)| {
                    let now = Instant::now();
                    *hand_offs < self.config.max_hand_offs
                        && now.saturating_duration_since(*since) < self.config.max_hand_off_hold
                        && now < store.expires_at()
                });
            if let Some((store, hand_offs, since)) = hand_off {
                let consecutive = hand_offs + 1;
                st.holder = None;
                st.offer = Some(Offer {
                    store,
                    hand_offs: consecutive,
                    since,
                });
                drop(st);
                slot.wake.notify_one();
                self.observers.emit(|| LockEvent::HandedOff {
                    key: lease.key().clone(),
                    consecutive,
                });
                return Ok(true);
            }
            // A real release: the holder stays in place (the key is still held in the store)
            // until the store answered. `None` inside: the holder's own lease is the store's.
            Some(handed)
        };
        let Some(handed) = store else {
            // Not the local holder's lease (stale or foreign): the store decides.
            return self.inner.release(lease).await;
        };
        // The slot is freed when the store has answered, or if this call is cancelled; then a
        // handed store lease is still released (in the background), as its mapping goes away.
        let mut vacate = Vacate::new(self, &slot, lease.token());
        vacate.give_back = handed.clone();
        let released = self.inner.release(handed.as_ref().unwrap_or(lease)).await;
        vacate.give_back = None;
        released
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let local = self.shared.slots.get(lease.key()).and_then(|slot| {
            let store = lock(&slot)
                .holder
                .as_ref()
                .filter(|h| &h.token == lease.token())
                .map(|h| h.store_lease(lease))?;
            Some((slot.clone(), store))
        });
        let Some((slot, store)) = local else {
            return self.inner.extend(lease, ttl).await;
        };
        let renewed = self.inner.extend(&store, ttl).await?;
        {
            let mut st = lock(&slot);
            if let Some(h) = st.holder.as_mut().filter(|h| &h.token == lease.token()) {
                h.expires_at = renewed.expires_at();
                if h.handed.is_some() {
                    h.handed = Some(renewed.clone());
                }
            }
        }
        Ok(renewed.with_token(lease.token().clone()))
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.list(prefix).await
    }

    async fn watch(&self, key: &LockKey) -> crate::core::ReleaseWatch {
        self.inner.watch(key).await
    }

    async fn shutdown(&self) -> Result<usize> {
        self.shared.close();
        self.inner.shutdown().await
    }
}

#[cfg(test)]
mod tests;
