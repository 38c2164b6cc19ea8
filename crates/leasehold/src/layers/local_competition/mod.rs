//! Local competition (Bond 3.4, fast-fail): contenders for one key inside this process meet in
//! memory first, so only one of them talks to the store at a time.
//!
//! # What it guarantees
//! - **try-lock** ([`Acquire::deadline`] `None`): if another local holder has the key (or is
//!   acquiring or releasing it), the call fails at once with `LockUnavailable` and no store I/O
//!   ([`LockEvent::FastFailed`]).
//! - **blocking lock** (deadline set): the caller joins the key's line, in arrival order, and
//!   waits in memory until it is the head and the key is free locally (woken by the release, or
//!   at the holder's lease expiry, or at its deadline) — no polling of the store. A task that
//!   releases and asks again goes to the back; a try-lock never passes anyone in line.
//! - **One store contender per key and process**: only the head of the line asks the store, and
//!   marks the key as acquiring before sending. When the store refuses it (another process holds
//!   the key), a head with a [`WaiterId`](crate::core::WaiterId) (the manager's wait) keeps its
//!   place and waits for the store in the manager's loop, while everyone behind it waits in
//!   memory: the process is one contender in the store, as a fair store's line expects. A grant
//!   marked contended ([`Lease::is_contended`]: other processes queued) with local waiters left
//!   means the process went to the back of the store's line: the next head then waits for the
//!   store's word instead of asking only to be refused. The place is given up when the wait's
//!   [`ReleaseWatch`] is dropped, and lapses at the waiter's deadline. Over a store that keeps
//!   one place per waiter ([`Capabilities::waiter_line`](crate::core::Capabilities::waiter_line):
//!   strict FIFO across the fleet), blocking requests skip the local line and take their own
//!   place in the store's.
//! - **No local state outlives its lease**: a holder's expiry (the lease's, in `tokio::time`) is
//!   checked on every access, so a crashed, cancelled or leaked holder never blocks the process
//!   beyond its lease; drop guards free the entry on error and cancellation.
//! - **No handed lease left behind**: a store lease received by hand-off is released in the
//!   background whenever the layer stops knowing it (the taker cancelled or failed during the
//!   extend, its release cancelled, the waiters gone). Background releases run through the
//!   layer's [`Lifecycle`], so a shutdown can wait for them.
//! - **Shutdown**: once the lifecycle is closing ([`LocalCompetitionLayer::with_lifecycle`]; used
//!   alone, the layer's own [`LockStore::shutdown`] closes it), acquisitions fail with
//!   [`ErrorKind::ShutDown`] and local waiters wake and end with it.
//!
//! # The entries: a moka cache
//! Each key's state (`slot.rs`: a small synchronous state machine) lives in a
//! [`moka::sync::Cache`] entry whose expiry (moka's per-entry [`moka::Expiry`]) follows the
//! state: while anyone holds, is offered or waits for the key, the entry expires no earlier than
//! the end of the longest of those (lease, offer, waiter wake-up), plus a slack of an eighth of
//! the lease, at most one second, so that on a hot key the next holders need no cache write; once
//! nobody does, no later than the end of the last lease, and at most one second after it emptied
//! (so a hot key reuses its entry instead of inserting one per acquisition). A leaked holder's
//! entry is dropped by moka at its lease's end plus that slack, with no sweep task; its local
//! state is void at the lease's end exactly (checked on every access).
//!
//! **Never evicted while in use.** moka's size bound cannot be used for that: its eviction (and
//! TinyLFU admission, which may refuse a new entry outright) picks victims regardless of weight —
//! a zero-weight entry is evicted like any other (moka 0.12 `evict_lru_entries` / `admit`). So the
//! cache has no moka size bound and no other eviction than the expiry above, and:
//! - the expiry is only ever written under the entry's lock, by the task that changed the state
//!   (a read that only looks the key up leaves it as it is), so a stale, shorter expiry can never
//!   overwrite a longer one;
//! - after taking or waiting on an entry, the task checks the entry it changed is still the
//!   cache's (it could have expired between the look-up and the lock); if not, it backs out and
//!   looks again. From then on the expiry covers its use.
//!
//! **Fewer cache reads on a hot key.** A moka read costs about as much as the rest of the layer's
//! work, so three reads are skipped where nothing can have changed: a waiter woken in its place
//! looks at the same entry again (it is pinned in the cache while the waiter is in its line); a
//! thread remembers, weakly, the entry it looked up last, which serves its next acquire or release
//! of that key; and a wait that ends after being served leaves nothing to clean up. An entry that
//! left the cache is marked so (the eviction listener, a reclaim, a failed check) and is never used
//! again from memory; one that moka expired without saying yet was idle, so whoever takes it moves
//! its expiry, and that write finds it gone and sends the taker back to look again.
//!
//! **Capacity.** The layer bounds the number of entries itself
//! ([`capacity`](LocalCompetitionLayer::capacity), default [`DEFAULT_CAPACITY`]): a new key is
//! admitted only below capacity; at capacity, expired entries are dropped and idle ones reclaimed
//! (at most every 100 ms), and if every entry is in use the acquisition goes to the store
//! directly, without local competition for that key (still correct: the store decides; only the
//! in-memory fast path is skipped). A flood of unique keys therefore never grows memory past
//! `capacity` entries (≈ 600 bytes each: the 344-byte entry, the key and moka's bookkeeping), and
//! never pushes out a key in use.
//!
//! # Local hand-off (opt-in: [`LocalCompetitionLayer::hand_off`])
//! When a local holder releases while other local contenders wait, the store lease is handed
//! straight to the head of the line: no store release, no store acquire. The waiter extends the
//! lease in the store first if less than half of its requested TTL is left. This turns a hot key
//! from network-bound into memory-bound. To stay fair to other processes, hand-offs are bounded:
//! after [`max_hand_offs`](LocalCompetitionLayer::max_hand_offs) consecutive hand-offs of one
//! store lease, or once it has been held (across hand-offs) for
//! [`max_hand_off_hold`](LocalCompetitionLayer::max_hand_off_hold), the next release is a real
//! one and every contender, local or remote, competes in the store again. A lease the store
//! granted while other processes queued for it ([`Lease::is_contended`]) is never handed off:
//! those processes asked first.
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
//! Uncontended: a cache read on acquire and on release unless the thread's last look-up serves
//! it, plus one when the entry's expiry has to move (taking with a new lease, emptying), a clock
//! read and a few short mutex sections (docs/PERFORMANCE.md has the numbers; moka records every
//! read for its policies). Contended: at most one cache read per acquisition, and no store I/O at
//! all for fast-fails and local waits. Serving the line in arrival order wakes a different task
//! at every hand-over: on the embedded store that task switch, not the layer, bounds a hot key's
//! throughput (docs/PERFORMANCE.md).

