use super::*;
use crate::layers::test_support::{events, req};
use crate::MemoryStore;
use leasehold_testkit::scripted::{Op, ScriptedStore};

fn reentrant(scripted: &ScriptedStore) -> (Reentrancy<ScriptedStore>, events::Seen) {
    let (wiring, seen) = events::wiring();
    let store = ReentrancyLayer::default().layer_wired(scripted.clone(), &wiring);
    (store, seen)
}

#[tokio::test(start_paused = true)]
async fn nested_acquire_and_release_touch_the_store_once_each() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().expect_release(Ok(true));
    let (store, seen) = reentrant(&scripted);
    let me = HolderId::new_explicit();
    let outer = store
        .try_acquire(&req("a", 1000).with_holder(Some(me)))
        .await
        .unwrap();
    let inner = store
        .try_acquire(&req("a", 1000).with_holder(Some(me)))
        .await
        .unwrap();
    let innermost = store
        .try_acquire(&req("a", 5000).with_holder(Some(me)))
        .await
        .unwrap();
    assert_eq!(inner, outer, "the same lease");
    assert_eq!(
        innermost.ttl(),
        Duration::from_millis(1000),
        "a different TTL changes nothing"
    );
    assert_eq!(store.depth(outer.key(), me), 3);
    assert!(store.release(&innermost).await.unwrap());
    assert!(store.release(&inner).await.unwrap());
    assert_eq!(scripted.count(Op::Release), 0, "outer level still holds");
    assert!(store.release(&outer).await.unwrap());
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Release]);
    assert_eq!(store.depth(outer.key(), me), 0);
    assert_eq!(seen.names(), ["reentered", "reentered"]);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn two_holders_contend_in_the_store() {
    let scripted = ScriptedStore::new();
    let (store, _) = reentrant(&scripted);
    let (a, b) = (HolderId::new_explicit(), HolderId::new_explicit());
    scripted.grant_acquire();
    let _held = store
        .try_acquire(&req("a", 1000).with_holder(Some(a)))
        .await
        .unwrap();
    scripted.refuse_acquire();
    let err = store
        .try_acquire(&req("a", 1000).with_holder(Some(b)))
        .await
        .unwrap_err();
    assert!(err.is_unavailable());
    assert_eq!(scripted.count(Op::Acquire), 2, "b went to the store");
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn no_holder_is_never_reentrant() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().refuse_acquire();
    let (store, seen) = reentrant(&scripted);
    store.try_acquire(&req("a", 1000)).await.unwrap();
    assert!(store
        .try_acquire(&req("a", 1000))
        .await
        .unwrap_err()
        .is_unavailable());
    assert!(seen.names().is_empty());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn expired_hold_is_a_new_acquisition() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_acquire();
    let (store, _) = reentrant(&scripted);
    let me = HolderId::new_explicit();
    let first = store
        .try_acquire(&req("a", 100).with_holder(Some(me)))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(100)).await;
    let second = store
        .try_acquire(&req("a", 100).with_holder(Some(me)))
        .await
        .unwrap();
    assert_ne!(first.token(), second.token());
    assert_eq!(store.depth(second.key(), me), 1);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn depth_is_bounded() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire();
    let store = ReentrancyLayer::new().max_depth(2).layer(scripted.clone());
    let me = Some(HolderId::new_explicit());
    store
        .try_acquire(&req("a", 1000).with_holder(me))
        .await
        .unwrap();
    store
        .try_acquire(&req("a", 1000).with_holder(me))
        .await
        .unwrap();
    let err = store
        .try_acquire(&req("a", 1000).with_holder(me))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), crate::ErrorKind::InvalidArgument);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn extend_by_any_level_is_seen_by_later_levels() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_extend();
    let (store, _) = reentrant(&scripted);
    let me = Some(HolderId::new_explicit());
    let lease = store
        .try_acquire(&req("a", 1000).with_holder(me))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(900)).await;
    store.extend(&lease, Duration::from_secs(10)).await.unwrap();
    tokio::time::advance(Duration::from_millis(500)).await;
    let again = store
        .try_acquire(&req("a", 1000).with_holder(me))
        .await
        .unwrap();
    assert_eq!(again.ttl(), Duration::from_secs(10));
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn the_last_release_sends_the_lease_an_earlier_level_extended() {
    // Over the unlock window: a stale copy (the inner level's, 2 s from t=0) would be skipped
    // at t=6 and the lock left in the store until the extended lease ran out.
    let memory = MemoryStore::new();
    let store = ReentrancyLayer::default()
        .layer(crate::layers::UnlockWindowLayer::default().layer(memory.clone()));
    let me = Some(HolderId::new_explicit());
    let outer = store
        .try_acquire(&req("a", 2000).with_holder(me))
        .await
        .unwrap();
    let inner = store
        .try_acquire(&req("a", 2000).with_holder(me))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_secs(1)).await;
    store.extend(&outer, Duration::from_secs(60)).await.unwrap();
    tokio::time::advance(Duration::from_secs(4)).await;
    assert!(store.release(&outer).await.unwrap(), "depth 2 → 1");
    tokio::time::advance(Duration::from_secs(1)).await;
    assert!(
        store.release(&inner).await.unwrap(),
        "released in the store at depth 0"
    );
    assert_eq!(memory.inspect(inner.key()).await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_lock_found_lost_by_extend_is_not_reentered() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_extend(Err(Error::not_held("scripted: the record is gone")))
        .grant_acquire();
    let (store, seen) = reentrant(&scripted);
    let me = Some(HolderId::new_explicit());
    let lease = store
        .try_acquire(&req("a", 10_000).with_holder(me))
        .await
        .unwrap();
    let err = store
        .extend(&lease, Duration::from_secs(10))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    let again = store
        .try_acquire(&req("a", 10_000).with_holder(me))
        .await
        .unwrap();
    assert_ne!(again.token(), lease.token(), "a new store acquisition");
    assert_eq!(
        scripted.count(Op::Acquire),
        2,
        "asked the store, not counted up"
    );
    assert!(
        seen.names().is_empty(),
        "no Reentered event: {:?}",
        seen.names()
    );
    scripted.verify();
}

