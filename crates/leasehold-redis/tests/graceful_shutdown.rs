//! Holders that die, on a real Redis: the shared suite (`tests/suites/graceful_shutdown.rs`). A
//! lock left by a killed holder stays until its key's `PEXPIRE` runs out.

use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

#[path = "../../../tests/suites/graceful_shutdown.rs"]
mod suite;

impl suite::Deployment for RedisServer {
    type Store = RedisStore;

    fn start(_: &tokio::runtime::Runtime) -> Self {
        RedisServer::start().expect("start redis-server")
    }

    fn address(&self) -> String {
        self.url()
    }

    async fn connect(address: &str) -> RedisStore {
        RedisStore::connect(RedisConfig::new(address))
            .await
            .expect("connect")
    }
}

suite::graceful_shutdown_suite!(RedisServer);
