//! Faults on real Redis deployments: forced failovers (`CLUSTER FAILOVER TAKEOVER`,
//! `SENTINEL FAILOVER`) and a killed master, while a lock is held, while waiters wait, and while
//! acquisitions run in a loop. Each test starts its own cluster or sentinel group, since it
//! breaks it.

use std::time::{Duration, Instant};

use leasehold::{LockManager, LockOptions};
use leasehold_core::{Acquire, ErrorKind, LockKey, LockStore, OwnerToken};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;
use leasehold_testkit::redis_cluster::{RedisCluster, RedisSentinel};

const TTL: Duration = Duration::from_secs(20);

fn key(name: &str) -> LockKey {
    format!("DC#f1#t#{name}").parse().unwrap()
}

/// Retries `op` while it fails with a temporary error, for at most `budget`: what renewal and a
/// blocking acquire do across a failover.
async fn within<T, F, Fut>(budget: Duration, mut op: F) -> leasehold_core::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = leasehold_core::Result<T>>,
{
    let started = Instant::now();
    loop {
        match op().await {
            Err(e) if e.is_temporary() && started.elapsed() < budget => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            done => return done,
        }
    }
}

/// A manager on `store` with the default stack and watchdog, keys `DC#f1#t#<name>`.
fn manager(store: RedisStore, ttl: Duration) -> LockManager {
    LockManager::builder()
        .client_id("t")
        .farm_id("f1")
        .lock_ttl(ttl)
        .store(store)
        .build()
        .unwrap()
}

/// Takes and releases `loop` for `run`, each `lock()` waiting up to 30 s: how many times, or the
/// first error.
fn acquire_in_a_loop(
    locks: LockManager,
    run: Duration,
) -> tokio::task::JoinHandle<leasehold::Result<u32>> {
    tokio::spawn(async move {
        let mut done = 0u32;
        let started = Instant::now();
        while started.elapsed() < run {
            let guard = locks
                .lock_with("loop", LockOptions::new().wait(Duration::from_secs(30)))
                .await?;
            tokio::time::sleep(Duration::from_millis(5)).await;
            guard.release().await?;
            done += 1;
        }
        Ok(done)
    })
}

