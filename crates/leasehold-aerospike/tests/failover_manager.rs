//! The lock manager over the Aerospike store rides out a node that stops answering, on the
//! testkit's wire fixture: paused (data requests held, then applied on resume: every attempt in
//! the outage ends in doubt and may land late) and frozen (nothing answered, info included, as a
//! SIGSTOPped node). A blocking acquire retries within its wait and gets the lock, under its own
//! token, with every earlier attempt undone; a guard's release rides out the outage and frees the
//! key. See `crate::failover` in `leasehold`, and `tests/suites/failover.rs` (Redis and etcd)
//! for the give-up cases.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{LockEvent, LockManager, LockOptions, LockStore};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::AerospikeFixture;
use tokio::time::Instant;

/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(1);

type Events = Arc<Mutex<Vec<LockEvent>>>;

fn config(fixture: &AerospikeFixture) -> AerospikeConfig {
    // The store's own retries of an acquire are turned down to one attempt, so the outage is
    // ridden out by the manager's wait loop, which this test is about.
    AerospikeConfig::new(fixture.host_string(), "test", "farm1")
        .fair(false)
        .max_error_rate(0)
        .retries(1, Duration::from_millis(10))
        .total_timeout(Duration::from_millis(300))
        .socket_timeout(Duration::from_millis(300))
}

/// The fixture, a manager over it recording its events (warmed up), and a second store to look
/// at what the node holds.
async fn setup() -> (AerospikeFixture, LockManager, Events, AerospikeStore) {
    let fixture = AerospikeFixture::start().await.unwrap();
    let events: Events = Arc::default();
    let sink = events.clone();
    let locks = LockManager::builder()
        .client_id("orders")
        .farm_id("farm1")
        .store(AerospikeStore::connect(config(&fixture)).await.unwrap())
        .renewal(false)
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let guard = locks.try_lock("warm-up").await.unwrap();
    assert!(guard.release().await.unwrap());
    events.lock().unwrap().clear();
    let direct = AerospikeStore::connect(config(&fixture)).await.unwrap();
    (fixture, locks, events, direct)
}

fn acquired_after(events: &Events) -> Option<u32> {
    events.lock().unwrap().iter().find_map(|e| match e {
        LockEvent::Acquired { attempts, .. } => Some(*attempts),
        _ => None,
    })
}

/// Waits (up to 15 s) until the node holds nothing for `key`: undos still in flight finish.
async fn eventually_free(direct: &AerospikeStore, key: &leasehold::LockKey) {
    let give_up = Instant::now() + Duration::from_secs(15);
    while direct.inspect(key).await.unwrap().is_some() {
        assert!(Instant::now() < give_up, "a lock was left behind on {key}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquire_rides_out_a_paused_node_and_undoes_the_attempts_that_landed_late() {
    let (fixture, locks, events, direct) = setup().await;
    fixture.pause();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock_with("order-1", LockOptions::new().wait(Duration::from_secs(20)))
                .await
        }
    });
    tokio::time::sleep(OUTAGE).await;
    fixture.resume();
    let guard = waiter
        .await
        .unwrap()
        .expect("acquired once the node answered");
    assert!(
        acquired_after(&events).is_some_and(|n| n > 1),
        "retried: {:?}",
        acquired_after(&events)
    );
    let info = direct.inspect(guard.key()).await.unwrap().expect("held");
    assert!(
        info.is_owned_by(guard.token()),
        "held under the guard's own token"
    );
    let key = guard.key().clone();
    assert!(guard.release().await.unwrap());
    eventually_free(&direct, &key).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquire_and_a_release_ride_out_a_frozen_node() {
    let (fixture, locks, events, direct) = setup().await;
    fixture.freeze();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock_with("order-2", LockOptions::new().wait(Duration::from_secs(20)))
                .await
        }
    });
    tokio::time::sleep(OUTAGE).await;
    fixture.thaw();
    let guard = waiter
        .await
        .unwrap()
        .expect("acquired once the node answered");
    assert!(acquired_after(&events).is_some_and(|n| n > 1));
    let key = guard.key().clone();
    let info = direct.inspect(&key).await.unwrap().expect("held");
    assert!(info.is_owned_by(guard.token()));

    fixture.freeze();
    let release = tokio::spawn(guard.release());
    tokio::time::sleep(OUTAGE).await;
    fixture.thaw();
    assert!(
        release
            .await
            .unwrap()
            .expect("released once the node answered"),
        "it was still ours"
    );
    eventually_free(&direct, &key).await;
    assert!(!events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::LeftToExpire { .. })));
}
