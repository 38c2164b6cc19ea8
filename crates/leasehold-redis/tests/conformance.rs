//! The store conformance suite against a real, private redis-server: with fencing (the default),
//! without, and in strict FIFO mode.

use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

async fn store(fencing: bool) -> (RedisStore, RedisServer) {
    let server = RedisServer::start().expect("start redis-server");
    let store = RedisStore::connect(RedisConfig::new(server.url()).fencing(fencing))
        .await
        .expect("connect");
    (store, server)
}

mod fenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(true));
}

mod unfenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(false));
}

/// Strict FIFO: one place in the waiter queue per waiting call.
async fn strict_store() -> (RedisStore, RedisServer) {
    let server = RedisServer::start().expect("start redis-server");
    let store = RedisStore::connect(RedisConfig::new(server.url()).strict_fifo(true))
        .await
        .expect("connect");
    (store, server)
}

mod strict_fifo {
    leasehold_testkit::conformance_tests!(with_guard: super::strict_store());
}
