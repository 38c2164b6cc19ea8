//! etcd failover, measured on a private 3-member cluster (heartbeat 50 ms, election timeout
//! 250 ms): over N rounds the leader is killed (or paused) while locks are held with watchdog
//! renewal and one client acquires and releases a lock in a loop; each round reports the time
//! from the fault to the next lock granted, the acquisitions that failed, and the held locks that
//! were reported lost. The member is healed before the next round.
//!
//! A baseline first: etcd-client's own balanced channel over the three endpoints with the member
//! behind the first endpoint killed, to show what the store no longer does.
//!
//! ```text
//! cargo run --release -p leasehold-bench --example etcd_failover -- [rounds] [kill|pause]
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::LockManager;
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd_cluster::{EtcdCluster, Fault};
use tokio::time::Instant;

/// Locks held (and renewed) through each fault.
const HELD: usize = 5;
/// Their TTL: the watchdog renews every third of it.
const TTL: Duration = Duration::from_secs(3);

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let rounds: usize = args.next().map_or(Ok(10), |n| n.parse())?;
    let fault = match args.next().as_deref() {
        None | Some("kill") => Fault::Kill,
        Some("pause") => Fault::Pause,
        Some(other) => return Err(format!("unknown fault {other:?} (kill or pause)").into()),
    };
    let cluster = Arc::new(tokio::task::spawn_blocking(|| EtcdCluster::start(3)).await??);

    baseline(&cluster).await?;

    let mut to_grant = Vec::new();
    let (mut lost, mut failed, mut attempts) = (0, 0, 0);
    for round in 0..rounds {
        let prefix = format!("failover{round}:");
        let holder = manager(&cluster, &prefix).await?;
        let prober = manager(&cluster, &prefix).await?;
        let mut held = Vec::new();
        for i in 0..HELD {
            held.push(holder.try_lock(format!("held-{i}").as_str()).await?);
        }
        // Acquire-release in a loop, each success's grant instant recorded.
        let stop = Arc::new(AtomicBool::new(false));
        let grants = Arc::new(Mutex::new(Vec::new()));
        let probing = {
            let (stop, grants) = (stop.clone(), grants.clone());
            tokio::spawn(async move {
                let (mut tried, mut failures) = (0, 0);
                while !stop.load(Ordering::SeqCst) {
                    tried += 1;
                    match prober.try_lock("probe").await {
                        Ok(guard) => {
                            grants
                                .lock()
                                .unwrap_or_else(std::sync::PoisonError::into_inner)
                                .push(Instant::now());
                            if !matches!(guard.release().await, Ok(true)) {
                                failures += 1;
                            }
                        }
                        Err(error) => {
                            eprintln!("  acquire failed: {}", error.chain());
                            failures += 1;
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
                (tried, failures)
            })
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        let leader = {
            let c = cluster.clone();
            tokio::task::spawn_blocking(move || c.wait_for_leader()).await??
        };
        let at = Instant::now();
        cluster.hurt(leader, fault)?;
        tokio::time::sleep(TTL * 2).await;
        stop.store(true, Ordering::SeqCst);
        let (tried, failures) = probing.await?;
        let first = grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .copied()
            .find(|granted| *granted > at);
        let lost_now = held.iter().filter(|g| !g.is_held()).count();
        for guard in held {
            let _ = guard.release().await;
        }
        match first {
            Some(granted) => {
                let took = granted - at;
                to_grant.push(took);
                println!(
                    "round {round}: member {leader} {fault:?}: next lock granted after {took:?}, \
                     {failures}/{tried} acquisitions failed, {lost_now}/{HELD} held locks lost"
                );
            }
            None => println!("round {round}: no lock granted after the fault"),
        }
        lost += lost_now;
        failed += failures;
        attempts += tried;
        let c = cluster.clone();
        tokio::task::spawn_blocking(move || c.heal_all()).await??;
    }
    to_grant.sort();
    if let (Some(max), false) = (to_grant.last(), to_grant.is_empty()) {
        println!(
            "{fault:?} of the leader, {} rounds: fault -> next lock granted p50 {:?}, max {:?}; \
             {failed}/{attempts} acquisitions failed; {lost}/{} held locks reported lost",
            to_grant.len(),
            to_grant[to_grant.len() / 2],
            max,
            rounds * HELD
        );
    }
    Ok(())
}

/// A manager on every member, in member order, with the default store settings.
async fn manager(cluster: &EtcdCluster, prefix: &str) -> leasehold::Result<LockManager> {
    let store = EtcdStore::connect(EtcdConfig::from_url(&cluster.url())?.prefix(prefix)).await?;
    LockManager::builder()
        .client_id("failover")
        .farm_id("bench")
        .store(store)
        .default_layers()
        .lock_ttl(TTL)
        .build()
}

/// etcd-client's balanced channel with the first endpoint's member killed: how many of 50 reads
/// fail (the store sends none of its requests this way).
async fn baseline(cluster: &EtcdCluster) -> Result<(), Box<dyn std::error::Error>> {
    let endpoints = cluster.endpoints();
    let mut client = etcd_client::Client::connect(&endpoints, None).await?;
    cluster.kill(0)?;
    let mut failed = 0;
    for _ in 0..50 {
        if client.get("baseline", None).await.is_err() {
            failed += 1;
        }
    }
    let store = EtcdStore::connect(EtcdConfig::from_url(&cluster.url())?).await?;
    let locks = LockManager::builder()
        .client_id("failover")
        .farm_id("bench")
        .store(store)
        .default_layers()
        .build()?;
    let mut store_failed = 0;
    for _ in 0..50 {
        match locks.try_lock("baseline").await {
            Ok(guard) => {
                let _ = guard.release().await;
            }
            Err(_) => store_failed += 1,
        }
    }
    println!(
        "baseline, member 0 (first endpoint) killed: etcd-client balanced channel {failed}/50 \
         reads failed; leasehold-etcd {store_failed}/50 lock+release failed"
    );
    tokio::task::block_in_place(|| cluster.heal_all())?;
    Ok(())
}
