use std::sync::Arc;

use super::*;
use crate::layers::test_support::{events, key, req};
use leasehold_testkit::scripted::{Op, ScriptedStore};

type Local = Arc<LocalCompetition<ScriptedStore>>;

fn local(scripted: &ScriptedStore, layer: LocalCompetitionLayer) -> (Local, events::Seen) {
    let (observers, seen) = events::capture();
    let store = layer.with_observers(observers).layer(scripted.clone());
    (Arc::new(store), seen)
}

fn blocking(entity: &str, ttl_ms: u64, wait: Duration) -> Acquire {
    req(entity, ttl_ms).with_deadline(Some(Instant::now() + wait))
}

/// A task waiting (blocking acquire, deadline `wait` from now) for `entity`.
fn spawn_waiter<S: LockStore>(
    store: &Arc<LocalCompetition<S>>,
    entity: &'static str,
    ttl_ms: u64,
    wait: Duration,
) -> tokio::task::JoinHandle<Result<Lease>> {
    let store = store.clone();
    tokio::spawn(async move { store.try_acquire(&blocking(entity, ttl_ms, wait)).await })
}

/// Lets spawned tasks run until they park.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn try_lock_fast_fails_without_store_io() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().expect_release(Ok(true));
    let (store, seen) = local(&scripted, LocalCompetitionLayer::default());
    let lease = store.try_acquire(&req("a", 10_000)).await.unwrap();
    for _ in 0..3 {
        let err = store.try_acquire(&req("a", 10_000)).await.unwrap_err();
        assert!(err.is_unavailable());
    }
    assert_eq!(
        scripted.count(Op::TryAcquire),
        1,
        "no store I/O for the contenders"
    );
    assert_eq!(seen.names(), ["fast_failed"; 3]);
    assert!(store.release(&lease).await.unwrap());
    scripted.grant_acquire();
    store.try_acquire(&req("a", 10_000)).await.unwrap();
    assert_eq!(store.local_keys(), 1, "one entry per key");
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn blocking_lock_is_woken_by_the_local_release() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_release(Ok(true))
        .grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let first = store.try_acquire(&req("a", 10_000)).await.unwrap();
    let waiter = spawn_waiter(&store, "a", 10_000, Duration::from_secs(60));
    settle().await;
    assert_eq!(
        scripted.count(Op::TryAcquire),
        1,
        "the waiter waits in memory"
    );
    let started = Instant::now();
    store.release(&first).await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::ZERO,
        "woken at once, not by polling"
    );
    assert_ne!(second.token(), first.token());
    assert_eq!(
        scripted.ops(),
        [Op::TryAcquire, Op::Release, Op::TryAcquire]
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn blocking_lock_times_out_locally() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let _held = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let err = store
        .try_acquire(&blocking("a", 1000, Duration::from_secs(2)))
        .await
        .unwrap_err();
    assert!(err.is_unavailable());
    assert_eq!(scripted.count(Op::TryAcquire), 1);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn one_store_talker_per_key() {
    let scripted = ScriptedStore::new();
    let (gate, open) = tokio::sync::oneshot::channel::<()>();
    // The first acquire is slow and finds the key held by another process.
    scripted.expect_acquire_after(
        async move {
            let _ = open.await;
        },
        |r| Err(Error::unavailable(&r.key)),
    );
    scripted.grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let s = store.clone();
    let slow = tokio::spawn(async move { s.try_acquire(&req("a", 10_000)).await });
    settle().await;
    assert!(store
        .try_acquire(&req("a", 10_000))
        .await
        .unwrap_err()
        .is_unavailable());
    let waiter = spawn_waiter(&store, "a", 10_000, Duration::from_secs(60));
    settle().await;
    assert_eq!(
        scripted.count(Op::TryAcquire),
        1,
        "only the first talks to the store"
    );
    gate.send(()).unwrap();
    assert!(slow.await.unwrap().unwrap_err().is_unavailable());
    assert!(waiter.await.unwrap().is_ok(), "then the waiter, in turn");
    assert_eq!(scripted.count(Op::TryAcquire), 2);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn cancelled_acquire_frees_the_key() {
    let scripted = ScriptedStore::new();
    scripted.expect_acquire_after(futures::future::pending(), |r| {
        Err(Error::unavailable(&r.key))
    });
    scripted.grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let s = store.clone();
    let stuck = tokio::spawn(async move { s.try_acquire(&req("a", 10_000)).await });
    settle().await;
    assert!(
        store.try_acquire(&req("a", 10_000)).await.is_err(),
        "in flight: fast-fail"
    );
    stuck.abort();
    assert!(stuck.await.unwrap_err().is_cancelled());
    store.try_acquire(&req("a", 10_000)).await.unwrap();
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn store_error_frees_the_key() {
    let scripted = ScriptedStore::new();
    scripted
        .expect_acquire(Err(Error::connection("down")))
        .grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let err = store.try_acquire(&req("a", 10_000)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection);
    store.try_acquire(&req("a", 10_000)).await.unwrap();
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn entry_never_outlives_its_lease() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    // A holder that never releases (its task crashed and the guard was leaked).
    let leaked = store.try_acquire(&req("a", 1000)).await.unwrap();
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(store.try_acquire(&req("a", 1000)).await.is_err());
    tokio::time::advance(Duration::from_millis(1)).await;
    let next = store.try_acquire(&req("a", 1000)).await.unwrap();
    assert_ne!(next.token(), leaked.token());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn waiter_is_woken_when_a_leaked_lease_expires() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let _leaked = store.try_acquire(&req("a", 1000)).await.unwrap();
    let started = Instant::now();
    store
        .try_acquire(&blocking("a", 1000, Duration::from_secs(60)))
        .await
        .unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(1),
        "at the lease's expiry"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn foreign_release_and_extend_go_to_the_store() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_release(Ok(false))
        .grant_extend()
        .expect_release(Ok(true));
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let lease = store.try_acquire(&req("a", 10_000)).await.unwrap();
    let impostor = lease.clone().with_token(OwnerToken::generate());
    assert!(!store.release(&impostor).await.unwrap());
    assert!(
        store.try_acquire(&req("a", 10_000)).await.is_err(),
        "still held locally"
    );
    let renewed = store.extend(&lease, Duration::from_secs(20)).await.unwrap();
    assert_eq!(renewed.token(), lease.token());
    assert_eq!(renewed.ttl(), Duration::from_secs(20));
    assert!(store.release(&renewed).await.unwrap());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn hand_off_skips_the_store_and_is_bounded() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let config = LocalCompetitionLayer::new().hand_off(true).max_hand_offs(2);
    let (store, seen) = local(&scripted, config);
    let mut lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let first = lease.clone();
    for round in 1..=2 {
        let waiter = spawn_waiter(&store, "a", 60_000, Duration::from_secs(60));
        settle().await;
        assert!(store.release(&lease).await.unwrap());
        let next = waiter.await.unwrap().unwrap();
        assert_ne!(
            next.token(),
            lease.token(),
            "each local holder has its own token"
        );
        assert_eq!(
            next.fencing_token(),
            first.fencing_token(),
            "one store lease"
        );
        assert_eq!(
            scripted.ops(),
            [Op::TryAcquire],
            "round {round}: no store I/O"
        );
        lease = next;
    }
    assert_eq!(
        seen.all(),
        [
            LockEvent::HandedOff {
                key: key("a"),
                consecutive: 1
            },
            LockEvent::HandedOff {
                key: key("a"),
                consecutive: 2
            },
        ]
    );
    // The bound is reached: the next release is a real one, under the store's token.
    let s = store.clone();
    scripted.expect_release(Ok(true)).grant_acquire();
    let waiter = tokio::spawn(async move {
        s.try_acquire(&blocking("a", 60_000, Duration::from_secs(60)))
            .await
    });
    settle().await;
    assert!(store.release(&lease).await.unwrap());
    let fresh = waiter.await.unwrap().unwrap();
    let calls = scripted.calls();
    assert_eq!(
        scripted.ops(),
        [Op::TryAcquire, Op::Release, Op::TryAcquire]
    );
    assert_eq!(
        calls[1].token.as_ref(),
        Some(first.token()),
        "released with the store token"
    );
    assert_ne!(fresh.fencing_token(), first.fencing_token());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn hand_off_hold_time_is_bounded() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_release(Ok(true))
        .grant_acquire();
    let config = LocalCompetitionLayer::new()
        .hand_off(true)
        .max_hand_off_hold(Duration::from_millis(100));
    let (store, seen) = local(&scripted, config);
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = spawn_waiter(&store, "a", 60_000, Duration::from_secs(60));
    settle().await;
    tokio::time::advance(Duration::from_millis(100)).await;
    store.release(&lease).await.unwrap();
    waiter.await.unwrap().unwrap();
    assert_eq!(
        scripted.ops(),
        [Op::TryAcquire, Op::Release, Op::TryAcquire]
    );
    assert!(seen.names().is_empty());
    scripted.verify();
}

/// Local competition with hand-off over `scripted` (which must grant the first acquire): a lease
/// of 1 s taken, a waiter (TTL 1 s) registered, and the lease handed to it 600 ms in — with less
/// than half its TTL left, so the waiter extends it first.
async fn hand_off_with_little_time_left(
    scripted: &ScriptedStore,
) -> (Local, Lease, tokio::task::JoinHandle<Result<Lease>>) {
    let config = LocalCompetitionLayer::new()
        .hand_off(true)
        .max_hand_off_hold(Duration::from_secs(60));
    let (store, _) = local(scripted, config);
    let lease = store.try_acquire(&req("a", 1000)).await.unwrap();
    let waiter = spawn_waiter(&store, "a", 1000, Duration::from_secs(60));
    settle().await;
    tokio::time::advance(Duration::from_millis(600)).await;
    assert!(store.release(&lease).await.unwrap(), "handed off");
    (store, lease, waiter)
}

#[tokio::test(start_paused = true)]
async fn hand_off_extends_a_short_lease() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_extend();
    let (_store, lease, waiter) = hand_off_with_little_time_left(&scripted).await;
    let next = waiter.await.unwrap().unwrap();
    assert_eq!(
        next.remaining(),
        Duration::from_millis(1000),
        "extended for the new holder"
    );
    let calls = scripted.calls();
    assert_eq!(scripted.ops(), [Op::TryAcquire, Op::Extend]);
    assert_eq!(
        calls[1].token.as_ref(),
        Some(lease.token()),
        "extended under the store token"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn unclaimed_hand_off_is_released_in_the_store() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().expect_release(Ok(true));
    let (store, _) = local(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = spawn_waiter(&store, "a", 60_000, Duration::from_secs(60));
    settle().await;
    assert!(store.release(&lease).await.unwrap(), "handed off");
    waiter.abort(); // the waiter goes away before taking it
    assert!(waiter.await.unwrap_err().is_cancelled());
    settle().await;
    assert_eq!(
        scripted.ops(),
        [Op::TryAcquire, Op::Release],
        "given back to the store"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn shutdown_wakes_local_waiters() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let _held = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = spawn_waiter(&store, "a", 1000, Duration::from_secs(60));
    settle().await;
    store.shutdown().await.unwrap();
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn idle_entries_are_reclaimed_and_held_ones_kept() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .grant_acquire()
        .expect_release(Ok(true));
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let _held = store.try_acquire(&req("held", 10_000)).await.unwrap();
    let done = store.try_acquire(&req("done", 10_000)).await.unwrap();
    assert!(store.release(&done).await.unwrap());
    assert_eq!(
        store.local_keys(),
        2,
        "the emptied entry is reused until a sweep"
    );
    assert_eq!(store.reclaim_idle(), 1, "only the emptied entry goes");
    assert_eq!(store.local_keys(), 1);
    // A holder whose lease ran out (a leaked guard) no longer keeps its entry.
    tokio::time::advance(Duration::from_secs(10)).await;
    assert_eq!(store.reclaim_idle(), 1);
    assert_eq!(store.local_keys(), 0);
    scripted.verify();
}

/// On the real clock: moka expires entries on its own clock, which tokio's paused test clock
/// does not move.
#[tokio::test]
async fn the_cache_reclaims_emptied_entries_by_itself_and_spares_waited_ones() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_release(Ok(true))
        .grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let held = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = spawn_waiter(&store, "a", 60_000, Duration::from_secs(60));
    settle().await;
    // Longer than an emptied entry lingers, while a task waits: its entry (and the holder's)
    // stays.
    tokio::time::sleep(Duration::from_millis(3500)).await;
    assert_eq!(store.local_keys(), 1);
    assert!(store.release(&held).await.unwrap());
    let next = waiter.await.unwrap().unwrap();
    assert_ne!(next.token(), held.token());
    // Emptied by a release through a plain store path: expired by the cache about a second
    // later (its idle linger).
    scripted.expect_release(Ok(true));
    assert!(store.release(&next).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(store.local_keys(), 0, "reclaimed without being asked");
    scripted.verify();
}

/// A gate for the scripted store's delayed answers: open it (or drop the sender) to let the
/// answer through.
fn gate() -> (
    tokio::sync::oneshot::Sender<()>,
    impl std::future::Future<Output = ()> + Send + 'static,
) {
    let (open, rx) = tokio::sync::oneshot::channel::<()>();
    (open, async move {
        let _ = rx.await;
    })
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
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let held = store.try_acquire(&req("a", 30_000)).await.unwrap();
    let short = spawn_waiter(&store, "a", 30_000, Duration::from_secs(5));
    settle().await;
    let long = spawn_waiter(&store, "a", 30_000, Duration::from_secs(60));
    settle().await;
    tokio::time::advance(Duration::from_millis(4999)).await;
    // The release wakes the first waiter; its deadline passes before it runs.
    assert!(store.release(&held).await.unwrap());
    tokio::time::advance(Duration::from_millis(2)).await;
    let first = short
        .await
        .unwrap()
        .expect("the woken waiter finds the key free and takes it");
    let released_at = Instant::now();
    assert!(store.release(&first).await.unwrap());
    let second = long
        .await
        .unwrap()
        .expect("the next waiter is woken in turn");
    assert_eq!(
        released_at.elapsed(),
        Duration::ZERO,
        "at the release, not at the old lease's expiry"
    );
    assert_ne!(second.token(), first.token());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_hand_off_whose_extend_fails_is_given_back_and_the_error_reported() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_extend(Err(leasehold_testkit::scripted::reply_lost()))
        .expect_release(Ok(true));
    let (store, lease, waiter) = hand_off_with_little_time_left(&scripted).await;
    let err = waiter.await.unwrap().unwrap_err();
    assert!(
        err.is_in_doubt(),
        "not a lease with 0.4 s left of 1 s: {err}"
    );
    settle().await;
    assert_eq!(scripted.ops(), [Op::TryAcquire, Op::Extend, Op::Release]);
    assert_eq!(
        scripted.calls()[2].token.as_ref(),
        Some(lease.token()),
        "released under the store token"
    );
    // The key is free locally again: the next contender goes to the store.
    scripted.grant_acquire();
    store.try_acquire(&req("a", 1000)).await.unwrap();
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_hand_off_cancelled_during_its_extend_is_given_back() {
    let scripted = ScriptedStore::new();
    let (_open, extend_gate) = gate();
    scripted
        .grant_acquire()
        .expect_extend_after(extend_gate, |lease, ttl| {
            Ok(lease.renewed(ttl, Instant::now()))
        })
        .expect_release(Ok(true));
    let (_store, lease, waiter) = hand_off_with_little_time_left(&scripted).await;
    settle().await;
    assert_eq!(scripted.ops(), [Op::TryAcquire, Op::Extend], "extending");
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    settle().await;
    assert_eq!(scripted.ops(), [Op::TryAcquire, Op::Extend, Op::Release]);
    assert_eq!(scripted.calls()[2].token.as_ref(), Some(lease.token()));
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_handed_lease_whose_release_is_cancelled_is_still_released() {
    let scripted = ScriptedStore::new();
    let (_open, release_gate) = gate();
    scripted
        .grant_acquire()
        .expect_release_after(release_gate, Ok(true))
        .expect_release(Ok(true));
    let (store, _) = local(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = spawn_waiter(&store, "a", 60_000, Duration::from_secs(60));
    settle().await;
    assert!(store.release(&lease).await.unwrap(), "handed off");
    let next = waiter.await.unwrap().unwrap();
    assert_ne!(next.token(), lease.token());
    let releasing = {
        let store = store.clone();
        tokio::spawn(async move { store.release(&next).await })
    };
    settle().await;
    releasing.abort();
    assert!(releasing.await.unwrap_err().is_cancelled());
    settle().await;
    let calls = scripted.calls();
    assert_eq!(scripted.ops(), [Op::TryAcquire, Op::Release, Op::Release]);
    assert_eq!(calls[1].token.as_ref(), Some(lease.token()));
    assert_eq!(
        calls[2].token.as_ref(),
        Some(lease.token()),
        "the store lease is released again, not under the local holder's own token"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn an_extend_that_outlasts_the_handed_lease_gives_it_back() {
    let scripted = ScriptedStore::new();
    let (open, extend_gate) = gate();
    scripted
        .grant_acquire()
        .expect_extend_after(extend_gate, |lease, ttl| {
            Ok(lease.renewed(ttl, Instant::now()))
        })
        .expect_acquire(Err(Error::unavailable(&key("a"))))
        .expect_release(Ok(true));
    let config = LocalCompetitionLayer::new()
        .hand_off(true)
        .max_hand_off_hold(Duration::from_secs(60));
    let (store, _) = local(&scripted, config);
    let lease = store.try_acquire(&req("a", 1000)).await.unwrap();
    let first = spawn_waiter(&store, "a", 1000, Duration::from_secs(60));
    settle().await;
    let second = spawn_waiter(&store, "a", 1000, Duration::from_secs(60));
    settle().await;
    tokio::time::advance(Duration::from_millis(600)).await;
    assert!(
        store.release(&lease).await.unwrap(),
        "handed off to the first"
    );
    settle().await;
    // The extend hangs past the lease's expiry: the second waiter takes the slot and asks the
    // store (which still has the lock: the extend is on its way).
    tokio::time::advance(Duration::from_millis(500)).await;
    let err = second.await.unwrap().unwrap_err();
    assert!(err.is_unavailable());
    open.send(()).unwrap();
    let err = first.await.unwrap().unwrap_err();
    assert!(
        err.is_unavailable(),
        "no lease the layer no longer maps: {err}"
    );
    settle().await;
    assert_eq!(
        scripted.ops(),
        [Op::TryAcquire, Op::Extend, Op::TryAcquire, Op::Release]
    );
    assert_eq!(
        scripted.calls()[3].token.as_ref(),
        Some(lease.token()),
        "the renewed store lease is given back"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn an_absurd_ttl_is_rejected_before_any_store_io() {
    let scripted = ScriptedStore::new();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let err = store.try_acquire(&req("a", u64::MAX)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(scripted.ops().is_empty());
}

/// Local competition over the embedded store, with room for `capacity` keys.
fn bounded(capacity: u64) -> (Arc<LocalCompetition<crate::MemoryStore>>, events::Seen) {
    let (observers, seen) = events::capture();
    let store = LocalCompetitionLayer::new()
        .capacity(capacity)
        .with_observers(observers)
        .layer(crate::MemoryStore::new());
    (Arc::new(store), seen)
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_unique_keys_stays_within_capacity() {
    let (store, _) = bounded(8);
    for i in 0..1000 {
        let lease = store
            .try_acquire(&req(&format!("flood-{i}"), 10_000))
            .await
            .unwrap();
        assert!(store.release(&lease).await.unwrap());
        assert!(store.local_keys() <= 8, "at most 8 entries, at key {i}");
    }
    assert_eq!(
        store.local_keys(),
        8,
        "emptied entries are reused up to capacity"
    );
    // Held keys count too, and keys beyond capacity still lock (through the store).
    let mut held = Vec::new();
    for i in 0..100 {
        held.push(
            store
                .try_acquire(&req(&format!("held-{i}"), 10_000))
                .await
                .unwrap(),
        );
    }
    assert_eq!(store.local_keys(), 8);
    for (i, _) in held.iter().enumerate() {
        let err = store
            .try_acquire(&req(&format!("held-{i}"), 10_000))
            .await
            .unwrap_err();
        assert!(
            err.is_unavailable(),
            "held-{i} is held, locally or in the store"
        );
    }
    for lease in &held {
        assert!(store.release(lease).await.unwrap());
    }
}

#[tokio::test(start_paused = true)]
async fn an_entry_in_use_survives_a_flood_beyond_capacity() {
    let (store, seen) = bounded(4);
    let held = store.try_acquire(&req("held", 60_000)).await.unwrap();
    let waited = store.try_acquire(&req("waited", 60_000)).await.unwrap();
    let waiter = spawn_waiter(&store, "waited", 60_000, Duration::from_secs(60));
    settle().await;
    // Far more unique keys than there is room for: some held, most released at once.
    let mut flood = Vec::new();
    for i in 0..200 {
        let lease = store
            .try_acquire(&req(&format!("flood-{i}"), 60_000))
            .await
            .unwrap();
        if i % 50 == 0 {
            flood.push(lease);
        } else {
            assert!(store.release(&lease).await.unwrap());
        }
    }
    assert!(store.local_keys() <= 4);
    assert_eq!(store.reclaim_idle(), 0, "nothing idle left to reclaim");
    // The holder still excludes others locally (fast-failed in memory, not by the store).
    let err = store.try_acquire(&req("held", 60_000)).await.unwrap_err();
    assert!(err.is_unavailable());
    assert_eq!(seen.names(), ["fast_failed"]);
    // The waiter is still woken by the release, at once.
    let started = Instant::now();
    assert!(store.release(&waited).await.unwrap());
    let next = waiter.await.unwrap().unwrap();
    assert_eq!(started.elapsed(), Duration::ZERO, "woken, not timed out");
    assert_ne!(next.token(), waited.token());
    for lease in [held, next].iter().chain(&flood) {
        assert!(store.release(lease).await.unwrap());
    }
}

/// On the real clock, which moka's expiry follows.
#[tokio::test]
async fn an_entrys_local_state_does_not_outlive_its_lease() {
    let (store, _) = bounded(DEFAULT_CAPACITY);
    // A holder that never releases (its guard was leaked).
    let leaked = store.try_acquire(&req("leaked", 200)).await.unwrap();
    let cached = |store: &LocalCompetition<crate::MemoryStore>| {
        store.shared.cache.contains_key(&key("leaked"))
    };
    assert!(cached(&store));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(cached(&store), "kept while the lease runs");
    assert!(store.try_acquire(&req("leaked", 200)).await.is_err());
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert!(
        !cached(&store),
        "expired with the lease, without being asked"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.local_keys() > 0 {
        assert!(Instant::now() < deadline, "the memory is reclaimed too");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let next = store.try_acquire(&req("leaked", 200)).await.unwrap();
    assert_ne!(next.token(), leaked.token());
}

#[tokio::test]
async fn a_last_look_up_that_expired_meanwhile_is_not_where_the_key_is_taken() {
    // One thread: after the first, every look-up of the key is served from the thread's last.
    let (store, _) = bounded(DEFAULT_CAPACITY);
    let first = store.try_acquire(&req("a", 100)).await.unwrap();
    assert!(store.release(&first).await.unwrap());
    let emptied = store.shared.lookup(&key("a")).expect("remembered");
    // Past the last lease's end: the cache expires the emptied entry (moka may report it only
    // at its next housekeeping, so the thread may still remember it).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let next = store.try_acquire(&req("a", 30_000)).await.unwrap();
    let live = store
        .shared
        .cache
        .get(&key("a"))
        .expect("the key has an entry");
    assert!(!Arc::ptr_eq(&live, &emptied), "a new entry");
    assert!(
        live.lock().in_use(),
        "the holder is in the entry the cache has"
    );
    let second = store.try_acquire(&req("a", 30_000)).await.unwrap_err();
    assert!(second.is_unavailable(), "a second taker fails fast on it");
    assert!(store.release(&next).await.unwrap());
    assert!(!live.lock().in_use());
}

#[tokio::test(start_paused = true)]
async fn closing_the_lifecycle_wakes_waiters_and_tracks_the_returned_hand_off() {
    let scripted = ScriptedStore::new();
    let (open, release_gate) = gate();
    scripted
        .grant_acquire()
        .expect_release_after(release_gate, Ok(true));
    let lifecycle = Lifecycle::new();
    let (store, _) = local(
        &scripted,
        LocalCompetitionLayer::new()
            .hand_off(true)
            .with_lifecycle(lifecycle.clone()),
    );
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = spawn_waiter(&store, "a", 60_000, Duration::from_secs(60));
    settle().await;
    assert!(store.release(&lease).await.unwrap(), "handed off");
    // Closed before the woken waiter ran: it ends with ShutDown and the hand-off goes back.
    lifecycle.close();
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
    let err = store.try_acquire(&req("b", 60_000)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown, "no new acquisition");
    settle().await;
    assert_eq!(
        scripted.ops(),
        [Op::TryAcquire, Op::Release],
        "being released"
    );
    assert_eq!(
        lifecycle.in_flight(),
        1,
        "the background release is tracked"
    );
    let waiting = {
        let lifecycle = lifecycle.clone();
        tokio::spawn(async move { lifecycle.wait().await })
    };
    settle().await;
    assert!(!waiting.is_finished(), "wait() waits for the release");
    open.send(()).unwrap();
    waiting.await.unwrap();
    assert_eq!(lifecycle.in_flight(), 0);
    assert_eq!(scripted.calls()[1].token.as_ref(), Some(lease.token()));
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_layer_used_alone_shuts_down_through_its_own_lifecycle() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    assert!(!store.lifecycle().is_closing());
    let _held = store.try_acquire(&req("a", 60_000)).await.unwrap();
    store.shutdown().await.unwrap();
    assert!(store.lifecycle().is_closing());
    let err = store.try_acquire(&req("b", 60_000)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
    assert_eq!(
        scripted.count(Op::TryAcquire),
        1,
        "refused before any store I/O"
    );
    scripted.verify();
}

// The line: arrival order, one store talker per process, places kept between attempts.

/// A waiter as the manager's wait loop is one: a watch for the whole wait, and attempts that
/// carry its waiter id.
struct Wait {
    watch: crate::core::ReleaseWatch,
    deadline: Instant,
}

impl Wait {
    async fn new(store: &Local, entity: &str, wait: Duration) -> Wait {
        Wait {
            watch: store.watch(&key(entity)).await,
            deadline: Instant::now() + wait,
        }
    }

    fn attempt(&self, entity: &str) -> Acquire {
        req(entity, 30_000)
            .with_deadline(Some(self.deadline))
            .with_waiter(Some(self.watch.waiter()))
    }
}

/// The order in which `waiters` finish, releasing each lease at once (each release is a store
/// release, scripted by the caller).
async fn finishing_order(
    store: &Local,
    mut waiters: Vec<(usize, tokio::task::JoinHandle<Result<Lease>>)>,
) -> Vec<usize> {
    let mut order = Vec::new();
    while !waiters.is_empty() {
        settle().await;
        let done = waiters
            .iter()
            .position(|(_, w)| w.is_finished())
            .expect("one waiter has the key");
        let (n, handle) = waiters.remove(done);
        let lease = handle.await.unwrap().expect("granted");
        assert!(
            waiters.iter().all(|(_, w)| !w.is_finished()),
            "one at a time"
        );
        order.push(n);
        assert!(store.release(&lease).await.unwrap());
    }
    order
}

#[tokio::test(start_paused = true)]
async fn local_waiters_are_served_in_arrival_order() {
    let scripted = ScriptedStore::new();
    for _ in 0..6 {
        scripted.grant_acquire().expect_release(Ok(true));
    }
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let held = store.try_acquire(&req("a", 30_000)).await.unwrap();
    let mut waiters = Vec::new();
    for n in 0..4 {
        waiters.push((
            n,
            spawn_waiter(&store, "a", 30_000, Duration::from_secs(60)),
        ));
        settle().await;
    }
    assert!(store.release(&held).await.unwrap());
    // The releasing task asks again at once: it goes to the back of the line.
    waiters.push((
        4,
        spawn_waiter(&store, "a", 30_000, Duration::from_secs(60)),
    ));
    assert_eq!(finishing_order(&store, waiters).await, [0, 1, 2, 3, 4]);
    assert_eq!(
        scripted.count(Op::TryAcquire),
        6,
        "one store acquire per grant: nobody asked out of turn"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_refused_head_keeps_its_place_and_nobody_behind_it_asks_the_store() {
    let scripted = ScriptedStore::new();
    scripted
        .expect_acquire_with(|req| Err(Error::unavailable(&req.key)))
        .grant_acquire()
        .expect_release(Ok(true))
        .grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let head = Wait::new(&store, "a", Duration::from_secs(60)).await;
    let refused = store.try_acquire(&head.attempt("a")).await.unwrap_err();
    assert!(refused.is_unavailable(), "another process holds it");
    // Two more tasks of this process arrive while the head waits for the store.
    let second = spawn_waiter(&store, "a", 30_000, Duration::from_secs(60));
    settle().await;
    let third = spawn_waiter(&store, "a", 30_000, Duration::from_secs(60));
    settle().await;
    assert_eq!(
        scripted.count(Op::TryAcquire),
        1,
        "they wait in memory behind the head: the process has one contender in the store"
    );
    assert!(
        store.try_acquire(&req("a", 30_000)).await.is_err(),
        "a try-lock does not pass the line"
    );
    // The store names this process: the head asks again, still first.
    let lease = store.try_acquire(&head.attempt("a")).await.unwrap();
    assert!(!second.is_finished() && !third.is_finished());
    assert!(store.release(&lease).await.unwrap());
    drop(head.watch);
    let second = second.await.unwrap().expect("next in line");
    settle().await;
    assert!(!third.is_finished(), "still behind the second");
    drop(second);
    third.abort();
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_head_that_stops_waiting_hands_its_place_to_the_next() {
    let scripted = ScriptedStore::new();
    scripted
        .expect_acquire_with(|req| Err(Error::unavailable(&req.key)))
        .grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let head = Wait::new(&store, "a", Duration::from_secs(60)).await;
    assert!(store.try_acquire(&head.attempt("a")).await.is_err());
    assert!(
        store.shared.kept.contains(&head.watch.waiter()),
        "the place outlives the attempt"
    );
    let next = spawn_waiter(&store, "a", 30_000, Duration::from_secs(60));
    settle().await;
    assert!(!next.is_finished(), "behind the head");
    drop(head.watch); // the head's lock() call ended (timeout, cancellation)
    assert!(
        store.shared.kept.is_empty(),
        "nothing kept for a wait that ended"
    );
    next.await
        .unwrap()
        .expect("the next in line is woken and asks the store");
    assert_eq!(scripted.count(Op::TryAcquire), 2);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn behind_other_processes_the_next_head_waits_for_the_store_instead_of_asking() {
    let scripted = ScriptedStore::new();
    let this = scripted.clone();
    let (open, answer) = gate();
    scripted
        .expect_acquire_after(answer, move |req| {
            Ok(this.lease_for(req).with_contended(true))
        })
        .expect_release(Ok(true))
        .grant_acquire();
    // Hand-off on: a lease other processes queue for still goes back to the store.
    let (store, seen) = local(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let first = Wait::new(&store, "a", Duration::from_secs(60)).await;
    let taking = {
        let (store, attempt) = (store.clone(), first.attempt("a"));
        tokio::spawn(async move { store.try_acquire(&attempt).await })
    };
    settle().await;
    // Another task of this process queues while the store grants the first.
    let next = Wait::new(&store, "a", Duration::from_secs(60)).await;
    let asked = {
        let (store, attempt) = (store.clone(), next.attempt("a"));
        tokio::spawn(async move { store.try_acquire(&attempt).await })
    };
    settle().await;
    open.send(()).unwrap();
    let lease = taking.await.unwrap().unwrap();
    drop(first.watch);
    assert!(store.release(&lease).await.unwrap());
    assert!(!seen.names().contains(&"handed_off"), "yields to the queue");
    let answer = asked.await.unwrap().unwrap_err();
    assert!(answer.is_unavailable() && answer.is_behind_others());
    assert_eq!(
        scripted.count(Op::TryAcquire),
        1,
        "the process went to the back of the store's line: no request only to be refused"
    );
    // The store's word came (a notification): it asks, keeping its place.
    store.try_acquire(&next.attempt("a")).await.unwrap();
    assert_eq!(scripted.count(Op::TryAcquire), 2);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn over_a_store_with_a_place_per_waiter_blocking_requests_take_their_own_place() {
    let scripted = ScriptedStore::new()
        .with_capabilities(crate::core::Capabilities::NONE.with_waiter_line(true));
    scripted
        .grant_acquire()
        .expect_acquire_with(|req| Err(Error::unavailable(&req.key)))
        .expect_acquire_with(|req| Err(Error::unavailable(&req.key)));
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let held = store.try_acquire(&req("a", 30_000)).await.unwrap();
    let first = Wait::new(&store, "a", Duration::from_secs(60)).await;
    let second = Wait::new(&store, "a", Duration::from_secs(60)).await;
    // Both ask the store (each joins the store's line in its own arrival order) instead of
    // waiting in memory behind the local holder.
    assert!(store.try_acquire(&first.attempt("a")).await.is_err());
    assert!(store.try_acquire(&second.attempt("a")).await.is_err());
    assert_eq!(scripted.count(Op::TryAcquire), 3);
    assert!(
        store.try_acquire(&req("a", 30_000)).await.is_err(),
        "a try-lock still fails fast on the local holder"
    );
    assert_eq!(scripted.count(Op::TryAcquire), 3);
    drop(held);
    scripted.verify();
}
