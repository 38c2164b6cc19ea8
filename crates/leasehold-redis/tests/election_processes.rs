//! Elections between candidate processes on a real Redis: the shared suite
//! (`tests/suites/election_processes.rs`). Each candidate process connects to the test's private
//! redis-server by its URL.

use std::future::Future;
use std::pin::Pin;

use leasehold::LockManager;
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

#[path = "../../../tests/suites/election_processes.rs"]
mod suite;

/// A private redis-server.
struct Deployment(RedisServer);

impl suite::Store for Deployment {
    fn address(&self) -> String {
        self.0.url()
    }

    fn connect(address: String) -> Pin<Box<dyn Future<Output = LockManager> + Send>> {
        Box::pin(async move {
            let store = RedisStore::connect(RedisConfig::new(address))
                .await
                .expect("connect");
            LockManager::builder()
                .client_id("procs")
                .farm_id("f1")
                .store(store)
                .default_layers()
                .build()
                .expect("manager")
        })
    }
}

suite::election_processes_suite!(
    Deployment,
    Deployment(RedisServer::start().expect("start redis"))
);
