//! The embedded in-memory store: the default, so leasehold runs with no server at all.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::{
    instant_after, validate_ttl, Acquire, Attempt, Capabilities, ChangeWatch, Error, HistoryEntry,
    HistoryEvent, Lease, LockInfo, LockKey, LockMode, LockStore, ReleaseWatch, Result, TraceConfig,
};
use crate::keymap::KeyMap;
use crate::sweep::Sweeper;

mod record;
mod waiting;

use record::{Admit, Record};
use waiting::Watched;

/// How often the background task reclaims expired records by default.
const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(1);

/// A lock store in this process's memory: thread-safe (dashmap), exact TTLs, owner-checked
/// release and extend, fencing tokens (one store-wide counter, so every key's tokens only grow),
/// and listing.
///
/// Managers sharing one store (clones) are woken at once when a lock they wait on is released
/// ([`LockStore::watch`]), and a refused acquire says how long the holder's lease has left.
///
/// It holds locks only for the tasks of this process, which makes it the right store for tests,
/// demos, single-instance services, and the inner store of a benchmark. Clones share the same
/// records.
///
/// Expired records are invisible to every operation the instant their TTL passes (time is
/// `tokio::time`, so paused-time tests are exact), and a background task reclaims their memory
/// every second (see [`MemoryStore::with_purge_interval`]), not only when the key is touched again.
///
/// ```
/// use std::time::Duration;
/// use leasehold::core::Acquire;
/// use leasehold::{LockKey, LockStore, MemoryStore, OwnerToken};
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let store = MemoryStore::new();
/// let key = LockKey::xdc("orders", "o-1")?;
/// let lease = store.try_acquire(&Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(5))).await?;
/// assert_eq!(lease.fencing_token(), Some(1));
/// let second = store.try_acquire(&Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(5))).await;
/// assert!(second.unwrap_err().is_unavailable());
/// assert!(store.release(&lease).await?);
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    records: KeyMap<Record>,
    /// One fencing counter for the whole store (like etcd's revision): a token is greater than
    /// every earlier token of every key, so in particular of its own key, and the counter needs no
    /// per-key memory that would have to outlive the records.
    fence: AtomicU64,
    purge_interval: Duration,
    purger: Sweeper,
    /// Keys some manager waits on: how to wake it (every manager sharing this store is notified
    /// of a release at once instead of polling), and the key's line of waiters.
    watched: KeyMap<Arc<Watched>>,
    /// Entries in `watched`, so an unwatched release skips the map.
    watched_count: AtomicUsize,
    /// Keys some reader watches for a change of holder (an election's observers): one wake-up
    /// per key, fired on every grant and release.
    observed: KeyMap<Arc<Observed>>,
    /// Entries in `observed`, so an unobserved grant or release skips the map.
    observed_count: AtomicUsize,
    /// Lock histories of traced keys: an in-process ring per key, newest first.
    histories: KeyMap<History>,
}

/// A key some reader watches for a change of holder. Every live [`ChangeWatch`] on the key holds
/// it, so the map's reference alone left means nobody observes the key any more.
#[derive(Debug, Default)]
struct Observed {
    changed: Arc<Notify>,
}

/// One key's lock history: bounded, and gone `ttl` after its last write.
#[derive(Debug)]
struct History {
    entries: VecDeque<HistoryEntry>,
    expires_at: Instant,
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

impl MemoryStore {
    /// An empty store that purges expired records every second.
    pub fn new() -> Self {
        MemoryStore::with_purge_interval(DEFAULT_PURGE_INTERVAL)
    }

    /// An empty store that purges expired records every `interval` (clamped to at least 1 ms).
    pub fn with_purge_interval(interval: Duration) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                records: KeyMap::default(),
                fence: AtomicU64::new(0),
                purge_interval: interval.max(Duration::from_millis(1)),
                purger: Sweeper::default(),
                watched: KeyMap::default(),
                watched_count: AtomicUsize::new(0),
                observed: KeyMap::default(),
                observed_count: AtomicUsize::new(0),
                histories: KeyMap::default(),
            }),
        }
    }

    /// Number of records in memory, including expired ones not yet purged (for tests and metrics).
    pub fn record_count(&self) -> usize {
        self.inner.records.len()
    }

    /// Removes every expired record now and returns how many were removed.
    pub fn purge_expired(&self) -> usize {
        self.inner.purge(Instant::now())
    }
}

impl Inner {
    fn purge(&self, now: Instant) -> usize {
        let before = self.records.len();
        self.records.retain(|_, record| record.is_live(now));
        self.histories.retain(|_, history| history.expires_at > now);
        before.saturating_sub(self.records.len())
    }

