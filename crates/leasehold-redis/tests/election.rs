//! Job locks on a real Redis: a job lock released early is kept (a `PEXPIRE` to the rest of its
//! period) and then expires.

use std::time::Duration;

use leasehold::{LockManager, LockOptions, ReleaseOutcome};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

/// One "process" of the fleet: its own manager and connection.
async fn instance(server: &RedisServer) -> LockManager {
    let store = RedisStore::connect(RedisConfig::new(server.url()))
        .await
        .expect("connect");
    LockManager::builder()
        .client_id("jobs")
        .farm_id("f1")
        .store(store)
        .default_layers()
        .build()
        .expect("manager")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_lock_released_early_keeps_other_instances_out_until_its_period_ends() {
    let server = RedisServer::start().expect("start redis");
    let a = instance(&server).await;
    let b = instance(&server).await;
    let period = Duration::from_secs(2);

    let guard = a
        .try_lock_with("nightly", LockOptions::new().hold_at_least(period))
        .await
        .unwrap();
    let outcome = guard.release_outcome().await.unwrap();
    let ReleaseOutcome::Kept { left } = outcome else {
        panic!("released at once after the grant, yet {outcome:?}");
    };
    assert!(left <= period);
    // The record lives on with the rest of the period as its Redis TTL.
    let info = b.inspect("nightly").await.unwrap().expect("kept");
    assert!(info.ttl_remaining.expect("a TTL") <= period);
    let err = b.try_lock("nightly").await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");

    // Then Redis expires it and the next period's run gets it.
    let next = b
        .lock_with("nightly", LockOptions::new().wait(Duration::from_secs(20)))
        .await
        .expect("free once the period has passed");
    assert_eq!(
        next.release_outcome().await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_lock_released_after_its_period_is_freed_at_once() {
    let server = RedisServer::start().expect("start redis");
    let a = instance(&server).await;
    let guard = a
        .try_lock_with(
            "quick",
            LockOptions::new().hold_at_least(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        guard.release_outcome().await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(a.inspect("quick").await.unwrap(), None);
}
