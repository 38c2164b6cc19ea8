//! The lock manager rides out real outages, the behaviour every store runs (included by each
//! store's `tests/failover_manager.rs` with `#[path]`): a private server behind the testkit's TCP
//! fault proxy, which refuses connections (and closes open ones) or loses every reply after the
//! server applied the request, for a while.
//!
//! What is checked (see `crate::failover` in `leasehold`): a blocking acquire retries the store
//! within its wait and gets the lock once the store is back; a store down for the whole wait gives
//! the last store error, not a timeout; a try-lock answers at once; a guard's release retries
//! within its budget, and says the lock is left to its TTL when the store stays down; renewal
//! keeps a guard held across an outage shorter than the lease; attempts that may have taken the lock
//! while their replies were lost are undone, never reported held. Each test has its own server and
//! proxy on loopback; a second store talks to the server directly to see what it holds.
//!
//! A store's test file implements [`Deployment`] and invokes `failover_suite!`.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{ErrorKind, LockEvent, LockKey, LockManager, LockOptions, LockStore};
use leasehold_testkit::fault_proxy::{FaultProxy, ProxyMode};
use tokio::time::Instant;

/// How long each outage lasts.
const OUTAGE: Duration = Duration::from_secs(1);

type Events = Arc<Mutex<Vec<LockEvent>>>;

/// A private server of one store, and how a store connects to it or to a proxy in front of it.
pub(crate) trait Deployment: Sized + Send + Sync + 'static {
    /// The lock store under test.
    type Store: LockStore;

    /// Starts a private server (stopped when dropped).
    fn start() -> Self;
    /// Where the server listens, for the proxy to forward to.
    fn addr(&self) -> std::net::SocketAddr;
    /// Connects a store to this server directly, with short timeouts.
    fn connect(&self) -> impl Future<Output = Self::Store> + Send;
    /// Connects a store to the server through `proxy`, with the same short timeouts.
    fn connect_through(proxy: &FaultProxy) -> impl Future<Output = Self::Store> + Send;
}

/// One test per behaviour, each on a server of its own of `$deployment` (a type implementing
/// [`Deployment`]). The including file names this module `suite`.
macro_rules! failover_suite {
    ($deployment:ty) => {
        suite::failover_suite!(@tests $deployment;
            a_blocking_acquire_rides_out_refused_connections,
            a_store_down_past_the_wait_gives_the_last_store_error_not_a_timeout,
            a_try_lock_with_the_store_down_fails_at_once,
            a_release_rides_out_a_short_outage,
            a_release_past_its_budget_leaves_the_lock_to_its_ttl_and_says_so,
            renewal_keeps_a_guard_held_across_an_outage_shorter_than_its_lease,
            attempts_applied_with_their_replies_lost_are_undone_and_never_reported_held,
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
pub(crate) use failover_suite;

/// A server, a proxy in front of it, a manager talking through the proxy (recording its events),
/// and a store talking to the server directly.
pub(crate) struct Rig<D: Deployment> {
    /// Kept so the server lives as long as the test; a store's own tests may change it (some
    /// stores' never do, hence the allowance).
    #[allow(dead_code)]
    pub(crate) server: D,
    pub(crate) proxy: FaultProxy,
    pub(crate) locks: LockManager,
    events: Events,
    direct: D::Store,
}

/// A rig whose manager `configure` sets up.
pub(crate) async fn rig<D: Deployment>(
    configure: impl FnOnce(leasehold::LockManagerBuilder) -> leasehold::LockManagerBuilder,
) -> Rig<D> {
    let server = D::start();
    let proxy = FaultProxy::start(server.addr())
        .await
        .expect("start the proxy");
    let events: Events = Arc::default();
    let sink = events.clone();
    let builder = LockManager::builder()
        .client_id("failover")
        .farm_id("f1")
        .store(D::connect_through(&proxy).await)
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()));
    let locks = configure(builder).build().unwrap();
    // Warm up: the connection is open (and any scripts are in the server's cache).
    let guard = locks.try_lock("warm-up").await.unwrap();
    assert!(guard.release().await.unwrap());
    let direct = server.connect().await;
    events.lock().unwrap().clear();
    Rig {
        server,
        proxy,
        locks,
        events,
        direct,
    }
}

impl<D: Deployment> Rig<D> {
    fn key(&self, entity: &str) -> LockKey {
        self.locks.key(entity).unwrap()
    }

    /// Whether the server holds `entity` (asked directly, not through the proxy).
    async fn held(&self, entity: &str) -> bool {
        self.direct
            .inspect(&self.key(entity))
            .await
            .unwrap()
            .is_some()
    }

    /// The manager's events so far.
    pub(crate) fn events(&self) -> Vec<LockEvent> {
        self.events.lock().unwrap().clone()
    }

    /// Runs `op` in its own task while the proxy refuses connections for `outage`, then lets
    /// them through again and waits for `op`'s answer.
    async fn during_outage<T: Send + 'static>(
        &self,
        outage: Duration,
        op: impl std::future::Future<Output = T> + Send + 'static,
    ) -> T {
        self.proxy.set_mode(ProxyMode::Refuse);
        let op = tokio::spawn(op);
        tokio::time::sleep(outage).await;
        self.proxy.set_mode(ProxyMode::Pass);
        op.await.expect("the operation's task")
    }
}

