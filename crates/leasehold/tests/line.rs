//! The manager's line with local competition in the stack, over a scripted store on paused time:
//! waiters of one process are woken by its releases, only the head asks the store, a head that
//! stops waiting hands its place on, a process served behind others waits for the store's word,
//! and a released lease is handed to the head without store I/O when hand-off is on.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::layers::LocalCompetitionLayer;
use leasehold::{ErrorKind, LockEvent, LockGuard, LockManager, LockOptions, MemoryStore, Result};
use leasehold_testkit::scripted::{Op, ScriptedStore};
use tokio::task::JoinHandle;
use tokio::time::Instant;

type Events = Arc<Mutex<Vec<LockEvent>>>;

/// A manager over `store` with local competition (`layer`) as its only layer, no renewal.
fn manager(store: &ScriptedStore, layer: LocalCompetitionLayer) -> (LockManager, Events) {
    let events: Events = Arc::default();
    let sink = events.clone();
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(store.clone())
        .without_layers()
        .local_competition(layer)
        .renewal(false)
        .task_holders(false)
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    (locks, events)
}

fn wait(secs: u64) -> LockOptions {
    LockOptions::new().wait(Duration::from_secs(secs))
}

/// A task waiting (`lock_with`, `wait_secs`) for `key`.
fn spawn_waiter(
    locks: &LockManager,
    key: &'static str,
    wait_secs: u64,
) -> JoinHandle<Result<LockGuard>> {
    let locks = locks.clone();
    tokio::spawn(async move { locks.lock_with(key, wait(wait_secs)).await })
}

/// Takes `a` for `secs` seconds.
async fn hold(locks: &LockManager, secs: u64) -> LockGuard {
    let ttl = LockOptions::new().ttl(Duration::from_secs(secs));
    locks.try_lock_with("a", ttl).await.unwrap()
}

/// Lets spawned tasks run until they park (no time passes).
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn a_blocking_lock_is_woken_by_the_local_release() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_release(Ok(true))
        .grant_acquire();
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let first = locks.try_lock("a").await.unwrap();
    let waiter = spawn_waiter(&locks, "a", 60);
    settle().await;
    assert_eq!(
        scripted.count(Op::Acquire),
        1,
        "the waiter is refused in memory"
    );
    let started = Instant::now();
    let first_token = first.token().clone();
    first.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "woken at once, not by polling"
    );
    assert_ne!(second.token(), &first_token);
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Release, Op::Acquire]);
    std::mem::forget(second);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_blocking_lock_behind_a_local_holder_times_out_without_store_io() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let held = hold(&locks, 60).await;
    let err = locks.lock_with("a", wait(2)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert_eq!(scripted.count(Op::Acquire), 1);
    std::mem::forget(held);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_when_a_leaked_lease_expires() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_acquire();
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let leaked = hold(&locks, 1).await;
    std::mem::forget(leaked);
    let started = Instant::now();
    let next = locks.lock_with("a", wait(60)).await.unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_millis(1100),
        "at the lease's expiry: {waited:?}"
    );
    assert_eq!(scripted.count(Op::Acquire), 2, "no store I/O before it");
    std::mem::forget(next);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn the_head_after_a_served_waiter_that_leaks_its_guard_gets_the_key_at_its_expiry() {
    // The head after one served uncontended is woken by that holder's release, not when it
    // becomes head: a guard that is never released must not leave it asleep for its whole wait.
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_release(Ok(true))
        .grant_acquire()
        .grant_acquire();
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let first = locks.try_lock("a").await.unwrap();
    let short = LockOptions::new()
        .wait(Duration::from_secs(60))
        .ttl(Duration::from_secs(1));
    let served = {
        let locks = locks.clone();
        tokio::spawn(async move { locks.lock_with("a", short).await })
    };
    settle().await;
    let next = spawn_waiter(&locks, "a", 60);
    settle().await;
    first.release().await.unwrap();
    let leaked = served.await.unwrap().unwrap();
    let started = Instant::now();
    std::mem::forget(leaked);
    let third = next.await.unwrap().unwrap();
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(1) && waited < Duration::from_millis(1100),
        "as the leaked lease runs out: the head's own look found no release coming, and it \
         asked at once, told how long the lease had left: {waited:?}"
    );
    assert_eq!(scripted.count(Op::Acquire), 3, "no store I/O before it");
    std::mem::forget(third);
    scripted.verify();
}

/// The order in which `waiters` finish, releasing each guard at once.
async fn finishing_order(mut waiters: Vec<(usize, JoinHandle<Result<LockGuard>>)>) -> Vec<usize> {
    let mut order = Vec::new();
    while !waiters.is_empty() {
        settle().await;
        let done = waiters
            .iter()
            .position(|(_, w)| w.is_finished())
            .expect("one waiter has the key");
        let (n, handle) = waiters.remove(done);
        let guard = handle.await.unwrap().expect("granted");
        assert!(
            waiters.iter().all(|(_, w)| !w.is_finished()),
            "one at a time"
        );
        order.push(n);
        guard.release().await.unwrap();
    }
    order
}

