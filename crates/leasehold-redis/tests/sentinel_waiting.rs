//! A waiter through Sentinel keeps hearing release announcements when the master dies: its
//! subscriber connection drops with the master, and the store remakes it on the master the
//! sentinels promote as soon as there is one, not at the next wait.

use std::time::{Duration, Instant};

use leasehold::{LockManager, LockOptions};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis_cluster::RedisSentinel;

/// A manager that retries a down store every 100 ms and, while the store is up, polls a refused
/// wait only every `poll` (the release announcement is what wakes it).
async fn manager(url: &str, poll: Duration) -> LockManager {
    let store = RedisStore::connect(RedisConfig::new(url)).await.unwrap();
    LockManager::builder()
        .client_id("t")
        .farm_id("f1")
        .store(store)
        .min_backoff(Duration::from_millis(100))
        .retry_interval(poll)
        .build()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_woken_by_the_new_master_after_the_old_one_died() {
    let mut group = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis Sentinel (redis-server, redis-sentinel)");
    let url = group.url();
    let holder = manager(&url, Duration::from_millis(100)).await;
    // Polls once a minute: within the test, only an announcement can hand it the lock.
    let waiter = manager(&url, Duration::from_secs(60)).await;
    let held = holder.try_lock("after-failover").await.unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock_with(
                "after-failover",
                LockOptions::new().wait(Duration::from_secs(120)),
            )
            .await
            .expect("its turn comes");
        let got = Instant::now();
        guard.release().await.unwrap();
        got
    });
    // The waiter is in line and subscribed, and both are on the replicas, before the kill.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let old = group.master_port().unwrap();
    group.kill(old).unwrap();
    let (_group, new) = tokio::task::spawn_blocking(move || {
        let new = group.wait_new_master(old);
        (group, new)
    })
    .await
    .unwrap();
    assert_ne!(old, new.expect("the sentinels promoted a replica"));
    // Time for the clients to follow; then the release on the new master must reach the waiter.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let released = Instant::now();
    // The release rides out the holder's own move to the new master within its retry budget.
    assert!(
        held.release().await.expect("released on the new master"),
        "the lock was kept through the failover"
    );
    let got = waiting.await.unwrap();
    let after = got.saturating_duration_since(released);
    assert!(
        after < Duration::from_secs(20),
        "woken by the announcement on the new master, not the minute's poll ({after:?})"
    );
}