mod acquire;
mod entries;
mod permits;
mod slot;

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::{
    validate_ttl, Acquire, Error, ErrorKind, Layer, LayeredStore, Lease, Lifecycle, LockEvent,
    LockKey, LockStore, Observers, OwnerToken, ReleaseWatch, Result,
};
use acquire::Vacate;
use entries::Shared;
use permits::LocalPermits;
use slot::{HandOff, Release, Slot};

/// Default bound of consecutive local hand-offs of one store lease.
pub const DEFAULT_MAX_HAND_OFFS: u32 = 8;
/// Default bound of how long one store lease may be passed around by local hand-offs.
pub const DEFAULT_MAX_HAND_OFF_HOLD: Duration = Duration::from_millis(500);
/// Default bound of keys with a local entry: 100 000 entries are ≈ 60 MB, more than the keys
/// one process holds or waits for at once in any deployment we know of, and small enough to
/// stay bounded under a flood of unique keys.
pub const DEFAULT_CAPACITY: u64 = 100_000;
/// At capacity with every entry in use, how long before idle entries are looked for again (a
/// look is a pass over the whole cache).
const RECLAIM_GAP: Duration = Duration::from_millis(100);

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
#[derive(Debug, Clone)]
pub struct LocalCompetitionLayer {
    hand_off: HandOff,
    capacity: u64,
    observers: Observers,
    lifecycle: Lifecycle,
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
            observers: Observers::default(),
            lifecycle: Lifecycle::new(),
        }
    }
}

impl LocalCompetitionLayer {
    /// The default: fast-fail and local waiting, no hand-off, [`DEFAULT_CAPACITY`] keys, no
    /// observers, a lifecycle of its own.
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

    /// Sets how many keys may have a local entry at once (default [`DEFAULT_CAPACITY`]; at
    /// least 1). Beyond it, new keys go to the store without local competition.
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