#[tokio::test(start_paused = true)]
async fn local_waiters_are_served_in_arrival_order_and_ask_the_store_only_in_turn() {
    let scripted = ScriptedStore::new();
    for _ in 0..6 {
        scripted.grant_acquire().expect_release(Ok(true));
    }
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let held = locks.try_lock("a").await.unwrap();
    let mut waiters = Vec::new();
    for n in 0..4 {
        waiters.push((n, spawn_waiter(&locks, "a", 60)));
        settle().await;
    }
    held.release().await.unwrap();
    // The releasing task asks again at once: it goes to the back of the line.
    waiters.push((4, spawn_waiter(&locks, "a", 60)));
    assert_eq!(finishing_order(waiters).await, [0, 1, 2, 3, 4]);
    assert_eq!(
        scripted.count(Op::Acquire),
        6,
        "one store acquire per grant: nobody asked out of turn"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_refused_head_keeps_its_place_and_nobody_behind_it_asks_the_store() {
    let scripted = ScriptedStore::new();
    // Another process holds the key: the head's try and its first wait's attempt are refused.
    for _ in 0..2 {
        scripted.refuse_acquire();
    }
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let head = spawn_waiter(&locks, "a", 60);
    settle().await;
    assert_eq!(scripted.count(Op::Acquire), 2);
    // Two more tasks of this process arrive while the head waits for the store.
    let second = spawn_waiter(&locks, "a", 60);
    settle().await;
    let third = spawn_waiter(&locks, "a", 60);
    settle().await;
    assert!(
        locks.try_lock("a").await.unwrap_err().is_unavailable(),
        "a try-lock does not pass the line"
    );
    assert_eq!(
        scripted.count(Op::Acquire),
        2,
        "they wait in memory behind the head: the process has one contender in the store"
    );
    // The store lets the head have it at its next poll; the others follow in turn.
    for _ in 0..3 {
        scripted.grant_acquire().expect_release(Ok(true));
    }
    let head = loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        if head.is_finished() {
            break head.await.unwrap().unwrap();
        }
    };
    assert!(!second.is_finished() && !third.is_finished(), "still first");
    head.release().await.unwrap();
    let order = finishing_order(vec![(2, second), (3, third)]).await;
    assert_eq!(
        order,
        [2, 3],
        "then the others, woken by the releases, in turn"
    );
    assert_eq!(scripted.count(Op::Acquire), 5);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_head_that_stops_waiting_hands_its_place_to_the_next() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let held = hold(&locks, 60).await;
    let head = spawn_waiter(&locks, "a", 5);
    settle().await;
    let next = spawn_waiter(&locks, "a", 60);
    settle().await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(
        head.await.unwrap().unwrap_err().kind(),
        ErrorKind::Timeout,
        "the head's wait ended"
    );
    assert!(
        !next.is_finished(),
        "the next is the head now, still waiting"
    );
    scripted.expect_release(Ok(true)).grant_acquire();
    let released_at = Instant::now();
    held.release().await.unwrap();
    let next = next
        .await
        .unwrap()
        .expect("woken by the release, as the head");
    assert_eq!(released_at.elapsed(), Duration::ZERO);
    std::mem::forget(next);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn behind_other_processes_the_next_head_waits_for_the_store_instead_of_asking() {
    let scripted = ScriptedStore::new();
    let this = scripted.clone();
    scripted
        .refuse_acquire()
        .refuse_acquire()
        .expect_acquire_with(move |req| Ok(this.lease_for(req).with_contended(true).into()))
        .expect_release(Ok(true));
    // Hand-off on: a lease other processes queue for still goes back to the store.
    let (locks, events) = manager(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let first = spawn_waiter(&locks, "a", 60);
    settle().await;
    let next = spawn_waiter(&locks, "a", 60);
    settle().await;
    assert_eq!(scripted.count(Op::Acquire), 2, "only the head asked");
    // The head's next poll is granted, with other processes queued in the store.
    let first = loop {
        tokio::time::sleep(Duration::from_millis(1)).await;
        if first.is_finished() {
            break first.await.unwrap().unwrap();
        }
    };
    first.release().await.unwrap();
    let handed = events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::HandedOff { .. }));
    assert!(!handed, "yields to the queue");
    settle().await;
    assert_eq!(
        scripted.count(Op::Acquire),
        3,
        "the process went to the back of the store's line: no request only to be refused"
    );
    // The store's word (here: the next poll) comes; then it asks, and gets it.
    scripted.grant_acquire();
    let next = next.await.unwrap().unwrap();
    assert_eq!(scripted.count(Op::Acquire), 4);
    std::mem::forget(next);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn shutdown_wakes_local_waiters() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().expect_release(Ok(true));
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let _held = locks.try_lock("a").await.unwrap();
    let waiter = spawn_waiter(&locks, "a", 60);
    settle().await;
    locks.shutdown().await.unwrap();
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
}

#[tokio::test(start_paused = true)]
async fn a_wake_up_arriving_as_the_deadline_passes_is_acted_on_not_lost() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_release(Ok(true))
        .grant_acquire()
        .expect_release(Ok(true))
        .grant_acquire();
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let held = hold(&locks, 30).await;
    let short = spawn_waiter(&locks, "a", 5);
    settle().await;
    let long = spawn_waiter(&locks, "a", 60);
    settle().await;
    tokio::time::advance(Duration::from_millis(4999)).await;
    // The release wakes the first waiter; its deadline passes before it runs.
    held.release().await.unwrap();
    tokio::time::advance(Duration::from_millis(2)).await;
    let first = short
        .await
        .unwrap()
        .expect("the woken waiter finds the key free and takes it");
    let released_at = Instant::now();
    first.release().await.unwrap();
    let second = long
        .await
        .unwrap()
        .expect("the next waiter is woken in turn");
    assert_eq!(
        released_at.elapsed(),
        Duration::ZERO,
        "at the release, not at the old lease's expiry"
    );
    std::mem::forget(second);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_released_lease_is_handed_to_the_head_without_store_io() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let (locks, events) = manager(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let first = locks.try_lock("a").await.unwrap();
    let fencing = first.fencing_token();
    let waiter = spawn_waiter(&locks, "a", 60);
    settle().await;
    let released_at = Instant::now();
    first.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert_eq!(released_at.elapsed(), Duration::ZERO, "at once");
    assert_eq!(next.fencing_token(), fencing, "one store lease");
    assert_eq!(scripted.ops(), [Op::Acquire], "no store I/O");
    assert!(events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::HandedOff { consecutive: 1, .. })));
    scripted.expect_release(Ok(true));
    next.release().await.unwrap();
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Release]);
    scripted.verify();
}

