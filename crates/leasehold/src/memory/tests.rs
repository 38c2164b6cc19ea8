//! Unit tests of the embedded store.

use super::*;
use crate::core::ErrorKind;
use crate::core::{OwnerToken, Wait};

fn key(entity: &str) -> LockKey {
    LockKey::dc("f1", "test", entity).unwrap()
}

fn req(entity: &str, ttl_ms: u64) -> Acquire {
    Acquire::new(
        key(entity),
        OwnerToken::generate(),
        Duration::from_millis(ttl_ms),
    )
}

#[tokio::test(start_paused = true)]
async fn record_expires_exactly_at_ttl() {
    let store = MemoryStore::new();
    let first = store.try_acquire(&req("a", 1000)).await.unwrap();
    tokio::time::advance(Duration::from_millis(999)).await;
    assert!(store
        .try_acquire(&req("a", 1000))
        .await
        .unwrap_err()
        .is_unavailable());
    assert!(store.inspect(&key("a")).await.unwrap().is_some());
    tokio::time::advance(Duration::from_millis(1)).await;
    assert_eq!(store.inspect(&key("a")).await.unwrap(), None);
    assert!(
        !store.release(&first).await.unwrap(),
        "expired lease is not ours"
    );
    let second = store.try_acquire(&req("a", 1000)).await.unwrap();
    assert!(second.fencing_token() > first.fencing_token());
}

#[tokio::test(start_paused = true)]
async fn purge_reclaims_memory_without_access() {
    let store = MemoryStore::with_purge_interval(Duration::from_millis(100));
    for i in 0..50 {
        store
            .try_acquire(&req(&format!("k{i}"), 500))
            .await
            .unwrap();
    }
    assert_eq!(store.record_count(), 50);
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(store.record_count(), 0, "background purge ran");
}

#[tokio::test(start_paused = true)]
async fn purge_task_ends_with_the_store() {
    let store = MemoryStore::with_purge_interval(Duration::from_millis(10));
    store.try_acquire(&req("a", 5)).await.unwrap();
    let weak = Arc::downgrade(&store.inner);
    drop(store);
    tokio::time::sleep(Duration::from_millis(30)).await;
    assert!(weak.upgrade().is_none());
}

#[tokio::test]
async fn release_and_extend_are_owner_checked() {
    let store = MemoryStore::new();
    let mine = store.try_acquire(&req("a", 60_000)).await.unwrap();
    let stale = mine.clone().with_token(OwnerToken::generate());
    assert!(!store.release(&stale).await.unwrap());
    let err = store
        .extend(&stale, Duration::from_secs(1))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
    assert!(store
        .inspect(&key("a"))
        .await
        .unwrap()
        .unwrap()
        .is_owned_by(mine.token()));
    let extended = store.extend(&mine, Duration::from_secs(120)).await.unwrap();
    assert_eq!(extended.ttl(), Duration::from_secs(120));
    let info = store.inspect(&key("a")).await.unwrap().unwrap();
    assert!(info.ttl_remaining.unwrap() > Duration::from_secs(60));
    assert!(store.release(&mine).await.unwrap());
    assert!(
        !store.release(&mine).await.unwrap(),
        "second release finds nothing"
    );
}

#[tokio::test(start_paused = true)]
async fn stale_token_cannot_touch_next_holder() {
    let store = MemoryStore::new();
    let old = store.try_acquire(&req("a", 100)).await.unwrap();
    tokio::time::advance(Duration::from_millis(150)).await;
    let new = store.try_acquire(&req("a", 1000)).await.unwrap();
    assert!(!store.release(&old).await.unwrap());
    assert!(store.extend(&old, Duration::from_secs(5)).await.is_err());
    let info = store.inspect(&key("a")).await.unwrap().unwrap();
    assert!(info.is_owned_by(new.token()));
    assert_eq!(info.ttl_remaining, Some(Duration::from_millis(1000)));
}

#[tokio::test]
async fn fencing_tokens_only_grow() {
    let store = MemoryStore::new();
    let mut last = 0;
    for _ in 0..20 {
        let lease = store.try_acquire(&req("a", 60_000)).await.unwrap();
        let fence = lease.fencing_token().unwrap();
        assert!(fence > last);
        last = fence;
        store.release(&lease).await.unwrap();
    }
    let other = store.try_acquire(&req("b", 60_000)).await.unwrap();
    assert!(
        other.fencing_token().unwrap() > last,
        "one store-wide counter"
    );
}