    /// Reports events to `observers`.
    pub fn with_observers(mut self, observers: Observers) -> Self {
        self.observers = observers;
        self
    }

    /// Shuts down with `lifecycle` (a manager passes its own): closing it refuses acquisitions
    /// and wakes local waiters, and its [`wait`](Lifecycle::wait) covers the background
    /// releases. Every store this layer wraps shares it.
    pub fn with_lifecycle(mut self, lifecycle: Lifecycle) -> Self {
        self.lifecycle = lifecycle;
        self
    }
}

impl<S: LockStore> Layer<S> for LocalCompetitionLayer {
    type Store = LocalCompetition<S>;

    fn layer(&self, inner: S) -> LocalCompetition<S> {
        LocalCompetition {
            inner: Arc::new(inner),
            shared: Arc::new(Shared::new(self.capacity)),
            hand_off: self.hand_off,
            observers: self.observers.clone(),
            lifecycle: self.lifecycle.clone(),
            permits: Arc::default(),
        }
    }
}

/// A store where local contenders meet in memory first (see the [module docs](self)).
pub struct LocalCompetition<S> {
    inner: Arc<S>,
    shared: Arc<Shared>,
    hand_off: HandOff,
    observers: Observers,
    lifecycle: Lifecycle,
    permits: Arc<LocalPermits>,
}

impl<S: LockStore> std::fmt::Debug for LocalCompetition<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalCompetition")
            .field("store", &self.inner.name())
            .field("keys", &self.shared.entries.load(Ordering::Relaxed))
            .field("capacity", &self.shared.capacity)
            .field("hand_off", &self.hand_off)
            .finish()
    }
}

impl<S: LockStore> LocalCompetition<S> {
    /// Wraps `inner` with the default layer ([`LocalCompetitionLayer::new`]).
    pub fn new(inner: S) -> Self {
        LocalCompetitionLayer::new().layer(inner)
    }

    /// Keys with a local entry, including emptied ones not reclaimed yet (expired ones are
    /// dropped first).
    pub fn local_keys(&self) -> usize {
        self.shared.cache.run_pending_tasks();
        usize::try_from(self.shared.entries.load(Ordering::Acquire)).unwrap_or(0)
    }

    /// Reclaims now the entries nobody holds, is offered or waits for (the cache drops them by
    /// itself at their expiry, and at capacity); returns how many were removed.
    pub fn reclaim_idle(&self) -> usize {
        let removed = self.shared.reclaim(Instant::now());
        self.shared.cache.run_pending_tasks();
        removed
    }

    /// The lifecycle this store shuts down with.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self.lifecycle
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// A holder's release decided in `slot`, and the head's wake-up if the key is free now.
    fn release_in(&self, slot: &Arc<Slot>, lease: &Lease) -> (Release, Option<Arc<Notify>>) {
        let mut st = slot.lock();
        let now = Instant::now();
        let decision = st.release(lease, self.hand_off, now);
        if matches!(decision, Release::HandedOff { .. }) {
            self.shared.settle(lease.key(), slot, &mut st, now);
        }
        let head = st.head_wake();
        (decision, head)
    }

    /// Frees the slot if `token` still holds it, gives the entry its new expiry, and wakes the
    /// head of the line.
    fn vacate(&self, key: &LockKey, slot: &Arc<Slot>, token: &OwnerToken) {
        let wake = {
            let mut st = slot.lock();
            let wake = st.vacate(token);
            self.shared.settle(key, slot, &mut st, Instant::now());
            wake
        };
        if let Some(wake) = wake {
            wake.notify_waiters();
        }
    }

    fn release_in_background(&self, lease: Lease) {
        release_in_background(&self.inner, &self.lifecycle, lease);
    }

    /// Readers and semaphore permits: no one-at-a-time slot (many hold at once), but a permit
    /// request fails fast, with no store I/O, when this process already holds every permit.
    async fn acquire_shared(&self, req: &Acquire) -> Result<Lease> {
        if self.lifecycle.is_closing() {
            return Err(Error::shut_down().with_key(req.key.as_str()));
        }
        let Some(permits) = req.mode.permits() else {
            return self.inner.try_acquire(req).await;
        };
        if let Err(refused) = self.permits.check(req, permits) {
            self.observers.emit(|| LockEvent::FastFailed {
                key: req.key.clone(),
            });
            return Err(refused);
        }
        let lease = self.inner.try_acquire(req).await?;
        self.permits.granted(&lease);
        Ok(lease)
    }
}

