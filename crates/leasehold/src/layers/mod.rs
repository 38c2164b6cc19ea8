//! The scenario layers: Bond's scenarios as composable middlewares over any [`LockStore`](crate::LockStore).
//!
//! Each layer is one module with a config type (`…Config`), a [`Layer`](crate::Layer) (`…Layer`)
//! and the store it wraps around another (`Readback<S>`, …), and overrides only the operations its
//! scenario changes. ([`LocalCompetitionLayer`] is both its configuration and its layer.) Each reports what it did through the manager's one observer hook
//! ([`LockEvent`](crate::LockEvent)), so metrics and tracing attach without touching the layers.
//!
//! | layer | Bond | guarantee |
//! |---|---|---|
//! | [`reentrancy`] | 3.6 | a holder re-taking its own key counts up instead of deadlocking |
//! | [`local_competition`] | 3.4 | local contenders meet in memory: fast-fail, local wake-up, optional hand-off |
//! | [`shutdown`] | 3.5 | every live lock is released at shutdown (and on SIGINT/SIGTERM) |
//! | [`unlock_window`] | 3.2 | a release is sent only while the lease can still be ours |
//! | [`readback`] | 3.1 | an in-doubt reply is resolved by reading the record back |
//! | [`counting`] | — | counts the requests that reach the store (benchmarks, tests) |
//!
//! # The default stack and its order
//! [`LockManagerBuilder::default_layers`](crate::LockManagerBuilder::default_layers) enables all
//! five; each can also be enabled and configured alone with its own builder method. Whatever is
//! enabled is assembled in this order, outer → inner:
//!
//! ```text
//! manager → Reentrancy → LocalCompetition → ShutdownTracking → UnlockWindow → Readback → [custom .layer()s] → store
//! ```
//!
//! - **Reentrancy outermost**: a holder re-taking a key it holds is answered first, so it is never
//!   fast-failed or made to wait by local competition on its own key, and costs no I/O.
//! - **Local competition next**: before anything that does I/O, so a local fast-fail or local wait
//!   costs none, and a local hand-off is invisible below (the layers below see one store lease).
//! - **Shutdown tracking below local competition**: it sees each real store lease exactly once
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
//! ## What another order would do
//! - Local competition outside reentrancy: a holder re-taking its key is fast-failed (try-lock)
//!   or waits for itself until its deadline (blocking lock).
//! - Shutdown tracking above local competition: hand-offs hide store releases from it; it would
//!   release leases a local waiter had just received, or miss them.
//! - Readback above the unlock window: a skipped release is never in doubt, so nothing changes;
//!   but readback above shutdown tracking would leave an in-doubt acquire untracked.
//!
//! # Using a layer alone
//! Every layer wraps any store, the embedded one included:
//!
//! ```
//! use std::time::Duration;
//! use leasehold::layers::{ReadbackConfig, ReadbackLayer};
//! use leasehold::{Acquire, Layer, LockKey, LockStore, MemoryStore, OwnerToken};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! let store = ReadbackLayer::new(ReadbackConfig::new()).layer(MemoryStore::new());
//! let req = Acquire::new(LockKey::xdc("c", "e")?, OwnerToken::generate(), Duration::from_secs(2));
//! let lease = store.try_acquire(&req).await?;
//! assert!(store.release(&lease).await?);
//! # Ok(()) }
//! ```

pub mod counting;
pub mod local_competition;
pub mod readback;
pub mod reentrancy;
pub mod shutdown;
pub mod unlock_window;

pub use counting::{Counting, CountingLayer, RequestCounts};
pub use local_competition::{LocalCompetition, LocalCompetitionLayer};
pub use readback::{Readback, ReadbackConfig, ReadbackLayer};
pub use reentrancy::{ReentrancyConfig, ReentrancyLayer, Reentrant};
pub use shutdown::{GracefulShutdownConfig, ShutdownLayer, ShutdownTracking};
pub use unlock_window::{UnlockWindow, UnlockWindowConfig, UnlockWindowLayer};

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
            crate::layers::ReadbackLayer::default().layer(MemoryStore::new())
        });
    }

    mod unlock_window_alone {
        use super::*;
        leasehold_testkit::conformance_tests!(async {
            crate::layers::UnlockWindowLayer::default().layer(MemoryStore::new())
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
            crate::layers::ReentrancyLayer::default().layer(MemoryStore::new())
        });
    }

    mod shutdown_tracking_alone {
        use super::*;
        leasehold_testkit::conformance_tests!(async {
            crate::layers::ShutdownLayer::default().layer(MemoryStore::new())
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
        let (locks, counts, seen) = manager(|b| b.unlock_window(UnlockWindowConfig::default()));
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
