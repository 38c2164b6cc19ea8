//! Store failures every store is tested against (included by each store's `tests/faults.rs` with
//! `#[path]`): a reply lost after the store applied the request (through the testkit's loopback
//! fault proxy, which closes the connection at the first reply byte) never ends as a false
//! result when a manager reads back. Also the helpers a store's own fault tests share: keys,
//! acquire requests, and waiting for a store to answer again after a fault.
//!
//! A store's test file implements [`Deployment`] and invokes `faults_suite!`.

use std::future::Future;
use std::time::Duration;

use leasehold::core::Acquire;
use leasehold::layers::ReadbackLayer;
use leasehold::{ErrorKind, LockKey, LockManager, LockOptions, LockStore, OwnerToken};
use leasehold_testkit::fault_proxy::{FaultProxy, ProxyMode};

/// A private server of one store, and how a store connects to it or to a proxy in front of it.
pub(crate) trait Deployment: Sized {
    /// The lock store under test.
    type Store: LockStore + Clone;

    /// Starts a private server (stopped when dropped).
    fn start() -> Self;
    /// Where the server listens, for the proxy to forward to.
    fn addr(&self) -> std::net::SocketAddr;
    /// Connects a store to this server directly, with short timeouts.
    fn connect(&self) -> impl Future<Output = Self::Store> + Send;
    /// Connects a store to the server through `proxy`, with the same short timeouts.
    fn connect_through(proxy: &FaultProxy) -> impl Future<Output = Self::Store> + Send;
    /// Connects a store to the server through `proxy` with a response timeout of 5 s: a store
    /// slow to give up on a request.
    fn connect_patient_through(proxy: &FaultProxy) -> impl Future<Output = Self::Store> + Send;
    /// Readies the server before a fault (e.g. loads scripts, so that a proxied request is applied
    /// on its first send); nothing by default.
    fn warm_up(_direct: &Self::Store) -> impl Future<Output = ()> + Send {
        async {}
    }
}

/// One test per behaviour, each on a server of its own of `$deployment` (a type implementing
/// [`Deployment`]). The including file names this module `suite`.
macro_rules! faults_suite {
    ($deployment:ty) => {
        suite::faults_suite!(@tests $deployment;
            a_lost_reply_through_a_manager_with_readback_is_never_a_false_result,
            a_wait_ends_at_its_deadline_when_the_store_stops_answering,
        );
    };
    (@tests $deployment:ty; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                suite::$name::<$deployment>().await;
            }
        )*
    };
}
pub(crate) use faults_suite;

/// The key of `entity` (farm `f1`, client `faults`).
pub(crate) fn key(entity: &str) -> LockKey {
    LockKey::dc("f1", "faults", entity).unwrap()
}

/// A request for `entity` by a new owner, with a 30 s TTL.
pub(crate) fn acquire(entity: &str) -> Acquire {
    Acquire::new(key(entity), OwnerToken::generate(), Duration::from_secs(30))
}