    /// Pushes `entry` on `key`'s history (newest first), trims it to the bound and restarts its
    /// lifetime.
    fn record(&self, key: &LockKey, trace: &TraceConfig, entry: HistoryEntry) {
        let now = Instant::now();
        let mut history = self
            .histories
            .entry(key.clone())
            .or_insert_with(|| History {
                entries: VecDeque::new(),
                expires_at: now,
            });
        if history.expires_at <= now {
            history.entries.clear();
        }
        history.entries.push_front(entry);
        history.entries.truncate(trace.max_entries() as usize);
        history.expires_at = now + trace.ttl();
    }

    /// Wakes the managers waiting on `key`.
    fn notify_release(&self, key: &LockKey) {
        if self.watched_count.load(Ordering::Acquire) > 0 {
            if let Some(watched) = self.watched.get(key).map(|w| w.clone()) {
                watched.lock().wake_released();
            }
        }
    }

    /// Wakes the readers watching `key` for a change of holder.
    fn notify_change(&self, key: &LockKey) {
        if self.observed_count.load(Ordering::Acquire) > 0 {
            if let Some(observed) = self.observed.get(key).map(|o| o.changed.clone()) {
                observed.notify_waiters();
            }
        }
    }

    fn next_fence(&self) -> u64 {
        self.fence.fetch_add(1, Ordering::Relaxed) + 1
    }
}

