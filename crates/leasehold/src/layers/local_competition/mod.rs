//! Local competition (Bond 3.4, fast-fail): a cache of the keys this process holds, so a
//! contender inside the process is refused in memory, with no store I/O, while another task of
//! the process holds the key.
//!
//! # What it does
//! - **try-lock**: a key held (or being asked for) by another task of this process is refused at
//!   once ([`Attempt::Refused`], telling how long the holder's lease has left), and emits
//!   [`LockEvent::FastFailed`]; nothing is sent to the store.
//! - **One asker per key and process**: the task that finds the key free locally marks it as
//!   being asked for before it sends its request, so two tasks of the process never ask the
//!   store for one key at once.
//! - **Waiting is not here.** A blocking `lock()` waits in the manager's line for the key (see
//!   `LockManager`): only the head of that line asks, and this layer answers each of its attempts
//!   like any other, one call at a time.
//! - **Nothing outlives its lease**: each key has a slot in the cache holding its local state;
//!   moka's [`Expiry`](moka::Expiry) reads the slot at every access and keeps it while its state
//!   lasts (then a second more, so a key in use again soon finds it without a cache write), and
//!   every access checks the state against the clock, so a crashed, cancelled or leaked holder
//!   never blocks the process beyond its lease. Drop guards free the slot on error and
//!   cancellation.
//! - **Bounded, and an entry in use is never lost**: at most
//!   [`capacity`](LocalCompetitionLayer::capacity) keys in the cache (moka's size bound). A slot
//!   moka drops while it is in use (held, asked for, offered, or waited on) is kept aside until
//!   it is idle (see `entry.rs`), so a held key keeps refusing its contenders in memory however
//!   many keys flood the cache; idle slots are what the bound drops. Correctness never rests on
//!   the cache: the store decides.
//! - **Shutdown**: once the lifecycle is closing ([`Wiring::lifecycle`]; used
//!   alone, the layer's own [`LockStore::shutdown`] closes it), acquisitions fail with
//!   [`ErrorKind::ShutDown`].
//!
//! # Local hand-off (opt-in: [`LocalCompetitionLayer::hand_off`])
//! A release while another task of this process waits for the key keeps the store lease for the
//! head of the manager's line, which takes it on its next attempt with no store I/O (see
//! `hand_off.rs`). Bounded by [`max_hand_offs`](LocalCompetitionLayer::max_hand_offs) and
//! [`max_hand_off_hold`](LocalCompetitionLayer::max_hand_off_hold); a lease granted while other
//! processes queued ([`Lease::is_contended`]) is never handed off. The taker holds the store's
//! lease as it is, owner and fencing token included, so fencing does not tell two consecutive
//! local holders apart: leave hand-off off if a downstream system must (docs/LAYERS.md).
//!
//! # Where it belongs
//! Below reentrancy (a holder re-taking its own key must count up, not fail fast on itself) and
//! above everything that does I/O (shutdown tracking, unlock window, readback), so a fast-fail
//! costs no I/O and a hand-off is invisible below: they see one store lease.
//!
//! # Cost
//! Uncontended: a cache read at acquire and one at release, a short lock of the key's slot each,
//! and no cache write while the key stays in use (docs/PERFORMANCE.md has the numbers).
//! Contended: one cache read per refused try, no store I/O.

mod entry;
mod hand_off;
mod permits;

use std::sync::Arc;
use std::time::Duration;

use moka::sync::Cache;
use tokio::time::Instant;

use crate::core::{
    validate_ttl, Acquire, Attempt, Error, ErrorKind, Layer, LayeredStore, Lease, Lifecycle,
    LockEvent, LockKey, LockStore, Observers, OwnerToken, ReleaseWatch, Result,
};

use super::wiring::{WiredLayer, Wiring};
use entry::{Hasher, Kept, Local, Run, Slot, State};
use permits::LocalPermits;

