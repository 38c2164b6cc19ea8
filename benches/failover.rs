//! Failover benchmark: how long locks stop being granted when the node holding a lock's data
//! dies, and whether a lock held across it is reported lost. Real deployments on loopback, a
//! fault injected by SIGKILL.
//!
//! Run: `cargo bench -p leasehold-bench --bench failover` (`FAILOVER=redis-cluster`,
//! `redis-sentinel` or `etcd-cluster` for one; `FAILOVER_ROUNDS=N`, default 10).
//!
//! Each round: one task takes and releases the key in a loop (a 1 ms critical section, each
//! `lock()` waiting up to 30 s), while another guard holds a second key under watchdog renewal
//! (TTL 6 s). The node serving both keys (the slot's master, the Sentinel master, the etcd
//! leader) is killed; the round measures the time from the kill to the next lock granted, and
//! whether the held guard reported its lock lost. The node is then restarted and the deployment
//! left to settle before the next round. Printed: p50 and max of the gaps, how many held locks
//! were reported lost, and the store's own failover time for scale (the node timeout or the
//! sentinels' down-after, plus the election).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use leasehold::{LockManager, LockOptions};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::etcd_cluster::EtcdCluster;
use leasehold_testkit::redis_cluster::{
    RedisCluster, RedisSentinel, CLUSTER_NODE_TIMEOUT, SENTINEL_DOWN_AFTER,
};

/// What one round saw.
struct Round {
    gap: Duration,
    /// From the kill until the deployment itself had a new master or leader.
    store: Duration,
    lost: bool,
}

fn manager(store: impl leasehold::LockStore) -> LockManager {
    LockManager::builder()
        .client_id("bench")
        .farm_id("f1")
        .lock_ttl(Duration::from_secs(6))
        .store(store)
        .build()
        .expect("manager")
}

