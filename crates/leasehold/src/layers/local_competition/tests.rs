use std::sync::Arc;

use super::*;
use crate::layers::test_support::{events, key, req};
use leasehold_testkit::scripted::{Op, ScriptedStore};

type Local = Arc<LocalCompetition<ScriptedStore>>;

fn local(scripted: &ScriptedStore, layer: LocalCompetitionLayer) -> (Local, events::Seen) {
    let (wiring, seen) = events::wiring();
    let store = layer.layer_wired(scripted.clone(), &wiring);
    (Arc::new(store), seen)
}

/// Lets spawned tasks run until they park.
async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
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

/// A waiter as the manager's head of line is one: a watch for the whole wait, and attempts that
/// carry its waiter id.
struct Wait {
    watch: crate::core::ReleaseWatch,
    deadline: Instant,
}

impl Wait {
    async fn new(store: &Local, entity: &str) -> Wait {
        Wait {
            watch: store.watch(&key(entity)).await,
            deadline: Instant::now() + Duration::from_secs(60),
        }
    }

    fn attempt(&self, entity: &str, ttl_ms: u64) -> Acquire {
        req(entity, ttl_ms).with_wait(Some(crate::core::Wait::new(
            self.deadline,
            self.watch.waiter(),
        )))
    }
}

#[tokio::test(start_paused = true)]
async fn try_lock_fast_fails_without_store_io() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().expect_release(Ok(true));
    let (store, seen) = local(&scripted, LocalCompetitionLayer::default());
    let lease = store.try_acquire(&req("a", 10_000)).await.unwrap();
    tokio::time::advance(Duration::from_secs(4)).await;
    for _ in 0..3 {
        let refused = store.acquire(&req("a", 10_000)).await.unwrap();
        assert!(!refused.is_granted());
        assert_eq!(
            refused.retry_after(),
            Some(Duration::from_secs(6)),
            "how long the holder's lease has left"
        );
    }
    assert_eq!(
        scripted.count(Op::Acquire),
        1,
        "no store I/O for the contenders"
    );
    assert_eq!(seen.names(), ["fast_failed"; 3]);
    assert!(store.release(&lease).await.unwrap());
    assert_eq!(
        store.local_keys(),
        1,
        "the key's slot is kept for its next use"
    );
    scripted.grant_acquire();
    store.try_acquire(&req("a", 10_000)).await.unwrap();
    assert_eq!(store.local_keys(), 1, "one slot per key");
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn one_store_talker_per_key() {
    let scripted = ScriptedStore::new();
    let (open, answer) = gate();
    // The first acquire is slow and finds the key held by another process.
    scripted.expect_acquire_after(answer, |_| Ok(Attempt::refused()));
    scripted.grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let s = store.clone();
    let slow = tokio::spawn(async move { s.try_acquire(&req("a", 10_000)).await });
    settle().await;
    for _ in 0..3 {
        assert!(store
            .try_acquire(&req("a", 10_000))
            .await
            .unwrap_err()
            .is_unavailable());
    }
    assert_eq!(
        scripted.count(Op::Acquire),
        1,
        "only the first talks to the store"
    );
    open.send(()).unwrap();
    assert!(slow.await.unwrap().unwrap_err().is_unavailable());
    assert!(
        store.try_acquire(&req("a", 10_000)).await.is_ok(),
        "a refusal frees the key locally"
    );
    assert_eq!(scripted.count(Op::Acquire), 2);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn cancelled_acquire_frees_the_key() {
    let scripted = ScriptedStore::new();
    scripted.expect_acquire_after(futures::future::pending(), |_| Ok(Attempt::refused()));
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
    tokio::time::advance(Duration::from_secs(15)).await;
    assert!(
        store.try_acquire(&req("a", 10_000)).await.is_err(),
        "held locally until the extended lease's end"
    );
    assert!(store.release(&renewed).await.unwrap());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_lost_lease_frees_the_key_locally() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_extend(Err(Error::not_held("gone")))
        .grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::default());
    let lease = store.try_acquire(&req("a", 10_000)).await.unwrap();
    let err = store.extend(&lease, Duration::from_secs(10)).await;
    assert_eq!(err.unwrap_err().kind(), ErrorKind::NotHeld);
    store.try_acquire(&req("a", 10_000)).await.unwrap();
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_try_never_takes_a_lease_offered_to_a_waiter() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let (store, _) = local(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = Wait::new(&store, "a").await;
    assert!(store.release(&lease).await.unwrap(), "handed off");
    assert!(
        store.try_acquire(&req("a", 60_000)).await.is_err(),
        "offered to the waiter"
    );
    let taken = store
        .try_acquire(&waiter.attempt("a", 60_000))
        .await
        .unwrap();
    assert_eq!(taken.token(), lease.token(), "the store's lease as it is");
    assert_eq!(scripted.ops(), [Op::Acquire]);
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
        let waiter = Wait::new(&store, "a").await;
        assert!(store.release(&lease).await.unwrap());
        let next = store
            .try_acquire(&waiter.attempt("a", 60_000))
            .await
            .unwrap();
        assert_eq!(
            next.fencing_token(),
            first.fencing_token(),
            "one store lease"
        );
        assert_eq!(scripted.ops(), [Op::Acquire], "round {round}: no store I/O");
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
    scripted.expect_release(Ok(true)).grant_acquire();
    let waiter = Wait::new(&store, "a").await;
    assert!(store.release(&lease).await.unwrap());
    let fresh = store
        .try_acquire(&waiter.attempt("a", 60_000))
        .await
        .unwrap();
    let calls = scripted.calls();
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Release, Op::Acquire]);
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
    let waiter = Wait::new(&store, "a").await;
    tokio::time::advance(Duration::from_millis(100)).await;
    store.release(&lease).await.unwrap();
    store
        .try_acquire(&waiter.attempt("a", 60_000))
        .await
        .unwrap();
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Release, Op::Acquire]);
    assert!(seen.names().is_empty());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_contended_lease_is_never_handed_off() {
    let scripted = ScriptedStore::new();
    let this = scripted.clone();
    scripted
        .expect_acquire_with(move |req| Ok(this.lease_for(req).with_contended(true).into()))
        .expect_release(Ok(true));
    let (store, seen) = local(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let _waiter = Wait::new(&store, "a").await;
    assert!(store.release(&lease).await.unwrap());
    assert!(seen.names().is_empty(), "yields to the processes queued");
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Release]);
    scripted.verify();
}

