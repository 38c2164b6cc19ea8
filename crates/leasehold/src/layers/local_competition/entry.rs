//! What the cache keeps for a key: a slot holding the key's local state, and when moka drops it.
//! moka's [`Expiry`] reads the slot on every access: an entry lives while its state lasts, then
//! a little longer so a key in use again soon reuses it without a cache write.
//!
//! An entry in use is never lost: moka has no pinning (its size bound may pick any entry, and
//! its admission policy may refuse a new one), so its eviction listener hands a slot still in
//! use to [`Kept`], a map aside from the cache that holds it until it is idle, as moka's authors
//! suggest for values that must outlive their entry. The cache bounds the idle slots; the slots
//! in use are as many as the keys this process holds, asks for or waits on. A slot the cache
//! drops while idle is marked gone: a task that found it just before looks the key up again.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use dashmap::Entry;
use moka::notification::RemovalCause;
use moka::sync::Cache;
use moka::Expiry;
use tokio::time::Instant;

use crate::core::{Lease, LockKey, OwnerToken};
use crate::KeyMap;

/// How long an idle slot stays after its state ended (or after its last access): a hot key
/// finds it again instead of inserting one per acquisition.
const LINGER: Duration = Duration::from_secs(1);
/// How long a slot some task of this process waits on stays after its last access (the head
/// reads it at every attempt; hand-off counts the waiters in it).
const WAITED_LINGER: Duration = Duration::from_secs(60);

/// One key's local state.
#[derive(Debug, Clone)]
pub(super) enum Local {
    /// A task of this process asks the store for the key with `token`, or holds the lease it got
    /// (kept in the slot only when a hand-off may need it: see `Held`): the others fail fast
    /// meanwhile. `until` is the end of the TTL it asked for (or extended to).
    Taken { token: OwnerToken, until: Instant },
    /// The store's `lease` is held here (by whoever has a lease with its token), kept for a
    /// hand-off.
    Held { lease: Lease, run: Run },
    /// Released while a task of this process waited for the key: the store's `lease` is kept
    /// for the head of the manager's line to take, without a store release or acquire.
    Offered { lease: Lease, run: Run },
}

/// The local holders one store lease has had so far: how many hand-offs, since when.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) hand_offs: u32,
    pub(super) since: Instant,
}

impl Run {
    /// A lease the store has just granted.
    pub(super) fn start(now: Instant) -> Self {
        Run {
            hand_offs: 0,
            since: now,
        }
    }
}

impl Local {
    /// When the state ends: the lease's expiry (or the asked-for one).
    pub(super) fn until(&self) -> Instant {
        match self {
            Local::Taken { until, .. } => *until,
            Local::Held { lease, .. } | Local::Offered { lease, .. } => lease.expires_at(),
        }
    }

    /// Whether `token` is this state's: its asker or its holder.
    pub(super) fn is_of(&self, token: &OwnerToken) -> bool {
        match self {
            Local::Taken { token: own, .. } => own == token,
            Local::Held { lease, .. } => lease.token() == token,
            Local::Offered { .. } => false,
        }
    }
}

/// A key's entry in the cache.
#[derive(Debug, Default)]
pub(super) struct Slot(Mutex<State>);

/// What a slot holds. Changed only under the slot's lock, and the cache is never called with the
/// lock held (moka calls the expiry, which takes it).
#[derive(Debug, Default)]
pub(super) struct State {
    local: Option<Local>,
    /// Waiters of this process registered on the key (their watches; counted with hand-off on).
    pub(super) waiters: usize,
    /// The cache dropped this slot while it was idle (or [`Kept`] let it go): it is nobody's
    /// any more, so whoever finds it looks the key up again, and no lease is offered in it.
    pub(super) gone: bool,
    /// When the cache drops the slot, as the expiry last said.
    kept_until: Option<Instant>,
}

impl Slot {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// The state, once an ended one is forgotten (every access checks it against tokio's clock:
    /// moka's own clock drops the slot a little later, and not at all in paused-time tests).
    pub(super) fn current(&mut self, now: Instant) -> Option<&Local> {
        if self.local.as_ref().is_some_and(|l| now >= l.until()) {
            self.local = None;
        }
        self.local.as_ref()
    }