/// Retries `op` until it stops failing (bounded): the store reconnects by itself.
pub(crate) async fn eventually<T, F, Fut>(mut op: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = leasehold::Result<T>>,
{
    let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        match op().await {
            Ok(v) => return v,
            Err(e) if tokio::time::Instant::now() < give_up => {
                assert!(
                    matches!(e.kind(), ErrorKind::Connection | ErrorKind::InDoubt),
                    "only connection errors while the server comes back: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("store did not recover within 20 s: {e}"),
        }
    }
}

/// Puts the proxy back in pass mode and waits until the proxied store answers again (the previous
/// fault may have closed its connection).
pub(crate) async fn heal(proxy: &FaultProxy, store: &impl LockStore) {
    proxy.set_mode(ProxyMode::Pass);
    let probe = key("probe");
    let _ = eventually(|| store.inspect(&probe)).await;
}

pub(crate) async fn a_lost_reply_through_a_manager_with_readback_is_never_a_false_result<
    D: Deployment,
>() {
    let server = D::start();
    let direct = server.connect().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let proxied = D::connect_through(&proxy).await;
    D::warm_up(&direct).await;

    let locks = LockManager::builder()
        .client_id("faults")
        .farm_id("f1")
        .store(proxied.clone())
        .readback(ReadbackLayer::new())
        .build()
        .unwrap();
    heal(&proxy, &proxied).await;
    proxy.set_mode(ProxyMode::DropReplies);
    let outcome = locks.try_lock("lost-2").await;
    proxy.set_mode(ProxyMode::Pass);
    let info = direct.inspect(&key("lost-2")).await.unwrap();
    match outcome {
        // The readback itself went through the dropping proxy too; then the error must say so and
        // the record must not be reported as held by us.
        Err(e) => assert!(
            matches!(e.kind(), ErrorKind::InDoubt | ErrorKind::Connection),
            "{e}"
        ),
        Ok(guard) => {
            assert!(info.expect("held").is_owned_by(guard.token()));
            guard.release().await.unwrap();
        }
    }
}

/// The store stops answering (its replies held back far longer than its response timeout) while
/// a blocking call waits: the call ends at its deadline, not at the store's timeouts, with an
/// in-doubt error (not a timeout: the holder is not what it waited for); the attempt it cut off
/// is undone if the store granted it, and the waiter leaves nothing in the line.
pub(crate) async fn a_wait_ends_at_its_deadline_when_the_store_stops_answering<D: Deployment>() {
    let server = D::start();
    let direct = server.connect().await;
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let patient = D::connect_patient_through(&proxy).await;
    D::warm_up(&direct).await;
    let manager = |store| {
        LockManager::builder()
            .client_id("faults")
            .farm_id("f1")
            .store(store)
            // Polls often, so an attempt is in flight when the deadline comes.
            .retry_interval(Duration::from_millis(200))
            .build()
            .unwrap()
    };
    let (holder, waiter) = (manager(direct.clone()), manager(patient.clone()));
    heal(&proxy, &patient).await;
    let held = holder.try_lock("stuck").await.unwrap();

    let wait = Duration::from_secs(2);
    let started = tokio::time::Instant::now();
    let waiting = tokio::spawn(async move {
        waiter
            .lock_with("stuck", LockOptions::new().wait(wait))
            .await
            .map(|guard| guard.token().clone())
    });
    // Its first try is refused and it waits; then the store's replies stop coming (its requests
    // still arrive and are applied), and the lock is released: the waiter's next attempt is
    // granted by the store, and its reply never comes in time.
    tokio::time::sleep(Duration::from_millis(500)).await;
    proxy.set_mode(ProxyMode::DelayReplies(Duration::from_secs(60)));
    assert!(held.release().await.unwrap());
    let error = waiting
        .await
        .unwrap()
        .expect_err("no answer reached the waiter");
    let waited = started.elapsed();
    assert_eq!(error.kind(), ErrorKind::InDoubt, "{error}");
    assert!(
        error
            .chain()
            .to_string()
            .contains("had not answered the last attempt"),
        "{error}"
    );
    // Not held for the store's 5 s response timeout past its 2 s wait.
    assert!(waited < wait + Duration::from_millis(1500), "{waited:?}");
    // Whatever the cut-off attempt was granted is undone, and the waiter's place in line is
    // left (both requests are applied though their replies are held back too): another owner
    // takes the key well within the waiter timeout (5 s) a forgotten place would last.
    let until = tokio::time::Instant::now() + Duration::from_secs(4);
    loop {
        match holder.try_lock("stuck").await {
            Ok(guard) => {
                guard.release().await.unwrap();
                break;
            }
            Err(refused) => assert!(
                tokio::time::Instant::now() < until,
                "the waiter left the key held or its place in line: {refused}; {:?}",
                direct.inspect(&key("stuck")).await
            ),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
