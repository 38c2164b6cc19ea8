//! Failures against real etcd processes: etcd killed and restarted while a lock is held (the lease
//! survives in etcd's log and the store reconnects), a lease lost under a renewing guard, replies
//! lost after the request was sent (through the testkit's loopback fault proxy, which works for
//! gRPC over HTTP/2: it forwards bytes and delays them or closes the connection at the first reply
//! byte; and etcd paused by SIGSTOP between an acquire's lease grant and its transaction), an
//! unreachable cluster, wrong credentials, bad configuration. The shared suite
//! (`tests/suites/faults.rs`) adds a lost reply read back through a manager.

use std::time::Duration;

use leasehold::core::{Acquire, Operation};
use leasehold::layers::ReadbackLayer;
use leasehold::{ErrorKind, LockManager, LockOptions, LockStore, OwnerToken};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use leasehold_testkit::fault_proxy::{FaultProxy, ProxyMode};
use leasehold_testkit::redis::free_port;

#[path = "../../../tests/suites/faults.rs"]
mod suite;
use suite::{acquire, eventually, heal, key};

async fn connect(endpoint: String) -> EtcdStore {
    EtcdStore::connect(
        EtcdConfig::new([endpoint])
            .response_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("connect")
}

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

    async fn connect_patient_through(proxy: &FaultProxy) -> EtcdStore {
        let config =
            EtcdConfig::new([proxy.addr().to_string()]).response_timeout(Duration::from_secs(5));
        EtcdStore::connect(config).await.expect("connect")
    }
}

