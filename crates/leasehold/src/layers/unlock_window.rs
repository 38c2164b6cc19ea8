//! Unlock window (Bond 3.2, unlock thread isolation): send a release only while the lease can
//! still be ours.
//!
//! # What it guarantees
//! A release is sent to the store only while `now <= acquired_at + ttl - margin`, where
//! `acquired_at` is the instant just before the acquire (or the last successful extend) was sent.
//! Past that point the record may already have expired in the store and been taken by another
//! holder; the release is then *skipped*: it returns `Ok(false)` (not held), a
//! [`LockEvent::ReleaseSkipped`] with [`SkipReason::WindowClosed`] (saying how late it was) is
//! emitted, and a `debug` log line says why.
//!
//! Owner-checked release already keeps a stale token from deleting another holder's record on the
//! stores leasehold ships; the window adds protection for stores (or other clients sharing the
//! store) whose delete is not owner-checked, and for a clock-rate difference between this process
//! and the store smaller than the margin. It also turns a late release into a visible event.
//!
//! # Where it belongs
//! Below shutdown tracking and above readback: every real release — a guard's, and the one sent at
//! shutdown — passes through it, and a skipped release never reaches the readback layer.
//!
//! # Cost
//! One clock read per release; no I/O.
//!
//! # Configuration
//! [`UnlockWindowConfig::margin`], default 150 ms (Bond's value). Choose more than the worst
//! clock-rate drift over a TTL plus the store's expiry granularity.

use std::time::Duration;

use tokio::time::Instant;

use crate::core::{
    Acquire, Capabilities, Layer, Lease, LockEvent, LockInfo, LockKey, LockStore, Observers,
    Result, SkipReason,
};

/// Default safety margin before a lease's expiry after which a release is skipped (Bond: 150 ms).
pub const DEFAULT_UNLOCK_MARGIN: Duration = Duration::from_millis(150);

/// Configuration of the unlock-window layer.
///
/// ```
/// use std::time::Duration;
/// use leasehold::layers::UnlockWindowConfig;
/// let config = UnlockWindowConfig::new().margin(Duration::from_millis(300));
/// assert_eq!(config.margin, Duration::from_millis(300));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct UnlockWindowConfig {
    /// How long before the lease's expiry the window closes. Default [`DEFAULT_UNLOCK_MARGIN`].
    pub margin: Duration,
}

impl Default for UnlockWindowConfig {
    fn default() -> Self {
        UnlockWindowConfig {
            margin: DEFAULT_UNLOCK_MARGIN,
        }
    }
}

impl UnlockWindowConfig {
    /// The default: a 150 ms margin.
    pub fn new() -> Self {
        UnlockWindowConfig::default()
    }

    /// Sets the margin.
    pub fn margin(mut self, margin: Duration) -> Self {
        self.margin = margin;
        self
    }
}

/// Wraps a store in [`UnlockWindow`].
#[derive(Debug, Clone, Default)]
pub struct UnlockWindowLayer {
    config: UnlockWindowConfig,
    observers: Observers,
}

impl UnlockWindowLayer {
    /// A layer with `config` and no observers.
    pub fn new(config: UnlockWindowConfig) -> Self {
        UnlockWindowLayer {
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

impl<S: LockStore> Layer<S> for UnlockWindowLayer {
    type Store = UnlockWindow<S>;

    fn layer(&self, inner: S) -> UnlockWindow<S> {
        UnlockWindow {
            inner,
            config: self.config,
            observers: self.observers.clone(),
        }
    }
}

/// A store that skips releases outside the unlock window (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct UnlockWindow<S> {
    inner: S,
    config: UnlockWindowConfig,
    observers: Observers,
}

impl<S> UnlockWindow<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, config: UnlockWindowConfig) -> Self {
        UnlockWindow {
            inner,
            config,
            observers: Observers::default(),
        }
    }

    /// The last instant at which a release of `lease` is still sent.
    pub fn window_closes_at(&self, lease: &Lease) -> Instant {
        lease.acquired_at() + lease.ttl().saturating_sub(self.config.margin)
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

impl<S: LockStore> LockStore for UnlockWindow<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        self.inner.try_acquire(req).await
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        let closes_at = self.window_closes_at(lease);
        let now = Instant::now();
        if now > closes_at {
            let reason = SkipReason::WindowClosed {
                late_by: now - closes_at,
            };
            tracing::debug!(key = %lease.key(), %reason,
                "release skipped: the lease may have expired and been taken by another holder");
            self.observers.emit(|| LockEvent::ReleaseSkipped {
                key: lease.key().clone(),
                reason,
            });
            return Ok(false);
        }
        self.inner.release(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.inner.extend(lease, ttl).await
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.list(prefix).await
    }

    async fn shutdown(&self) -> Result<usize> {
        self.inner.shutdown().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::test_support::{events, req};
    use leasehold_testkit::scripted::{Op, ScriptedStore};

    fn window(scripted: &ScriptedStore) -> (UnlockWindow<ScriptedStore>, events::Seen) {
        let (observers, seen) = events::capture();
        let store = UnlockWindowLayer::new(UnlockWindowConfig::default())
            .with_observers(observers)
            .layer(scripted.clone());
        (store, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn release_inside_the_window_is_sent() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire().expect_release(Ok(true));
        let (store, seen) = window(&scripted);
        let lease = store.try_acquire(&req("a", 1000)).await.unwrap();
        // Exactly at the last instant of the window: acquired_at + 1000 - 150 ms.
        tokio::time::advance(Duration::from_millis(850)).await;
        assert!(store.release(&lease).await.unwrap());
        assert!(seen.names().is_empty());
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn release_after_the_window_is_skipped_with_a_reason() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire();
        let (store, seen) = window(&scripted);
        let lease = store.try_acquire(&req("a", 1000)).await.unwrap();
        tokio::time::advance(Duration::from_millis(851)).await;
        assert!(
            !store.release(&lease).await.unwrap(),
            "reported as not held"
        );
        assert_eq!(scripted.count(Op::Release), 0, "nothing sent");
        assert_eq!(
            seen.all(),
            [LockEvent::ReleaseSkipped {
                key: lease.key().clone(),
                reason: SkipReason::WindowClosed {
                    late_by: Duration::from_millis(1)
                },
            }]
        );
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn extend_moves_the_window() {
        let scripted = ScriptedStore::new();
        scripted
            .grant_acquire()
            .grant_extend()
            .expect_release(Ok(true));
        let (store, _) = window(&scripted);
        let lease = store.try_acquire(&req("a", 1000)).await.unwrap();
        tokio::time::advance(Duration::from_millis(800)).await;
        let renewed = store
            .extend(&lease, Duration::from_millis(1000))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(800)).await;
        assert!(
            !store.release(&lease).await.unwrap(),
            "the old lease's window has closed"
        );
        assert!(
            store.release(&renewed).await.unwrap(),
            "the renewed one's is open"
        );
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn ttl_shorter_than_the_margin_closes_at_once() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire().expect_release(Ok(true));
        let (store, _) = window(&scripted);
        let lease = store.try_acquire(&req("a", 100)).await.unwrap();
        assert_eq!(store.window_closes_at(&lease), lease.acquired_at());
        assert!(
            store.release(&lease).await.unwrap(),
            "still the same instant"
        );
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!store.release(&lease).await.unwrap());
        scripted.verify();
    }
}
