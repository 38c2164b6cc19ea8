//! Job locks and elections on a real Redis: the shared suite (`tests/suites/election.rs`). A job
//! lock released early is kept by a `PEXPIRE` to the rest of its period.

use std::future::Future;
use std::pin::Pin;

use leasehold::LockManager;
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

#[path = "../../../tests/suites/election.rs"]
mod suite;

/// A private redis-server; each instance connects to it on its own.
struct Deployment(RedisServer);

impl suite::Fleet for Deployment {
    fn instance(&self) -> Pin<Box<dyn Future<Output = LockManager> + Send + '_>> {
        Box::pin(async move {
            let store = RedisStore::connect(RedisConfig::new(self.0.url()))
                .await
                .expect("connect");
            LockManager::builder()
                .client_id("jobs")
                .farm_id("f1")
                .store(store)
                .default_layers()
                .build()
                .expect("manager")
        })
    }
}

suite::election_suite!(Deployment(RedisServer::start().expect("start redis")));
