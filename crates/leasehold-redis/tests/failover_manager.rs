//! The lock manager over the Redis store rides out real outages: the shared suite
//! (`tests/suites/failover.rs`, a private redis-server behind the testkit's TCP fault proxy), and
//! here a server turned read-only as a failover leaves a client talking to a replica (`READONLY`).

use std::time::Duration;

use leasehold::{LockEvent, LockOptions};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::fault_proxy::FaultProxy;
use leasehold_testkit::redis::{free_port, RedisServer};

#[path = "../../../tests/suites/failover.rs"]
mod suite;

async fn connect(url: String) -> RedisStore {
    RedisStore::connect(
        RedisConfig::new(url)
            .response_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300)),
    )
    .await
    .expect("connect")
}

impl suite::Deployment for RedisServer {
    type Store = RedisStore;

    fn start() -> Self {
        RedisServer::start().expect("start redis-server")
    }

    fn addr(&self) -> std::net::SocketAddr {
        RedisServer::addr(self)
    }

    async fn connect(&self) -> RedisStore {
        connect(self.url()).await
    }

    async fn connect_through(proxy: &FaultProxy) -> RedisStore {
        connect(proxy.redis_url()).await
    }
}

suite::failover_suite!(RedisServer);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquire_rides_out_a_read_only_primary() {
    let rig = suite::rig::<RedisServer>(|b| b).await;
    // As after a failover that left the client talking to a replica: writes answer READONLY.
    let nowhere = free_port().unwrap().to_string();
    assert_eq!(
        rig.server
            .command(&["REPLICAOF", "127.0.0.1", &nowhere])
            .unwrap(),
        "+OK"
    );
    let waiter = tokio::spawn({
        let locks = rig.locks.clone();
        async move {
            locks
                .lock_with("order-7", LockOptions::new().wait(Duration::from_secs(10)))
                .await
        }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        rig.server.command(&["REPLICAOF", "NO", "ONE"]).unwrap(),
        "+OK"
    );
    let guard = waiter
        .await
        .unwrap()
        .expect("acquired once a primary again");
    let attempts = rig.events().iter().find_map(|e| match e {
        LockEvent::Acquired { attempts, .. } => Some(*attempts),
        _ => None,
    });
    assert!(attempts.is_some_and(|n| n > 1), "retried: {attempts:?}");
    assert!(guard.release().await.unwrap());
}
