//! The per-key entries: a bounded moka cache whose per-entry expiry follows each entry's state
//! (see the module docs of [`super`] for the rules), and the admission and reclaim that keep it
//! within capacity without ever evicting an entry in use.

use std::cell::Cell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use moka::notification::RemovalCause;
use moka::ops::compute::{CompResult, Op};
use moka::sync::Cache;
use tokio::time::Instant;

use crate::core::LockKey;

use super::slot::{self, Slot, State};
use super::RECLAIM_GAP;

type Entries = Cache<LockKey, Arc<Slot>, foldhash::fast::RandomState>;

pub(super) struct Shared {
    pub(super) cache: Entries,
    /// Entries in the cache (or being inserted): admission checks it against `capacity`.
    /// Signed so that a removal counted before its insertion can never wrap around.
    pub(super) entries: Arc<AtomicI64>,
    pub(super) capacity: u64,
    /// When a pass over a full cache last found nothing to reclaim.
    fruitless_reclaim: Mutex<Option<Instant>>,
}

thread_local! {
    /// The expiry the next cache read of this thread gives the entry it reads (see
    /// [`Shared::settle`]); `None`: reads leave expiries as they are.
    static PIN: Cell<Option<Duration>> = const { Cell::new(None) };
}

/// Entry expiry for the cache: set at creation (briefly: the creator takes the entry at once and
/// then settles it), and afterwards only by [`Shared::settle`]'s reads.
struct LeaseExpiry;

impl moka::Expiry<LockKey, Arc<Slot>> for LeaseExpiry {
    fn expire_after_create(
        &self,
        _: &LockKey,
        _: &Arc<Slot>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        Some(slot::IDLE_LINGER)
    }

    fn expire_after_read(
        &self,
        _: &LockKey,
        _: &Arc<Slot>,
        _: std::time::Instant,
        current: Option<Duration>,
        _: std::time::Instant,
    ) -> Option<Duration> {
        // Unchanged unless this read is a settle: a look-up must not write an expiry computed
        // from a state that may already be stale.
        PIN.with(Cell::get).or(current)
    }

    fn expire_after_update(
        &self,
        _: &LockKey,
        _: &Arc<Slot>,
        _: std::time::Instant,
        current: Option<Duration>,
    ) -> Option<Duration> {
        current
    }
}

impl Shared {
    pub(super) fn new(capacity: u64) -> Self {
        let entries = Arc::new(AtomicI64::new(0));
        let counted = entries.clone();
        let cache = Cache::builder()
            .expire_after(LeaseExpiry)
            .eviction_listener(move |_, slot: Arc<Slot>, cause| {
                // Explicit removals are counted by their caller (`remove`), synchronously.
                if cause != RemovalCause::Explicit {
                    counted.fetch_sub(1, Ordering::AcqRel);
                }
                // Nobody is left waiting on an entry out of the cache: they look again.
                slot.gone_wake.notify_waiters();
            })
            .build_with_hasher(foldhash::fast::RandomState::default());
        Shared {
            cache,
            entries,
            capacity,
            fruitless_reclaim: Mutex::new(None),
        }
    }

    /// The key's entry, made if there is none and the cache has room; `None`: at capacity with
    /// every entry in use.
    pub(super) fn slot(&self, key: &LockKey) -> Option<Arc<Slot>> {
        if let Some(slot) = self.cache.get(key) {
            return Some(slot);
        }
        if !self.reserve() {
            return None;
        }
        let entry = self
            .cache
            .entry_by_ref(key)
            .or_insert_with(|| Arc::new(Slot::default()));
        if !entry.is_fresh() {
            // Made by another task meanwhile: the reservation is not needed.
            self.entries.fetch_sub(1, Ordering::AcqRel);
        }
        Some(entry.into_value())
    }

    /// Reserves room for one entry, making room first at capacity.
    pub(super) fn reserve(&self) -> bool {
        let capacity = i64::try_from(self.capacity).unwrap_or(i64::MAX);
        for attempt in 0..2 {
            if self.entries.fetch_add(1, Ordering::AcqRel) < capacity {
                return true;
            }
            self.entries.fetch_sub(1, Ordering::AcqRel);
            if attempt == 0 && !self.make_room(capacity) {
                return false;
            }
        }
        false
    }

    /// At capacity: drops expired entries, then reclaims idle ones unless a recent pass found
    /// none. Returns whether there is room now.
    pub(super) fn make_room(&self, capacity: i64) -> bool {
        self.cache.run_pending_tasks();
        if self.entries.load(Ordering::Acquire) < capacity {
            return true;
        }
        let now = Instant::now();
        {
            let last = self
                .fruitless_reclaim
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            if last.is_some_and(|at| now.saturating_duration_since(at) < RECLAIM_GAP) {
                return false;
            }
        }
        let reclaimed = self.reclaim(now);
        if reclaimed == 0 {
            *self
                .fruitless_reclaim
                .lock()
                .unwrap_or_else(PoisonError::into_inner) = Some(now);
        }
        self.entries.load(Ordering::Acquire) < capacity
    }

    /// Removes the entries nobody holds, is offered or waits for; returns how many.
    pub(super) fn reclaim(&self, now: Instant) -> usize {
        let mut removed = 0;
        for (key, slot) in self.cache.iter() {
            let mut st = slot.lock();
            if st.is_retired() || !st.retire_if_idle(now) {
                continue;
            }
            // Removed under the entry's lock: a contender that finds it retired and looks again
            // finds it gone.
            if self.remove(&key, &slot) {
                removed += 1;
            }
            drop(st);
        }
        removed
    }

    /// Removes `slot` from the cache if it is still the key's entry.
    pub(super) fn remove(&self, key: &LockKey, slot: &Arc<Slot>) -> bool {
        let result = self
            .cache
            .entry_by_ref(key)
            .and_compute_with(|current| match current {
                Some(entry) if Arc::ptr_eq(entry.value(), slot) => Op::Remove,
                _ => Op::Nop,
            });
        let removed = matches!(result, CompResult::Removed(_));
        if removed {
            self.entries.fetch_sub(1, Ordering::AcqRel);
        }
        removed
    }

    /// Gives `slot`'s cache entry the expiry its (just changed) state needs, under its lock
    /// (`st`), so expiries are written in the order of the state changes. Returns `false` if
    /// `slot` is no longer the key's cache entry (it expired between the caller's look-up and
    /// its lock): it is then retired, and the caller backs out and looks the key up again.
    pub(super) fn settle(
        &self,
        key: &LockKey,
        slot: &Arc<Slot>,
        st: &mut State,
        now: Instant,
    ) -> bool {
        let Some(until) = st.expiry_change(now) else {
            return true;
        };
        PIN.with(|pin| pin.set(Some(until.saturating_duration_since(now))));
        let cached = self.cache.get(key);
        PIN.with(|pin| pin.set(None));
        if cached.is_some_and(|cached| Arc::ptr_eq(&cached, slot)) {
            st.pinned(until);
            true
        } else {
            st.retire();
            false
        }
    }
}