/// How many times an acquisition looks its key's slot up when the cache keeps dropping the one it
/// found (idle, as a new slot is until marked): past that it uses the last one, which costs the
/// key its fast path for this acquisition only (the store decides).
const MAX_LOOKS: u32 = 4;

/// How close to its bound the cache counts as possibly evicting (see `slot_of`): moka applies
/// at most a few hundred writes per maintenance run (its write log holds 384), and its entry
/// count is updated at the end of each, so a cache further below its bound than this evicts
/// nothing in the run under way.
const EVICTION_MARGIN: u64 = 1024;

/// Default bound of consecutive local hand-offs of one store lease.
pub const DEFAULT_MAX_HAND_OFFS: u32 = 8;
/// Default bound of how long one store lease may be passed around by local hand-offs.
pub const DEFAULT_MAX_HAND_OFF_HOLD: Duration = Duration::from_millis(500);
/// Default bound of keys with a local entry: more than the keys one process holds at once in any
/// deployment we know of, and small enough to stay bounded under a flood of unique keys.
pub const DEFAULT_CAPACITY: u64 = 100_000;

/// The hand-off policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct HandOff {
    enabled: bool,
    max_hand_offs: u32,
    max_hold: Duration,
}

/// Local competition: the configuration and the [`Layer`] (like tower's `TimeoutLayer`).
///
/// ```
/// use std::time::Duration;
/// use leasehold::layers::LocalCompetitionLayer;
/// use leasehold::core::Layer;
/// use leasehold::MemoryStore;
/// let layer = LocalCompetitionLayer::new()
///     .hand_off(true)
///     .max_hand_offs(16)
///     .max_hand_off_hold(Duration::from_secs(1))
///     .capacity(10_000);
/// let store = layer.layer(MemoryStore::new());
/// # let _ = store;
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalCompetitionLayer {
    hand_off: HandOff,
    capacity: u64,
}

impl Default for LocalCompetitionLayer {
    fn default() -> Self {
        LocalCompetitionLayer {
            hand_off: HandOff {
                enabled: false,
                max_hand_offs: DEFAULT_MAX_HAND_OFFS,
                max_hold: DEFAULT_MAX_HAND_OFF_HOLD,
            },
            capacity: DEFAULT_CAPACITY,
        }
    }
}

impl LocalCompetitionLayer {
    /// The default: fast-fail, no hand-off, [`DEFAULT_CAPACITY`] keys.
    pub fn new() -> Self {
        LocalCompetitionLayer::default()
    }

    /// Turns local hand-off on or off (default off: see the module docs on fencing tokens).
    pub fn hand_off(mut self, on: bool) -> Self {
        self.hand_off.enabled = on;
        self
    }

    /// Sets the bound of consecutive hand-offs of one store lease (default
    /// [`DEFAULT_MAX_HAND_OFFS`]).
    pub fn max_hand_offs(mut self, max: u32) -> Self {
        self.hand_off.max_hand_offs = max;
        self
    }

    /// Sets the bound of hold time of one store lease across hand-offs (default
    /// [`DEFAULT_MAX_HAND_OFF_HOLD`]).
    pub fn max_hand_off_hold(mut self, max: Duration) -> Self {
        self.hand_off.max_hold = max;
        self
    }

    /// Sets how many keys the cache holds at once (default [`DEFAULT_CAPACITY`]; at least 1).
    /// Beyond it the cache drops idle keys to make room; keys in use are kept aside until idle
    /// (see the module docs).
    pub fn capacity(mut self, keys: u64) -> Self {
        self.capacity = keys.max(1);
        self
    }

    /// The hand-off bounds, `(max_hand_offs, max_hand_off_hold)`, when hand-off is on; `None`
    /// when it is off.
    pub fn hand_off_limits(&self) -> Option<(u32, Duration)> {
        self.hand_off
            .enabled
            .then_some((self.hand_off.max_hand_offs, self.hand_off.max_hold))
    }