    /// Whether the slot is in use: a state that has not ended, or tasks of this process waiting
    /// on the key.
    pub(super) fn in_use(&mut self, now: Instant) -> bool {
        self.current(now).is_some() || self.waiters > 0
    }

    /// Takes the state out (see [`current`](Self::current)).
    pub(super) fn take(&mut self, now: Instant) -> Option<Local> {
        self.current(now);
        self.local.take()
    }

    /// Sets the state; `true` when the cache's expiry of the slot must be brought up to it (the
    /// caller then reads the slot from the cache, once the lock is let go).
    #[must_use]
    pub(super) fn set(&mut self, local: Option<Local>) -> bool {
        let until = local.as_ref().map(Local::until);
        self.local = local;
        until.is_some_and(|until| self.kept_until.is_none_or(|kept| kept < until))
    }

    /// How long the cache keeps the slot from `now` on: while its state lasts, then
    /// [`LINGER`] (or [`WAITED_LINGER`] while tasks wait on the key). `None`: as long as it keeps
    /// it already, which covers that (the usual case on a read: moka then has no expiry to
    /// reschedule, which would cost it more than the read itself). The slot may so outlive its
    /// use by up to its last lease's length: only memory, bounded by the capacity.
    fn keep_for(&mut self, now: Instant) -> Option<Duration> {
        let end = self.current(now).map_or(now, Local::until);
        let linger = if self.waiters > 0 {
            WAITED_LINGER
        } else {
            LINGER
        };
        if self.kept_until.is_some_and(|kept| kept >= end + linger) {
            return None;
        }
        let keep = end.saturating_duration_since(now) + linger;
        self.kept_until = Some(now + keep);
        Some(keep)
    }
}

/// The cache's expiry reads the slot's state at every access (slots are inserted once, never
/// replaced, so creation and reads are all there is).
struct WhileInUse;

impl Expiry<LockKey, Arc<Slot>> for WhileInUse {
    fn expire_after_create(
        &self,
        _key: &LockKey,
        slot: &Arc<Slot>,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        let mut state = slot.lock();
        // A new slot: nothing is kept yet, so `keep_for` always says how long (`None` here
        // would mean "never expires").
        state.kept_until = None;
        state.keep_for(Instant::now())
    }

    fn expire_after_read(
        &self,
        _key: &LockKey,
        slot: &Arc<Slot>,
        _read_at: std::time::Instant,
        duration_until_expiry: Option<Duration>,
        _last_modified_at: std::time::Instant,
    ) -> Option<Duration> {
        // Unchanged (the same duration moka passed in) unless the slot must be kept longer.
        slot.lock()
            .keep_for(Instant::now())
            .or(duration_until_expiry)
    }
}

/// The cache's hasher: the map's (`crate::KeyMap`), several times faster than the standard
/// library's on keys of this size.
pub(super) type Hasher = foldhash::fast::RandomState;

/// The cache: at most `capacity` keys (moka's size bound), each slot kept while in use as its
/// expiry says. A slot the cache drops while in use (an offered lease included) goes to `kept`;
/// an idle one is marked gone.
pub(super) fn cache(capacity: u64, kept: Arc<Kept>) -> Cache<LockKey, Arc<Slot>, Hasher> {
    Cache::builder()
        .max_capacity(capacity)
        .expire_after(WhileInUse)
        .eviction_listener(
            move |key: Arc<LockKey>, slot: Arc<Slot>, _cause: RemovalCause| {
                // Every cause, `Replaced` included: slots are inserted once and never replaced,
                // so a replaced one had expired in the cache, not yet removed, when a new one was
                // inserted for its key (moka reports that as `Replaced` under a per-entry expiry).
                // Decided under the slot's lock, as every change of its state is; `Kept` takes
                // the lock itself, so it is let go first.
                let in_use = {
                    let mut st = slot.lock();
                    let in_use = st.in_use(Instant::now());
                    st.gone |= !in_use;
                    in_use
                };
                if in_use {
                    kept.keep((*key).clone(), slot);
                }
                kept.removed_from_cache();
            },
        )
        .build_with_hasher(Hasher::default())
}