/// The line lives in the manager, not in local competition's cache: a flood of keys beyond the
/// cache's capacity never makes a waiter miss its wake-up.
#[tokio::test(start_paused = true)]
async fn a_waiter_is_woken_at_once_after_a_flood_of_keys_beyond_the_cache() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(MemoryStore::new())
        .local_competition(LocalCompetitionLayer::new().capacity(4))
        .renewal(false)
        .task_holders(false)
        .build()
        .unwrap();
    let held = locks.try_lock("held").await.unwrap();
    let waited = locks.try_lock("waited").await.unwrap();
    let waiter = spawn_waiter(&locks, "waited", 60);
    settle().await;
    let mut flood = Vec::new();
    for i in 0..200 {
        let guard = locks.try_lock(format!("flood-{i}").as_str()).await.unwrap();
        if i % 50 == 0 {
            flood.push(guard);
        } else {
            guard.release().await.unwrap();
        }
    }
    assert!(
        locks.try_lock("held").await.unwrap_err().is_unavailable(),
        "the holder still excludes others (in memory or in the store)"
    );
    let started = Instant::now();
    waited.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO, "woken, not timed out");
    next.release().await.unwrap();
    held.release().await.unwrap();
    for guard in flood {
        guard.release().await.unwrap();
    }
}

/// A first try whose caller stops waiting while its request is out (a `timeout` around `lock()`,
/// a request handler dropped) wakes the head it kept refused in memory: the head asks at once,
/// instead of at its next look (on a store that notifies, the poll net: a second), with nothing
/// released to wake it.
#[tokio::test(start_paused = true)]
async fn a_first_try_cancelled_mid_request_wakes_the_head() {
    let scripted = ScriptedStore::new();
    let this = scripted.clone();
    scripted
        // The first try's request never answers: its caller stops waiting first.
        .expect_acquire_after(std::future::pending(), move |req| {
            Ok(this.lease_for(req).into())
        })
        // The manager undoes the cancelled try (owner-checked, in the background): not held.
        .expect_release(Ok(false))
        .grant_acquire();
    let (locks, _) = manager(&scripted, LocalCompetitionLayer::new());
    let first = spawn_waiter(&locks, "a", 60);
    settle().await;
    let head = spawn_waiter(&locks, "a", 60);
    settle().await;
    assert_eq!(
        scripted.count(Op::Acquire),
        1,
        "the head is refused in memory while the first try asks"
    );
    let started = Instant::now();
    first.abort();
    assert!(first.await.unwrap_err().is_cancelled());
    let second = head.await.unwrap().unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "woken when the try was cancelled, not by polling"
    );
    settle().await;
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Release, Op::Acquire]);
    std::mem::forget(second);
    scripted.verify();
}
