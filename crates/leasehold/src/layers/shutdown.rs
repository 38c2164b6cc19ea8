//! Graceful shutdown (Bond 3.5): track every live lock and release them all when the process
//! stops, so a restart does not leave locks held until their TTL.
//!
//! # What it guarantees
//! Every lease acquired through the layer is tracked (key → lease: token and expiry) until it is
//! released or expires; a background task purges expired entries every
//! [`GracefulShutdownConfig::purge_interval`]. [`LockStore::shutdown`] on this layer — which
//! [`LockManager::shutdown`](crate::LockManager::shutdown) calls after new acquisitions stopped and
//! in-flight ones finished — releases every still-live tracked lock through the layers below
//! (unlock window, readback, store), concurrently, within [`GracefulShutdownConfig::deadline`],
//! emits [`LockEvent::ReleasedAtShutdown`] for each, then shuts the inner store down. It returns
//! how many locks were released. After shutdown the layer refuses new acquisitions
//! ([`ErrorKind::ShutDown`](crate::ErrorKind::ShutDown)); an acquisition that was in flight and
//! lands after the sweep is released at once.
//!
//! With the `signal` feature, [`LockManager::install_signal_handler`] runs the same shutdown on
//! SIGINT/SIGTERM.
//!
//! Bond's constraints hold: only this process's own locks are released, synchronously at shutdown;
//! a guard still alive afterwards finds its lock gone (its release answers `Ok(false)`).
//! Most useful with TTLs long enough (Bond: over 15 s) that waiting them out after a restart hurts.
//!
//! # Where it belongs
//! Below local competition (so it sees each real store lease exactly once: local hand-offs and
//! reentrant levels share one store lease), above the unlock window and readback (so a shutdown
//! release is window-checked and its in-doubt reply read back).
//!
//! # Cost
//! One concurrent-map insert per acquisition and one remove per release; a purge sweep per
//! interval.
//!
//! [`LockManager::install_signal_handler`]: crate::LockManager

use std::sync::atomic::{fence, AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;

use crate::core::{
    instant_after, Acquire, Capabilities, Error, Layer, Lease, LockEvent, LockInfo, LockKey,
    LockStore, Observers, Result,
};
use crate::sweep::Sweeper;
use crate::KeyMap;

/// Default time the shutdown sweep may take to release every live lock.
pub const DEFAULT_SHUTDOWN_DEADLINE: Duration = Duration::from_secs(5);
/// Default interval of the purge of expired entries.
pub const DEFAULT_PURGE_INTERVAL: Duration = Duration::from_secs(1);

/// Configuration of graceful shutdown.
///
/// ```
/// use std::time::Duration;
/// use leasehold::layers::GracefulShutdownConfig;
/// let config = GracefulShutdownConfig::new().deadline(Duration::from_secs(2));
/// assert_eq!(config.deadline, Duration::from_secs(2));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct GracefulShutdownConfig {
    /// How long the release sweep may take. Locks not released by then expire at their TTL.
    /// Default [`DEFAULT_SHUTDOWN_DEADLINE`].
    pub deadline: Duration,
    /// How often expired entries are purged. Default [`DEFAULT_PURGE_INTERVAL`].
    pub purge_interval: Duration,
    /// Exit status of the process after a signal-triggered shutdown (feature `signal`). Default
    /// 130 (128 + SIGINT; `ctrlc` does not say whether SIGINT or SIGTERM arrived).
    pub exit_code: i32,
}

impl Default for GracefulShutdownConfig {
    fn default() -> Self {
        GracefulShutdownConfig {
            deadline: DEFAULT_SHUTDOWN_DEADLINE,
            purge_interval: DEFAULT_PURGE_INTERVAL,
            exit_code: 130,
        }
    }
}

impl GracefulShutdownConfig {
    /// The default.
    pub fn new() -> Self {
        GracefulShutdownConfig::default()
    }

    /// Sets the sweep deadline.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets the purge interval (at least 1 ms).
    pub fn purge_interval(mut self, interval: Duration) -> Self {
        self.purge_interval = interval.max(Duration::from_millis(1));
        self
    }

    /// Sets the exit status after a signal-triggered shutdown.
    pub fn exit_code(mut self, code: i32) -> Self {
        self.exit_code = code;
        self
    }
}

/// Wraps a store in [`ShutdownTracking`].
#[derive(Debug, Clone, Default)]
pub struct ShutdownLayer {
    config: GracefulShutdownConfig,
    observers: Observers,
}

