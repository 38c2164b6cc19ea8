//! Reentrancy (Bond 3.6): the same holder taking a key it already holds counts up instead of
//! deadlocking.
//!
//! # What it guarantees
//! For an acquisition that names a holder ([`Acquire::holder`]): if that holder already holds the
//! key through this layer and the lease has not expired, the hold count goes up and the same lease
//! is returned at once, with no store I/O ([`LockEvent::Reentered`] with the new depth). Only the
//! first acquisition goes to the store; only the release that brings the count back to zero is
//! sent to the store. Releases of the inner levels return `Ok(true)` (the lock is still held by
//! the outer level). Guards can be released or dropped in any order: they share one lease and are
//! only counted.
//!
//! # Who is a holder
//! - An explicit [`Holder`](crate::Holder) handle passed with
//!   [`LockOptions::holder`](crate::LockOptions::holder): create one per logical owner and pass it
//!   (or a copy) down to the code that re-takes the lock. It works across tasks: every task given
//!   the same handle is the same holder.
//! - The current tokio task, when the manager is built with
//!   [`task_holders(true)`](crate::LockManagerBuilder::task_holders) and no explicit holder is
//!   given. A task that spawns a subtask is *not* the subtask's holder: the subtask waits for the
//!   lock like anyone else (and deadlocks if the parent waits for it while holding the lock).
//!   Conversely, futures run concurrently inside one task (`join!`, `select!`,
//!   `FuturesUnordered`) are all the same holder and would all enter; give them explicit holders.
//!   A guard should not outlive the task that took it: tokio only promises a task id is unique
//!   among running tasks, so after the task ends its id may in principle be given to a new task,
//!   which would then re-enter the old guard's lock. (Today's tokio counts ids up and does not
//!   reuse them, but the contract allows it.) Pass an explicit holder when guards move between
//!   tasks.
//!
//! Acquisitions without a holder are never reentrant and pass straight through.
//!
//! # Edge cases (Bond's warning)
//! - **Same key, different logical locks.** Reentrancy is by key: two logically different locks
//!   that map to the same key (the same entity id in the same client and farm) are one lock here,
//!   and the inner acquisition protects nothing more than the outer one. Give distinct locks
//!   distinct entity ids.
//! - **A different TTL on a reentrant acquisition** does not change the store lease: the returned
//!   lease is the one already held, with its own TTL and expiry. To get more time, extend a guard:
//!   the layer keeps one lease per hold, an extend by any level moves it on, later levels get the
//!   extended lease, and the last release sends that one to the store. (Each guard still reports
//!   its own copy in `lease()`/`is_held()`; renew or extend through the outermost guard.)
//! - **An expired hold** is not re-entered: if the held lease's TTL has passed, the acquisition
//!   goes to the store as a new one.
//! - The depth is bounded by [`ReentrancyConfig::max_depth`] (runaway recursion is an error, not
//!   an overflow).
//!
//! # Where it belongs
//! Outermost: before local competition, so a holder is never fast-failed (or made to wait) on a
//! key it holds itself, and before anything that does I/O.
//!
//! # Cost
//! One atomic load per call when no holder holds anything; otherwise one concurrent-map lookup.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::core::{
    Acquire, Capabilities, Error, ErrorKind, HolderId, Layer, Lease, LockEvent, LockInfo, LockKey,
    LockStore, Observers, Result,
};
use crate::KeyMap;

/// Default bound of a hold count.
pub const DEFAULT_MAX_DEPTH: u32 = 1024;

/// Configuration of the reentrancy layer.
///
/// ```
/// use leasehold::layers::ReentrancyConfig;
/// assert_eq!(ReentrancyConfig::new().max_depth(8).max_depth, 8);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReentrancyConfig {
    /// Deepest hold count allowed; a deeper acquisition fails with `InvalidArgument`. Default
    /// [`DEFAULT_MAX_DEPTH`].
    pub max_depth: u32,
}

