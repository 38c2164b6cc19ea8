//! Mutual exclusion across OS processes: several copies of this test binary each increment a
//! shared counter in Redis under the lock with a read-modify-write (GET, then SET — not INCR).
//! Without the lock, updates are lost; with it, the final count is exact.
//!
//! The test is its own worker: run normally it is the coordinator (starts a private redis-server,
//! spawns workers, checks the total); spawned with `LEASEHOLD_WORKER_URL` set it is a worker.

use std::process::Command;
use std::time::Duration;

use leasehold::{LockManager, LockOptions};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

const WORKERS: usize = 4;
const INCREMENTS: usize = 50;
const COUNTER: &str = "leasehold-test:counter";

async fn worker(url: String) {
    let store = RedisStore::connect(RedisConfig::new(url.clone()))
        .await
        .expect("connect");
    let locks = LockManager::builder()
        .client_id("multiprocess")
        .farm_id("f1")
        .store(store)
        .default_layers()
        .build()
        .expect("manager");
    let client = redis::Client::open(url).expect("url");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("counter connection");
    for _ in 0..INCREMENTS {
        let guard = locks
            .lock_with(
                "counter",
                LockOptions::new()
                    .ttl(Duration::from_secs(10))
                    .wait(Duration::from_secs(60)),
            )
            .await
            .expect("lock");
        let seen: Option<u64> = redis::cmd("GET")
            .arg(COUNTER)
            .query_async(&mut conn)
            .await
            .expect("GET");
        tokio::task::yield_now().await;
        let () = redis::cmd("SET")
            .arg(COUNTER)
            .arg(seen.unwrap_or(0) + 1)
            .query_async(&mut conn)
            .await
            .expect("SET");
        assert!(guard.release().await.expect("release"), "still ours");
    }
}

#[test]
fn processes_incrementing_under_the_lock_lose_no_update() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(url) = std::env::var("LEASEHOLD_WORKER_URL") {
        runtime.block_on(worker(url));
        return;
    }
    let server = RedisServer::start().expect("start redis-server");
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..WORKERS)
        .map(|_| {
            Command::new(&me)
                .args([
                    "--exact",
                    "processes_incrementing_under_the_lock_lose_no_update",
                    "--nocapture",
                ])
                .env("LEASEHOLD_WORKER_URL", server.url())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a worker failed");
    }
    let total = server.command(&["GET", COUNTER]).unwrap();
    assert_eq!(total, (WORKERS * INCREMENTS).to_string());
}