/// Local competition with hand-off over `scripted` (which must grant the first acquire): a lease
/// of 1 s taken, a waiter registered, and the lease handed to it 600 ms in — with less than half
/// its TTL left, so the waiter extends it when it takes it.
async fn hand_off_with_little_time_left(scripted: &ScriptedStore) -> (Local, Lease, Wait) {
    let config = LocalCompetitionLayer::new()
        .hand_off(true)
        .max_hand_off_hold(Duration::from_secs(60));
    let (store, _) = local(scripted, config);
    let lease = store.try_acquire(&req("a", 1000)).await.unwrap();
    let waiter = Wait::new(&store, "a").await;
    tokio::time::advance(Duration::from_millis(600)).await;
    assert!(store.release(&lease).await.unwrap(), "handed off");
    (store, lease, waiter)
}

#[tokio::test(start_paused = true)]
async fn hand_off_extends_a_short_lease() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_extend();
    let (store, lease, waiter) = hand_off_with_little_time_left(&scripted).await;
    let next = store.try_acquire(&waiter.attempt("a", 1000)).await.unwrap();
    assert_eq!(
        next.remaining(),
        Duration::from_millis(1000),
        "extended for the new holder"
    );
    let calls = scripted.calls();
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Extend]);
    assert_eq!(
        calls[1].token.as_ref(),
        Some(lease.token()),
        "extended under the store token"
    );
    tokio::time::advance(Duration::from_millis(900)).await;
    assert!(
        store.try_acquire(&req("a", 1000)).await.is_err(),
        "held locally until the extended lease's end"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn unclaimed_hand_off_is_released_in_the_store() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().expect_release(Ok(true));
    let (store, _) = local(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = Wait::new(&store, "a").await;
    assert!(store.release(&lease).await.unwrap(), "handed off");
    drop(waiter); // the waiter goes away before taking it
    settle().await;
    assert_eq!(
        scripted.ops(),
        [Op::Acquire, Op::Release],
        "given back to the store"
    );
    scripted.grant_acquire();
    store.try_acquire(&req("a", 60_000)).await.unwrap();
    assert_eq!(
        scripted.ops(),
        [Op::Acquire, Op::Release, Op::Acquire],
        "the key is free locally: the next try asks the store"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn without_a_waiter_a_release_is_a_real_one() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().expect_release(Ok(true));
    let (store, seen) = local(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = Wait::new(&store, "a").await;
    drop(waiter); // the wait ended before the release
    assert!(store.release(&lease).await.unwrap());
    assert!(seen.names().is_empty());
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Release]);
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
    let err = store
        .try_acquire(&waiter.attempt("a", 1000))
        .await
        .unwrap_err();
    assert!(
        err.is_in_doubt(),
        "not a lease with 0.4 s left of 1 s: {err}"
    );
    settle().await;
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Extend, Op::Release]);
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
    let (store, lease, waiter) = hand_off_with_little_time_left(&scripted).await;
    let taking = {
        let (store, attempt) = (store.clone(), waiter.attempt("a", 1000));
        tokio::spawn(async move { store.try_acquire(&attempt).await })
    };
    settle().await;
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Extend], "extending");
    taking.abort();
    assert!(taking.await.unwrap_err().is_cancelled());
    settle().await;
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Extend, Op::Release]);
    assert_eq!(scripted.calls()[2].token.as_ref(), Some(lease.token()));
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
        .expect_acquire(Ok(Attempt::refused()))
        .expect_release(Ok(true));
    let (store, lease, waiter) = hand_off_with_little_time_left(&scripted).await;
    let taking = {
        let (store, attempt) = (store.clone(), waiter.attempt("a", 1000));
        tokio::spawn(async move { store.try_acquire(&attempt).await })
    };
    settle().await;
    // The extend hangs past the lease's expiry: another task finds the key free locally and
    // asks the store (which still has the lock: the extend is on its way).
    tokio::time::advance(Duration::from_millis(500)).await;
    let err = store.try_acquire(&req("a", 1000)).await.unwrap_err();
    assert!(err.is_unavailable());
    open.send(()).unwrap();
    let err = taking.await.unwrap().unwrap_err();
    assert!(
        err.is_unavailable(),
        "no lease the layer no longer knows: {err}"
    );
    settle().await;
    assert_eq!(
        scripted.ops(),
        [Op::Acquire, Op::Extend, Op::Acquire, Op::Release]
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

#[tokio::test(start_paused = true)]
async fn closing_the_lifecycle_refuses_and_tracks_the_returned_hand_off() {
    let scripted = ScriptedStore::new();
    let (open, release_gate) = gate();
    scripted
        .grant_acquire()
        .expect_release_after(release_gate, Ok(true));
    let lifecycle = Lifecycle::new();
    let wiring = Wiring::new(Observers::default(), lifecycle.clone());
    let store = Arc::new(
        LocalCompetitionLayer::new()
            .hand_off(true)
            .layer_wired(scripted.clone(), &wiring),
    );
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = Wait::new(&store, "a").await;
    assert!(store.release(&lease).await.unwrap(), "handed off");
    // Closed before the waiter took it: its attempt is refused, its wait ends, and the offer
    // goes back to the store.
    lifecycle.close();
    let err = store
        .try_acquire(&waiter.attempt("a", 60_000))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
    drop(waiter);
    settle().await;
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Release], "being released");
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
        scripted.count(Op::Acquire),
        1,
        "refused before any store I/O"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn over_a_store_with_a_place_per_waiter_blocking_requests_take_their_own_place() {
    let scripted = ScriptedStore::new()
        .with_capabilities(crate::core::Capabilities::NONE.with_waiter_line(true));
    scripted
        .grant_acquire()
        .expect_acquire_with(|_| Ok(Attempt::refused()))
        .expect_acquire_with(|_| Ok(Attempt::refused()));
    let (store, _) = local(&scripted, LocalCompetitionLayer::new().hand_off(true));
    let held = store.try_acquire(&req("a", 30_000)).await.unwrap();
    let first = Wait::new(&store, "a").await;
    let second = Wait::new(&store, "a").await;
    // Both ask the store (each joins the store's line in its own arrival order) instead of
    // being refused by the local holder.
    assert!(store
        .try_acquire(&first.attempt("a", 30_000))
        .await
        .is_err());
    assert!(store
        .try_acquire(&second.attempt("a", 30_000))
        .await
        .is_err());
    assert_eq!(scripted.count(Op::Acquire), 3);
    assert!(
        store.try_acquire(&req("a", 30_000)).await.is_err(),
        "a try-lock still fails fast on the local holder"
    );
    assert_eq!(scripted.count(Op::Acquire), 3);
    // No hand-off to waiters the store lines up itself: the release is a real one.
    scripted.expect_release(Ok(true));
    assert!(store.release(&held).await.unwrap());
    assert_eq!(scripted.count(Op::Release), 1);
    scripted.verify();
}

