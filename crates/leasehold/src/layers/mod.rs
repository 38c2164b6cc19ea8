//! The scenario layers: Bond's scenarios as composable middlewares over any [`LockStore`](crate::LockStore).
//!
//! Each layer is one folder, `layers/<name>/`: `mod.rs` holds the module docs (what it guarantees,
//! where it belongs, what it costs), one type that is both its configuration and its
//! [`Layer`](crate::core::Layer) (`<Name>Layer`, as tower's `TimeoutLayer`), and the store it wraps
//! around another (`<Name><S>`); its tests sit beside it in `tests.rs`. The wrapper implements
//! [`LayeredStore`](crate::core::LayeredStore), so it writes only the operations its scenario changes
//! and forwards the rest. One word names a layer everywhere: module, types, builder method, docs
//! and events. Each reports what it did through the manager's one observer hook
//! ([`LockEvent`](crate::LockEvent)), so metrics and tracing attach without touching the layers.
//!
//! | layer | Bond | guarantee |
//! |---|---|---|
//! | [`reentrancy`] | 3.6 | a holder re-taking its own key counts up instead of deadlocking |
//! | [`local_competition`] | 3.4 | local contenders meet in memory: fast-fail, local wake-up, optional hand-off |
//! | [`graceful_shutdown`] | 3.5 | every live lock is released at shutdown (and on SIGINT/SIGTERM) |
//! | [`unlock_window`] | 3.2 | a release is sent only while the lease can still be ours |
//! | [`readback`] | 3.1 | an in-doubt reply is resolved by reading the record back |
//! | [`counting`] | — | counts the requests that reach the store (benchmarks, tests) |
//!
//! # The default stack and its order
//! [`LockManager::builder`](crate::LockManager::builder) enables all five by default; each can be
//! configured or turned off with its own builder method (`.readback(false)`), and
//! [`without_layers`](crate::LockManagerBuilder::without_layers) turns them all off. Whatever is
//! enabled is assembled in this order, outer → inner:
//!
//! ```text
//! manager → Reentrancy → LocalCompetition → GracefulShutdown → UnlockWindow → Readback → [custom .layer()s] → store
//! ```
//!
//! - **Reentrancy outermost**: a holder re-taking a key it holds is answered first, so it is never
//!   fast-failed or made to wait by local competition on its own key, and costs no I/O.
//! - **Local competition next**: before anything that does I/O, so a local fast-fail or local wait
//!   costs none, and a local hand-off is invisible below (the layers below see one store lease).
//! - **Graceful shutdown below local competition**: it sees each real store lease exactly once
//!   (not once per reentrant level or local holder), and its shutdown releases go through the
//!   unlock window and readback like any other release.
//! - **Unlock window above readback**: a release outside the window is skipped before any I/O;
//!   one inside it that ends in doubt is then read back.
//! - **Readback innermost**, around the store: it must see the store's own in-doubt replies, and
//!   everything above sees only resolved outcomes.
//! - **Custom layers** added with [`LockManagerBuilder::layer`](crate::LockManagerBuilder::layer)
//!   wrap the store directly, inside readback (a timeout or fault-injection layer belongs there:
//!   its in-doubt errors are then read back).
//!
//! A disabled layer is left out: no pass-through is written by hand. A layer's configuration holds
//! only its settings; the manager builds every layer with its [`Wiring`] ([`WiredLayer`]): its
//! observers, and its [`Lifecycle`](crate::core::Lifecycle), which the layers that act at shutdown
//! (local competition, graceful shutdown) share: one closing signal and one tracker of background
//! releases.
//!
//! ## What another order would do
//! - Local competition outside reentrancy: a holder re-taking its key is fast-failed (try-lock)
//!   or waits for itself until its deadline (blocking lock).
//! - Graceful shutdown above local competition: hand-offs hide store releases from it; it would
//!   release leases a local waiter had just received, or miss them.
//! - Readback above the unlock window: a skipped release is never in doubt, so nothing changes;
//!   but readback above graceful shutdown would leave an in-doubt acquire untracked.
//!
//! # Writing a layer
//! A layer is its configuration, a [`Layer`](crate::core::Layer) impl, and a wrapper that overrides
//! only what its scenario changes. This one refuses releases of leases older than a limit:
//!
//! ```
//! use std::time::Duration;
//! use leasehold::core::{Layer, LayeredStore};
//! use leasehold::{Error, Lease, LockStore, Result};
//!
//! /// Refuses to release leases held longer than `max`.
//! #[derive(Debug, Clone)]
//! pub struct MaxHoldLayer { max: Duration }
//!
//! #[derive(Debug)]
//! pub struct MaxHold<S> { inner: S, max: Duration }
//!
//! impl<S: LockStore> Layer<S> for MaxHoldLayer {
//!     type Store = MaxHold<S>;
//!     fn layer(&self, inner: S) -> MaxHold<S> { MaxHold { inner, max: self.max } }
//! }
//!
//! impl<S: LockStore> LayeredStore for MaxHold<S> {
//!     type Inner = S;
//!     fn inner(&self) -> &S { &self.inner }
//!     // acquire, extend, inspect, list, shutdown: forwarded.
//!     async fn release(&self, lease: &Lease) -> Result<bool> {
//!         if lease.acquired_at().elapsed() > self.max {
//!             return Err(Error::invalid_argument("held too long"));
//!         }
//!         self.inner.release(lease).await
//!     }
//! }
//!
//! # fn main() -> leasehold::Result<()> {
//! let locks = leasehold::LockManager::builder()
//!     .client_id("c").farm_id("f")
//!     .layer(MaxHoldLayer { max: Duration::from_secs(60) })
//!     .build()?;
//! # let _ = locks; Ok(()) }
//! ```
//!
//! # Using a layer alone
//! Every layer wraps any store, the embedded one included:
//!
//! ```
//! use std::time::Duration;
//! use leasehold::layers::ReadbackLayer;
//! use leasehold::core::{Acquire, Layer};
//! use leasehold::{LockKey, LockStore, MemoryStore, OwnerToken};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! let store = ReadbackLayer::new().layer(MemoryStore::new());
//! let req = Acquire::new(LockKey::xdc("c", "e")?, OwnerToken::generate(), Duration::from_secs(2));
//! let lease = store.try_acquire(&req).await?;
//! assert!(store.release(&lease).await?);
//! # Ok(()) }
//! ```

