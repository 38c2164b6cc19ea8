//! Mutual exclusion across OS processes: several copies of this test binary each increment a
//! shared counter in etcd under one etcd lock with a read-modify-write (a plain get, then a plain
//! put — no transaction). Without the lock, updates are lost; with it, the final count is exact.
//!
//! The test is its own worker: run normally it is the coordinator (starts a private etcd, spawns
//! workers, checks the total); spawned with `LEASEHOLD_WORKER_ENDPOINT` set it is a worker.

use std::process::Command;
use std::time::Duration;

use leasehold::{LockManager, LockOptions};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

const WORKERS: usize = 4;
const INCREMENTS: usize = 25;
const COUNTER: &str = "leasehold-test:counter";

async fn worker(endpoint: String) {
    let store = EtcdStore::connect(EtcdConfig::new([endpoint.clone()]))
        .await
        .expect("connect");
    let locks = LockManager::builder()
        .client_id("multiprocess")
        .farm_id("f1")
        .store(store)
        .default_layers()
        .build()
        .expect("manager");
    let mut client = etcd_client::Client::connect([endpoint], None)
        .await
        .expect("counter connection");
    for _ in 0..INCREMENTS {
        let guard = locks
            .lock_with(
                "counter",
                LockOptions::new()
                    .ttl(Duration::from_secs(10))
                    .wait(Duration::from_secs(120)),
            )
            .await
            .expect("lock");
        let seen: u64 = match client.get(COUNTER, None).await.expect("get").kvs().first() {
            Some(kv) => kv.value_str().unwrap().parse().unwrap(),
            None => 0,
        };
        tokio::task::yield_now().await;
        client
            .put(COUNTER, (seen + 1).to_string(), None)
            .await
            .expect("put");
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
    if let Ok(endpoint) = std::env::var("LEASEHOLD_WORKER_ENDPOINT") {
        runtime.block_on(worker(endpoint));
        return;
    }
    let server = EtcdServer::start().expect("start etcd");
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..WORKERS)
        .map(|_| {
            Command::new(&me)
                .args([
                    "--exact",
                    "processes_incrementing_under_the_lock_lose_no_update",
                    "--nocapture",
                ])
                .env("LEASEHOLD_WORKER_ENDPOINT", server.endpoint())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a worker failed");
    }
    let total = runtime.block_on(async {
        let mut client = etcd_client::Client::connect([server.endpoint()], None)
            .await
            .unwrap();
        let response = client.get(COUNTER, None).await.unwrap();
        response.kvs()[0].value_str().unwrap().to_owned()
    });
    assert_eq!(total, (WORKERS * INCREMENTS).to_string());
}
