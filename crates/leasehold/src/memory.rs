//! The embedded in-memory store: the default, so leasehold runs with no server at all.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use dashmap::mapref::entry::Entry;
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::{
    validate_ttl, wall_time_of, Acquire, Capabilities, Error, HistoryEntry, HistoryEvent, Lease,
    LockInfo, LockKey, LockStore, OwnerToken, ReleaseWatch, Result, TraceConfig,
};
use crate::sweep::Sweeper;
use crate::KeyMap;

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
/// use leasehold::{Acquire, LockKey, LockStore, MemoryStore, OwnerToken};
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
    /// Keys some manager waits on, and how to wake it: every manager sharing this store is
    /// notified of a release at once instead of polling.
    watched: KeyMap<Arc<Notify>>,
    /// Entries in `watched`, so an unwatched release skips the map.
    watched_count: AtomicUsize,
    /// Lock histories of traced keys: an in-process ring per key, newest first.
    histories: KeyMap<History>,
}

/// One key's lock history: bounded, and gone `ttl` after its last write.
#[derive(Debug)]
struct History {
    entries: VecDeque<HistoryEntry>,
    expires_at: Instant,
}

#[derive(Debug, Clone)]
struct Record {
    token: OwnerToken,
    expires_at: Instant,
    acquired_at: Instant,
    fencing_token: u64,
}