    /// How many keys may have a local entry at once (see [`capacity`](Self::capacity)).
    pub fn key_capacity(&self) -> u64 {
        self.capacity
    }
}

impl<S: LockStore> Layer<S> for LocalCompetitionLayer {
    type Store = LocalCompetition<S>;

    fn layer(&self, inner: S) -> LocalCompetition<S> {
        self.layer_wired(inner, &Wiring::default())
    }
}

/// The store shuts down with the wiring's lifecycle (the manager's): closing it refuses
/// acquisitions, and its [`wait`](Lifecycle::wait) covers the background releases of unclaimed
/// offers.
impl<S: LockStore> WiredLayer<S> for LocalCompetitionLayer {
    fn layer_wired(&self, inner: S, wiring: &Wiring) -> LocalCompetition<S> {
        let inner = Arc::new(inner);
        let kept = Arc::new(Kept::default());
        LocalCompetition {
            cache: entry::cache(self.capacity, kept.clone()),
            kept,
            inner,
            hand_off: self.hand_off,
            observers: wiring.observers().clone(),
            lifecycle: wiring.lifecycle().clone(),
            permits: Arc::default(),
        }
    }
}

/// A store where this process's contenders for a key are refused in memory while another of its
/// tasks holds it (see the [module docs](self)).
pub struct LocalCompetition<S> {
    inner: Arc<S>,
    cache: Cache<LockKey, Arc<Slot>, Hasher>,
    /// Slots the cache dropped while in use, until they are idle.
    kept: Arc<Kept>,
    hand_off: HandOff,
    observers: Observers,
    lifecycle: Lifecycle,
    permits: Arc<LocalPermits>,
}

impl<S: LockStore> std::fmt::Debug for LocalCompetition<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCompetition")
            .field("store", &self.inner.name())
            .field("keys", &self.cache.entry_count())
            .field("hand_off", &self.hand_off)
            .finish()
    }
}

/// What a try found in the cache.
enum Found {
    /// Free locally: this call is now the key's asker.
    Free,
    /// Held, being asked for, or offered to a waiter, until then.
    Busy(Instant),
    /// A lease offered to this waiter.
    Offer(Lease),
}

/// What a release decided.
enum Released {
    /// Not this layer's holder: the store decides.
    NotHolder,
    /// Kept for the waiting head: the `n`th consecutive hand-off.
    HandedOff(u32),
    /// A real release. The key stays the holder's here until the store has answered (or the
    /// call is cancelled): a contender asking meanwhile would only be refused by the store, and
    /// a waiter queued there for nothing.
    ToStore(Arc<Slot>),
}

impl<S: LockStore> LocalCompetition<S> {
    /// Wraps `inner` with the default layer ([`LocalCompetitionLayer::new`]).
    pub fn new(inner: S) -> Self {
        LocalCompetitionLayer::new().layer(inner)
    }

    /// Keys with a local slot (in use, or idle and kept a little for their next use), once the
    /// cache has applied its pending work: the cache's, at most the
    /// [capacity](LocalCompetitionLayer::capacity), and those it dropped while they were in use.
    pub fn local_keys(&self) -> usize {
        self.cache.run_pending_tasks();
        usize::try_from(self.cache.entry_count())
            .unwrap_or(usize::MAX)
            .saturating_add(self.kept.len())
    }

