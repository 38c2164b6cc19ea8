//! Failures against real redis-server processes: a server killed and restarted mid-run, replies
//! delayed past the timeout and replies lost after the command was applied (through the testkit's
//! loopback fault proxy), scripts flushed, an unreachable server, bad configuration. The shared
//! suite (`tests/suites/faults.rs`) adds a lost reply read back through a manager.

use std::time::Duration;

use leasehold::core::Operation;
use leasehold::layers::ReadbackLayer;
use leasehold::{ErrorKind, LockEvent, LockManager, LockStore};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::fault_proxy::{FaultProxy, ProxyMode};
use leasehold_testkit::redis::{free_port, RedisServer};

#[path = "../../../tests/suites/faults.rs"]
mod suite;
use suite::{acquire, eventually, heal, key};

async fn connect(url: String) -> RedisStore {
    RedisStore::connect(RedisConfig::new(url).response_timeout(Duration::from_millis(300)))
        .await
        .expect("connect")
}

/// Loads the scripts into the server's script cache (shared by all connections), so a proxied
/// `EVALSHA` is applied on its first send instead of answering `NOSCRIPT`.
async fn warm_scripts(store: &RedisStore) {
    let lease = store.try_acquire(&acquire("warm")).await.unwrap();
    store.extend(&lease, Duration::from_secs(30)).await.unwrap();
    store.inspect(lease.key()).await.unwrap();
    store.release(&lease).await.unwrap();
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

    async fn connect_patient_through(proxy: &FaultProxy) -> RedisStore {
        let config = RedisConfig::new(proxy.redis_url()).response_timeout(Duration::from_secs(5));
        RedisStore::connect(config).await.expect("connect")
    }

    async fn warm_up(direct: &RedisStore) {
        warm_scripts(direct).await;
    }
}

