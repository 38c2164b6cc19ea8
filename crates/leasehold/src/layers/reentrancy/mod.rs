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
//! # Lock modes
//! - **Write under write** (an exclusive hold re-taken) and **read under read** (a reader
//!   reading again) count up as above. Several holders of this process may read one key at
//!   once; each has its own count.
//! - **Read under one's own write** and **write under one's own read** are refused at once with
//!   [`ErrorKind::ModeConflict`], with no store I/O: the first can never be granted while the
//!   write is held, the second never while the read is held, so waiting would only deadlock the
//!   holder on itself. Release the outer hold first (or take the write from the start).
//! - **Semaphore permits** are never reentrant: every acquisition takes one more permit (a holder
//!   that needs two permits takes two), and passes straight through.
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
//!   its own copy in `lease()`/`is_held()`: an inner guard that is not renewed reads not held
//!   once its copy's expiry passes, even while the outer guard's renewal keeps the key. Renew or
//!   extend through the outermost guard, and ask it.)
//! - **An expired hold** is not re-entered: if the held lease's TTL has passed, the acquisition
//!   goes to the store as a new one.
//! - The depth is bounded by [`ReentrancyLayer::max_depth`] (runaway recursion is an error, not
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
    Acquire, Attempt, Error, ErrorKind, HolderId, Layer, Lease, LockEvent, LockKey, LockMode,
    LockStore, Observers, Result,
};
use crate::KeyMap;

use super::wiring::{WiredLayer, Wiring};

/// Default bound of a hold count.
pub const DEFAULT_MAX_DEPTH: u32 = 1024;

/// The reentrancy layer: its configuration, and the [`Layer`] that wraps a store in
/// [`Reentrancy`].
///
/// ```
/// use leasehold::layers::ReentrancyLayer;
/// assert_eq!(ReentrancyLayer::new().max_depth(8).max_depth, 8);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReentrancyLayer {
    /// Deepest hold count allowed; a deeper acquisition fails with `InvalidArgument`. Default
    /// [`DEFAULT_MAX_DEPTH`].
    pub max_depth: u32,
}

impl Default for ReentrancyLayer {
    fn default() -> Self {
        ReentrancyLayer {
            max_depth: DEFAULT_MAX_DEPTH,
        }
    }
}

impl ReentrancyLayer {
    /// The default: depth bound [`DEFAULT_MAX_DEPTH`].
    pub fn new() -> Self {
        ReentrancyLayer::default()
    }

    /// Sets the depth bound (at least 1).
    pub fn max_depth(mut self, max_depth: u32) -> Self {
        self.max_depth = max_depth.max(1);
        self
    }
}

impl<S: LockStore> Layer<S> for ReentrancyLayer {
    type Store = Reentrancy<S>;

    fn layer(&self, inner: S) -> Reentrancy<S> {
        self.layer_wired(inner, &Wiring::default())
    }
}