    /// The lifecycle this store shuts down with.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// An exclusive acquire: refused in memory while the key is another local task's, a lease
    /// offered to a waiter taken, else asked of the store as the key's one asker.
    async fn acquire_exclusive(&self, req: &Acquire) -> Result<Attempt> {
        if req.wait.is_some() && self.inner.capabilities().waiter_line {
            // Strict FIFO: every waiter keeps its own place in the store's line; being refused
            // here would keep it from taking it.
            return self.inner.acquire(req).await;
        }
        let now = Instant::now();
        let (slot, (found, refresh)) = self.with_slot(&req.key, |st| match st.take(now) {
            Some(Local::Offered { lease, run }) if req.wait.is_some() => {
                let refresh = st.set(Some(Local::Held {
                    lease: lease.clone(),
                    run,
                }));
                (Found::Offer(lease), refresh)
            }
            Some(local) => {
                let until = local.until();
                let _ = st.set(Some(local));
                (Found::Busy(until), false)
            }
            None => {
                let refresh = st.set(Some(Local::Taken {
                    token: req.token.clone(),
                    until: now + req.ttl,
                }));
                (Found::Free, refresh)
            }
        });
        if refresh {
            self.refresh(&req.key);
        }
        match found {
            Found::Free => self.ask_store(req, &slot).await,
            Found::Offer(lease) => self.take_offer(req, lease, &slot).await,
            Found::Busy(until) => {
                self.observers.emit(|| LockEvent::FastFailed {
                    key: req.key.clone(),
                });
                Ok(Attempt::refused_for(until.saturating_duration_since(now)))
            }
        }
    }

    /// Asks the store as the key's asker; the slot keeps the mark as the holder's, or is freed
    /// on error and cancellation.
    async fn ask_store(&self, req: &Acquire, slot: &Slot) -> Result<Attempt> {
        let mut undo = Undo::new(self, slot, req.token.clone());
        let lease = match self.inner.acquire(req).await? {
            Attempt::Granted(lease) => lease,
            refused => return Ok(refused), // the slot is freed (`undo`)
        };
        undo.armed = false;
        if self.hand_off.enabled {
            // The slot keeps the lease only where a hand-off may need it: without, the asker's
            // mark (its token, until the end of the TTL it asked for) serves as the holder's.
            self.hold(slot, &req.token, &lease, Run::start(Instant::now()));
        }
        Ok(Attempt::Granted(lease))
    }

    /// Records `lease` as held in `slot` where it is still `asker`'s (or free).
    fn hold(&self, slot: &Slot, asker: &OwnerToken, lease: &Lease, run: Run) {
        let refresh = {
            let mut st = slot.lock();
            match st.current(Instant::now()) {
                Some(local) if !local.is_of(asker) => false,
                _ => st.set(Some(Local::Held {
                    lease: lease.clone(),
                    run,
                })),
            }
        };
        if refresh {
            self.refresh(lease.key());
        }
    }

    /// Runs `change` on the key's slot under its lock, and returns the slot with what `change`
    /// returned. The slot is one the cache dropped while in use (kept aside), else the cache's,
    /// else a new one added to the cache. One the cache dropped since it was looked up is
    /// nobody's, so the key is looked up again, [`MAX_LOOKS`] times at most.
    fn with_slot<R>(&self, key: &LockKey, change: impl FnOnce(&mut State) -> R) -> (Arc<Slot>, R) {
        let mut looks = 1;
        loop {
            let slot = self.existing_slot(key).unwrap_or_else(|| {
                let new = self
                    .cache
                    .entry_by_ref(key)
                    .or_insert_with(|| Arc::new(Slot::default()))
                    .into_value();
                // The insert may have replaced a slot the cache had let expire but not yet
                // removed, and that one, still in use, been kept aside meanwhile: it is the
                // key's (one slot per key in use).
                self.kept.in_use(key).unwrap_or(new)
            });
            let mut st = slot.lock();
            if !st.gone || looks == MAX_LOOKS {
                let out = change(&mut st);
                drop(st);
                return (slot, out);
            }
            drop(st);
            looks += 1;
        }
    }

    /// The key's slot, if it has one: one the cache dropped while in use (kept aside), else the
    /// cache's.
    fn existing_slot(&self, key: &LockKey) -> Option<Arc<Slot>> {
        self.kept.in_use(key).or_else(|| self.cache.get(key))
    }