pub mod counting;
pub mod graceful_shutdown;
pub mod local_competition;
pub mod readback;
pub mod reentrancy;
pub mod unlock_window;
mod wiring;

pub use counting::{Counting, CountingLayer, RequestCounts};
pub use graceful_shutdown::{GracefulShutdown, GracefulShutdownLayer};
pub use local_competition::{LocalCompetition, LocalCompetitionLayer};
pub use readback::{Readback, ReadbackLayer, MAX_READBACK_RETRIES};
pub use reentrancy::{Reentrancy, ReentrancyLayer};
pub use unlock_window::{UnlockWindow, UnlockWindowLayer};
pub use wiring::{WiredLayer, Wiring};

/// The scenario layers, named once: hands `name: Type` for each to `$then!`. A scenario's
/// [`LayerSettings`](crate::scenario::LayerSettings), the builder's stack and the scenario file's
/// `[scenario.layers]` table are generated from this list, so a new layer is added here (its
/// place in the stack's order is the builder's `assemble`).
macro_rules! scenario_layers {
    ($then:ident) => {
        $then! {
            readback: $crate::layers::ReadbackLayer,
            unlock_window: $crate::layers::UnlockWindowLayer,
            local_competition: $crate::layers::LocalCompetitionLayer,
            reentrancy: $crate::layers::ReentrancyLayer,
            graceful_shutdown: $crate::layers::GracefulShutdownLayer,
        }
    };
}
pub(crate) use scenario_layers;

#[cfg(test)]
pub(crate) mod test_support {
    use std::time::Duration;

    use crate::core::{Acquire, LockKey, OwnerToken};

    pub(crate) fn key(entity: &str) -> LockKey {
        LockKey::dc("f1", "test", entity).unwrap()
    }

    pub(crate) fn req(entity: &str, ttl_ms: u64) -> Acquire {
        Acquire::new(
            key(entity),
            OwnerToken::generate(),
            Duration::from_millis(ttl_ms),
        )
    }

    pub(crate) mod events {
        use std::sync::{Arc, Mutex};

        use crate::core::{LockEvent, Observers};

        /// Events seen by a capturing observer.
        #[derive(Clone, Default)]
        pub(crate) struct Seen(Arc<Mutex<Vec<LockEvent>>>);

        impl Seen {
            pub(crate) fn all(&self) -> Vec<LockEvent> {
                self.0.lock().unwrap().clone()
            }

            pub(crate) fn names(&self) -> Vec<&'static str> {
                self.all().iter().map(LockEvent::name).collect()
            }
        }

        pub(crate) fn capture() -> (Observers, Seen) {
            let seen = Seen::default();
            let sink = seen.clone();
            let observers = Observers::default()
                .with(move |e: &LockEvent| sink.0.lock().unwrap().push(e.clone()));
            (observers, seen)
        }

        /// A stack's wiring whose observer captures the events (and a lifecycle of its own).
        pub(crate) fn wiring() -> (crate::layers::Wiring, Seen) {
            let (observers, seen) = capture();
            (
                crate::layers::Wiring::new(observers, Default::default()),
                seen,
            )
        }
    }
}

/// The store contract holds through the full default stack, and through each layer alone, over
/// the embedded store.
#[cfg(test)]
mod conformance {
    use crate::core::Layer;
    use crate::MemoryStore;

    mod full_stack {
        leasehold_testkit::conformance_tests!(async {
            crate::LockManager::builder()
                .client_id("conformance")
                .farm_id("conf")
                .default_layers()
                .build()
                .unwrap()
                .store()
                .clone()
        });
    }

    mod readback_alone {
        use super::*;
        leasehold_testkit::conformance_tests!(async {
            crate::layers::ReadbackLayer::new().layer(MemoryStore::new())
        });
    }