#[tokio::test]
async fn list_filters_by_prefix_and_sorts() {
    let store = MemoryStore::new();
    for e in ["b", "a", "c"] {
        store.try_acquire(&req(e, 60_000)).await.unwrap();
    }
    store
        .try_acquire(&Acquire::new(
            LockKey::xdc("test", "x").unwrap(),
            OwnerToken::generate(),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    let all = store.list("").await.unwrap();
    assert_eq!(all.len(), 4);
    let dc: Vec<_> = store
        .list("DC#f1#")
        .await
        .unwrap()
        .into_iter()
        .map(|i| i.key.entity_id().to_owned())
        .collect();
    assert_eq!(dc, ["a", "b", "c"]);
}

/// A blocking attempt of waiter `watch` on `entity`, waiting up to a minute.
fn waiting(entity: &str, watch: &ReleaseWatch) -> Acquire {
    req(entity, 10_000).with_wait(Some(Wait::new(
        Instant::now() + Duration::from_secs(60),
        watch.waiter(),
    )))
}

#[tokio::test(start_paused = true)]
async fn a_released_key_goes_to_the_first_in_line_never_to_a_newcomer() {
    use futures::FutureExt;
    let store = MemoryStore::new();
    let held = store.try_acquire(&req("line", 10_000)).await.unwrap();
    let (first, second) = (
        store.watch(&key("line")).await,
        store.watch(&key("line")).await,
    );
    assert!(store
        .try_acquire(&waiting("line", &first))
        .await
        .unwrap_err()
        .is_unavailable());
    assert!(store
        .try_acquire(&waiting("line", &second))
        .await
        .unwrap_err()
        .is_unavailable());

    let mut first_woken = Box::pin(first.notify().notified());
    let mut second_woken = Box::pin(second.notify().notified());
    first_woken.as_mut().enable();
    second_woken.as_mut().enable();
    assert!(store.release(&held).await.unwrap());
    assert!(first_woken.now_or_never().is_some(), "the head is woken");
    assert!(
        second_woken.now_or_never().is_some(),
        "and every other waiter (the head may not be listening)"
    );

    // The key is free, yet neither a try nor the second in line may pass the head.
    let newcomer = store.try_acquire(&req("line", 10_000)).await;
    assert!(
        newcomer.unwrap_err().is_unavailable(),
        "a try waits its turn"
    );
    let early = store.try_acquire(&waiting("line", &second)).await;
    assert!(early.unwrap_err().is_unavailable(), "not its turn yet");
    let lease = store.try_acquire(&waiting("line", &first)).await.unwrap();
    assert!(store.release(&lease).await.unwrap());
    let lease = store.try_acquire(&waiting("line", &second)).await.unwrap();
    assert!(store.release(&lease).await.unwrap());
    // The line is empty again: a try takes the key.
    store.try_acquire(&req("line", 10_000)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_that_gives_up_hands_its_turn_to_the_next() {
    use futures::FutureExt;
    let store = MemoryStore::new();
    let held = store.try_acquire(&req("gone", 10_000)).await.unwrap();
    let (first, second) = (
        store.watch(&key("gone")).await,
        store.watch(&key("gone")).await,
    );
    assert!(store.try_acquire(&waiting("gone", &first)).await.is_err());
    assert!(store.try_acquire(&waiting("gone", &second)).await.is_err());
    assert!(store.release(&held).await.unwrap());

    let mut second_woken = Box::pin(second.notify().notified());
    second_woken.as_mut().enable();
    drop(first);
    assert!(
        second_woken.now_or_never().is_some(),
        "woken: it is first now"
    );
    store.try_acquire(&waiting("gone", &second)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_waiter_whose_wait_is_over_leaves_the_head_of_the_line() {
    let store = MemoryStore::new();
    let held = store.try_acquire(&req("late", 10_000)).await.unwrap();
    let first = store.watch(&key("late")).await;
    let short = req("late", 10_000).with_wait(Some(Wait::new(
        Instant::now() + Duration::from_secs(1),
        first.waiter(),
    )));
    assert!(store.try_acquire(&short).await.is_err());
    assert!(store.release(&held).await.unwrap());
    assert!(
        store.try_acquire(&req("late", 10_000)).await.is_err(),
        "in line"
    );
    tokio::time::advance(Duration::from_secs(1)).await;
    // Its watch is still registered (a caller that forgot it), but its wait is over.
    store.try_acquire(&req("late", 10_000)).await.unwrap();
}