impl<S: LockStore> LayeredStore for LocalCompetition<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        // Before `now + ttl` below: used alone, this layer may be the first to see the request.
        validate_ttl(req.ttl)?;
        if req.mode.is_shared_record() {
            self.acquire_shared(req).await
        } else {
            self.acquire_exclusive(req).await
        }
    }

    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        // The watch is the wait's registration: when it ends, so does the waiter's place in line.
        let watch = self.inner.watch(key).await;
        let (waiter, key) = (watch.waiter(), key.clone());
        let (shared, inner, lifecycle) = (
            self.shared.clone(),
            self.inner.clone(),
            self.lifecycle.clone(),
        );
        watch.also_on_drop(move || {
            // Only a place kept between attempts is still in line here: every other attempt
            // left the line when it ended (served, or its `InLine` guard dropped).
            if shared.kept.remove(&waiter).is_none() {
                return;
            }
            let Some(slot) = shared.read(&key) else {
                return;
            };
            let left = {
                let mut st = slot.lock();
                let left = st.leave(waiter);
                shared.settle(&key, &slot, &mut st, Instant::now());
                left
            };
            if let Some(wake) = left.wake {
                wake.notify_waiters();
            }
            if let Some(orphan) = left.orphan {
                release_in_background(&inner, &lifecycle, orphan);
            }
        })
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        if lease.mode().is_shared_record() {
            self.permits.forget(lease);
            return self.inner.release(lease).await;
        }
        let Some(mut slot) = self.shared.lookup(lease.key()) else {
            return self.inner.release(lease).await;
        };
        let (mut decision, mut head) = self.release_in(&slot, lease);
        if decision == Release::NotHolder {
            // The thread's last look-up may be an entry that left the cache: ask the cache.
            match self.shared.read(lease.key()) {
                Some(read) if !Arc::ptr_eq(&read, &slot) => {
                    slot = read;
                    (decision, head) = self.release_in(&slot, lease);
                }
                _ => {}
            }
        }
        let store = match decision {
            // Not the local holder's lease (stale or foreign): the store decides.
            Release::NotHolder => return self.inner.release(lease).await,
            Release::HandedOff { consecutive } => {
                if let Some(head) = head {
                    head.notify_waiters();
                }
                self.observers.emit(|| LockEvent::HandedOff {
                    key: lease.key().clone(),
                    consecutive,
                });
                return Ok(true);
            }
            Release::ToStore { store } => store,
        };
        // A real release: the holder stays in place (the key is still held in the store) until
        // the store answered, or this call is cancelled; then a handed store lease is still
        // released (in the background), as its mapping goes away.
        let mut vacate = Vacate::new(self, lease.key(), &slot, lease.token());
        if store.token() != lease.token() {
            vacate.give_back = Some(store.clone());
        }
        let released = self.inner.release(&store).await;
        vacate.give_back = None;
        released
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        // Rare next to acquire and release: a cache read, not the thread's last look-up.
        if lease.mode().is_shared_record() {
            let renewed = self.inner.extend(lease, ttl).await;
            match &renewed {
                Ok(renewed) => self.permits.extended(renewed),
                Err(e) if e.kind() == ErrorKind::NotHeld => self.permits.forget(lease),
                Err(_) => {}
            }
            return renewed;
        }
        let slot = self.shared.cache.get(lease.key());
        let store = slot
            .as_ref()
            .and_then(|slot| slot.lock().store_lease(lease));
        let (Some(slot), Some(store)) = (slot, store) else {
            return self.inner.extend(lease, ttl).await;
        };
        let renewed = self.inner.extend(&store, ttl).await?;
        {
            let mut st = slot.lock();
            if st.renewed(lease.token(), &renewed) {
                self.shared
                    .settle(lease.key(), &slot, &mut st, Instant::now());
            }
        }
        Ok(renewed.with_token(lease.token().clone()))
    }

    async fn shutdown(&self) -> Result<usize> {
        self.lifecycle.close();
        self.permits.clear();
        self.inner.shutdown().await
    }
}

/// Releases a handed-off store lease nobody will use (owner-checked, so harmless if it is gone
/// already), tracked by the lifecycle so a shutdown can wait for it.
fn release_in_background<S: LockStore>(inner: &Arc<S>, lifecycle: &Lifecycle, lease: Lease) {
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
}

#[cfg(test)]
mod tests;