impl ShutdownLayer {
    /// A layer with `config` and no observers.
    pub fn new(config: GracefulShutdownConfig) -> Self {
        ShutdownLayer {
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

impl<S: LockStore> Layer<S> for ShutdownLayer {
    type Store = ShutdownTracking<S>;

    fn layer(&self, inner: S) -> ShutdownTracking<S> {
        ShutdownTracking {
            inner,
            live: Arc::new(Live::default()),
            config: self.config,
            observers: self.observers.clone(),
            purger: Sweeper::default(),
            closed: AtomicBool::new(false),
        }
    }
}

type Live = KeyMap<Lease>;

/// A store that tracks live locks and releases them at shutdown (see the [module docs](self)).
#[derive(Debug)]
pub struct ShutdownTracking<S> {
    inner: S,
    live: Arc<Live>,
    config: GracefulShutdownConfig,
    observers: Observers,
    purger: Sweeper,
    closed: AtomicBool,
}

fn purge(live: &Live, now: Instant) -> usize {
    let before = live.len();
    live.retain(|_, lease| now < lease.expires_at());
    before.saturating_sub(live.len())
}

impl<S: LockStore> ShutdownTracking<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, config: GracefulShutdownConfig) -> Self {
        ShutdownLayer::new(config).layer(inner)
    }

    /// Tracked locks, including expired ones not purged yet.
    pub fn tracked(&self) -> usize {
        self.live.len()
    }

    /// Removes expired entries now; returns how many.
    pub fn purge_expired(&self) -> usize {
        purge(&self.live, Instant::now())
    }

    /// The wrapped store.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// Stops tracking `lease` (if it is still the tracked one for its key).
    fn untrack(&self, lease: &Lease) {
        self.live
            .remove_if(lease.key(), |_, tracked| tracked.token() == lease.token());
    }

    /// Releases every live tracked lock within the deadline; returns how many were released.
    async fn sweep(&self) -> usize {
        // `closed` was set before this fence; an acquisition that inserts after the scan below
        // fences before reading `closed`, so it sees it and gives its lease back itself.
        fence(Ordering::SeqCst);
        let now = Instant::now();
        let leases: Vec<Lease> = self
            .live
            .iter()
            .map(|entry| entry.value().clone())
            .filter(|lease| now < lease.expires_at())
            .collect();
        for lease in &leases {
            self.untrack(lease);
        }
        if leases.is_empty() {
            return 0;
        }
        let deadline = instant_after(now, self.config.deadline);
        let mut pending: FuturesUnordered<_> = leases
            .iter()
            .map(|lease| async move { (lease, self.inner.release(lease).await) })
            .collect();
        let mut released = 0;
        loop {
            match tokio::time::timeout_at(deadline, pending.next()).await {
                Ok(Some((lease, Ok(true)))) => {
                    released += 1;
                    self.observers.emit(|| LockEvent::ReleasedAtShutdown {
                        key: lease.key().clone(),
                    });
                }
                Ok(Some((lease, Ok(false)))) => {
                    tracing::debug!(key = %lease.key(), "at shutdown the lock was no longer ours")
                }
                Ok(Some((lease, Err(error)))) => {
                    tracing::warn!(key = %lease.key(), %error,
                        "releasing at shutdown failed; the lock expires at its TTL")
                }
                Ok(None) => break,
                Err(_) => {
                    tracing::warn!(
                        unreleased = pending.len(),
                        "shutdown deadline passed; the remaining locks expire at their TTL"
                    );
                    break;
                }
            }
        }
        released
    }
}

impl<S: LockStore> LockStore for ShutdownTracking<S> {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        if self.closed.load(Ordering::Acquire) {
            return Err(Error::shut_down().with_key(req.key.as_str()));
        }
        self.purger
            .ensure(&self.live, self.config.purge_interval, purge);
        let lease = self.inner.try_acquire(req).await?;
        // Tracked first, then `closed` read (with a fence against the sweep's, see `sweep`):
        // either the sweep sees this lease or this call sees the shutdown, never neither.
        self.live.insert(lease.key().clone(), lease.clone());
        fence(Ordering::SeqCst);
        if self.closed.load(Ordering::Relaxed) {
            // Landed during the shutdown: give it back now (the sweep may too; both are
            // owner-checked, so the second is a no-op).
            self.untrack(&lease);
            if let Err(error) = self.inner.release(&lease).await {
                tracing::warn!(key = %lease.key(), %error,
                    "releasing a lock acquired during shutdown failed; it expires at its TTL");
            }
            return Err(Error::shut_down().with_key(req.key.as_str()));
        }
        Ok(lease)
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        // Untracked only once the store answered: a release that fails (or is cancelled) may
        // leave the lock in the store, and then the shutdown must still release it.
        let released = self.inner.release(lease).await;
        if released.is_ok() {
            self.untrack(lease);
        }
        released
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let renewed = self.inner.extend(lease, ttl).await?;
        // Tracked again even if the purge dropped the entry while the extend was in flight: the
        // store holds the lock for the new TTL.
        self.live
            .entry(lease.key().clone())
            .and_modify(|tracked| {
                if tracked.token() == lease.token() {
                    *tracked = renewed.clone();
                }
            })
            .or_insert_with(|| renewed.clone());
        Ok(renewed)
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inner.inspect(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.inner.list(prefix).await
    }