    mod unlock_window_alone {
        use super::*;
        leasehold_testkit::conformance_tests!(async {
            crate::layers::UnlockWindowLayer::new().layer(MemoryStore::new())
        });
    }

    mod local_competition_alone {
        use super::*;
        leasehold_testkit::conformance_tests!(async {
            crate::layers::LocalCompetitionLayer::default().layer(MemoryStore::new())
        });
    }

    mod local_with_hand_off_alone {
        use super::*;
        leasehold_testkit::conformance_tests!(async {
            crate::layers::LocalCompetitionLayer::new()
                .hand_off(true)
                .layer(MemoryStore::new())
        });
    }

    mod reentrancy_alone {
        use super::*;
        leasehold_testkit::conformance_tests!(async {
            crate::layers::ReentrancyLayer::new().layer(MemoryStore::new())
        });
    }

    mod graceful_shutdown_alone {
        use super::*;
        leasehold_testkit::conformance_tests!(async {
            crate::layers::GracefulShutdownLayer::new().layer(MemoryStore::new())
        });
    }
}

/// The layers assembled by the builder, over the embedded store.
#[cfg(test)]
mod stack {
    use std::time::Duration;

    use super::test_support::events;
    use super::*;
    use crate::{ErrorKind, Holder, LockManager, LockOptions, MemoryStore};

    fn manager(
        builder: impl FnOnce(crate::LockManagerBuilder) -> crate::LockManagerBuilder,
    ) -> (LockManager, std::sync::Arc<RequestCounts>, events::Seen) {
        let counting = CountingLayer::new();
        let counts = counting.counts();
        let (observers, seen) = events::capture();
        let mut b = LockManager::builder()
            .client_id("c")
            .farm_id("f")
            .without_layers()
            .store(MemoryStore::new())
            .layer(counting);
        b = b.observer(move |e: &crate::LockEvent| observers.emit(|| e.clone()));
        (builder(b).build().unwrap(), counts, seen)
    }

    #[tokio::test(start_paused = true)]
    async fn default_stack_fast_fails_reenters_and_releases_at_shutdown() {
        let (locks, counts, seen) = manager(|b| b.default_layers());
        let me = Holder::new();
        let a = locks
            .try_lock_with("a", LockOptions::new().holder(me))
            .await
            .unwrap();
        let a2 = locks
            .try_lock_with("a", LockOptions::new().holder(me))
            .await
            .unwrap();
        let err = locks.try_lock("a").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::LockUnavailable);
        assert_eq!(
            counts.acquires(),
            1,
            "reentry and fast-fail cost no store I/O"
        );
        let _b = locks.try_lock("b").await.unwrap();
        drop(a2);
        drop(a);
        tokio::task::yield_now().await;
        let _a = locks.try_lock("a").await.unwrap();
        assert_eq!(
            locks.shutdown().await.unwrap(),
            2,
            "both live locks released"
        );
        assert!(locks.list("").await.unwrap().is_empty());
        let names = seen.names();
        for expected in ["reentered", "fast_failed", "released_at_shutdown"] {
            assert!(names.contains(&expected), "{expected} in {names:?}");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn shutdown_is_not_held_up_by_local_waiters() {
        let (locks, _, _) = manager(|b| b.default_layers());
        let _held = locks.try_lock("a").await.unwrap();
        let l = locks.clone();
        let waiter = tokio::spawn(async move { l.lock("a").await.map(drop) });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        let started = tokio::time::Instant::now();
        assert_eq!(locks.shutdown().await.unwrap(), 1);
        assert!(started.elapsed() < crate::DEFAULT_SHUTDOWN_TIMEOUT);
        assert_eq!(
            waiter.await.unwrap().unwrap_err().kind(),
            ErrorKind::ShutDown
        );
    }

    #[tokio::test(start_paused = true)]
    async fn late_release_is_skipped_by_the_unlock_window() {
        let (locks, counts, seen) = manager(|b| b.unlock_window(UnlockWindowLayer::new()));
        let guard = locks
            .try_lock_with("a", LockOptions::new().ttl(Duration::from_secs(1)))
            .await
            .unwrap();
        tokio::time::advance(Duration::from_millis(900)).await;
        assert!(!guard.release().await.unwrap());
        assert_eq!(counts.releases(), 0);
        assert!(seen.names().contains(&"release_skipped"));
    }

    #[tokio::test]
    async fn hot_key_with_hand_off_needs_few_store_requests() {
        let (locks, counts, _) = manager(|b| {
            b.local_competition(LocalCompetitionLayer::new().hand_off(true))
                .lock_ttl(Duration::from_secs(30))
        });
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let locks = locks.clone();
                tokio::spawn(async move {
                    for _ in 0..50 {
                        let guard = locks.lock("hot").await.unwrap();
                        tokio::task::yield_now().await;
                        guard.release().await.unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
        assert!(
            counts.acquires() < 400,
            "{} store acquisitions for 400 lock acquisitions",
            counts.acquires()
        );
        assert_eq!(
            locks.inspect("hot").await.unwrap(),
            None,
            "finally released"
        );
    }
}