/// The last command of every direct connection (the store's own, one per master, named
/// `leasehold-direct`) on the node at `port`, from `CLIENT LIST`: how a test tells that lock
/// operations went straight to the node rather than through the cluster client.
fn direct_commands(cluster: &RedisCluster, port: u16) -> Vec<String> {
    let list = cluster
        .node(port)
        .expect("a node on that port")
        .command(&["CLIENT", "LIST"])
        .unwrap();
    list.lines()
        .filter(|line| line.split(' ').any(|f| f == "name=leasehold-direct"))
        .filter_map(|line| line.split(' ').find_map(|f| f.strip_prefix("cmd=")))
        .map(str::to_owned)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_failover_loses_no_lock_acknowledged_by_a_replica() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("start a Redis Cluster");
    let config = RedisConfig::new(cluster.url()).min_replicas(1, Duration::from_millis(500));
    let holder = RedisStore::connect(config.clone()).await.unwrap();
    let other = RedisStore::connect(config).await.unwrap();
    for round in 0..3 {
        let k = key(&format!("failover-{round}"));
        let lease = holder
            .try_acquire(&Acquire::new(k.clone(), OwnerToken::generate(), TTL))
            .await
            .expect("acquire (acknowledged by a replica)");
        let master = cluster.master_of(&holder.lock_key(&k)).unwrap();
        // The grant and its WAIT went straight to the slot's master, WAIT on the connection
        // that carried the write.
        assert!(
            direct_commands(&cluster, master)
                .iter()
                .any(|c| c == "wait"),
            "round {round}: {:?}",
            direct_commands(&cluster, master)
        );
        let promoted = cluster.failover_takeover(master).unwrap();
        assert_ne!(promoted, master);
        // The promoted replica had the grant: nobody else gets the lock.
        let refused = within(Duration::from_secs(10), || {
            let req = Acquire::new(k.clone(), OwnerToken::generate(), TTL);
            let other = other.clone();
            async move { other.try_acquire(&req).await }
        })
        .await;
        assert_eq!(
            refused.map(|_| ()).unwrap_err().kind(),
            ErrorKind::LockUnavailable,
            "round {round}: the lock survived the failover"
        );
        let info = other.inspect(&k).await.unwrap().expect("still held");
        assert_eq!(info.token.as_ref(), Some(lease.token()));
        // The holder renews and releases on the new master.
        let lease = within(Duration::from_secs(10), || holder.extend(&lease, TTL))
            .await
            .expect("extend after the failover");
        assert!(within(Duration::from_secs(10), || holder.release(&lease))
            .await
            .unwrap());
        assert!(other.inspect(&k).await.unwrap().is_none(), "nothing left");
        // After the failover the direct route found the promoted master: the last inspect ran
        // there, not through the cluster client.
        assert!(
            direct_commands(&cluster, promoted)
                .iter()
                .any(|c| c == "evalsha"),
            "round {round}: {:?}",
            direct_commands(&cluster, promoted)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_in_a_loop_ride_out_a_killed_master() {
    let mut cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("start a Redis Cluster");
    let store = RedisStore::connect(RedisConfig::new(cluster.url()))
        .await
        .unwrap();
    let k = key("loop");
    let master = cluster.master_of(&store.lock_key(&k)).unwrap();
    let runs = acquire_in_a_loop(manager(store.clone(), TTL), Duration::from_secs(8));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    cluster.kill(master).unwrap();
    let done = runs
        .await
        .unwrap()
        .expect("every acquisition rode out the failover");
    assert!(done > 10, "{done} acquisitions");
    let new_master = cluster.master_of(&store.lock_key(&k)).unwrap();
    assert_ne!(new_master, master);
    assert!(store.inspect(&k).await.unwrap().is_none(), "nothing left");
    assert!(
        direct_commands(&cluster, new_master)
            .iter()
            .any(|c| c == "evalsha"),
        "the acquisitions after the failover went straight to the new master: {:?}",
        direct_commands(&cluster, new_master)
    );
}

/// A try on `k`, whose master (port `master`) is down, fails as temporary and names that master.
async fn try_fails_naming(store: &RedisStore, k: &LockKey, master: u16) {
    let err = store
        .try_acquire(&Acquire::new(k.clone(), OwnerToken::generate(), TTL))
        .await
        .unwrap_err();
    assert!(err.is_temporary(), "{err}");
    assert!(err.to_string().contains(&format!(":{master}")), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_error_on_a_cluster_names_the_node_that_failed_and_the_slot() {
    // No replicas: a killed master's slots stay without one until it comes back.
    let mut cluster = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(0))
        .await
        .unwrap()
        .expect("start a Redis Cluster without replicas");
    let store = RedisStore::connect(RedisConfig::new(cluster.url()))
        .await
        .unwrap();
    let k = key("named");
    let lock_key = store.lock_key(&k);
    let (master, slot) = (
        cluster.master_of(&lock_key).unwrap(),
        cluster.slot_of(&lock_key).unwrap(),
    );
    assert!(store.inspect(&k).await.unwrap().is_none());
    cluster.kill(master).unwrap();
    let err = store.inspect(&k).await.unwrap_err();
    assert!(err.is_temporary(), "{err}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("node 127.0.0.1:{master} (slot {slot})")),
        "names the master that failed: {message}"
    );
    assert!(
        std::error::Error::source(&err).is_some(),
        "the Redis error is kept as the cause"
    );
    // A write names it too, and reports nothing held.
    try_fails_naming(&store, &k, master).await;
    // A listing scans every master: the dead one's scan fails, naming that master alone.
    let err = store.list("").await.unwrap_err();
    let message = err.to_string();
    let named = format!("Redis at 127.0.0.1:{master}");
    let after = message.split_once(&named).map(|(_, after)| after);
    assert!(
        after.is_some_and(
            |after| !after.starts_with(',') && !after.starts_with(|c: char| c.is_ascii_digit())
        ),
        "names the master whose scan failed, not the seed list: {message}"
    );
    // A store started now (a service restarting during the outage) connects, and serves the
    // slots whose masters are up; the dead master's slot fails as above.
    let started = RedisStore::connect(RedisConfig::new(cluster.url()))
        .await
        .expect("connects with a master down");
    let elsewhere = (0..100)
        .map(|i| key(&format!("elsewhere-{i}")))
        .find(|k| cluster.master_of(&started.lock_key(k)).unwrap() != master)
        .expect("a key on another master");
    let lease = started
        .try_acquire(&Acquire::new(elsewhere, OwnerToken::generate(), TTL))
        .await
        .expect("a slot whose master is up is served");
    assert!(started.release(&lease).await.unwrap());
    try_fails_naming(&started, &k, master).await;
    // The master comes back: the store reconnects to it and locks work again.
    let _cluster = tokio::task::spawn_blocking(move || cluster.restart(master).map(|()| cluster))
        .await
        .unwrap()
        .expect("restart the master");
    let lease = within(Duration::from_secs(20), || {
        let req = Acquire::new(k.clone(), OwnerToken::generate(), TTL);
        let store = store.clone();
        async move { store.try_acquire(&req).await }
    })
    .await
    .expect("locks work once the master is back");
    assert!(store.release(&lease).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_cluster_is_told_of_the_release() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("start a Redis Cluster");
    let config = RedisConfig::new(cluster.url());
    // Polling once a minute: only the release announcement (sharded pub/sub) can wake the
    // waiter within its wait.
    let polling_rarely = |store| {
        LockManager::builder()
            .client_id("t")
            .farm_id("f1")
            .store(store)
            .retry_interval(Duration::from_secs(60))
            .build()
            .unwrap()
    };
    let holder = polling_rarely(RedisStore::connect(config.clone()).await.unwrap());
    let waiter = polling_rarely(RedisStore::connect(config).await.unwrap());
    let guard = holder.try_lock("told").await.unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .lock_with("told", LockOptions::new().wait(Duration::from_secs(20)))
            .await
            .map(|g| g.fencing_token())
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let held = guard.fencing_token();
    guard.release().await.unwrap();
    let granted = waiting.await.unwrap().expect("the waiter got the lock");
    assert!(
        granted > held,
        "fencing tokens grow: {held:?} then {granted:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sentinel_failover_is_followed_and_loses_no_acknowledged_lock() {
    let group = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis Sentinel");
    let config = RedisConfig::new(group.url()).min_replicas(1, Duration::from_millis(500));
    let holder = RedisStore::connect(config.clone()).await.unwrap();
    let k = key("sentinel-failover");
    let lease = holder
        .try_acquire(&Acquire::new(k.clone(), OwnerToken::generate(), TTL))
        .await
        .unwrap();
    let old = group.master_port().unwrap();
    let new = tokio::task::spawn_blocking(move || {
        let port = group.failover();
        (group, port)
    })
    .await
    .unwrap();
    let (group, new) = (new.0, new.1.expect("failover"));
    assert_ne!(old, new);
    // The holder's store follows the failover (a READONLY answer from the demoted master makes
    // it ask the sentinels again), renews and releases on the new master.
    let lease = within(Duration::from_secs(15), || holder.extend(&lease, TTL))
        .await
        .expect("extend on the new master");
    let other = RedisStore::connect(RedisConfig::new(group.url()))
        .await
        .unwrap();
    let info = other
        .inspect(&k)
        .await
        .unwrap()
        .expect("held on the new master");
    assert_eq!(info.token.as_ref(), Some(lease.token()));
    assert!(within(Duration::from_secs(10), || holder.release(&lease))
        .await
        .unwrap());
    assert!(other.inspect(&k).await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_few_replicas_undo_the_grant_and_say_so() {
    // A lone server has no replica: WAIT 1 answers 0, so no lock may be reported held.
    let server = RedisServer::start().unwrap();
    let store = RedisStore::connect(
        RedisConfig::new(server.url()).min_replicas(1, Duration::from_millis(100)),
    )
    .await
    .unwrap();
    let k = key("unacknowledged");
    let err = store
        .try_acquire(&Acquire::new(k.clone(), OwnerToken::generate(), TTL))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.is_temporary());
    assert!(err.to_string().contains("replicas"), "{err}");
    assert!(
        store.inspect(&k).await.unwrap().is_none(),
        "the grant was undone"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_of_one_server_acknowledges_grants_and_extends_until_it_stops() {
    let master = RedisServer::start().unwrap();
    let port = master.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port]).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while replica
        .info_field("replication", "master_link_status")
        .ok()
        .as_deref()
        != Some("up")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the replica never synced"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let connect = |fair: bool| {
        RedisStore::connect(
            RedisConfig::new(master.url())
                .fair(fair)
                .min_replicas(1, Duration::from_millis(500)),
        )
    };
    for (name, fair) in [("acknowledged", true), ("acknowledged-first-come", false)] {
        let store = connect(fair).await.unwrap();
        let lease = store
            .try_acquire(&Acquire::new(key(name), OwnerToken::generate(), TTL))
            .await
            .expect("a replica acknowledged the grant");
        let lease = store.extend(&lease, TTL).await.expect("and the extend");
        assert!(store.release(&lease).await.unwrap());
    }
    // The replica stops answering: the next grant is not confirmed, and undone.
    let store = connect(true).await.unwrap();
    replica.pause().unwrap();
    let k = key("unacknowledged-after-pause");
    let err = store
        .try_acquire(&Acquire::new(k.clone(), OwnerToken::generate(), TTL))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("only 0 of the 1"), "{err}");
    assert!(
        store.inspect(&k).await.unwrap().is_none(),
        "the grant was undone"
    );
    replica.resume().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_server_url_at_a_cluster_node_names_redis_cluster() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("start a Redis Cluster");
    let seed = cluster.seeds()[0].clone();
    let err = RedisStore::connect(RedisConfig::new(format!("redis://{seed}")))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreSetup, "{err}");
    assert!(err.to_string().contains("redis+cluster://"), "{err}");
    // And the other way round: a cluster URL at a lone server.
    let server = RedisServer::start().unwrap();
    let err = RedisStore::connect(RedisConfig::cluster([format!(
        "127.0.0.1:{}",
        server.port()
    )]))
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreSetup, "{err}");
    assert!(err.to_string().contains("not a cluster"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_master_costs_a_renewed_lock_nothing_and_its_waiter_gets_it_after() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("start a Redis Cluster");
    // Without min_replicas: while the old master is paused the promoted replica has no replica
    // of its own, and min_replicas(1) would (rightly) refuse to confirm the renewals.
    let config = RedisConfig::new(cluster.url());
    let holder_store = RedisStore::connect(config.clone()).await.unwrap();
    let master = cluster
        .master_of(&holder_store.lock_key(&key("paused")))
        .unwrap();
    // Renewed every 3.3 s by the watchdog.
    let holder = manager(holder_store, Duration::from_secs(10));
    let waiter = manager(
        RedisStore::connect(config).await.unwrap(),
        Duration::from_secs(10),
    );
    let guard = holder.try_lock("paused").await.unwrap();
    let waiting = tokio::spawn(async move {
        waiter
            .lock_with("paused", LockOptions::new().wait(Duration::from_secs(40)))
            .await
            .map(|g| g.fencing_token())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Paused past the node timeout: its replica takes the slot over meanwhile.
    let promoted = cluster.replica_of(master).unwrap();
    cluster.node(master).unwrap().pause().unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    cluster.node(master).unwrap().resume().unwrap();
    cluster
        .wait_until(|nodes| nodes.iter().any(|n| n.port == promoted && n.master))
        .unwrap();
    // Renewal rode out the pause: the lock was never reported lost, and it is still ours.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(guard.is_held(), "the renewed lock was not reported lost");
    if waiting.is_finished() {
        panic!(
            "the waiter finished while the lock was held: {:?}",
            waiting.await
        );
    }
    let held = guard.fencing_token();
    assert!(guard.release().await.unwrap());
    let granted = waiting
        .await
        .unwrap()
        .expect("the waiter got the lock after the release");
    assert!(granted > held, "{held:?} then {granted:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquisitions_in_a_loop_ride_out_a_killed_sentinel_master() {
    let mut group = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis Sentinel");
    let store = RedisStore::connect(RedisConfig::new(group.url()))
        .await
        .unwrap();
    let runs = acquire_in_a_loop(manager(store.clone(), TTL), Duration::from_secs(10));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let old = group.master_port().unwrap();
    group.kill(old).unwrap();
    let new = tokio::task::spawn_blocking(move || {
        let new = group.wait_new_master(old);
        (group, new)
    })
    .await
    .unwrap();
    let (_group, new) = (new.0, new.1.expect("the sentinels promoted a replica"));
    assert_ne!(new, old);
    let done = runs
        .await
        .unwrap()
        .expect("every acquisition rode out the failover");
    assert!(done > 10, "{done} acquisitions");
    let looped = key("loop");
    assert!(
        within(Duration::from_secs(10), || store.inspect(&looped))
            .await
            .unwrap()
            .is_none(),
        "nothing left"
    );
}