impl LockStore for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::ALL
    }

    async fn history(&self, key: &LockKey) -> Result<Vec<HistoryEntry>> {
        let now = Instant::now();
        Ok(self
            .inner
            .histories
            .get(key)
            .filter(|h| h.expires_at > now)
            .map(|h| h.entries.iter().cloned().collect())
            .unwrap_or_default())
    }

    async fn append_history(
        &self,
        key: &LockKey,
        trace: &TraceConfig,
        entry: &HistoryEntry,
    ) -> Result<()> {
        self.inner.record(key, trace, entry.clone());
        Ok(())
    }

    /// Registers a waiter on `key`. Its refused exclusive attempts take a place in the key's
    /// line, which it keeps until it is served or this watch is dropped.
    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        let watched = match self.inner.watched.entry(key.clone()) {
            Entry::Occupied(watched) => watched.get().clone(),
            Entry::Vacant(free) => {
                self.inner.watched_count.fetch_add(1, Ordering::AcqRel);
                free.insert(Arc::default()).clone()
            }
        };
        let watch = {
            let mut state = watched.lock();
            let watch = ReleaseWatch::new(state.released(), || {});
            state.add(watch.waiter());
            watch
        };
        let waiter = watch.waiter();
        let (inner, key) = (self.inner.clone(), key.clone());
        watch.also_on_drop(move || {
            watched.lock().remove(waiter);
            drop(watched);
            // Every live watch holds the entry (its hook does), and a new one takes its hold
            // under the map's lock: the map's reference alone left means nobody waits on the key.
            if inner
                .watched
                .remove_if(&key, |_, watched| Arc::strong_count(watched) == 1)
                .is_some()
            {
                inner.watched_count.fetch_sub(1, Ordering::AcqRel);
            }
        })
    }

    /// Registers a reader of `key`'s holder: fired on every grant and release of the key. An
    /// expiry fires nothing (records lapse lazily); readers read again when the lease they saw
    /// runs out.
    async fn watch_changes(&self, key: &LockKey) -> ChangeWatch {
        let observed = match self.inner.observed.entry(key.clone()) {
            Entry::Occupied(observed) => observed.get().clone(),
            Entry::Vacant(free) => {
                self.inner.observed_count.fetch_add(1, Ordering::AcqRel);
                free.insert(Arc::default()).clone()
            }
        };
        let (inner, key) = (self.inner.clone(), key.clone());
        ChangeWatch::new(observed.changed.clone(), move || {
            drop(observed);
            if inner
                .observed
                .remove_if(&key, |_, observed| Arc::strong_count(observed) == 1)
                .is_some()
            {
                inner.observed_count.fetch_sub(1, Ordering::AcqRel);
            }
        })
    }

    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        req.validate()?;
        self.inner
            .purger
            .ensure(&self.inner, self.inner.purge_interval, Inner::purge);
        let now = Instant::now();
        let exclusive = req.mode == LockMode::Exclusive;
        // Only exclusive holds (and writers) are fenced: a fence orders writes to a resource,
        // and readers or permit holders are many at once by design.
        let fence = || {
            if exclusive {
                self.inner.next_fence()
            } else {
                0
            }
        };
        // An exclusive request on a key with a line: only the head of the line may take it, and
        // a blocking attempt refused for any reason keeps (or takes) its place. The line stays
        // locked until the decision is made, so nobody passes in between.
        let watched = (exclusive && self.inner.watched_count.load(Ordering::Acquire) > 0)
            .then(|| self.inner.watched.get(&req.key).map(|w| w.clone()))
            .flatten();
        let mut line = watched.as_ref().map(|w| w.lock());
        let me = req.wait;
        if let Some(line) = line.as_mut() {
            if !line.may_take(me, now) {
                line.join(me);
                return Ok(Attempt::refused());
            }
        }
        // `Ok(Ok(fence))`: taken; `Ok(Err(retry_after))`: refused.
        let admitted = match self.inner.records.entry(req.key.clone()) {
            Entry::Occupied(mut held) => match held.get_mut().admit(req, now) {
                Ok(Admit::Replace) => {
                    let fence = fence();
                    held.insert(Record::fresh(req, now, fence));
                    Ok(Ok(fence))
                }
                Ok(Admit::Joined) => Ok(Ok(0)),
                Ok(Admit::Refused { retry_after }) => Ok(Err(retry_after)),
                Err(conflict) => Err(conflict),
            },
            Entry::Vacant(free) => {
                let fence = fence();
                free.insert(Record::fresh(req, now, fence));
                Ok(Ok(fence))
            }
        };
        if let Some(line) = line.as_mut() {
            match &admitted {
                Ok(Ok(_)) => line.served(me),
                _ => line.join(me),
            }
        }
        drop(line);
        let fence = match admitted? {
            Ok(fence) => fence,
            Err(retry_after) => {
                if let Some(trace) = &req.trace {
                    let event = if req.wait.is_some() {
                        HistoryEvent::Waited
                    } else {
                        HistoryEvent::Refused
                    };
                    let entry = HistoryEntry::new(event, &req.token, "held by another owner");
                    self.inner.record(&req.key, trace, entry);
                }
                return Ok(Attempt::refused_for(retry_after));
            }
        };
        self.inner.notify_change(&req.key);
        if let Some(trace) = &req.trace {
            let detail = format!("{} ttl {:?}", req.mode, req.ttl);
            let entry = HistoryEntry::new(HistoryEvent::Acquired, &req.token, detail);
            self.inner.record(&req.key, trace, entry);
        }
        Ok(Attempt::Granted(
            Lease::granted(req, now).with_fencing_token(exclusive.then_some(fence)),
        ))
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let now = Instant::now();
        let released = match lease.mode() {
            LockMode::Exclusive => {
                let mut released = false;
                self.inner.records.remove_if_mut(lease.key(), |_, record| {
                    released = record.release(lease, now);
                    released || !record.is_live(now)
                });
                released
            }
            _ => {
                let released = match self.inner.records.get_mut(lease.key()) {
                    Some(mut record) => record.release(lease, now),
                    None => false,
                };
                self.inner
                    .records
                    .remove_if(lease.key(), |_, record| record.is_empty(now));
                released
            }
        };
        if released {
            self.inner.notify_release(lease.key());
            self.inner.notify_change(lease.key());
        }
        if let Some(trace) = lease.trace() {
            let event = if released {
                HistoryEvent::Released
            } else {
                HistoryEvent::NotHeld
            };
            let entry = HistoryEntry::new(event, lease.token(), "");
            self.inner.record(lease.key(), trace, entry);
        }
        Ok(released)
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        validate_ttl(ttl)?;
        let now = Instant::now();
        let extended = match self.inner.records.get_mut(lease.key()) {
            Some(mut record) => record.extend(lease, now, instant_after(now, ttl)),
            None => false,
        };
        if extended {
            Ok(lease.renewed(ttl, now))
        } else {
            if let Some(trace) = lease.trace() {
                let entry = HistoryEntry::new(
                    HistoryEvent::Lost,
                    lease.token(),
                    "expired or taken by another owner before it could be extended",
                );
                self.inner.record(lease.key(), trace, entry);
            }
            Err(Error::not_held(
                "the lease expired or was taken by another owner before it could be extended",
            )
            .with_key(lease.key().as_str()))
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        Ok(self
            .inner
            .records
            .get(key)
            .and_then(|record| record.info(key, now)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let now = Instant::now();
        let mut locks: Vec<LockInfo> = self
            .inner
            .records
            .iter()
            .filter(|entry| entry.key().as_str().starts_with(prefix))
            .filter_map(|entry| entry.value().info(entry.key(), now))
            .collect();
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(locks)
    }
}

#[cfg(test)]
mod tests;