impl Record {
    fn is_live(&self, now: Instant) -> bool {
        now < self.expires_at
    }
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
            if let Some(notify) = self.watched.get(key) {
                notify.notify_waiters();
            }
        }
    }

    fn next_fence(&self) -> u64 {
        self.fence.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn info(key: &LockKey, record: &Record, now: Instant) -> LockInfo {
        LockInfo::new(key.clone(), Some(record.token.clone()))
            .with_ttl_remaining(Some(record.expires_at.saturating_duration_since(now)))
            .with_acquired_at(Some(wall_time_of(record.acquired_at)))
            .with_fencing_token(Some(record.fencing_token))
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

    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        let notify = match self.inner.watched.entry(key.clone()) {
            Entry::Occupied(watched) => watched.get().clone(),
            Entry::Vacant(free) => {
                self.inner.watched_count.fetch_add(1, Ordering::AcqRel);
                free.insert(Arc::new(Notify::new())).clone()
            }
        };
        let (inner, key) = (self.inner.clone(), key.clone());
        ReleaseWatch::new(notify, move || {
            // The map's own reference is the last one once this watch's is dropped (it is
            // dropped with the watch, just after this hook): nobody else waits on the key.
            if inner
                .watched
                .remove_if(&key, |_, notify| Arc::strong_count(notify) <= 2)
                .is_some()
            {
                inner.watched_count.fetch_sub(1, Ordering::AcqRel);
            }
        })
    }

    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        validate_ttl(req.ttl)?;
        self.inner
            .purger
            .ensure(&self.inner, self.inner.purge_interval, Inner::purge);
        let now = Instant::now();
        let fresh = |fence| Record {
            token: req.token.clone(),
            expires_at: now + req.ttl,
            acquired_at: now,
            fencing_token: fence,
        };
        let fence = match self.inner.records.entry(req.key.clone()) {
            Entry::Occupied(mut held) => {
                if held.get().is_live(now) {
                    let left = held.get().expires_at - now;
                    drop(held);
                    if let Some(trace) = &req.trace {
                        let event = if req.deadline.is_some() {
                            HistoryEvent::Waited
                        } else {
                            HistoryEvent::Refused
                        };
                        let entry = HistoryEntry::new(event, &req.token, "held by another owner");
                        self.inner.record(&req.key, trace, entry);
                    }
                    return Err(Error::unavailable(&req.key).with_retry_after(left));
                }
                let fence = self.inner.next_fence();
                held.insert(fresh(fence));
                fence
            }
            Entry::Vacant(free) => {
                let fence = self.inner.next_fence();
                free.insert(fresh(fence));
                fence
            }
        };
        if let Some(trace) = &req.trace {
            let detail = format!("ttl {:?}", req.ttl);
            let entry = HistoryEntry::new(HistoryEvent::Acquired, &req.token, detail);
            self.inner.record(&req.key, trace, entry);
        }
        Ok(Lease::new(req.key.clone(), req.token.clone(), req.ttl, now)
            .with_fencing_token(Some(fence))
            .with_trace(req.trace))
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let now = Instant::now();
        let removed = self.inner.records.remove_if(lease.key(), |_, record| {
            record.token == *lease.token() || !record.is_live(now)
        });
        let released = matches!(removed, Some((_, record)) if record.token == *lease.token() && record.is_live(now));
        if released {
            self.inner.notify_release(lease.key());
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
        match self.inner.records.get_mut(lease.key()) {
            Some(mut record) if record.token == *lease.token() && record.is_live(now) => {
                record.expires_at = now + ttl;
                Ok(lease.renewed(ttl, now))
            }
            _ => {
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
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let now = Instant::now();
        Ok(self
            .inner
            .records
            .get(key)
            .filter(|record| record.is_live(now))
            .map(|record| Inner::info(key, &record, now)))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let now = Instant::now();
        let mut locks: Vec<LockInfo> = self
            .inner
            .records
            .iter()
            .filter(|entry| entry.key().as_str().starts_with(prefix) && entry.is_live(now))
            .map(|entry| Inner::info(entry.key(), entry.value(), now))
            .collect();
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(locks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ErrorKind;

    fn key(entity: &str) -> LockKey {
        LockKey::dc("f1", "test", entity).unwrap()
    }

    fn req(entity: &str, ttl_ms: u64) -> Acquire {
        Acquire::new(
            key(entity),
            OwnerToken::generate(),
            Duration::from_millis(ttl_ms),
        )
    }

    #[tokio::test(start_paused = true)]
    async fn record_expires_exactly_at_ttl() {
        let store = MemoryStore::new();
        let first = store.try_acquire(&req("a", 1000)).await.unwrap();
        tokio::time::advance(Duration::from_millis(999)).await;
        assert!(store
            .try_acquire(&req("a", 1000))
            .await
            .unwrap_err()
            .is_unavailable());
        assert!(store.inspect(&key("a")).await.unwrap().is_some());
        tokio::time::advance(Duration::from_millis(1)).await;
        assert_eq!(store.inspect(&key("a")).await.unwrap(), None);
        assert!(
            !store.release(&first).await.unwrap(),
            "expired lease is not ours"
        );
        let second = store.try_acquire(&req("a", 1000)).await.unwrap();
        assert!(second.fencing_token() > first.fencing_token());
    }

    #[tokio::test(start_paused = true)]
    async fn purge_reclaims_memory_without_access() {
        let store = MemoryStore::with_purge_interval(Duration::from_millis(100));
        for i in 0..50 {
            store
                .try_acquire(&req(&format!("k{i}"), 500))
                .await
                .unwrap();
        }
        assert_eq!(store.record_count(), 50);
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(store.record_count(), 0, "background purge ran");
    }

    #[tokio::test(start_paused = true)]
    async fn purge_task_ends_with_the_store() {
        let store = MemoryStore::with_purge_interval(Duration::from_millis(10));
        store.try_acquire(&req("a", 5)).await.unwrap();
        let weak = Arc::downgrade(&store.inner);
        drop(store);
        tokio::time::sleep(Duration::from_millis(30)).await;
        assert!(weak.upgrade().is_none());
    }

    #[tokio::test]
    async fn release_and_extend_are_owner_checked() {
        let store = MemoryStore::new();
        let mine = store.try_acquire(&req("a", 60_000)).await.unwrap();
        let stale = mine.clone().with_token(OwnerToken::generate());
        assert!(!store.release(&stale).await.unwrap());
        let err = store
            .extend(&stale, Duration::from_secs(1))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotHeld);
        assert!(store
            .inspect(&key("a"))
            .await
            .unwrap()
            .unwrap()
            .is_owned_by(mine.token()));
        let extended = store.extend(&mine, Duration::from_secs(120)).await.unwrap();
        assert_eq!(extended.ttl(), Duration::from_secs(120));
        let info = store.inspect(&key("a")).await.unwrap().unwrap();
        assert!(info.ttl_remaining.unwrap() > Duration::from_secs(60));
        assert!(store.release(&mine).await.unwrap());
        assert!(
            !store.release(&mine).await.unwrap(),
            "second release finds nothing"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn stale_token_cannot_touch_next_holder() {
        let store = MemoryStore::new();
        let old = store.try_acquire(&req("a", 100)).await.unwrap();
        tokio::time::advance(Duration::from_millis(150)).await;
        let new = store.try_acquire(&req("a", 1000)).await.unwrap();
        assert!(!store.release(&old).await.unwrap());
        assert!(store.extend(&old, Duration::from_secs(5)).await.is_err());
        let info = store.inspect(&key("a")).await.unwrap().unwrap();
        assert!(info.is_owned_by(new.token()));
        assert_eq!(info.ttl_remaining, Some(Duration::from_millis(1000)));
    }

    #[tokio::test]
    async fn fencing_tokens_only_grow() {
        let store = MemoryStore::new();
        let mut last = 0;
        for _ in 0..20 {
            let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
            let fence = lease.fencing_token().unwrap();
            assert!(fence > last);
            last = fence;
            store.release(&lease).await.unwrap();
        }
        let other = store.try_acquire(&req("b", 60_000)).await.unwrap();
        assert!(
            other.fencing_token().unwrap() > last,
            "one store-wide counter"
        );
    }

    #[tokio::test]
    async fn list_filters_by_prefix_and_sorts() {
        let store = MemoryStore::new();
        for e in ["b", "a", "c"] {
            store.try_acquire(&req(e, 60_000)).await.unwrap();
        }
        store
            .try_acquire(&Acquire::new(
                LockKey::xdc("test", "x").unwrap(),
                OwnerToken::generate(),
                Duration::from_secs(60),
            ))
            .await
            .unwrap();
        let all = store.list("").await.unwrap();
        assert_eq!(all.len(), 4);
        let dc: Vec<_> = store
            .list("DC#f1#")
            .await
            .unwrap()
            .into_iter()
            .map(|i| i.key.entity_id().to_owned())
            .collect();
        assert_eq!(dc, ["a", "b", "c"]);
    }
}