/// Local competition over the embedded store, with room for `capacity` keys.
fn bounded(capacity: u64) -> (Arc<LocalCompetition<crate::MemoryStore>>, events::Seen) {
    let (wiring, seen) = events::wiring();
    let store = LocalCompetitionLayer::new()
        .capacity(capacity)
        .layer_wired(crate::MemoryStore::new(), &wiring);
    (Arc::new(store), seen)
}

#[tokio::test(start_paused = true)]
async fn a_flood_of_unique_keys_stays_within_capacity() {
    let (store, seen) = bounded(8);
    for i in 0..1000 {
        let lease = store
            .try_acquire(&req(&format!("flood-{i}"), 10_000))
            .await
            .unwrap();
        assert!(store.release(&lease).await.unwrap());
        assert!(store.local_keys() <= 8, "at most 8 entries, at key {i}");
    }
    assert!(
        store.local_keys() <= 8,
        "idle slots kept for their next use, within capacity"
    );
    // Keys held beyond the capacity: the cache stays within its bound, and the slots it drops
    // while they are held are kept aside, so every held key is still refused in memory.
    let mut held = Vec::new();
    for i in 0..100 {
        held.push(
            store
                .try_acquire(&req(&format!("held-{i}"), 10_000))
                .await
                .unwrap(),
        );
        store.local_keys(); // the cache's housekeeping
        assert!(
            store.cache.entry_count() <= 8,
            "at most 8 cached, at key {i}"
        );
    }
    assert!(store.local_keys() >= 100, "every held key has its slot");
    for (i, _) in held.iter().enumerate() {
        let err = store
            .try_acquire(&req(&format!("held-{i}"), 10_000))
            .await
            .unwrap_err();
        assert!(err.is_unavailable(), "held-{i} is held");
    }
    assert_eq!(
        seen.names(),
        ["fast_failed"; 100],
        "every contender refused in memory"
    );
    for lease in &held {
        assert!(store.release(lease).await.unwrap());
    }
    // Released, the kept slots are idle: a flood of new keys sweeps them out.
    for i in 0..200 {
        let lease = store
            .try_acquire(&req(&format!("after-{i}"), 10_000))
            .await
            .unwrap();
        assert!(store.release(&lease).await.unwrap());
    }
    assert!(
        store.local_keys() <= 8 + 64,
        "idle slots do not stay aside: {}",
        store.local_keys()
    );
}