/// Runs one round against `locks`: `fault` is called once the loop runs; it kills the node and
/// returns once the deployment has failed over. Returns the gap from the kill to the next grant,
/// the deployment's own failover time, and whether the held guard was reported lost.
async fn round(locks: &LockManager, round: usize, fault: impl FnOnce()) -> Round {
    let held = locks
        .lock_with(
            format!("held-{round}").as_str(),
            LockOptions::new().wait(Duration::from_secs(30)),
        )
        .await
        .expect("take the held lock");
    let grants = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let stop = tokio_util_stop();
    let looping = {
        let (locks, grants, stop) = (locks.clone(), grants.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match locks
                    .lock_with("loop", LockOptions::new().wait(Duration::from_secs(30)))
                    .await
                {
                    Ok(guard) => {
                        grants.lock().unwrap().push(Instant::now());
                        tokio::time::sleep(Duration::from_millis(1)).await;
                        let _ = guard.release().await;
                    }
                    Err(error) => eprintln!("  lock failed: {}", error.chain()),
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let killed = Instant::now();
    // Blocks this worker only (the loop runs on the other) while the fault waits for the
    // deployment to fail over.
    tokio::task::block_in_place(fault);
    let store = killed.elapsed();
    // Wait for the first grant after the kill, then a while longer for renewal to notice a loss.
    let gap = loop {
        tokio::time::sleep(Duration::from_millis(5)).await;
        // A reply read in the first milliseconds after the kill was sent by the dead node
        // before it died; the next grant comes from the new master.
        let after = killed + Duration::from_millis(20);
        let first = grants.lock().unwrap().iter().copied().find(|t| *t > after);
        if let Some(first) = first {
            break first - killed;
        }
        if killed.elapsed() > Duration::from_secs(60) {
            break killed.elapsed();
        }
    };
    tokio::time::sleep(Duration::from_secs(8)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = looping.await;
    let lost = !held.is_held();
    if lost {
        eprintln!("  the held lock was reported lost: {}", held.lost().await);
    }
    let _ = held.release().await;
    Round { gap, store, lost }
}

fn tokio_util_stop() -> Arc<std::sync::atomic::AtomicBool> {
    Arc::new(std::sync::atomic::AtomicBool::new(false))
}

fn report(label: &str, store_failover: &str, rounds: &[Round]) {
    let mut gaps: Vec<Duration> = rounds.iter().map(|r| r.gap).collect();
    gaps.sort_unstable();
    let mut stores: Vec<Duration> = rounds.iter().map(|r| r.store).collect();
    stores.sort_unstable();
    // How much longer than the deployment's own failover the locks waited, per round.
    let mut extra: Vec<f64> = rounds
        .iter()
        .map(|r| (r.gap.as_secs_f64() - r.store.as_secs_f64()) * 1e3)
        .collect();
    extra.sort_unstable_by(f64::total_cmp);
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "| {label} | {} | {store_failover} | {:.0} / {:.0} | {:.0} | {:.0} | {:.0} / {:.0} | {} of {} |",
        rounds.len(),
        ms(stores[stores.len() / 2]),
        ms(*stores.last().unwrap()),
        ms(gaps[gaps.len() / 2]),
        ms(*gaps.last().unwrap()),
        extra[extra.len() / 2],
        extra.last().unwrap(),
        rounds.iter().filter(|r| r.lost).count(),
        rounds.len()
    );
}

fn main() {
    let only = std::env::var("FAILOVER").ok();
    let wanted = |name: &str| only.as_deref().is_none_or(|o| o == name);
    let rounds: usize = std::env::var("FAILOVER_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    println!("| deployment | failovers | failure detection | store's own failover p50 / max ms | kill → next grant p50 ms | max ms | beyond the store's failover p50 / max ms | held locks reported lost |");
    println!("|---|---|---|---|---|---|---|---|");
    if wanted("redis-cluster") {
        let mut cluster = RedisCluster::start().expect("a Redis Cluster");
        let locks = runtime.block_on(async {
            manager(
                // No min_replicas: with one replica per master, the promoted replica has none
                // of its own until the killed node returns, so min_replicas(1) would refuse
                // every grant on that slot until then (docs/CLUSTERS.md).
                RedisStore::connect(RedisConfig::new(cluster.url()))
                    .await
                    .expect("connect"),
            )
        });
        let mut seen = Vec::new();
        for i in 0..rounds {
            // The held key and the loop's key on one master: the slot of `loop` is the one
            // whose master dies, and `held-i` is checked for loss wherever it lives.
            let master = cluster
                .master_of("leasehold:{DC#f1#bench#loop}")
                .expect("master");
            let replica = cluster.replica_of(master).expect("replica");
            let cluster_ref = &mut cluster;
            let r = runtime.block_on(round(&locks, i, || {
                cluster_ref.kill(master).expect("kill");
                cluster_ref
                    .wait_until(|nodes| nodes.iter().any(|n| n.port == replica && n.master))
                    .expect("the replica took over");
            }));
            eprintln!(
                "  redis cluster round {i}: store {:?}, gap {:?}, lost {}",
                r.store, r.gap, r.lost
            );
            seen.push(r);
            cluster.restart(master).expect("restart");
        }
        report(
            "Redis Cluster, 3 masters + 3 replicas",
            &format!("cluster-node-timeout {CLUSTER_NODE_TIMEOUT:?}"),
            &seen,
        );
    }
    if wanted("redis-sentinel") {
        let mut group = RedisSentinel::start().expect("Redis Sentinel");
        let locks = runtime.block_on(async {
            manager(
                RedisStore::connect(
                    RedisConfig::new(group.url()).min_replicas(1, Duration::from_millis(500)),
                )
                .await
                .expect("connect"),
            )
        });
        let mut seen = Vec::new();
        for i in 0..rounds {
            let master = group.master_port().expect("master");
            let group_ref = &mut group;
            let r = runtime.block_on(round(&locks, i, || {
                group_ref.kill(master).expect("kill");
                group_ref.wait_new_master(master).expect("a new master");
            }));
            eprintln!(
                "  sentinel round {i}: store {:?}, gap {:?}, lost {}",
                r.store, r.gap, r.lost
            );
            seen.push(r);
            group.restart(master).expect("restart");
        }
        report(
            "Sentinel: master + 2 replicas, 3 sentinels, min_replicas(1)",
            &format!("down-after {SENTINEL_DOWN_AFTER:?}"),
            &seen,
        );
    }
    if wanted("etcd-cluster") {
        let cluster = EtcdCluster::start(3).expect("etcd (install etcd-server)");
        let locks = runtime.block_on(async {
            manager(
                EtcdStore::connect(EtcdConfig::new(cluster.endpoints()))
                    .await
                    .expect("connect"),
            )
        });
        let mut seen = Vec::new();
        for i in 0..rounds {
            let leader = cluster.wait_for_leader().expect("leader");
            let r = runtime.block_on(round(&locks, i, || {
                cluster.kill(leader).expect("kill");
                cluster.wait_for_leader().expect("a new leader");
            }));
            eprintln!(
                "  etcd round {i}: store {:?}, gap {:?}, lost {}",
                r.store, r.gap, r.lost
            );
            seen.push(r);
            cluster.restart(leader).expect("restart");
            cluster.wait_healthy().expect("healthy");
        }
        report("etcd, 3 members (leader killed)", "election", &seen);
    }
}
