//! The lock manager over the etcd store rides out real outages: a private etcd killed and
//! restarted (a member that crashed and came back), and the testkit's TCP fault proxy refusing
//! connections for a while (gRPC over HTTP/2 goes through it byte for byte). A blocking acquire
//! retries within its wait and gets the lock once etcd is back; a guard's release retries within
//! its budget and frees the key; renewal keeps a guard held across an outage shorter than its
//! lease. See `crate::failover` in `leasehold`, and `crates/leasehold-redis/tests/failover_manager.rs`
//! for the same against Redis, with the give-up cases.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{LockEvent, LockManager, LockOptions, LockStore};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use leasehold_testkit::fault_proxy::{FaultProxy, ProxyMode};
use tokio::time::Instant;

/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(1);

type Events = Arc<Mutex<Vec<LockEvent>>>;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_acquire_and_a_release_ride_out_refused_connections() {
    let server = EtcdServer::start().expect("start etcd");
    let proxy = FaultProxy::start(server.addr())
        .await
        .expect("start the proxy");
    let (locks, events) = manager(connect(proxy.addr().to_string()).await, false).await;
    let direct = connect(server.endpoint()).await;

    proxy.set_mode(ProxyMode::Refuse);
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .lock_with("order-2", LockOptions::new().wait(Duration::from_secs(30)))
                .await
        }
    });
    tokio::time::sleep(OUTAGE).await;
    proxy.set_mode(ProxyMode::Pass);
    // Through the proxy the client may ride out the refusals inside one request (tonic waits for
    // its channel to reconnect within the response timeout) or fail it and let the manager retry:
    // either way the call gets the lock.
    let guard = waiter
        .await
        .unwrap()
        .expect("acquired once connections went through");
    let key = guard.key().clone();
    assert!(direct.inspect(&key).await.unwrap().is_some());

    proxy.set_mode(ProxyMode::Refuse);
    let release = tokio::spawn(guard.release());
    tokio::time::sleep(OUTAGE).await;
    proxy.set_mode(ProxyMode::Pass);
    assert!(
        release
            .await
            .unwrap()
            .expect("released once connections went through"),
        "it was still ours"
    );
    assert_eq!(direct.inspect(&key).await.unwrap(), None, "the key is free");
    assert!(!events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::LeftToExpire { .. })));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_keeps_a_guard_held_across_an_outage_shorter_than_its_lease() {
    let server = EtcdServer::start().expect("start etcd");
    let proxy = FaultProxy::start(server.addr())
        .await
        .expect("start the proxy");
    let (locks, events) = manager(connect(proxy.addr().to_string()).await, true).await;
    let ttl = Duration::from_secs(4);
    let guard = locks
        .try_lock_with("job-3", LockOptions::new().ttl(ttl).renew(true))
        .await
        .unwrap();
    let taken = Instant::now();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.set_mode(ProxyMode::Refuse);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    proxy.set_mode(ProxyMode::Pass);
    let past = (taken + ttl + Duration::from_secs(1)).saturating_duration_since(Instant::now());
    tokio::time::sleep(past).await;
    assert!(guard.is_held(), "not reported lost");
    assert!(!events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::Lost { .. })));
    let direct = connect(server.endpoint()).await;
    let info = direct
        .inspect(guard.key())
        .await
        .unwrap()
        .expect("held in etcd");
    assert!(info.is_owned_by(guard.token()));
    assert!(guard.release().await.unwrap());
}