#[tokio::test(start_paused = true)]
async fn an_offer_is_kept_for_its_waiter_however_full_the_cache() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let (store, _) = local(
        &scripted,
        LocalCompetitionLayer::new().hand_off(true).capacity(1),
    );
    let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let waiter = Wait::new(&store, "a").await;
    assert!(store.release(&lease).await.unwrap(), "handed off");
    // Another key, used more and more often, until the cache's policy (TinyLFU) prefers it to
    // the offer and drops the offer's slot for room.
    for _ in 0..200 {
        scripted.grant_acquire().expect_release(Ok(true));
        let other = store.try_acquire(&req("b", 60_000)).await.unwrap();
        store.local_keys(); // the cache's housekeeping, with both keys in it
        store.release(&other).await.unwrap();
        settle().await;
    }
    assert!(
        !store.cache.contains_key(&key("a")),
        "the cache dropped the offer's slot"
    );
    let taken = store
        .try_acquire(&waiter.attempt("a", 60_000))
        .await
        .expect("the offer is still there for the waiter");
    assert_eq!(taken.token(), lease.token(), "the same store lease");
    assert!(
        !scripted
            .calls()
            .iter()
            .any(|c| c.op == Op::Release && c.token.as_ref() == Some(lease.token())),
        "never given back to the store"
    );
}

/// On the real clock, which moka's expiry follows.
#[tokio::test]
async fn an_entrys_local_state_does_not_outlive_its_lease() {
    let (store, _) = bounded(DEFAULT_CAPACITY);
    // A holder that never releases (its guard was leaked).
    let leaked = store.try_acquire(&req("leaked", 200)).await.unwrap();
    let cached =
        |store: &LocalCompetition<crate::MemoryStore>| store.cache.contains_key(&key("leaked"));
    assert!(cached(&store));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(cached(&store), "kept while the lease runs");
    assert!(store.try_acquire(&req("leaked", 200)).await.is_err());
    tokio::time::sleep(Duration::from_millis(150)).await;
    let next = store
        .try_acquire(&req("leaked", 200))
        .await
        .expect("free locally at the lease's end");
    assert_ne!(next.token(), leaked.token());
    assert!(store.release(&next).await.unwrap());
    // The idle slot leaves the cache by itself, about a second after its last use.
    let deadline = Instant::now() + Duration::from_secs(5);
    while store.local_keys() > 0 {
        assert!(Instant::now() < deadline, "the memory is reclaimed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!cached(&store));
}
