//! The per-key entries: a bounded moka cache whose per-entry expiry follows each entry's state
//! (see the module docs of [`super`] for the rules), and the admission and reclaim that keep it
//! within capacity without ever evicting an entry in use.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::Duration;

use dashmap::DashSet;
use moka::notification::RemovalCause;
use moka::ops::compute::{CompResult, Op};
use moka::sync::Cache;
use tokio::time::Instant;

use crate::core::{LockKey, WaiterId};

use super::slot::{self, Slot, State};
use super::RECLAIM_GAP;

type Entries = Cache<LockKey, Arc<Slot>, foldhash::fast::RandomState>;

pub(super) struct Shared {
    /// Tells this layer's entries from another's in a thread's last look-up ([`LAST`]).
    id: u64,
    pub(super) cache: Entries,
    /// Entries in the cache (or being inserted): admission checks it against `capacity`.
    /// Signed so that a removal counted before its insertion can never wrap around.
    pub(super) entries: Arc<AtomicI64>,
    pub(super) capacity: u64,
    /// The waits whose place stays in line after their attempt returned (the store refused the
    /// head, or the process waits behind others in the store): only those must leave the line
    /// when their wait ends, so only those cost a cache read then.
    pub(super) kept: DashSet<WaiterId, foldhash::fast::RandomState>,
    /// When a pass over a full cache last found nothing to reclaim.
    fruitless_reclaim: Mutex<Option<Instant>>,
}

thread_local! {
    /// The expiry the next cache read of this thread gives the entry it reads (see
    /// [`Shared::settle`]); `None`: reads leave expiries as they are.
    static PIN: Cell<Option<Duration>> = const { Cell::new(None) };

    /// The entry this thread looked up last ([`Shared::lookup`]).
    static LAST: RefCell<Option<LastLookup>> = const { RefCell::new(None) };
}

/// Makes each layer's [`Shared::id`].
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A thread's last look-up: on a hot key, every acquisition and release of the thread looks up
/// the same entry, and a cache read costs as much as the rest of the layer's work. Weak, so it
/// keeps no entry alive; an entry out of the cache is never returned from here (its
/// [`Slot::is_gone`]).
struct LastLookup {
    layer: u64,
    key: LockKey,
    slot: Weak<Slot>,
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
                slot.mark_gone();
                slot.gone_wake.notify_waiters();
            })
            .build_with_hasher(foldhash::fast::RandomState::default());
        Shared {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            cache,
            entries,
            capacity,
            kept: DashSet::default(),
            fruitless_reclaim: Mutex::new(None),
        }
    }

    /// The key's entry, made if there is none and the cache has room; `None`: at capacity with
    /// every entry in use.
    pub(super) fn slot(&self, key: &LockKey) -> Option<Arc<Slot>> {
        if let Some(slot) = self.lookup(key) {
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
        let slot = entry.into_value();
        self.remember(key, &slot);
        Some(slot)
    }

    /// The key's entry, if it has one: this thread's last look-up when it was this key's and
    /// its entry is not known to be out of the cache, else a cache read.
    ///
    /// The last look-up may be an entry moka expired and has not reported yet (moka reports
    /// expiries at its next housekeeping). Nothing is lost: such an entry was idle (an entry in
    /// use is pinned past its use), so whoever takes it changes its expiry, and that write
    /// ([`Shared::settle`]) finds the entry gone and sends the taker back to look again; and a
    /// release that does not find its holder in it asks the cache ([`Shared::read`]).
    pub(super) fn lookup(&self, key: &LockKey) -> Option<Arc<Slot>> {
        let last = LAST.with(|last| {
            let last = last.borrow();
            let last = last.as_ref()?;
            if last.layer != self.id || last.key != *key {
                return None;
            }
            last.slot.upgrade().filter(|slot| !slot.is_gone())
        });
        last.or_else(|| self.read(key))
    }

    /// The key's entry in the cache, if any (a cache read, remembered as the thread's last
    /// look-up).
    pub(super) fn read(&self, key: &LockKey) -> Option<Arc<Slot>> {
        let slot = self.cache.get(key)?;
        self.remember(key, &slot);
        Some(slot)
    }

    fn remember(&self, key: &LockKey, slot: &Arc<Slot>) {
        // `try_borrow_mut`: a look-up from inside another (an eviction listener) just skips.
        LAST.with(|last| {
            if let Ok(mut last) = last.try_borrow_mut() {
                *last = Some(LastLookup {
                    layer: self.id,
                    key: key.clone(),
                    slot: Arc::downgrade(slot),
                });
            }
        });
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
            slot.mark_gone();
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
            slot.mark_gone();
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
            slot.mark_gone();
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_last_look_up_is_never_an_entry_out_of_the_cache_nor_another_layers() {
        let shared = Shared::new(16);
        let key = LockKey::dc("f1", "tests", "a").unwrap();
        let first = shared.slot(&key).unwrap();
        let again = shared.lookup(&key).unwrap();
        assert!(Arc::ptr_eq(&again, &first), "the same entry");
        let other = Shared::new(16);
        assert!(
            other.lookup(&key).is_none(),
            "another layer's entries are its own"
        );
        assert!(shared.remove(&key, &first));
        assert!(first.is_gone());
        assert!(
            shared.lookup(&key).is_none(),
            "a removed entry is not handed out from memory"
        );
        let second = shared.slot(&key).unwrap();
        assert!(!Arc::ptr_eq(&first, &second), "a new entry");
    }
}