    /// The slot holding `lease`'s state (its asker's mark or its hold), if any: the one kept
    /// aside or the cache's (an idle slot kept aside can shadow the cache's for a moment).
    ///
    /// One that finds neither looks again once moka's maintenance is done, while the cache may be
    /// evicting: moka takes an entry it evicts out of the cache before its eviction listener
    /// keeps it aside (see `entry.rs`), so a lookup in between finds the slot in neither place,
    /// and the slot kept aside right after would go on saying the lease is this process's (for a
    /// release: refusing its contenders until the lease's end). The listener runs under moka's
    /// maintenance lock, which [`Cache::run_pending_tasks`] waits for.
    fn slot_of(&self, lease: &Lease) -> Option<Arc<Slot>> {
        let key = lease.key();
        let find = || {
            [self.kept.get(key), self.cache.get(key)]
                .into_iter()
                .flatten()
                .find(|slot| {
                    slot.lock()
                        .current(Instant::now())
                        .is_some_and(|local| local.is_of(lease.token()))
                })
        };
        find().or_else(|| {
            if !self.may_be_evicting() {
                return None;
            }
            self.cache.run_pending_tasks();
            find()
        })
    }

    /// Whether the cache may be dropping slots in use: it is within [`EVICTION_MARGIN`] of its
    /// bound (as of its last maintenance), or has dropped some already. Otherwise a slot in use
    /// stays, its expiry following its state.
    fn may_be_evicting(&self) -> bool {
        let bound = self.cache.policy().max_capacity().unwrap_or(u64::MAX);
        !self.kept.is_empty() || self.cache.entry_count().saturating_add(EVICTION_MARGIN) >= bound
    }

    /// Brings the cache's expiry of the key's slot up to its state (a read: the expiry reads the
    /// slot at every access).
    fn refresh(&self, key: &LockKey) {
        self.cache.get(key);
    }

    /// A writer's lease offered to this process's waiters (hand-off) is of no use to a reader or
    /// a permit, which the store would refuse while it lasts: it goes back to the store first
    /// (in a task of its own, so a caller that stops waiting cannot leave it held), and the
    /// shared request then asks the store like any other.
    async fn decline_offer(&self, key: &LockKey) {
        let Some(slot) = self.existing_slot(key) else {
            return;
        };
        let offered = {
            let mut st = slot.lock();
            match st.take(Instant::now()) {
                Some(Local::Offered { lease, .. }) => Some(lease),
                other => {
                    let _ = st.set(other);
                    None
                }
            }
        };
        if let Some(lease) = offered {
            if let Some(released) = release_in_background(&self.inner, &self.lifecycle, lease) {
                let _ = released.await;
            }
        }
    }

    /// Readers and semaphore permits: many hold at once, so no one-at-a-time entry, but a permit
    /// request fails fast, with no store I/O, when this process already holds every permit.
    async fn acquire_shared(&self, req: &Acquire) -> Result<Attempt> {
        self.decline_offer(&req.key).await;
        let Some(permits) = req.mode.permits() else {
            return self.inner.acquire(req).await;
        };
        if let Some(retry_after) = self.permits.all_held(req, permits) {
            self.observers.emit(|| LockEvent::FastFailed {
                key: req.key.clone(),
            });
            return Ok(Attempt::refused_for(retry_after));
        }
        let attempt = self.inner.acquire(req).await?;
        if let Attempt::Granted(lease) = &attempt {
            self.permits.granted(lease);
        }
        Ok(attempt)
    }
}