fn store_down(kind: ErrorKind) -> bool {
    matches!(
        kind,
        ErrorKind::Connection | ErrorKind::RetriesExhausted | ErrorKind::InDoubt
    )
}

pub(crate) async fn a_blocking_acquire_rides_out_refused_connections<D: Deployment>() {
    let rig = rig::<D>(|b| b).await;
    let locks = rig.locks.clone();
    let guard = rig
        .during_outage(OUTAGE, async move {
            locks
                .lock_with("order-1", LockOptions::new().wait(Duration::from_secs(10)))
                .await
        })
        .await
        .expect("acquired once the store was back");
    assert!(guard.is_held());
    let info = rig
        .direct
        .inspect(guard.key())
        .await
        .unwrap()
        .expect("held in the store");
    assert!(
        info.is_owned_by(guard.token()),
        "held by this guard's token"
    );
    let attempts = rig.events().iter().find_map(|e| match e {
        LockEvent::Acquired { attempts, .. } => Some(*attempts),
        _ => None,
    });
    assert!(attempts.is_some_and(|n| n > 1), "retried: {attempts:?}");
    assert!(guard.release().await.unwrap());
    assert!(!rig.held("order-1").await);
}

pub(crate) async fn a_store_down_past_the_wait_gives_the_last_store_error_not_a_timeout<
    D: Deployment,
>() {
    let rig = rig::<D>(|b| b).await;
    rig.proxy.set_mode(ProxyMode::Refuse);
    // Long enough for retries after the first try, which a store may spend its own connect
    // budget on (etcd tries its members again): the wait does not outlast its deadline.
    let wait = Duration::from_secs(3);
    let started = Instant::now();
    let err = rig
        .locks
        .lock_with("order-2", LockOptions::new().wait(wait))
        .await
        .unwrap_err();
    let spent = started.elapsed();
    assert!(
        store_down(err.kind()),
        "the store's error, not {:?}: {err}",
        err.kind()
    );
    assert!(spent >= wait, "the whole wait was used: {spent:?}");
    assert!(
        spent < Duration::from_secs(30),
        "and not much more: {spent:?}"
    );
    assert!(
        err.to_string().contains("still down after waiting"),
        "{err}"
    );
    let failed = rig.events().iter().find_map(|e| match e {
        LockEvent::AcquireFailed {
            error, attempts, ..
        } => Some((*error, *attempts)),
        _ => None,
    });
    let (kind, attempts) = failed.expect("an AcquireFailed event");
    assert_eq!(kind, err.kind());
    assert!(attempts > 1, "retried within the wait: {attempts}");
    rig.proxy.set_mode(ProxyMode::Pass);
    assert!(!rig.held("order-2").await, "no lock left behind");
}

pub(crate) async fn a_try_lock_with_the_store_down_fails_at_once<D: Deployment>() {
    let rig = rig::<D>(|b| b).await;
    rig.proxy.set_mode(ProxyMode::Refuse);
    let err = rig.locks.try_lock("order-3").await.unwrap_err();
    assert!(store_down(err.kind()), "{err}");
    let attempts = rig.events().iter().find_map(|e| match e {
        LockEvent::AcquireFailed { attempts, .. } => Some(*attempts),
        _ => None,
    });
    assert_eq!(attempts, Some(1), "one attempt, no retry");
}

