//! Mutual exclusion across OS processes on a real Redis: the shared suite
//! (`tests/suites/multiprocess.rs`). The counter is read with GET and written with SET (not INCR).

use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

#[path = "../../../tests/suites/multiprocess.rs"]
mod suite;

impl suite::Deployment for RedisServer {
    type Store = RedisStore;
    type Counter = redis::aio::MultiplexedConnection;
    const INCREMENTS: usize = 50;

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

    async fn counter(address: &str) -> Self::Counter {
        let client = redis::Client::open(address).expect("url");
        client
            .get_multiplexed_async_connection()
            .await
            .expect("counter connection")
    }

    async fn read(counter: &mut Self::Counter) -> u64 {
        let seen: Option<u64> = redis::cmd("GET")
            .arg(suite::COUNTER)
            .query_async(counter)
            .await
            .expect("GET");
        seen.unwrap_or(0)
    }

    async fn write(counter: &mut Self::Counter, value: u64) {
        let () = redis::cmd("SET")
            .arg(suite::COUNTER)
            .arg(value)
            .query_async(counter)
            .await
            .expect("SET");
    }
}

suite::multiprocess_suite!(RedisServer);