    async fn shutdown(&self) -> Result<usize> {
        self.closed.store(true, Ordering::Relaxed);
        let released = self.sweep().await;
        Ok(released + self.inner.shutdown().await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::test_support::{events, req};
    use crate::ErrorKind;
    use leasehold_testkit::scripted::{Op, ScriptedStore};

    fn tracking(scripted: &ScriptedStore) -> (ShutdownTracking<ScriptedStore>, events::Seen) {
        let (observers, seen) = events::capture();
        let store = ShutdownLayer::new(
            GracefulShutdownConfig::new().purge_interval(Duration::from_millis(100)),
        )
        .with_observers(observers)
        .layer(scripted.clone());
        (store, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn tracks_acquired_forgets_released() {
        let scripted = ScriptedStore::new();
        scripted
            .grant_acquire()
            .grant_acquire()
            .expect_release(Ok(true));
        let (store, _) = tracking(&scripted);
        let a = store.try_acquire(&req("a", 10_000)).await.unwrap();
        store.try_acquire(&req("b", 10_000)).await.unwrap();
        assert_eq!(store.tracked(), 2);
        store.release(&a).await.unwrap();
        assert_eq!(store.tracked(), 1);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn background_purge_drops_expired_entries() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire().grant_acquire();
        let (store, _) = tracking(&scripted);
        store.try_acquire(&req("a", 150)).await.unwrap();
        store.try_acquire(&req("b", 10_000)).await.unwrap();
        tokio::time::sleep(Duration::from_millis(350)).await;
        assert_eq!(store.tracked(), 1, "the purge task removed the expired one");
        assert_eq!(store.purge_expired(), 0);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_releases_every_live_lock_then_refuses() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire().grant_acquire().grant_acquire();
        let (store, seen) = tracking(&scripted);
        store.try_acquire(&req("a", 10_000)).await.unwrap();
        store.try_acquire(&req("b", 10_000)).await.unwrap();
        store.try_acquire(&req("expired", 50)).await.unwrap();
        tokio::time::advance(Duration::from_millis(60)).await;
        scripted.expect_release(Ok(true)).expect_release(Ok(true));
        assert_eq!(store.shutdown().await.unwrap(), 2);
        assert_eq!(
            scripted.count(Op::Release),
            2,
            "the expired lock is not released"
        );
        assert_eq!(scripted.count(Op::Shutdown), 1, "inner store shut down too");
        assert_eq!(
            seen.names(),
            ["released_at_shutdown", "released_at_shutdown"]
        );
        let err = store.try_acquire(&req("c", 1000)).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ShutDown);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_counts_only_what_was_released() {
        let scripted = ScriptedStore::new();
        scripted.grant_acquire().grant_acquire().grant_acquire();
        let (store, seen) = tracking(&scripted);
        for k in ["a", "b", "c"] {
            store.try_acquire(&req(k, 10_000)).await.unwrap();
        }
        scripted
            .expect_release(Ok(true))
            .expect_release(Ok(false))
            .expect_release(Err(Error::connection("down")));
        assert_eq!(store.shutdown().await.unwrap(), 1);
        assert_eq!(seen.names(), ["released_at_shutdown"]);
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_respects_its_deadline() {
        let hung = ScriptedStore::new();
        hung.grant_acquire();
        let store =
            ShutdownLayer::new(GracefulShutdownConfig::new().deadline(Duration::from_secs(1)))
                .layer(NeverRelease(hung.clone()));
        store.try_acquire(&req("b", 60_000)).await.unwrap();
        let started = Instant::now();
        assert_eq!(store.shutdown().await.unwrap(), 0);
        assert_eq!(
            started.elapsed(),
            Duration::from_secs(1),
            "gave up at the deadline"
        );
        hung.verify();
    }

    #[cfg(feature = "signal")]
    #[test]
    fn signal_handler_needs_a_runtime_and_installs_once() {
        let locks = crate::LockManager::builder()
            .client_id("c")
            .farm_id("f")
            .graceful_shutdown(GracefulShutdownConfig::default())
            .build()
            .unwrap();
        let err = locks.install_signal_handler().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Internal, "outside a runtime: {err}");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            locks.install_signal_handler().unwrap();
            let again = locks.install_signal_handler().unwrap_err();
            assert_eq!(
                again.kind(),
                ErrorKind::Internal,
                "one handler per process: {again}"
            );
            assert!(
                again.to_string().contains("call LockManager::shutdown"),
                "says what to do instead: {again}"
            );
        });
    }

    /// A store whose release never completes.
    #[derive(Debug)]
    struct NeverRelease(ScriptedStore);

    impl LockStore for NeverRelease {
        fn name(&self) -> &'static str {
            "never-release"
        }
        fn capabilities(&self) -> Capabilities {
            Capabilities::NONE
        }
        async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
            self.0.try_acquire(req).await
        }
        async fn release(&self, _: &Lease) -> Result<bool> {
            futures::future::pending().await
        }
        async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
            self.0.extend(lease, ttl).await
        }
        async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
            self.0.inspect(key).await
        }
    }

    #[tokio::test(start_paused = true)]
    async fn acquisition_landing_after_the_sweep_is_given_back() {
        let scripted = ScriptedStore::new();
        let (gate_tx, gate_rx) = tokio::sync::oneshot::channel::<()>();
        let s = scripted.clone();
        scripted.expect_acquire_after(
            async move {
                let _ = gate_rx.await;
            },
            move |r| Ok(s.lease_for(r)),
        );
        scripted.expect_release(Ok(true));
        let (store, _) = tracking(&scripted);
        let store = Arc::new(store);
        let s2 = store.clone();
        let in_flight = tokio::spawn(async move { s2.try_acquire(&req("late", 10_000)).await });
        tokio::task::yield_now().await;
        assert_eq!(store.shutdown().await.unwrap(), 0);
        gate_tx.send(()).unwrap();
        let err = in_flight.await.unwrap().unwrap_err();
        assert_eq!(err.kind(), ErrorKind::ShutDown);
        assert_eq!(scripted.count(Op::Release), 1, "given back at once");
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn a_failed_release_stays_tracked_and_shutdown_releases_it() {
        let scripted = ScriptedStore::new();
        scripted
            .grant_acquire()
            .expect_release(Err(Error::connection("scripted: connection reset")))
            .expect_release(Ok(true));
        let (store, seen) = tracking(&scripted);
        let lease = store.try_acquire(&req("a", 10_000)).await.unwrap();
        let err = store.release(&lease).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Connection);
        assert_eq!(store.tracked(), 1, "the lock may still be in the store");
        assert_eq!(store.shutdown().await.unwrap(), 1);
        assert_eq!(seen.names(), ["released_at_shutdown"]);
        assert_eq!(scripted.calls()[2].token.as_ref(), Some(lease.token()));
        scripted.verify();
    }

    #[tokio::test(start_paused = true)]
    async fn an_extend_landing_after_the_purge_is_tracked_again() {
        let scripted = ScriptedStore::new();
        let (open, rx) = tokio::sync::oneshot::channel::<()>();
        scripted
            .grant_acquire()
            .expect_extend_after(
                async move {
                    let _ = rx.await;
                },
                |lease, ttl| Ok(lease.renewed(ttl, Instant::now())),
            )
            .expect_release(Ok(true));
        let (store, _) = tracking(&scripted);
        let store = Arc::new(store);
        let lease = store.try_acquire(&req("a", 1000)).await.unwrap();
        tokio::time::advance(Duration::from_millis(900)).await;
        let extending = {
            let (store, lease) = (store.clone(), lease.clone());
            tokio::spawn(async move { store.extend(&lease, Duration::from_secs(10)).await })
        };
        tokio::task::yield_now().await;
        tokio::time::advance(Duration::from_millis(200)).await;
        assert_eq!(store.purge_expired(), 1, "expired as far as the layer knew");
        open.send(()).unwrap();
        extending.await.unwrap().unwrap();
        assert_eq!(store.tracked(), 1, "the store holds it for 10 s more");
        assert_eq!(
            store.shutdown().await.unwrap(),
            1,
            "so the shutdown releases it"
        );
        scripted.verify();
    }
}
