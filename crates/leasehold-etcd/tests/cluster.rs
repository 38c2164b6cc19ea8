//! A member of a real 3-member etcd cluster hurt while locks are in use: killed (SIGKILL) or
//! paused (SIGSTOP), and either the leader or the member behind the *first* endpoint of the URL.
//! While the two others keep quorum, nothing may show: a lock held and renewed by the watchdog is
//! not reported lost and keeps its lease, waiters get the lock once its holder releases it,
//! acquisitions in a loop never fail, a store connected during the outage works, and nothing is
//! left behind at the end.
//!
//! The tests share one cluster (a test binary starts it once while tests hold it) and hurt it one
//! at a time; each heals it before it starts, and after it is done. Every test writes under its
//! own key prefix.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use leasehold::{ErrorKind, LockManager};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd_cluster::{EtcdCluster, Fault};
use leasehold_testkit::redis::free_port;

/// The cluster of this test binary, while a test holds it.
static CLUSTER: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());
/// One fault test at a time hurts the shared cluster.
static ONE_FAULT_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The lock TTL: the watchdog renews every third of it, so a renewal that failed through the
/// fault would leave the lock lost within the test.
const TTL: Duration = Duration::from_secs(3);
/// One attempt on one member: what a paused member costs a request before the next member is
/// asked.
const MEMBER_TIMEOUT: Duration = Duration::from_secs(1);

/// Which member is hurt.
#[derive(Debug, Clone, Copy)]
enum Victim {
    /// The member that leads when the fault starts.
    Leader,
    /// The member behind the first endpoint of the URL (member 0), leader or not.
    FirstEndpoint,
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("blocking work")
}

/// The shared cluster, whole, and this test's turn to hurt it.
async fn whole_cluster() -> (Arc<EtcdCluster>, tokio::sync::MutexGuard<'static, ()>) {
    let cluster = blocking(|| EtcdCluster::shared(&CLUSTER, 3))
        .await
        .expect("start a 3-member etcd cluster");
    let turn = ONE_FAULT_AT_A_TIME.lock().await;
    let healing = cluster.clone();
    blocking(move || healing.heal_all())
        .await
        .expect("every member healthy");
    (cluster, turn)
}