suite::faults_suite!(RedisServer);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_killed_and_restarted_mid_run() {
    let mut server = RedisServer::start().unwrap();
    let store = connect(server.url()).await;
    let held = store.try_acquire(&acquire("a")).await.unwrap();

    server.stop();
    let err = store.try_acquire(&acquire("b")).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Connection | ErrorKind::InDoubt),
        "a dead server is a connection problem, never a lock result: {err}"
    );
    assert!(
        err.to_string().contains(&server.port().to_string()),
        "names the address: {err}"
    );
    assert_eq!(err.operation(), Some(Operation::Acquire), "{err:?}");
    let err = store.inspect(&key("a")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert_eq!(err.operation(), Some(Operation::Inspect), "{err:?}");
    let err = store.release(&held).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::Connection | ErrorKind::InDoubt),
        "{err}"
    );
    assert_eq!(err.operation(), Some(Operation::Release), "{err:?}");

    server.restart().unwrap();
    // The restarted server kept nothing: the old lock is gone, and the store reconnects by itself.
    let a = key("a");
    let info = eventually(|| store.inspect(&a)).await;
    assert_eq!(info, None);
    let b = acquire("b");
    let lease = eventually(|| store.try_acquire(&b)).await;
    assert!(store.release(&lease).await.unwrap());
    assert!(
        !store.release(&held).await.unwrap(),
        "the pre-restart lease is not ours"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delayed_reply_is_in_doubt_and_readback_finds_it_ours() {
    let server = RedisServer::start().unwrap();
    let direct = connect(server.url()).await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let proxied = connect(proxy.redis_url()).await;

    warm_scripts(&direct).await;
    proxy.set_mode(ProxyMode::DelayReplies(Duration::from_millis(900)));
    let req = acquire("delayed");
    let err = proxied.try_acquire(&req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    // The command was applied: the record is ours although the caller got no answer.
    let info = direct.inspect(&req.key).await.unwrap().expect("applied");
    assert!(info.is_owned_by(&req.token));
    proxy.set_mode(ProxyMode::Pass);

    // Through the readback layer the same situation ends with the lock held, not an error.
    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = events.clone();
    let locks = LockManager::builder()
        .client_id("faults")
        .farm_id("f1")
        .store(proxied.clone())
        .readback(ReadbackLayer::new())
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1000)).await; // the delayed reply drains
                                                           // Only the acquire's reply is delayed (450 ms against a 300 ms timeout): the proxy is back in
                                                           // pass mode when the readback's reply comes through, right behind it.
    proxy.set_mode(ProxyMode::DelayReplies(Duration::from_millis(450)));
    let attempt = tokio::spawn({
        let locks = locks.clone();
        async move { locks.try_lock("delayed-2").await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_mode(ProxyMode::Pass);
    let guard = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .expect("bounded")
        .unwrap()
        .expect("readback resolves the lost reply as held");
    let recovered = events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::RecoveredByReadback { held: true, .. }));
    assert!(recovered, "readback recovered the acquisition");
    let info = direct.inspect(guard.key()).await.unwrap().expect("held");
    assert!(info.is_owned_by(guard.token()));
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reply_lost_after_apply_is_in_doubt_never_a_false_result() {
    let server = RedisServer::start().unwrap();
    let direct = connect(server.url()).await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let proxied = connect(proxy.redis_url()).await;
    warm_scripts(&direct).await;
    heal(&proxy, &proxied).await;

    proxy.set_mode(ProxyMode::DropReplies);
    let req = acquire("lost");
    let err = proxied.try_acquire(&req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert!(
        direct
            .inspect(&req.key)
            .await
            .unwrap()
            .unwrap()
            .is_owned_by(&req.token),
        "applied although the reply was lost"
    );
    // A release whose reply is lost is in doubt too, and did delete the record.
    let lease = direct.try_acquire(&acquire("lost-release")).await.unwrap();
    heal(&proxy, &proxied).await;
    proxy.set_mode(ProxyMode::DropReplies);
    let err = proxied.release(&lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert_eq!(direct.inspect(lease.key()).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_are_reloaded_after_script_flush() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.url()).await;
    let lease = store.try_acquire(&acquire("flush")).await.unwrap();
    assert_eq!(server.command(&["SCRIPT", "FLUSH"]).unwrap(), "+OK");
    assert!(
        store.release(&lease).await.unwrap(),
        "EVALSHA → NOSCRIPT → reloaded"
    );
    let again = store.try_acquire(&acquire("flush")).await.unwrap();
    assert!(again.fencing_token() > lease.fencing_token());
}

#[tokio::test]
async fn a_foreign_value_at_the_fence_key_fails_the_acquire_with_nothing_applied() {
    let server = RedisServer::start().unwrap();
    // Both acquire scripts, fair (the default) and first-come, on a free key: their common case;
    // with a value that is plainly not a counter, and with ones that look like digits but that
    // INCR refuses (a leading zero, past 2^63).
    let cases = [
        ("clash-fair", true, "x"),
        ("clash-first-come", false, "x"),
        ("clash-fair-zero", true, "007"),
        ("clash-first-come-zero", false, "007"),
        ("clash-first-come-huge", false, "99999999999999999999"),
    ];
    for (name, fair, foreign) in cases {
        let store = RedisStore::connect(
            RedisConfig::new(server.url())
                .response_timeout(Duration::from_millis(300))
                .fair(fair),
        )
        .await
        .expect("connect");
        let lock_key = format!("leasehold:{}", key(name).as_str());
        let fence_key = format!("leasehold:fence:{}", key(name).as_str());
        assert_eq!(
            server.command(&["SET", &fence_key, foreign]).unwrap(),
            "+OK"
        );
        let err = store.try_acquire(&acquire(name)).await.unwrap_err();
        assert!(
            err.chain().to_string().contains("non-integer"),
            "{name}: {}",
            err.chain()
        );
        assert!(!err.is_in_doubt(), "{name}: a definite failure: {err}");
        assert_eq!(
            server.command(&["EXISTS", &lock_key]).unwrap(),
            ":0",
            "{name}: no lock taken without a fencing token"
        );
    }
}

#[tokio::test]
async fn a_master_without_enough_replicas_refuses_temporarily_with_nothing_applied() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.url()).await;
    // The server's own guard (`min-replicas-to-write`): with no replica, it refuses writes.
    let set = |n: &str| {
        server
            .command(&["CONFIG", "SET", "min-replicas-to-write", n])
            .unwrap()
    };
    assert_eq!(set("1"), "+OK");
    let req = acquire("no-replicas");
    let err = store.try_acquire(&req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.is_temporary());
    assert!(err.to_string().contains("NOREPLICAS"), "{err}");
    assert_eq!(set("0"), "+OK");
    assert_eq!(
        store.inspect(&req.key).await.unwrap(),
        None,
        "nothing applied"
    );
    let lease = store.try_acquire(&req).await.expect("served again");
    assert!(store.release(&lease).await.unwrap());
}

#[tokio::test]
async fn a_read_only_replica_refuses_temporarily_with_nothing_applied() {
    let server = RedisServer::start().unwrap();
    let store = connect(server.url()).await;
    // As after a failover that left us talking to a replica (its master is unreachable).
    let unreachable = free_port().unwrap().to_string();
    assert_eq!(
        server
            .command(&["REPLICAOF", "127.0.0.1", &unreachable])
            .unwrap(),
        "+OK"
    );
    let err = store.try_acquire(&acquire("replica")).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.is_temporary());
    assert!(err.to_string().contains("READONLY"), "{err}");
    assert_eq!(server.command(&["REPLICAOF", "NO", "ONE"]).unwrap(), "+OK");
    store
        .try_acquire(&acquire("replica"))
        .await
        .expect("a primary again");
}

#[tokio::test]
async fn unreachable_server_is_a_connection_error_naming_the_address() {
    let port = free_port().unwrap();
    let url = format!("redis://alice:s3cret@127.0.0.1:{port}");
    let err =
        RedisStore::connect(RedisConfig::new(url).connect_timeout(Duration::from_millis(200)))
            .await
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert_eq!(err.operation(), Some(Operation::Connect), "{err:?}");
    let text = format!("{err} {err:?}");
    assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
    assert!(!text.contains("s3cret"), "no password in errors: {text}");
}

#[tokio::test]
async fn bad_configuration_is_rejected_before_io() {
    for config in [
        RedisConfig::new("http://127.0.0.1:6379"),
        RedisConfig::new("127.0.0.1:6379"),
        RedisConfig::new("redis://127.0.0.1:1").prefix(""),
        RedisConfig::new("redis://127.0.0.1:1").response_timeout(Duration::ZERO),
    ] {
        let err = RedisStore::connect(config).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    }
    let debug = format!("{:?}", RedisConfig::new("redis://bob:hunter2@127.0.0.1:1"));
    assert!(!debug.contains("hunter2"), "{debug}");
}

/// `rediss://` against a server that does not speak TLS: the handshake fails as a connection
/// error naming the address — no panic, no hang. (`scripts/check` builds with all features, so this
/// runs in CI.)
#[cfg(feature = "tls")]
#[tokio::test]
async fn tls_handshake_failure_is_a_connection_error() {
    let server = RedisServer::start().unwrap();
    let url = format!("rediss://127.0.0.1:{}", server.port());
    let err =
        RedisStore::connect(RedisConfig::new(url).connect_timeout(Duration::from_millis(500)))
            .await
            .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(
        err.to_string().contains(&server.port().to_string()),
        "{err}"
    );
}

/// A server whose certificate no trusted CA signed: a setup error that says what to fix, with
/// the TLS client's own error kept as its cause.
#[cfg(feature = "tls")]
#[tokio::test]
async fn an_untrusted_certificate_is_a_setup_error_that_keeps_the_cause() {
    use leasehold_testkit::tls::TestPki;
    let pki = TestPki::generate(&["localhost"]).unwrap();
    let server = RedisServer::start_tls(&pki, false).unwrap();
    let stranger = TestPki::generate(&["localhost"]).unwrap();
    let url = format!("rediss://localhost:{}", server.port());
    let err = RedisStore::connect(
        RedisConfig::new(url)
            .tls_ca_file(stranger.ca_file())
            .connect_timeout(Duration::from_secs(2)),
    )
    .await
    .unwrap_err();
    leasehold_testkit::tls::assert_untrusted_ca(&err);
}

#[cfg(not(feature = "tls"))]
#[tokio::test]
async fn rediss_without_the_tls_feature_says_which_feature() {
    let err = RedisStore::connect(RedisConfig::new("rediss://127.0.0.1:1"))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.to_string().contains("`tls`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_in_doubt_permit_acquire_is_resolved_by_readback() {
    let server = RedisServer::start().unwrap();
    let direct = connect(server.url()).await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let proxied = connect(proxy.redis_url()).await;
    let permits = leasehold::LockMode::semaphore(2).unwrap();

    // Loads the shared-mode scripts, and leaves another holder on one permit: the readback must
    // tell our permit from theirs.
    let warm = direct
        .try_acquire(&acquire("warm-permit").with_mode(permits))
        .await
        .unwrap();
    direct.extend(&warm, Duration::from_secs(30)).await.unwrap();
    direct.release(&warm).await.unwrap();
    let theirs = direct
        .try_acquire(&acquire("permit").with_mode(permits))
        .await
        .unwrap();

    let events = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let sink = events.clone();
    let locks = LockManager::builder()
        .client_id("faults")
        .farm_id("f1")
        .store(proxied.clone())
        .readback(ReadbackLayer::new())
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    // The acquire's reply comes 450 ms late against a 300 ms timeout: in doubt, though applied.
    proxy.set_mode(ProxyMode::DelayReplies(Duration::from_millis(450)));
    let attempt = tokio::spawn({
        let locks = locks.clone();
        async move { locks.try_semaphore("permit", 2).await }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    proxy.set_mode(ProxyMode::Pass);
    let guard = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .expect("bounded")
        .unwrap()
        .expect("readback resolves the lost reply: the permit is ours");
    let recovered = events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::RecoveredByReadback { held: true, .. }));
    assert!(recovered, "readback recovered the permit");
    let info = direct.inspect(guard.key()).await.unwrap().expect("held");
    assert_eq!(info.holders.len(), 2, "our permit and theirs, no third");
    assert!(info.is_owned_by(guard.token()) && info.is_owned_by(theirs.token()));
    assert!(guard.release().await.unwrap());
    assert!(direct.release(&theirs).await.unwrap());
}
