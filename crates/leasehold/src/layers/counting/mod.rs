//! Request counting: how many requests of each kind reach the layer below.
//!
//! Not a Bond scenario but the instrument that measures them: put a [`CountingLayer`] around the
//! store (innermost, with [`LockManagerBuilder::layer`](crate::LockManagerBuilder::layer)) and
//! [`RequestCounts`] tells how many acquisitions, releases and extends actually went to the store,
//! for example how much local competition saves on a hot key. Cost: one relaxed atomic increment
//! per request.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::core::{Acquire, Attempt, Layer, Lease, LockInfo, LockKey, LockStore, Result};

/// Counters of requests that passed through a [`Counting`] store. Shared: read them while the
/// store is in use.
#[derive(Debug, Default)]
pub struct RequestCounts {
    acquires: AtomicU64,
    releases: AtomicU64,
    extends: AtomicU64,
    inspects: AtomicU64,
    lists: AtomicU64,
}

impl RequestCounts {
    /// `acquire` requests.
    pub fn acquires(&self) -> u64 {
        self.acquires.load(Ordering::Relaxed)
    }

    /// `release` requests.
    pub fn releases(&self) -> u64 {
        self.releases.load(Ordering::Relaxed)
    }

    /// `extend` requests.
    pub fn extends(&self) -> u64 {
        self.extends.load(Ordering::Relaxed)
    }

    /// `inspect` requests.
    pub fn inspects(&self) -> u64 {
        self.inspects.load(Ordering::Relaxed)
    }

    /// `list` requests.
    pub fn lists(&self) -> u64 {
        self.lists.load(Ordering::Relaxed)
    }

    /// Every request.
    pub fn total(&self) -> u64 {
        self.acquires() + self.releases() + self.extends() + self.inspects() + self.lists()
    }

    /// Sets every counter back to zero.
    pub fn reset(&self) {
        for counter in [
            &self.acquires,
            &self.releases,
            &self.extends,
            &self.inspects,
            &self.lists,
        ] {
            counter.store(0, Ordering::Relaxed);
        }
    }
}

/// Counts the requests that go to the store it wraps.
///
/// ```
/// use leasehold::layers::CountingLayer;
/// use leasehold::LockManager;
///
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let counting = CountingLayer::new();
/// let counts = counting.counts();
/// let locks = LockManager::builder().client_id("c").farm_id("f").layer(counting).build()?;
/// locks.try_lock("k").await?.release().await?;
/// assert_eq!((counts.acquires(), counts.releases()), (1, 1));
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Default)]
pub struct CountingLayer {
    counts: Arc<RequestCounts>,
}

impl CountingLayer {
    /// A layer with fresh counters.
    pub fn new() -> Self {
        CountingLayer::default()
    }

    /// The counters every store wrapped by this layer adds to.
    pub fn counts(&self) -> Arc<RequestCounts> {
        self.counts.clone()
    }
}

impl<S: LockStore> Layer<S> for CountingLayer {
    type Store = Counting<S>;

    fn layer(&self, inner: S) -> Counting<S> {
        Counting {
            inner,
            counts: self.counts.clone(),
        }
    }
}

/// A store that counts the requests it forwards (see [`CountingLayer`]).
#[derive(Debug, Clone)]
pub struct Counting<S> {
    inner: S,
    counts: Arc<RequestCounts>,
}

impl<S> Counting<S> {
    /// The counters.
    pub fn counts(&self) -> &Arc<RequestCounts> {
        &self.counts
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Unwraps the store.
    pub fn into_inner(self) -> S {
        self.inner
    }
}

fn bump(counter: &AtomicU64) {
    counter.fetch_add(1, Ordering::Relaxed);
}

impl<S: LockStore> crate::core::LayeredStore for Counting<S> {
    type Inner = S;

    fn inner(&self) -> &S {
        &self.inner
    }

    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        bump(&self.counts.acquires);
        self.inner.acquire(req).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        bump(&self.counts.releases);
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        bump(&self.counts.extends);
        self.inner.extend(lease, ttl).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        bump(&self.counts.inspects);
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        bump(&self.counts.lists);
        self.inner.list(prefix).await
    }
}

#[cfg(test)]
mod tests;
