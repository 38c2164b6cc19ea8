use super::*;
use crate::layers::test_support::{events, req};
use leasehold_testkit::scripted::{Op, ScriptedStore};

fn window(scripted: &ScriptedStore) -> (UnlockWindow<ScriptedStore>, events::Seen) {
    let (wiring, seen) = events::wiring();
    let store = UnlockWindowLayer::new().layer_wired(scripted.clone(), &wiring);
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