impl<S: LockStore> LayeredStore for LocalCompetition<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        // Before `now + ttl`: used alone, this layer may be the first to see the request.
        validate_ttl(req.ttl)?;
        if self.lifecycle.is_closing() {
            return Err(Error::shut_down().with_key(req.key.as_str()));
        }
        if req.mode.is_shared_record() {
            self.acquire_shared(req).await
        } else {
            self.acquire_exclusive(req).await
        }
    }

    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        let watch = self.inner.watch(key).await;
        self.offer_to(key, watch)
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        if lease.mode().is_shared_record() {
            self.permits.forget(lease);
            return self.inner.release(lease).await;
        }
        match self.release_locally(lease) {
            Released::HandedOff(consecutive) => {
                self.observers.emit(|| LockEvent::HandedOff {
                    key: lease.key().clone(),
                    consecutive,
                });
                Ok(true)
            }
            Released::ToStore(slot) => {
                let _free = Undo::new(self, &slot, lease.token().clone());
                self.inner.release(lease).await
            }
            Released::NotHolder => self.inner.release(lease).await,
        }
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let renewed = self.inner.extend(lease, ttl).await;
        if lease.mode().is_shared_record() {
            match &renewed {
                Ok(renewed) => self.permits.extended(renewed),
                Err(e) if e.kind() == ErrorKind::NotHeld => self.permits.forget(lease),
                Err(_) => {}
            }
            return renewed;
        }
        let lost = matches!(&renewed, Err(e) if e.kind() == ErrorKind::NotHeld);
        let Some(slot) = (renewed.is_ok() || lost)
            .then(|| self.slot_of(lease))
            .flatten()
        else {
            return renewed;
        };
        let refresh = {
            let mut st = slot.lock();
            match (st.take(Instant::now()), &renewed) {
                (Some(Local::Held { lease: held, run }), Ok(renewed))
                    if held.token() == lease.token() =>
                {
                    st.set(Some(Local::Held {
                        lease: renewed.clone(),
                        run,
                    }))
                }
                (Some(Local::Taken { token, .. }), Ok(renewed)) if token == *lease.token() => st
                    .set(Some(Local::Taken {
                        token,
                        until: renewed.expires_at(),
                    })),
                (Some(local), _) if local.is_of(lease.token()) => false,
                (other, _) => st.set(other),
            }
        };
        if refresh {
            self.refresh(lease.key());
        }
        renewed
    }

    async fn shutdown(&self) -> Result<usize> {
        self.lifecycle.close();
        self.permits.clear();
        self.inner.shutdown().await
    }
}

/// Frees `slot` of `token` when dropped while armed (on error and cancellation), and releases
/// `give_back` then: once the slot is free nobody here knows that lease, and it would block the
/// key, here and elsewhere, for its whole TTL.
struct Undo<'a, S: LockStore> {
    layer: &'a LocalCompetition<S>,
    slot: &'a Slot,
    token: OwnerToken,
    give_back: Option<Lease>,
    armed: bool,
}

impl<'a, S: LockStore> Undo<'a, S> {
    fn new(layer: &'a LocalCompetition<S>, slot: &'a Slot, token: OwnerToken) -> Self {
        Undo {
            layer,
            slot,
            token,
            give_back: None,
            armed: true,
        }
    }
}

impl<S: LockStore> Drop for Undo<'_, S> {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        {
            let mut st = self.slot.lock();
            let mine = st
                .current(Instant::now())
                .is_some_and(|l| l.is_of(&self.token));
            if mine {
                let _ = st.set(None);
            }
        }
        if let Some(lease) = self.give_back.take() {
            release_in_background(&self.layer.inner, &self.layer.lifecycle, lease);
        }
    }
}

/// Releases a store lease nobody will use (owner-checked, so harmless if it is gone already),
/// tracked by the lifecycle so a shutdown can wait for it.
fn release_in_background<S: LockStore>(
    inner: &Arc<S>,
    lifecycle: &Lifecycle,
    lease: Lease,
) -> Option<tokio::task::JoinHandle<()>> {
    let inner = inner.clone();
    let key = lease.key().clone();
    let spawned = lifecycle.spawn(async move {
        if let Err(error) = inner.release(&lease).await {
            tracing::warn!(key = %lease.key(), error = %error.chain(),
                "releasing an unused hand-off failed; the lock expires at its TTL");
        }
    });
    if spawned.is_none() {
        tracing::warn!(%key, "unused hand-off outside a runtime; the lock expires at its TTL");
    }
    spawned
}

#[cfg(test)]
mod tests;