suite::faults_suite!(EtcdServer);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restarted_while_a_lock_is_held_keeps_the_lease() {
    let mut server = EtcdServer::start().unwrap();
    let store = connect(server.endpoint()).await;
    let req = acquire("restart");
    let held = store.try_acquire(&req).await.unwrap();

    server.stop();
    let err = store.try_acquire(&acquire("other")).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Connection | ErrorKind::InDoubt),
        "a dead server is a connection problem, never a lock result: {err}"
    );
    assert!(
        err.to_string().contains(&server.port().to_string()),
        "names the address: {err}"
    );
    let err = store.inspect(&req.key).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");

    server.restart().unwrap();
    // etcd kept the record and its lease in its log (a restarted leader renews every lease).
    let info = eventually(|| store.inspect(&req.key))
        .await
        .expect("the lock survived the restart");
    assert!(info.is_owned_by(&req.token), "{info:?}");
    assert_eq!(info.fencing_token, held.fencing_token());
    assert_eq!(
        store
            .try_acquire(&acquire("restart"))
            .await
            .unwrap_err()
            .kind(),
        ErrorKind::LockUnavailable,
        "still held after the restart"
    );
    let renewed = eventually(|| store.extend(&held, Duration::from_secs(30))).await;
    assert!(store.release(&renewed).await.unwrap());
    assert_eq!(store.inspect(&req.key).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_lease_is_not_held_and_reaches_the_guard() {
    let server = EtcdServer::start().unwrap();
    let store = connect(server.endpoint()).await;

    // A lease that expired: extend says NotHeld, release finds nothing.
    let lease = store
        .try_acquire(&Acquire::new(
            key("expired"),
            OwnerToken::generate(),
            Duration::from_secs(1),
        ))
        .await
        .unwrap();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(15);
    while store.inspect(lease.key()).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < give_up, "expired by its TTL");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = store
        .extend(&lease, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    assert!(!store.release(&lease).await.unwrap());

    // A renewing guard whose record an operator deleted: the next renewal's extend is NotHeld and
    // the guard's lost signal fires.
    let locks = LockManager::builder()
        .client_id("faults")
        .farm_id("f1")
        .store(store.clone())
        .build()
        .unwrap();
    let guard = locks
        .try_lock_with(
            "renewed",
            LockOptions::new().ttl(Duration::from_secs(2)).renew(true),
        )
        .await
        .unwrap();
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    raw.delete(store.lock_key(guard.key()), None).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(20), guard.lost())
        .await
        .expect("the loss is noticed by the next renewal");
    assert_eq!(lost.kind(), ErrorKind::NotHeld, "{lost}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_lost_after_apply_is_in_doubt_never_a_false_result() {
    let server = EtcdServer::start().unwrap();
    let direct = connect(server.endpoint()).await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let proxied = connect(proxy.addr().to_string()).await;

    // Release is one transaction. Its reply held back past the timeout (requests always pass):
    // in doubt, and it was applied.
    let lease = direct.try_acquire(&acquire("lost-release")).await.unwrap();
    proxy.set_mode(ProxyMode::DelayReplies(Duration::from_millis(1500)));
    let err = proxied.release(&lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert_eq!(err.operation(), Some(Operation::Release), "{err:?}");
    assert_eq!(
        direct.inspect(lease.key()).await.unwrap(),
        None,
        "applied although the reply was lost"
    );
    // The connection closed at the first reply byte: in doubt too. On HTTP/2 that byte may be a
    // control frame that came before etcd read the request, so applied or not, never a false
    // result: the record is gone or still ours.
    let lease = direct
        .try_acquire(&acquire("dropped-release"))
        .await
        .unwrap();
    heal(&proxy, &proxied).await;
    proxy.set_mode(ProxyMode::DropReplies);
    let err = proxied.release(&lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    if let Some(info) = direct.inspect(lease.key()).await.unwrap() {
        assert!(info.is_owned_by(lease.token()));
    }

    // Acquire is a lease grant, then the transaction. With every reply lost, the grant's is the
    // first: the acquire fails as a connection error and nothing is held — never a false result.
    heal(&proxy, &proxied).await;
    proxy.set_mode(ProxyMode::DropReplies);
    let req = acquire("lost-grant");
    let err = proxied.try_acquire(&req).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Connection | ErrorKind::InDoubt),
        "{err}"
    );
    if err.kind() == ErrorKind::Connection {
        assert_eq!(direct.inspect(&req.key).await.unwrap(), None);
    }

    // The transaction's reply lost: every reply is delayed 500 ms (a store with a 2 s timeout
    // still gets the grant's); as soon as etcd has granted the lease, etcd is paused (SIGSTOP by
    // pid), so the transaction that follows is sent and gets no reply. Resumed, etcd may still
    // apply it: the outcome is truly unknown to the caller.
    heal(&proxy, &proxied).await;
    let patient = EtcdStore::connect(
        EtcdConfig::new([proxy.addr().to_string()])
            .response_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    heal(&proxy, &patient).await;
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let before = raw.leases().await.unwrap().leases().len();
    proxy.set_mode(ProxyMode::DelayReplies(Duration::from_millis(500)));
    let req = acquire("lost-txn");
    let attempt = tokio::spawn({
        let (patient, req) = (patient.clone(), req.clone());
        async move { patient.try_acquire(&req).await }
    });
    while raw.leases().await.unwrap().leases().len() == before {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.pause().unwrap();
    let outcome = attempt.await.unwrap();
    server.resume().unwrap();
    let err = outcome.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    heal(&proxy, &proxied).await;
    if let Some(info) = direct.inspect(&req.key).await.unwrap() {
        assert!(info.is_owned_by(&req.token), "applied late, as ours");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readback_resolves_an_acquire_whose_transaction_got_no_reply() {
    // Through a manager with the readback layer: etcd is paused (SIGSTOP) between the acquire's
    // lease grant and its transaction, so the transaction times out (in doubt); etcd is resumed
    // well after that timeout and well before the readback's own, which then finds the record
    // ours (etcd applied it on resume) or absent (it did not, and the acquire is sent again with
    // the same token). Either way the caller holds the lock, and never a false result.
    let server = EtcdServer::start().unwrap();
    let direct = connect(server.endpoint()).await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let proxied = EtcdStore::connect(
        EtcdConfig::new([proxy.addr().to_string()])
            .response_timeout(Duration::from_secs(2))
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap();
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = events.clone();
    let locks = LockManager::builder()
        .client_id("faults")
        .farm_id("f1")
        .store(proxied.clone())
        .readback(ReadbackLayer::new())
        .observer(move |e: &leasehold::LockEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    let before = raw.leases().await.unwrap().leases().len();
    proxy.set_mode(ProxyMode::DelayReplies(Duration::from_millis(500)));
    let attempt = tokio::spawn({
        let locks = locks.clone();
        async move { locks.try_lock("readback").await }
    });
    while raw.leases().await.unwrap().leases().len() == before {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    server.pause().unwrap();
    // The grant's reply arrives within +0.5–1.0 s (one or two delayed chunks), so the
    // transaction times out within +2.5–3.0 s and the readback's inspect (sent then) would time
    // out within +4.5–5.0 s: resume in the middle, with 0.75 s to spare on either side.
    tokio::time::sleep(Duration::from_millis(3750)).await;
    proxy.set_mode(ProxyMode::Pass);
    server.resume().unwrap();
    let guard = attempt
        .await
        .unwrap()
        .expect("readback resolves the lost reply: the caller holds the lock");
    let recovered = events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, leasehold::LockEvent::RecoveredByReadback { .. }));
    assert!(
        recovered,
        "the readback layer resolved the in-doubt acquire"
    );
    let info = direct.inspect(guard.key()).await.unwrap().expect("held");
    assert!(info.is_owned_by(guard.token()));
    assert!(guard.release().await.unwrap());
}

#[tokio::test]
async fn unreachable_cluster_is_a_connection_error_naming_the_address() {
    let port = free_port().unwrap();
    let err = EtcdStore::connect(
        EtcdConfig::new([format!("127.0.0.1:{port}")])
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300)),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.to_string().contains(&port.to_string()), "{err}");
}

#[tokio::test]
async fn bad_configuration_is_rejected_before_io() {
    for config in [
        EtcdConfig::new(["127.0.0.1:1"]).prefix(""),
        EtcdConfig::new(["127.0.0.1:1"]).waiter_timeout(Duration::from_millis(10)),
        EtcdConfig::new(Vec::<String>::new()),
    ] {
        let err = EtcdStore::connect(config).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_credentials_are_a_setup_error() {
    let server = EtcdServer::start().unwrap();
    let mut raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    raw.user_add("root", "rootpw", None).await.unwrap();
    raw.user_grant_role("root", "root").await.unwrap();
    raw.auth_enable().await.unwrap();

    let url = format!("etcd://root:wrong@{}", server.endpoint());
    let err = EtcdStore::connect(EtcdConfig::from_url(&url).unwrap())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreSetup, "{err}");
    assert!(
        !err.chain().to_string().contains("wrong"),
        "no password shown: {}",
        err.chain()
    );
    // The connect's own error is kept as the cause: the member it reached, and etcd's answer.
    let cause = std::error::Error::source(&err).expect("the connect's error is the cause");
    assert!(
        cause.to_string().contains(&server.endpoint()),
        "names the member: {cause}"
    );

    let url = format!("etcd://root:rootpw@{}", server.endpoint());
    let store = EtcdStore::connect(EtcdConfig::from_url(&url).unwrap())
        .await
        .expect("the right credentials work");
    let lease = store.try_acquire(&acquire("auth")).await.unwrap();
    assert!(store.release(&lease).await.unwrap());
}
