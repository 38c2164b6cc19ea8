//! The lock manager over the etcd store rides out real outages: the shared suite
//! (`tests/suites/failover.rs`, a private etcd behind the testkit's TCP fault proxy, gRPC over
//! HTTP/2 going through it byte for byte), and here a private etcd killed and restarted (a member
//! that crashed and came back).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{LockEvent, LockManager, LockOptions, LockStore};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use leasehold_testkit::fault_proxy::FaultProxy;

#[path = "../../../tests/suites/failover.rs"]
mod suite;

/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(1);

type Events = Arc<Mutex<Vec<LockEvent>>>;

impl suite::Deployment for EtcdServer {
    type Store = EtcdStore;

    fn start() -> Self {
        EtcdServer::start().expect("start etcd")
    }

    fn addr(&self) -> std::net::SocketAddr {
        EtcdServer::addr(self)
    }

    async fn connect(&self) -> EtcdStore {
        connect(self.endpoint()).await
    }

    async fn connect_through(proxy: &FaultProxy) -> EtcdStore {
        connect(proxy.addr().to_string()).await
    }
}

suite::failover_suite!(EtcdServer);

async fn connect(endpoint: String) -> EtcdStore {
    EtcdStore::connect(
        EtcdConfig::new([endpoint])
            .response_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("connect")
}

/// A manager over `store`, recording its events, warmed up (connected, one lock taken and
/// released).
async fn manager(store: EtcdStore, renewal: bool) -> (LockManager, Events) {
    let events: Events = Arc::default();
    let sink = events.clone();
    let locks = LockManager::builder()
        .client_id("failover")
        .farm_id("f1")
        .store(store)
        .renewal(renewal)
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let guard = locks.try_lock("warm-up").await.unwrap();
    assert!(guard.release().await.unwrap());
    events.lock().unwrap().clear();
    (locks, events)
}

fn acquired_after(events: &Events) -> Option<u32> {
    events.lock().unwrap().iter().find_map(|e| match e {
        LockEvent::Acquired { attempts, .. } => Some(*attempts),
        _ => None,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquire_and_a_release_ride_out_etcd_restarts() {
    let mut server = EtcdServer::start().expect("start etcd");
    let (locks, events) = manager(connect(server.endpoint()).await, false).await;
    server.stop();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock_with("order-1", LockOptions::new().wait(Duration::from_secs(30)))
                .await
        }
    });
    tokio::time::sleep(OUTAGE).await;
    server.restart().expect("restart etcd");
    let guard = waiter.await.unwrap().expect("acquired once etcd was back");
    assert!(
        acquired_after(&events).is_some_and(|n| n > 1),
        "retried: {:?}",
        acquired_after(&events)
    );
    let direct = connect(server.endpoint()).await;
    let info = direct
        .inspect(guard.key())
        .await
        .unwrap()
        .expect("held in etcd");
    assert!(info.is_owned_by(guard.token()));

    // And its release rides out the next restart.
    server.stop();
    let release = tokio::spawn(guard.release());
    tokio::time::sleep(OUTAGE).await;
    server.restart().expect("restart etcd");
    assert!(
        release.await.unwrap().expect("released once etcd was back"),
        "it was still ours"
    );
    let direct = connect(server.endpoint()).await;
    assert_eq!(
        direct
            .inspect(&locks.key("order-1").unwrap())
            .await
            .unwrap(),
        None
    );
}