pub(crate) async fn a_release_rides_out_a_short_outage<D: Deployment>() {
    let rig = rig::<D>(|b| b.renewal(false)).await;
    let guard = rig
        .locks
        .try_lock_with("order-4", LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    let released = rig.during_outage(OUTAGE, guard.release()).await;
    assert!(
        released.expect("released once the store was back"),
        "it was still ours"
    );
    assert!(!rig.held("order-4").await, "the key is free");
    assert!(!rig
        .events()
        .iter()
        .any(|e| matches!(e, LockEvent::LeftToExpire { .. })));
}

pub(crate) async fn a_release_past_its_budget_leaves_the_lock_to_its_ttl_and_says_so<
    D: Deployment,
>() {
    let rig = rig::<D>(|b| b.renewal(false).release_retry(Duration::from_secs(1))).await;
    let ttl = Duration::from_secs(30);
    let guard = rig
        .locks
        .try_lock_with("order-5", LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let token = guard.token().clone();
    rig.proxy.set_mode(ProxyMode::Refuse);
    let err = guard.release().await.unwrap_err();
    assert!(store_down(err.kind()), "{err}");
    assert!(err.to_string().contains("left to expire in"), "{err}");
    let left = rig.events().iter().find_map(|e| match e {
        LockEvent::LeftToExpire {
            key,
            error,
            expires_in,
            attempts,
        } => Some((key.clone(), *error, *expires_in, *attempts)),
        _ => None,
    });
    let (key, kind, expires_in, attempts) = left.expect("a LeftToExpire event");
    assert_eq!(key, rig.key("order-5"));
    assert_eq!(kind, err.kind());
    assert!(
        expires_in > Duration::ZERO && expires_in < ttl,
        "{expires_in:?}"
    );
    assert!(attempts > 1, "retried within the budget: {attempts}");
    // It is indeed still held, by the released guard's token, until its TTL.
    rig.proxy.set_mode(ProxyMode::Pass);
    let info = rig.direct.inspect(&key).await.unwrap().expect("left held");
    assert!(info.is_owned_by(&token));
    assert!(info.ttl_remaining.is_some_and(|left| left <= ttl));
}

pub(crate) async fn renewal_keeps_a_guard_held_across_an_outage_shorter_than_its_lease<
    D: Deployment,
>() {
    let rig = rig::<D>(|b| b).await;
    let ttl = Duration::from_secs(4);
    let guard = rig
        .locks
        .try_lock_with("job-6", LockOptions::new().ttl(ttl).renew(true))
        .await
        .unwrap();
    let taken = Instant::now();
    // A renewal goes through first (every ttl / 3), then the store is down for 1.5 s.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    rig.proxy.set_mode(ProxyMode::Refuse);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    rig.proxy.set_mode(ProxyMode::Pass);
    // Past the first lease's expiry: only renewals after the outage can have kept it.
    let past = (taken + ttl + Duration::from_secs(1)).saturating_duration_since(Instant::now());
    tokio::time::sleep(past).await;
    assert!(guard.is_held(), "not reported lost");
    assert!(
        !rig.events()
            .iter()
            .any(|e| matches!(e, LockEvent::Lost { .. })),
        "{:?}",
        rig.events()
    );
    let info = rig
        .direct
        .inspect(guard.key())
        .await
        .unwrap()
        .expect("held in the store");
    assert!(info.is_owned_by(guard.token()));
    assert!(guard.release().await.unwrap());
}

pub(crate) async fn attempts_applied_with_their_replies_lost_are_undone_and_never_reported_held<
    D: Deployment,
>() {
    let rig = rig::<D>(|b| b).await;
    // Requests reach the server (an attempt may take the lock), replies are lost and the
    // connection closed: every attempt in this outage ends in doubt.
    rig.proxy.set_mode(ProxyMode::DropReplies);
    let waiter = tokio::spawn({
        let locks = rig.locks.clone();
        async move {
            locks
                .lock_with("order-8", LockOptions::new().wait(Duration::from_secs(20)))
                .await
        }
    });
    tokio::time::sleep(OUTAGE).await;
    rig.proxy.set_mode(ProxyMode::Pass);
    let guard = waiter
        .await
        .unwrap()
        .expect("acquired once replies came back");
    let attempts = rig.events().iter().find_map(|e| match e {
        LockEvent::Acquired { attempts, .. } => Some(*attempts),
        _ => None,
    });
    assert!(attempts.is_some_and(|n| n > 1), "retried: {attempts:?}");
    // Held in the store by this guard's token, not by an earlier attempt's.
    let info = rig
        .direct
        .inspect(guard.key())
        .await
        .unwrap()
        .expect("held in the store");
    assert!(
        info.is_owned_by(guard.token()),
        "held by the guard's own token"
    );
    assert!(guard.release().await.unwrap());
    // No attempt's lock is left behind: the key is free (an undo still in flight is waited for).
    let free_by = Instant::now() + Duration::from_secs(15);
    while rig.held("order-8").await {
        assert!(Instant::now() < free_by, "a lock was left behind");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!rig
        .events()
        .iter()
        .any(|e| matches!(e, LockEvent::LeftToExpire { .. })));
}
