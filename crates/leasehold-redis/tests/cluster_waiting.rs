//! A waiter on a Redis Cluster keeps hearing release announcements across failovers of the
//! lock's slot: the demoted master ends its sharded subscriptions (`SUNSUBSCRIBE` pushed by the
//! node), and the store subscribes again on the slot's new master.

use std::time::Duration;

use leasehold::{LockManager, LockOptions};
use leasehold_core::LockKey;
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis_cluster::RedisCluster;

/// A manager that, while the store is up, polls a refused wait only once a minute: within a
/// test's wait (and with a waiter timeout longer than it), only a release announcement hands it
/// the lock.
fn polling_rarely(store: RedisStore) -> LockManager {
    LockManager::builder()
        .client_id("t")
        .farm_id("f1")
        .store(store)
        .retry_interval(Duration::from_secs(60))
        .build()
        .unwrap()
}

/// A cluster of its own, and a holder and a waiter of `name`, each with a store of its own; the
/// Redis key of `name`'s lock.
async fn cluster_holder_and_waiter(name: &str) -> (RedisCluster, LockManager, LockManager, String) {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("start a Redis Cluster");
    let config = RedisConfig::new(cluster.url());
    let holder_store = RedisStore::connect(config.clone()).await.unwrap();
    let key: LockKey = format!("DC#f1#t#{name}").parse().unwrap();
    let lock_key = holder_store.lock_key(&key);
    let holder = polling_rarely(holder_store);
    // Its place in line lasts four minutes: no renewal of it wakes the waiter either.
    let waiter = polling_rarely(
        RedisStore::connect(config.waiter_timeout(Duration::from_secs(240)))
            .await
            .unwrap(),
    );
    (cluster, holder, waiter, lock_key)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_told_of_the_release_after_failovers_of_the_slot() {
    let (cluster, holder, waiter, lock_key) =
        cluster_holder_and_waiter("told-after-failover").await;
    let mut cluster = Some(cluster);

    for round in 0..2 {
        let guard = holder.try_lock("told-after-failover").await.unwrap();
        let waiter = waiter.clone();
        let waiting = tokio::spawn(async move {
            let guard = waiter
                .lock_with(
                    "told-after-failover",
                    LockOptions::new().wait(Duration::from_secs(30)),
                )
                .await?;
            let token = guard.fencing_token();
            guard.release().await?;
            Ok::<_, leasehold::Error>(token)
        });
        // The waiter is in line and subscribed on the slot's master before the failover.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let group = cluster.take().unwrap();
        let lock_key = lock_key.clone();
        let (group, moved) = tokio::task::spawn_blocking(move || {
            let moved = group.master_of(&lock_key).and_then(|master| {
                let new = group.failover_takeover(master)?;
                group.wait_healthy()?;
                Ok((master, new))
            });
            (group, moved)
        })
        .await
        .unwrap();
        cluster = Some(group);
        let (old, new) = moved.expect("the slot's replica took over");
        assert_ne!(old, new);
        // Time for the holder's store to follow the slot; then the release on the new master
        // must reach the waiter.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "round {round}: the lock was held");
        let held = guard.fencing_token();
        assert!(
            guard.release().await.expect("released on the new master"),
            "round {round}: the lock was kept through the failover"
        );
        let granted = waiting
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("round {round}: the waiter heard the release: {e}"));
        assert!(granted > held, "round {round}: {held:?} then {granted:?}");
    }
}

/// A killed master ends no subscription itself (nothing is pushed), and the cluster client keeps
/// its subscriptions on the dead address until something refreshes its slot map. The store
/// subscribes again when a node's connection drops, so a waiter whose slot moved to a promoted
/// replica hears the release published there, rather than polling. The lock is held long enough
/// after the failover for the waiter's polling backoff to have grown past the time it is given
/// to hear the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_is_told_of_the_release_after_its_slots_master_is_killed() {
    let (mut cluster, holder, waiter, lock_key) =
        cluster_holder_and_waiter("told-after-kill").await;
    let guard = holder.try_lock("told-after-kill").await.unwrap();
    let waiting = tokio::spawn({
        let waiter = waiter.clone();
        async move {
            let guard = waiter
                .lock_with(
                    "told-after-kill",
                    LockOptions::new().wait(Duration::from_secs(90)),
                )
                .await?;
            let granted_at = tokio::time::Instant::now();
            guard.release().await?;
            Ok::<_, leasehold::Error>(granted_at)
        }
    });
    // The waiter is in line and subscribed on the slot's master before the kill.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let old = cluster.master_of(&lock_key).unwrap();
    cluster.kill(old).unwrap();
    let lock_key_now = lock_key.clone();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster
            .wait_until(|_| {
                cluster
                    .master_of(&lock_key_now)
                    .is_ok_and(|master| master != old)
            })
            .map(|()| cluster)
    })
    .await
    .unwrap()
    .expect("a replica of the killed master is promoted");
    // Held on: the waiter's refused attempts meanwhile stretch its polling backoff.
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(!waiting.is_finished(), "the lock was held");
    let released_at = tokio::time::Instant::now();
    assert!(
        guard.release().await.expect("released on the new master"),
        "the lock was kept through the failover"
    );
    let granted_at = waiting
        .await
        .unwrap()
        .expect("the waiter got the lock within its wait");
    let heard_in = granted_at.saturating_duration_since(released_at);
    assert!(
        heard_in < Duration::from_secs(3),
        "the waiter heard the release on the promoted master ({heard_in:?} after it), rather \
         than at its next poll"
    );
    drop(cluster);
}
