//! Elections on the embedded store: of N candidates exactly one leads at a time and terms grow;
//! resigning, dropping or shutting down hands leadership over at once; a leader whose lock is
//! broken or who cannot renew finds its leadership lost; `observe` sees every change in order;
//! `lead` cancels its work on loss and campaigns again. Paused time throughout.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use leasehold::{
    Error, ErrorKind, Lease, LockManager, LockOptions, LockStore, MemoryStore, Result,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(6);

/// One "process" of the fleet over the shared store.
fn instance(store: impl LockStore) -> LockManager {
    LockManager::builder()
        .client_id("svc")
        .farm_id("f1")
        .store(store)
        .default_layers()
        .build()
        .expect("manager")
}

fn short() -> LockOptions {
    LockOptions::new().ttl(TTL).wait(Duration::from_secs(3600))
}

#[tokio::test(start_paused = true)]
async fn of_n_candidates_exactly_one_leads_at_a_time_and_terms_grow() {
    let store = MemoryStore::new();
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut candidates = Vec::new();
    for i in 0..5 {
        // Two candidates per "process" for some: they compete like any others.
        let locks = instance(store.clone());
        for _ in 0..(1 + i % 2) {
            let (locks, leading, terms) = (locks.clone(), leading.clone(), terms.clone());
            candidates.push(tokio::spawn(async move {
                for _ in 0..3 {
                    let leadership = locks.campaign_with("primary", short()).await.unwrap();
                    assert_eq!(
                        leading.fetch_add(1, Ordering::SeqCst),
                        0,
                        "two leaders at once"
                    );
                    terms
                        .lock()
                        .unwrap()
                        .push(leadership.term().expect("fenced"));
                    tokio::time::sleep(Duration::from_millis(700)).await;
                    assert!(leadership.is_leader());
                    leading.fetch_sub(1, Ordering::SeqCst);
                    assert!(leadership.resign().await.unwrap());
                }
            }));
        }
    }
    for candidate in candidates {
        candidate.await.unwrap();
    }
    let terms = terms.lock().unwrap().clone();
    assert_eq!(terms.len(), 7 * 3);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms grow: {terms:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn resigning_or_dropping_hands_leadership_over_at_once() {
    let store = MemoryStore::new();
    let a = instance(store.clone());
    let b = instance(store.clone());

    let first = a.campaign_with("primary", short()).await.unwrap();
    let next = tokio::spawn(async move {
        let leadership = b.campaign_with("primary", short()).await.unwrap();
        (leadership, Instant::now())
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let resigned_at = Instant::now();
    assert!(first.resign().await.unwrap());
    let (second, led_at) = next.await.unwrap();
    // Long before the TTL would have freed it: the resignation handed it over.
    assert!(led_at - resigned_at < TTL / 2);
    assert!(second.term() > Some(1));

    let c = instance(store.clone());
    let third = tokio::spawn(async move {
        let leadership = c.campaign_with("primary", short()).await.unwrap();
        (leadership, Instant::now())
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let dropped_at = Instant::now();
    drop(second);
    let (third, led_at) = third.await.unwrap();
    assert!(led_at - dropped_at < TTL / 2);
    assert!(third.is_leader());
}

#[tokio::test(start_paused = true)]
async fn shutting_the_leaders_manager_down_resigns() {
    let store = MemoryStore::new();
    let a = instance(store.clone());
    let b = instance(store.clone());
    let leadership = a.campaign_with("primary", short()).await.unwrap();
    let next = tokio::spawn(async move { b.campaign_with("primary", short()).await.map(drop) });
    tokio::time::sleep(Duration::from_secs(1)).await;
    let shut_at = Instant::now();
    a.shutdown().await.unwrap();
    let lost = leadership.lost().await;
    assert_eq!(lost.kind(), ErrorKind::NotHeld);
    assert!(!leadership.is_leader());
    next.await.unwrap().unwrap();
    assert!(Instant::now() - shut_at < TTL / 2);
    // A campaign on a manager that is shut down ends with that error.
    let err = a.campaign("primary").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
}

#[tokio::test(start_paused = true)]
async fn a_leader_whose_lock_is_broken_sees_lost_and_its_term_is_superseded() {
    let store = MemoryStore::new();
    let a = instance(store.clone());
    let b = instance(store.clone());
    let leadership = a.campaign_with("primary", short()).await.unwrap();
    // An operator force-releases the election lock (an owner-checked delete with its token).
    assert!(store.release(&leadership.lease()).await.unwrap());
    let usurper = b.campaign_with("primary", short()).await.unwrap();

    let lost = leadership.lost().await;
    assert_eq!(lost.kind(), ErrorKind::NotHeld, "{lost}");
    assert!(!leadership.is_leader());
    assert!(usurper.term() > leadership.term());
    assert!(
        !leadership.resign().await.unwrap(),
        "nothing left to resign"
    );
    assert!(usurper.is_leader());
}

/// The embedded store, with renewals failing on demand (the store unreachable from this
/// candidate only).
#[derive(Debug)]
struct Cut {
    inner: MemoryStore,
    cut: AtomicBool,
}

impl leasehold::core::LayeredStore for Cut {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if self.cut.load(Ordering::SeqCst) {
            return Err(Error::connection("cannot reach 127.0.0.1:1"));
        }
        self.inner.extend(lease, ttl).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_leader_that_cannot_renew_stops_believing_it_leads_before_another_can_lead() {
    let store = MemoryStore::new();
    let cut = Arc::new(Cut {
        inner: store.clone(),
        cut: AtomicBool::new(false),
    });
    let a = instance(cut.clone());
    let b = instance(store.clone());
    let leadership = a.campaign_with("primary", short()).await.unwrap();
    let term = leadership.term();
    tokio::time::sleep(TTL * 2).await;
    assert!(leadership.is_leader(), "renewed while the store answers");

    cut.cut.store(true, Ordering::SeqCst);
    let other = tokio::spawn(async move {
        let leadership = b.campaign_with("primary", short()).await.unwrap();
        (leadership.term(), Instant::now())
    });
    let lost = leadership.lost().await;
    let lost_at = Instant::now();
    assert_eq!(lost.kind(), ErrorKind::NotHeld, "{lost}");
    assert!(!leadership.is_leader());
    let (new_term, led_at) = other.await.unwrap();
    assert!(
        lost_at <= led_at,
        "the old leader knew before the new one led"
    );
    assert!(new_term > term);
}

#[tokio::test(start_paused = true)]
async fn observe_sees_every_change_in_order() {
    let store = MemoryStore::new();
    let watcher = instance(store.clone());
    let mut changes = Box::pin(watcher.observe_every("primary", Duration::from_millis(100)));
    assert_eq!(
        changes.next().await.unwrap().unwrap(),
        None,
        "nobody leads yet"
    );

    let mut terms = Vec::new();
    for round in 0..4 {
        let locks = instance(store.clone());
        let leadership = locks.campaign_with("primary", short()).await.unwrap();
        terms.push(leadership.term());
        let seen = changes.next().await.unwrap().unwrap().expect("a leader");
        assert_eq!(seen.term, leadership.term(), "round {round}");
        assert_eq!(&seen.token, leadership.token());
        assert_eq!(seen.pid, Some(std::process::id()));
        assert!(seen.host.is_some() && seen.since.is_some());
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(leadership.resign().await.unwrap());
        assert_eq!(changes.next().await.unwrap().unwrap(), None);
        assert_eq!(watcher.leader("primary").await.unwrap(), None);
    }
    assert!(terms.windows(2).all(|w| w[0] < w[1]));
}

#[tokio::test(start_paused = true)]
async fn lead_cancels_its_work_on_loss_and_campaigns_again() {
    let store = MemoryStore::new();
    let locks = instance(store.clone());
    let started = Arc::new(Mutex::new(Vec::new()));
    let cancelled = Arc::new(AtomicUsize::new(0));

    /// Counts a work future dropped before it finished.
    struct OnDrop(Arc<AtomicUsize>);
    impl Drop for OnDrop {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    let leader = {
        let (locks, started, cancelled) = (locks.clone(), started.clone(), cancelled.clone());
        tokio::spawn(async move {
            locks
                .lead("primary", move |lease: Lease| {
                    started.lock().unwrap().push(lease.clone());
                    let cancelled = cancelled.clone();
                    async move {
                        let _on_drop = OnDrop(cancelled);
                        std::future::pending::<()>().await;
                    }
                })
                .await
        })
    };
    // Lead, then have the election lock broken twice: each time the work is cancelled and the
    // loop leads again under a greater term.
    for round in 1..=2 {
        while started.lock().unwrap().len() < round {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let lease = started.lock().unwrap()[round - 1].clone();
        assert!(store.release(&lease).await.unwrap());
        while cancelled.load(Ordering::SeqCst) < round {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    while started.lock().unwrap().len() < 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let terms: Vec<_> = started
        .lock()
        .unwrap()
        .iter()
        .map(Lease::fencing_token)
        .collect();
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");

    // Shutdown ends the loop (and resigns).
    locks.shutdown().await.unwrap();
    leader.await.unwrap().unwrap();
    assert_eq!(locks.leader("primary").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn lead_campaigns_again_after_its_work_returns() {
    let locks = instance(MemoryStore::new());
    let runs = Arc::new(AtomicUsize::new(0));
    let seen = runs.clone();
    let stopper = locks.clone();
    let leader = tokio::spawn(async move {
        let locks = stopper;
        locks
            .lead("primary", move |_lease| {
                let runs = seen.clone();
                async move {
                    runs.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            })
            .await
    });
    while runs.load(Ordering::SeqCst) < 3 {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    locks.shutdown().await.unwrap();
    leader.await.unwrap().unwrap();
}

#[path = "suites/election.rs"]
mod suite;

/// The behaviour every store runs (`tests/suites/election.rs`), on the embedded store in real
/// time: each instance its own manager over one shared store, as processes sharing a server.
mod shared {
    use std::future::Future;
    use std::pin::Pin;

    use leasehold::{LockManager, MemoryStore};

    use super::suite;

    struct Deployment(MemoryStore);

    impl suite::Fleet for Deployment {
        fn instance(&self) -> Pin<Box<dyn Future<Output = LockManager> + Send + '_>> {
            Box::pin(async move { super::instance(self.0.clone()) })
        }
    }

    suite::election_suite!(Deployment(MemoryStore::new()));
}