#[tokio::test]
async fn guards_drop_in_any_order_over_the_manager() {
    let memory = MemoryStore::new();
    let locks = crate::LockManager::builder()
        .client_id("c")
        .farm_id("f")
        .store(memory.clone())
        .reentrancy(true)
        .build()
        .unwrap();
    let me = crate::Holder::new();
    let opts = || crate::LockOptions::new().holder(me);
    let a = locks.try_lock_with("k", opts()).await.unwrap();
    let b = locks.try_lock_with("k", opts()).await.unwrap();
    let c = locks.try_lock_with("k", opts()).await.unwrap();
    assert!(
        locks.try_lock("k").await.unwrap_err().is_unavailable(),
        "others still excluded"
    );
    assert!(a.release().await.unwrap(), "outermost released first");
    assert!(c.release().await.unwrap());
    assert!(locks.inspect("k").await.unwrap().is_some(), "b still holds");
    assert!(b.release().await.unwrap());
    assert_eq!(
        locks.inspect("k").await.unwrap(),
        None,
        "the last level released it"
    );
}

#[tokio::test]
async fn task_holders_reenter_within_one_task() {
    let locks = crate::LockManager::builder()
        .client_id("c")
        .farm_id("f")
        .task_holders(true)
        .reentrancy(true)
        .build()
        .unwrap();
    let l2 = locks.clone();
    tokio::spawn(async move {
        let outer = l2.try_lock("k").await.unwrap();
        let inner = l2.try_lock("k").await.unwrap();
        let other_task = {
            let l3 = l2.clone();
            tokio::spawn(async move { l3.try_lock("k").await.map(drop) })
                .await
                .unwrap()
        };
        assert!(
            other_task.unwrap_err().is_unavailable(),
            "another task is another holder"
        );
        inner.release().await.unwrap();
        outer.release().await.unwrap();
    })
    .await
    .unwrap();
    assert_eq!(locks.inspect("k").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_key_is_held_here_while_a_holder_has_it_uncontended_and_live() {
    let store = ReentrancyLayer::default().layer(MemoryStore::new());
    let me = HolderId::new_explicit();
    let key = crate::layers::test_support::key("a");
    assert!(!store.is_held_here(&key), "nobody holds it");
    let lease = store
        .try_acquire(&req("a", 1000).with_holder(Some(me)))
        .await
        .unwrap();
    assert!(store.is_held_here(&key));
    assert!(
        !store.is_held_here(&crate::layers::test_support::key("b")),
        "another key"
    );
    assert!(store.release(&lease).await.unwrap());
    assert!(!store.is_held_here(&key), "released");

    let lease = store
        .try_acquire(&req("a", 1000).with_holder(Some(me)))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(1001)).await;
    assert!(!store.is_held_here(&key), "its lease ran out");
    drop(lease);

    // A lease granted while other processes queued: its release goes to them first, so the key
    // does not count as held here (a waiter of this process listens to the store).
    let scripted = ScriptedStore::new();
    let contended = req("a", 1000);
    scripted.expect_acquire(Ok(Lease::new(
        contended.key.clone(),
        contended.token.clone(),
        contended.ttl,
        Instant::now(),
    )
    .with_contended(true)
    .into()));
    let (store, _) = reentrant(&scripted);
    store
        .try_acquire(&contended.with_holder(Some(me)))
        .await
        .unwrap();
    assert!(!store.is_held_here(&key));
}