/// Slots the cache dropped while they were in use, until they are idle: a key's slot is looked
/// for here first (a count of them makes that one atomic read while there are none), so that
/// once a slot is kept, every task of the process finds that one, even where the cache got a new
/// slot for the key in the moment between dropping the old one and handing it here. An idle one
/// leaves when it is next looked up, or at the next sweep, after as many removals from the cache
/// as slots kept (at least [`MIN_SWEEP`]): sweeping costs a look at each kept slot, paid once per
/// that many removals.
#[derive(Debug, Default)]
pub(super) struct Kept {
    slots: KeyMap<Arc<Slot>>,
    /// How many slots are kept (a hint, so that looking here costs nothing while none are).
    count: AtomicUsize,
    /// Removals from the cache since the last sweep.
    since_sweep: AtomicUsize,
}

/// Fewest slots kept before a sweep.
const MIN_SWEEP: usize = 64;

impl Kept {
    /// Keeps `slot`, which the cache dropped while it was in use.
    fn keep(&self, key: LockKey, slot: Arc<Slot>) {
        match self.slots.entry(key) {
            Entry::Vacant(vacant) => {
                vacant.insert(slot);
                self.count.fetch_add(1, Ordering::SeqCst);
            }
            Entry::Occupied(mut kept) => {
                if Arc::ptr_eq(kept.get(), &slot) {
                    return;
                }
                // Two slots of one key in use: the later one was made while the earlier was
                // between the cache and here (moka removes an entry before its listener runs).
                // The earlier stays the key's, or its state (an offered lease, a hold) would be
                // lost to every lookup; the later one, asked for meanwhile, is nobody's. An
                // earlier one since idle is let go instead.
                let earlier_in_use = {
                    let mut st = kept.get().lock();
                    !st.gone && st.in_use(Instant::now())
                };
                let let_go = if earlier_in_use {
                    slot
                } else {
                    kept.insert(slot)
                };
                let_go.lock().gone = true;
            }
        }
    }

    /// The cache removed a slot (dropped, or expired): now and then, the idle slots kept here
    /// are let go. Never called with a slot's lock held (a sweep takes the slots' locks under
    /// the map's).
    fn removed_from_cache(&self) {
        let removals = self.since_sweep.fetch_add(1, Ordering::Relaxed) + 1;
        if removals < MIN_SWEEP || self.slots.is_empty() || removals < self.slots.len() {
            return;
        }
        self.since_sweep.store(0, Ordering::Relaxed);
        let now = Instant::now();
        let mut let_go = 0;
        self.slots.retain(|_, slot| {
            let mut st = slot.lock();
            let keep = st.in_use(now);
            st.gone |= !keep;
            let_go += usize::from(!keep);
            keep
        });
        // Counted down by what this sweep removed, as `in_use` counts down what it removes: a
        // count set from the map's length here could miss a removal by `in_use` between its
        // remove and its count, and a count of 0 hides the slots kept (see `get`).
        self.count.fetch_sub(let_go, Ordering::SeqCst);
    }

    /// The slot kept for `key`, if it is still in use; an idle one is let go (marked gone, so a
    /// task holding it looks the key up again) and `None` returned: the key gets a new slot in
    /// the cache.
    pub(super) fn in_use(&self, key: &LockKey) -> Option<Arc<Slot>> {
        let slot = self.get(key)?;
        let idle = {
            let mut st = slot.lock();
            let idle = st.gone || !st.in_use(Instant::now());
            st.gone |= idle;
            idle
        };
        if !idle {
            return Some(slot);
        }
        if self
            .slots
            .remove_if(key, |_, kept| Arc::ptr_eq(kept, &slot))
            .is_some()
        {
            self.count.fetch_sub(1, Ordering::SeqCst);
        }
        None
    }

    /// The slot kept for `key`, in use or not.
    pub(super) fn get(&self, key: &LockKey) -> Option<Arc<Slot>> {
        if self.count.load(Ordering::SeqCst) == 0 {
            return None;
        }
        self.slots.get(key).map(|slot| slot.clone())
    }

    /// How many slots are kept.
    pub(super) fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no slot is kept (one atomic read, the count `get` reads).
    pub(super) fn is_empty(&self) -> bool {
        self.count.load(Ordering::SeqCst) == 0
    }
}