impl<S: LockStore> WiredLayer<S> for ReentrancyLayer {
    fn layer_wired(&self, inner: S, wiring: &Wiring) -> Reentrancy<S> {
        Reentrancy {
            inner,
            held: KeyMap::default(),
            count: AtomicUsize::new(0),
            readers: KeyMap::default(),
            reader_count: AtomicUsize::new(0),
            max_depth: self.max_depth,
            observers: wiring.observers().clone(),
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
pub struct Reentrancy<S> {
    inner: S,
    held: KeyMap<Held>,
    /// Entries in `held`, so calls skip the map when nobody holds anything.
    count: AtomicUsize,
    /// Read holds: a key may be read by several holders of this process at once.
    readers: KeyMap<Vec<Held>>,
    /// Entries in `readers`.
    reader_count: AtomicUsize,
    max_depth: u32,
    observers: Observers,
}

impl<S: LockStore> Reentrancy<S> {
    /// The hold count of `key` by `holder` (0: not held by it).
    pub fn depth(&self, key: &LockKey, holder: HolderId) -> u32 {
        let now = Instant::now();
        let live = |held: &Held| held.holder == holder && now < held.lease.expires_at();
        let write = self
            .held
            .get(key)
            .filter(|held| live(held))
            .map(|held| held.depth);
        write
            .or_else(|| {
                let readers = self.readers.get(key)?;
                readers
                    .iter()
                    .find(|held| live(held))
                    .map(|held| held.depth)
            })
            .unwrap_or(0)
    }

    /// Whether `holder` holds `key` for reading through this layer (live).
    fn reads(&self, key: &LockKey, holder: HolderId) -> bool {
        if self.reader_count.load(Ordering::Relaxed) == 0 {
            return false;
        }
        let now = Instant::now();
        self.readers.get(key).is_some_and(|readers| {
            readers
                .iter()
                .any(|held| held.holder == holder && now < held.lease.expires_at())
        })
    }

    /// Whether `holder` holds `key` exclusively through this layer (live).
    fn writes(&self, key: &LockKey, holder: HolderId) -> bool {
        self.count.load(Ordering::Relaxed) > 0
            && self.held.get(key).is_some_and(|held| {
                held.holder == holder && Instant::now() < held.lease.expires_at()
            })
    }

    /// A read by a holder: re-entered, refused under its own write, or taken from the store.
    async fn acquire_read(&self, req: &Acquire, holder: HolderId) -> Result<Attempt> {
        if self.writes(&req.key, holder) {
            return Err(Error::new(
                ErrorKind::ModeConflict,
                "this holder already holds the key for writing; a read under its own write \
                 would wait for itself forever. Release the write first, or keep using it",
            )
            .with_key(req.key.as_str()));
        }
        if self.reader_count.load(Ordering::Relaxed) > 0 {
            let now = Instant::now();
            if let Some(mut readers) = self.readers.get_mut(&req.key) {
                readers.retain(|held| now < held.lease.expires_at());
                if let Some(held) = readers.iter_mut().find(|held| held.holder == holder) {
                    if held.depth >= self.max_depth {
                        return Err(self.too_deep(&req.key));
                    }
                    held.depth += 1;
                    let (depth, lease) = (held.depth, held.lease.clone());
                    drop(readers);
                    self.observers.emit(|| LockEvent::Reentered {
                        key: req.key.clone(),
                        depth,
                    });
                    return Ok(Attempt::Granted(lease));
                }
            }
        }
        let lease = match self.inner.acquire(req).await? {
            Attempt::Granted(lease) => lease,
            refused => return Ok(refused),
        };
        let held = Held {
            holder,
            lease: lease.clone(),
            depth: 1,
        };
        let mut readers = self.readers.entry(req.key.clone()).or_insert_with(|| {
            self.reader_count.fetch_add(1, Ordering::Relaxed);
            Vec::new()
        });
        readers.push(held);
        Ok(Attempt::Granted(lease))
    }

    /// Counts a read hold down; `Some(still_held)` when an outer level still holds it, `None`
    /// when this was the last level (or not a hold of this layer) and the store must be told.
    fn count_down_read(&self, lease: &Lease) -> Option<bool> {
        if self.reader_count.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let mut outcome = None;
        let emptied = self.readers.remove_if_mut(lease.key(), |_, readers| {
            if let Some(at) = readers
                .iter()
                .position(|h| h.lease.token() == lease.token())
            {
                if readers[at].depth > 1 {
                    readers[at].depth -= 1;
                    outcome = Some(Instant::now() < readers[at].lease.expires_at());
                } else {
                    readers.swap_remove(at);
                }
            }
            readers.is_empty()
        });
        if emptied.is_some() {
            self.reader_count.fetch_sub(1, Ordering::Relaxed);
        }
        outcome
    }

    fn forget_read(&self, key: &LockKey, token: &crate::core::OwnerToken) {
        let emptied = self.readers.remove_if_mut(key, |_, readers| {
            readers.retain(|held| held.lease.token() != token);
            readers.is_empty()
        });
        if emptied.is_some() {
            self.reader_count.fetch_sub(1, Ordering::Relaxed);
        }
    }

    fn too_deep(&self, key: &LockKey) -> Error {
        Error::invalid_argument(format!(
            "reentrant hold count would exceed {}: runaway recursion?",
            self.max_depth
        ))
        .with_key(key.as_str())
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

impl<S: LockStore> crate::core::LayeredStore for Reentrancy<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    fn is_held_by(&self, key: &LockKey, holder: HolderId) -> bool {
        self.depth(key, holder) > 0 || self.inner.is_held_by(key, holder)
    }

    /// From the exclusive leases this layer holds for its holders.
    fn is_held_here(&self, key: &LockKey) -> bool {
        let held = self.count.load(Ordering::Relaxed) > 0
            && self.held.get(key).is_some_and(|held| {
                !held.lease.is_contended() && Instant::now() < held.lease.expires_at()
            });
        held || self.inner.is_held_here(key)
    }

    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        let Some(holder) = req.holder else {
            return self.inner.acquire(req).await;
        };
        match req.mode {
            LockMode::Exclusive => {}
            LockMode::Shared => return self.acquire_read(req, holder).await,
            LockMode::Semaphore { .. } => return self.inner.acquire(req).await,
        }
        if self.reads(&req.key, holder) {
            return Err(Error::new(
                ErrorKind::ModeConflict,
                "this holder already holds the key for reading; a write under its own read \
                 would wait for itself forever. Release the read, then take the write",
            )
            .with_key(req.key.as_str()));
        }
        if self.count.load(Ordering::Relaxed) > 0 {
            if let Some(mut held) = self.held.get_mut(&req.key) {
                if held.holder == holder {
                    if Instant::now() < held.lease.expires_at() {
                        if held.depth >= self.max_depth {
                            return Err(self.too_deep(&req.key));
                        }
                        held.depth += 1;
                        let depth = held.depth;
                        let lease = held.lease.clone();
                        drop(held);
                        self.observers.emit(|| LockEvent::Reentered {
                            key: req.key.clone(),
                            depth,
                        });
                        return Ok(Attempt::Granted(lease));
                    }
                    // Our hold expired: forget it, this is a new acquisition.
                    let token = held.lease.token().clone();
                    drop(held);
                    self.forget(&req.key, &token);
                }
            }
        }
        let lease = match self.inner.acquire(req).await? {
            Attempt::Granted(lease) => lease,
            refused => return Ok(refused),
        };
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
        Ok(Attempt::Granted(lease))
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        match lease.mode() {
            LockMode::Exclusive => {}
            LockMode::Shared => {
                if let Some(still_held) = self.count_down_read(lease) {
                    return Ok(still_held);
                }
                return self.inner.release(lease).await;
            }
            LockMode::Semaphore { .. } => return self.inner.release(lease).await,
        }
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
                if error.kind() == ErrorKind::NotHeld {
                    // Lost: the next acquisition by this holder must go to the store, not count
                    // up on a lock someone else may hold now.
                    match lease.mode() {
                        LockMode::Exclusive if self.count.load(Ordering::Relaxed) > 0 => {
                            self.forget(lease.key(), lease.token())
                        }
                        LockMode::Shared if self.reader_count.load(Ordering::Relaxed) > 0 => {
                            self.forget_read(lease.key(), lease.token())
                        }
                        _ => {}
                    }
                }
                return Err(error);
            }
        };
        if lease.mode() == LockMode::Shared && self.reader_count.load(Ordering::Relaxed) > 0 {
            if let Some(mut readers) = self.readers.get_mut(lease.key()) {
                if let Some(held) = readers
                    .iter_mut()
                    .find(|h| h.lease.token() == lease.token())
                {
                    held.lease = renewed.clone();
                }
            }
        } else if self.count.load(Ordering::Relaxed) > 0 {
            if let Some(mut held) = self.held.get_mut(lease.key()) {
                if held.lease.token() == lease.token() {
                    held.lease = renewed.clone();
                }
            }
        }
        Ok(renewed)
    }

    async fn shutdown(&self) -> Result<usize> {
        self.held.clear();
        self.count.store(0, Ordering::Relaxed);
        self.readers.clear();
        self.reader_count.store(0, Ordering::Relaxed);
        self.inner.shutdown().await
    }
}

#[cfg(test)]
mod tests;