impl Default for ReentrancyConfig {
    fn default() -> Self {
        ReentrancyConfig {
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

impl ReentrancyConfig {
    /// The default.
    pub fn new() -> Self {
        ReentrancyConfig::default()
    }

    /// Sets the depth bound (at least 1).
    pub fn max_depth(mut self, max_depth: u32) -> Self {
        self.max_depth = max_depth.max(1);
        self
    }
}

/// Wraps a store in [`Reentrant`].
#[derive(Debug, Clone, Default)]
pub struct ReentrancyLayer {
    config: ReentrancyConfig,
    observers: Observers,
}

impl ReentrancyLayer {
    /// A layer with `config` and no observers.
    pub fn new(config: ReentrancyConfig) -> Self {
        ReentrancyLayer {
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

impl<S: LockStore> Layer<S> for ReentrancyLayer {
    type Store = Reentrant<S>;

    fn layer(&self, inner: S) -> Reentrant<S> {
        Reentrant {
            inner,
            held: KeyMap::default(),
            count: AtomicUsize::new(0),
            config: self.config,
            observers: self.observers.clone(),
        }
    }
}

#[derive(Debug)]
struct Held {
    holder: HolderId,
    lease: Lease,
    depth: u32,
}

/// A store where a holder re-taking a key it holds counts up (see the [module docs](self)).
#[derive(Debug)]
pub struct Reentrant<S> {
    inner: S,
    held: KeyMap<Held>,
    /// Entries in `held`, so calls skip the map when nobody holds anything.
    count: AtomicUsize,
    config: ReentrancyConfig,
    observers: Observers,
}

impl<S: LockStore> Reentrant<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, config: ReentrancyConfig) -> Self {
        ReentrancyLayer::new(config).layer(inner)
    }

    /// The hold count of `key` by `holder` (0: not held by it).
    pub fn depth(&self, key: &LockKey, holder: HolderId) -> u32 {
        self.held
            .get(key)
            .filter(|held| held.holder == holder && Instant::now() < held.lease.expires_at())
            .map_or(0, |held| held.depth)
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    fn forget(&self, key: &LockKey, token: &crate::core::OwnerToken) {
        if self
            .held
            .remove_if(key, |_, held| held.lease.token() == token)
            .is_some()
        {
            self.count.fetch_sub(1, Ordering::Relaxed);
        }
    }
}

impl<S: LockStore> LockStore for Reentrant<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        let Some(holder) = req.holder else {
            return self.inner.try_acquire(req).await;
        };
        if self.count.load(Ordering::Relaxed) > 0 {
            if let Some(mut held) = self.held.get_mut(&req.key) {
                if held.holder == holder {
                    if Instant::now() < held.lease.expires_at() {
                        if held.depth >= self.config.max_depth {
                            return Err(Error::invalid_argument(format!(
                                "reentrant hold count would exceed {}: runaway recursion?",
                                self.config.max_depth
                            ))
                            .with_key(req.key.as_str()));
                        }
                        held.depth += 1;
                        let depth = held.depth;
                        let lease = held.lease.clone();
                        drop(held);
                        self.observers.emit(|| LockEvent::Reentered {
                            key: req.key.clone(),
                            depth,
                        });
                        return Ok(lease);
                    }
                    // Our hold expired: forget it, this is a new acquisition.
                    let token = held.lease.token().clone();
                    drop(held);
                    self.forget(&req.key, &token);
                }
            }
        }
        let lease = self.inner.try_acquire(req).await?;
        let previous = self.held.insert(
            req.key.clone(),
            Held {
                holder,
                lease: lease.clone(),
                depth: 1,
            },
        );
        if previous.is_none() {
            self.count.fetch_add(1, Ordering::Relaxed);
        }
        Ok(lease)
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        if self.count.load(Ordering::Relaxed) > 0 {
            // Count down or remove in one step under the entry's lock: a reentrant acquire by the
            // same holder on another thread cannot slip in between and be handed a lease that is
            // about to be released.
            let mut still_held = None;
            let removed = self.held.remove_if_mut(lease.key(), |_, held| {
                if held.lease.token() != lease.token() {
                    return false;
                }
                if held.depth > 1 {
                    held.depth -= 1;
                    still_held = Some(Instant::now() < held.lease.expires_at());
                    return false;
                }
                true
            });
            if let Some(still_held) = still_held {
                return Ok(still_held);
            }
            if let Some((_, held)) = removed {
                self.count.fetch_sub(1, Ordering::Relaxed);
                // The entry's lease, not this level's copy: an extend made through any level
                // moved it on, and a stale copy would be refused by the unlock window.
                return self.inner.release(&held.lease).await;
            }
        }
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let renewed = match self.inner.extend(lease, ttl).await {
            Ok(renewed) => renewed,
            Err(error) => {
                if error.kind() == ErrorKind::NotHeld && self.count.load(Ordering::Relaxed) > 0 {
                    // Lost: the next acquisition by this holder must go to the store, not count
                    // up on a lock someone else may hold now.
                    self.forget(lease.key(), lease.token());
                }
                return Err(error);
            }
        };
        if self.count.load(Ordering::Relaxed) > 0 {
            if let Some(mut held) = self.held.get_mut(lease.key()) {
                if held.lease.token() == lease.token() {
                    held.lease = renewed.clone();
                }
            }
        }
        Ok(renewed)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.list(prefix).await
    }

    async fn shutdown(&self) -> Result<usize> {
        self.held.clear();
        self.count.store(0, Ordering::Relaxed);
        self.inner.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::test_support::{events, req};
    use crate::MemoryStore;
    use leasehold_testkit::scripted::{Op, ScriptedStore};

    fn reentrant(scripted: &ScriptedStore) -> (Reentrant<ScriptedStore>, events::Seen) {
        let (observers, seen) = events::capture();
        let store = ReentrancyLayer::default()
            .with_observers(observers)
            .layer(scripted.clone());
        (store, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn nested_acquire_and_release_touch_the_store_once_each() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire().expect_release(Ok(true));
        let (store, seen) = reentrant(&scripted);
        let me = HolderId::new_explicit();
        let outer = store
            .try_acquire(&req("a", 1000).with_holder(Some(me)))
            .await
            .unwrap();
        let inner = store
            .try_acquire(&req("a", 1000).with_holder(Some(me)))
            .await
            .unwrap();
        let innermost = store
            .try_acquire(&req("a", 5000).with_holder(Some(me)))
            .await
            .unwrap();
        assert_eq!(inner, outer, "the same lease");
        assert_eq!(
            innermost.ttl(),
            Duration::from_millis(1000),
            "a different TTL changes nothing"
        );
        assert_eq!(store.depth(outer.key(), me), 3);
        assert!(store.release(&innermost).await.unwrap());
        assert!(store.release(&inner).await.unwrap());
        assert_eq!(scripted.count(Op::Release), 0, "outer level still holds");
        assert!(store.release(&outer).await.unwrap());
        assert_eq!(scripted.ops(), [Op::TryAcquire, Op::Release]);
        assert_eq!(store.depth(outer.key(), me), 0);
        assert_eq!(seen.names(), ["reentered", "reentered"]);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn two_holders_contend_in_the_store() {
        let scripted = ScriptedStore::new();
        let (store, _) = reentrant(&scripted);
        let (a, b) = (HolderId::new_explicit(), HolderId::new_explicit());
        scripted.grant_acquire();
        let held = store
            .try_acquire(&req("a", 1000).with_holder(Some(a)))
            .await
            .unwrap();
        scripted.expect_acquire(Err(Error::unavailable(held.key())));
        let err = store
            .try_acquire(&req("a", 1000).with_holder(Some(b)))
            .await
            .unwrap_err();
        assert!(err.is_unavailable());
        assert_eq!(scripted.count(Op::TryAcquire), 2, "b went to the store");
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn no_holder_is_never_reentrant() {
        let scripted = ScriptedStore::new();
        scripted
            .grant_acquire()
            .expect_acquire(Err(Error::unavailable(&crate::layers::test_support::key(
                "a",
            ))));
        let (store, seen) = reentrant(&scripted);
        store.try_acquire(&req("a", 1000)).await.unwrap();
        assert!(store
            .try_acquire(&req("a", 1000))
            .await
            .unwrap_err()
            .is_unavailable());
        assert!(seen.names().is_empty());
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn expired_hold_is_a_new_acquisition() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire().grant_acquire();
        let (store, _) = reentrant(&scripted);
        let me = HolderId::new_explicit();
        let first = store
            .try_acquire(&req("a", 100).with_holder(Some(me)))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(100)).await;
        let second = store
            .try_acquire(&req("a", 100).with_holder(Some(me)))
            .await
            .unwrap();
        assert_ne!(first.token(), second.token());
        assert_eq!(store.depth(second.key(), me), 1);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn depth_is_bounded() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire();
        let store =
            ReentrancyLayer::new(ReentrancyConfig::new().max_depth(2)).layer(scripted.clone());
        let me = Some(HolderId::new_explicit());
        store
            .try_acquire(&req("a", 1000).with_holder(me))
            .await
            .unwrap();
        store
            .try_acquire(&req("a", 1000).with_holder(me))
            .await
            .unwrap();
        let err = store
            .try_acquire(&req("a", 1000).with_holder(me))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn extend_by_any_level_is_seen_by_later_levels() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire().grant_extend();
        let (store, _) = reentrant(&scripted);
        let me = Some(HolderId::new_explicit());
        let lease = store
            .try_acquire(&req("a", 1000).with_holder(me))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(900)).await;
        store.extend(&lease, Duration::from_secs(10)).await.unwrap();
        tokio::time::advance(Duration::from_millis(500)).await;
        let again = store
            .try_acquire(&req("a", 1000).with_holder(me))
            .await
            .unwrap();
        assert_eq!(again.ttl(), Duration::from_secs(10));
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_release_sends_the_lease_an_earlier_level_extended() {
        // Over the unlock window: a stale copy (the inner level's, 2 s from t=0) would be skipped
        // at t=6 and the lock left in the store until the extended lease ran out.
        let memory = MemoryStore::new();
        let store = ReentrancyLayer::default()
            .layer(crate::layers::UnlockWindowLayer::default().layer(memory.clone()));
        let me = Some(HolderId::new_explicit());
        let outer = store
            .try_acquire(&req("a", 2000).with_holder(me))
            .await
            .unwrap();
        let inner = store
            .try_acquire(&req("a", 2000).with_holder(me))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_secs(1)).await;
        store.extend(&outer, Duration::from_secs(60)).await.unwrap();
        tokio::time::advance(Duration::from_secs(4)).await;
        assert!(store.release(&outer).await.unwrap(), "depth 2 → 1");
        tokio::time::advance(Duration::from_secs(1)).await;
        assert!(
            store.release(&inner).await.unwrap(),
            "released in the store at depth 0"
        );
        assert_eq!(memory.inspect(inner.key()).await.unwrap(), None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_lock_found_lost_by_extend_is_not_reentered() {
        let scripted = ScriptedStore::new();
        scripted
            .grant_acquire()
            .expect_extend(Err(Error::not_held("scripted: the record is gone")))
            .grant_acquire();
        let (store, seen) = reentrant(&scripted);
        let me = Some(HolderId::new_explicit());
        let lease = store
            .try_acquire(&req("a", 10_000).with_holder(me))
            .await
            .unwrap();
        let err = store
            .extend(&lease, Duration::from_secs(10))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::NotHeld);
        let again = store
            .try_acquire(&req("a", 10_000).with_holder(me))
            .await
            .unwrap();
        assert_ne!(again.token(), lease.token(), "a new store acquisition");
        assert_eq!(
            scripted.count(Op::TryAcquire),
            2,
            "asked the store, not counted up"
        );
        assert!(
            seen.names().is_empty(),
            "no Reentered event: {:?}",
            seen.names()
        );
        scripted.verify();
    }

    #[tokio::test]
    async fn guards_drop_in_any_order_over_the_manager() {
        let memory = MemoryStore::new();
        let locks = crate::LockManager::builder()
            .client_id("c")
            .farm_id("f")
            .store(memory.clone())
            .reentrancy(true)
            .build()
            .unwrap();
        let me = crate::Holder::new();
        let opts = || crate::LockOptions::new().holder(me);
        let a = locks.try_lock_with("k", opts()).await.unwrap();
        let b = locks.try_lock_with("k", opts()).await.unwrap();
        let c = locks.try_lock_with("k", opts()).await.unwrap();
        assert!(
            locks.try_lock("k").await.unwrap_err().is_unavailable(),
            "others still excluded"
        );
        assert!(a.release().await.unwrap(), "outermost released first");
        assert!(c.release().await.unwrap());
        assert!(locks.inspect("k").await.unwrap().is_some(), "b still holds");
        assert!(b.release().await.unwrap());
        assert_eq!(
            locks.inspect("k").await.unwrap(),
            None,
            "the last level released it"
        );
    }

    #[tokio::test]
    async fn task_holders_reenter_within_one_task() {
        let locks = crate::LockManager::builder()
            .client_id("c")
            .farm_id("f")
            .task_holders(true)
            .reentrancy(true)
            .build()
            .unwrap();
        let l2 = locks.clone();
        tokio::spawn(async move {
            let outer = l2.try_lock("k").await.unwrap();
            let inner = l2.try_lock("k").await.unwrap();
            let other_task = {
                let l3 = l2.clone();
                tokio::spawn(async move { l3.try_lock("k").await.map(drop) })
                    .await
                    .unwrap()
            };
            assert!(
                other_task.unwrap_err().is_unavailable(),
                "another task is another holder"
            );
            inner.release().await.unwrap();
            outer.release().await.unwrap();
        })
        .await
        .unwrap();
        assert_eq!(locks.inspect("k").await.unwrap(), None);
    }
}