/// A store on every member of `cluster`, in member order (member 0 first).
async fn store(cluster: &EtcdCluster, prefix: &str) -> EtcdStore {
    EtcdStore::connect(
        EtcdConfig::from_url(&cluster.url())
            .unwrap()
            .prefix(prefix)
            .response_timeout(MEMBER_TIMEOUT)
            .connect_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("connect to the cluster")
}

/// A manager as `leasehold run` builds one: the default layers, a watchdog renewing every guard.
async fn manager(cluster: &EtcdCluster, prefix: &str) -> LockManager {
    LockManager::builder()
        .client_id("cluster")
        .farm_id("f1")
        .store(store(cluster, prefix).await)
        .default_layers()
        .lock_ttl(TTL)
        .wait_for_lock(Duration::from_secs(30))
        .retry_interval(Duration::from_millis(200))
        .build()
        .expect("manager")
}

/// Acquires and releases `entity` until `stop`, and says how many rounds went through and what
/// failed.
fn acquire_in_a_loop(
    locks: LockManager,
    entity: &'static str,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(usize, Vec<String>)> {
    tokio::spawn(async move {
        let (mut rounds, mut failures) = (0, Vec::new());
        while !stop.load(Ordering::SeqCst) {
            match locks.try_lock(entity).await {
                Ok(guard) => match guard.release().await {
                    Ok(true) => rounds += 1,
                    Ok(false) => failures.push("a release found the lock gone".to_owned()),
                    Err(e) => failures.push(format!("release: {e}")),
                },
                Err(e) => failures.push(format!("acquire: {e}")),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        (rounds, failures)
    })
}

/// Hurts `victim` with `fault` while a lock is held and renewed, two waiters wait, and
/// acquisitions run in a loop; then checks that nothing showed.
async fn nothing_shows(fault: Fault, victim: Victim) {
    let (cluster, _turn) = whole_cluster().await;
    let prefix = format!("{fault:?}-{victim:?}:").to_lowercase();
    let holder = manager(&cluster, &prefix).await;
    let others = manager(&cluster, &prefix).await;

    // (a) A lock held and renewed by the watchdog.
    let held = holder.try_lock("held").await.expect("take the held lock");
    // (b) Two waiters (in another process) for a lock held until after the fault.
    let gate = holder.try_lock("gate").await.expect("take the gate");
    let waiters: Vec<_> = (0..2)
        .map(|_| {
            let locks = others.clone();
            tokio::spawn(async move {
                let guard = locks.lock("gate").await?;
                tokio::time::sleep(Duration::from_millis(50)).await;
                guard.release().await
            })
        })
        .collect();
    // (c) Acquisitions in a loop.
    let stop = Arc::new(AtomicBool::new(false));
    let looping = acquire_in_a_loop(others.clone(), "loop", stop.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let hurt = match victim {
        Victim::Leader => {
            let c = cluster.clone();
            blocking(move || c.wait_for_leader())
                .await
                .expect("a leader")
        }
        Victim::FirstEndpoint => 0,
    };
    cluster.hurt(hurt, fault).expect("hurt the member");

    // A store connected during the outage, with the hurt member possibly first in its URL.
    let late = manager(&cluster, &prefix).await;
    let guard = late
        .try_lock("late")
        .await
        .expect("a lock taken during the outage");
    assert!(guard.release().await.expect("released during the outage"));

    // Renewals go on through the fault for longer than a TTL.
    tokio::time::sleep(TTL + Duration::from_secs(1)).await;
    assert!(
        held.is_held(),
        "{fault:?} of the {victim:?}: the held lock was reported lost"
    );
    let info = others
        .inspect("held")
        .await
        .expect("inspect during the outage")
        .expect("the held lock's lease is kept");
    assert!(info.is_owned_by(held.token()), "{info:?}");

    // The waiters get the lock once its holder releases it.
    assert!(gate.release().await.expect("release the gate"));
    for waiter in waiters {
        let released = tokio::time::timeout(Duration::from_secs(30), waiter)
            .await
            .expect("the waiter got the lock in time")
            .expect("the waiter's task")
            .expect("the waiter got and released the lock");
        assert!(released);
    }

    stop.store(true, Ordering::SeqCst);
    let (rounds, failures) = looping.await.expect("the loop's task");
    assert!(
        failures.is_empty(),
        "{fault:?} of the {victim:?}: {} of {} acquisitions failed: {failures:?}",
        failures.len(),
        rounds + failures.len()
    );
    assert!(rounds > 0, "the loop went round");
    assert!(held.release().await.expect("release the held lock"));

    // Nothing left behind.
    let left = others.list("").await.expect("list");
    assert!(left.is_empty(), "locks left behind: {left:?}");

    blocking(move || cluster.heal_all())
        .await
        .expect("the cluster heals");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_killed_shows_nothing() {
    nothing_shows(Fault::Kill, Victim::Leader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_paused_shows_nothing() {
    nothing_shows(Fault::Pause, Victim::Leader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_endpoint_killed_shows_nothing() {
    nothing_shows(Fault::Kill, Victim::FirstEndpoint).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_endpoint_paused_shows_nothing() {
    nothing_shows(Fault::Pause, Victim::FirstEndpoint).await;
}

/// A member down before the store connects, first in the URL: the store connects through the
/// others, and a request never waits on the dead one again once it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_order_does_not_matter() {
    let (cluster, _turn) = whole_cluster().await;
    cluster.kill(0).expect("kill member 0");
    for order in [[0, 1, 2], [1, 0, 2], [1, 2, 0]] {
        let store = EtcdStore::connect(
            EtcdConfig::from_url(&cluster.url_in_order(&order))
                .unwrap()
                .prefix("order:")
                .response_timeout(MEMBER_TIMEOUT),
        )
        .await
        .expect("connect with a dead member in the URL");
        let locks = LockManager::builder()
            .client_id("cluster")
            .farm_id("f1")
            .store(store)
            .default_layers()
            .build()
            .unwrap();
        for _ in 0..5 {
            let guard = locks.try_lock("order").await.expect("taken");
            assert!(guard.release().await.expect("released"));
        }
    }
    blocking(move || cluster.heal_all())
        .await
        .expect("the cluster heals");
}

/// Quorum lost (two of three members down): requests fail as temporary connection errors that
/// name the members, and the cluster serves again once a member is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_quorum_errors_are_temporary_and_name_the_members() {
    let (cluster, _turn) = whole_cluster().await;
    let locks = manager(&cluster, "quorum:").await;
    cluster.kill(1).expect("kill member 1");
    cluster.kill(2).expect("kill member 2");
    let err = locks.try_lock("q").await.expect_err("no quorum, no lock");
    assert!(err.is_temporary(), "{err}");
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Connection | ErrorKind::InDoubt | ErrorKind::RetriesExhausted
        ),
        "{err}"
    );
    let text = format!("{err} {:?}", std::error::Error::source(&err));
    assert!(
        text.contains(&cluster.endpoint(1)) || text.contains(&cluster.endpoint(0)),
        "the error names a member: {text}"
    );
    let healing = cluster.clone();
    blocking(move || healing.heal_all())
        .await
        .expect("the cluster heals");
    // Back to normal: every member answers again.
    let guard = locks.try_lock("q").await.expect("taken once healed");
    assert!(guard.release().await.expect("released"));
}

/// A store connected while the cluster has no leader (quorum lost) waits for one, for as long
/// as its leader wait, however many member timeouts that is: with a short wait it fails with an
/// error that says the cluster was reached but did not serve; with a long one it is handed out
/// once a quorum is back, and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connecting_waits_for_a_leader_within_the_leader_wait() {
    let (cluster, _turn) = whole_cluster().await;
    cluster.kill(1).expect("kill member 1");
    cluster.kill(2).expect("kill member 2");
    let config = |wait: Duration| {
        EtcdConfig::from_url(&cluster.url())
            .unwrap()
            .prefix("leader-wait:")
            .response_timeout(MEMBER_TIMEOUT)
            .connect_timeout(Duration::from_millis(500))
            .leader_wait(wait)
    };

    // Too short a wait: a connection error that says what was wrong, the members' own
    // failures kept as its cause.
    let Err(err) = EtcdStore::connect(config(2 * MEMBER_TIMEOUT)).await else {
        panic!("a store without quorum");
    };
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("was reached but did not serve for") && text.contains("leader_wait"),
        "{text}"
    );
    let cause = std::error::Error::source(&err).expect("the members' failure is kept");
    assert!(cause.to_string().contains(&cluster.endpoint(0)), "{cause}");

    // A long wait outlasts several member timeouts, and ends when a quorum is back.
    let connecting = tokio::spawn(EtcdStore::connect(config(Duration::from_secs(60))));
    tokio::time::sleep(3 * MEMBER_TIMEOUT).await;
    assert!(
        !connecting.is_finished(),
        "connect gave up while the cluster had no leader: {:?}",
        connecting.await.map(|r| r.err())
    );
    let healing = cluster.clone();
    blocking(move || healing.heal_all())
        .await
        .expect("the cluster heals");
    let store = tokio::time::timeout(Duration::from_secs(30), connecting)
        .await
        .expect("connect ends once the cluster serves")
        .expect("the connect task")
        .expect("connected once a leader was elected");
    let locks = LockManager::builder()
        .client_id("cluster")
        .farm_id("f1")
        .store(store)
        .build()
        .expect("manager");
    let guard = locks.try_lock("w").await.expect("the store serves");
    assert!(guard.release().await.expect("released"));
}

/// No member reachable at all: a connection error naming every endpoint it tried.
#[tokio::test]
async fn an_unreachable_cluster_names_every_endpoint() {
    let (a, b) = (free_port().unwrap(), free_port().unwrap());
    let err = EtcdStore::connect(
        EtcdConfig::new([format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}")])
            .connect_timeout(Duration::from_millis(300))
            .response_timeout(Duration::from_millis(300)),
    )
    .await
    .expect_err("nothing listens");
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("127.0.0.1:{a}")) && text.contains(&format!("127.0.0.1:{b}")),
        "{text}"
    );
}
