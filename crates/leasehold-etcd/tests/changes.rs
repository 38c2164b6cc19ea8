//! Change watches on a real etcd (`LockStore::watch_changes`, what an election's observers wait
//! on): fired when a hold is granted (exclusive, reader, permit), released or lapses with its
//! lease, and not when its holder renews it; one etcd watch per key and process, cancelled with
//! the last change watch; never a place in the waiter line nor a lease; and still fired after the
//! member under the watch died, on a 3-member cluster.

use std::future::Future;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, Weak};
use std::time::Duration;

use etcd_client::GetOptions;
use leasehold::core::{Acquire, ChangeWatch};
use leasehold::{LockKey, LockMode, LockStore, OwnerToken};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use leasehold_testkit::etcd_cluster::EtcdCluster;

/// The cluster of this test binary, while a test holds it.
static CLUSTER: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());

/// How long a change may take to reach an observer: one watch event on loopback takes
/// milliseconds; this leaves room for a loaded machine.
const FIRES_WITHIN: Duration = Duration::from_secs(5);
/// How long an observer is watched for a wake-up that must not come (a renewal's): a real one
/// arrives within milliseconds, so silence this long means none was sent.
const QUIET_FOR: Duration = Duration::from_secs(1);
/// The TTL of holds that are released by the test.
const TTL: Duration = Duration::from_secs(10);

fn key(entity: &str) -> LockKey {
    LockKey::dc("f1", "changes", entity).unwrap()
}

async fn store(server: &EtcdServer) -> EtcdStore {
    EtcdStore::connect(EtcdConfig::new([server.endpoint()]))
        .await
        .expect("connect")
}

async fn raw(server: &EtcdServer) -> etcd_client::Client {
    etcd_client::Client::connect([server.endpoint()], None)
        .await
        .expect("connect a plain client")
}

async fn blocking<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(work)
        .await
        .expect("blocking work")
}

/// Runs `change` with `watch`'s notification registered before it (as an observer does before
/// each read), and says whether the watch fired within `within` after it.
async fn fired<T>(
    watch: &ChangeWatch,
    within: Duration,
    change: impl Future<Output = T>,
) -> (T, bool) {
    let notified = watch.notify().notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    let out = change.await;
    let fired = tokio::time::timeout(within, notified).await.is_ok();
    (out, fired)
}

/// An acquisition of `key` in `mode` by a new owner.
fn acquire(key: &LockKey, mode: LockMode, ttl: Duration) -> Acquire {
    Acquire::new(key.clone(), OwnerToken::generate(), ttl).with_mode(mode)
}

/// The number of watchers the etcd at `addr` has open, from its Prometheus metrics (served on the
/// client port).
async fn watchers(addr: SocketAddr) -> u64 {
    blocking(move || watchers_now(addr)).await
}

fn watchers_now(addr: SocketAddr) -> u64 {
    let mut conn = TcpStream::connect(addr).expect("connect to the metrics");
    conn.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("ask for the metrics");
    let mut text = String::new();
    conn.read_to_string(&mut text).expect("read the metrics");
    text.lines()
        .find_map(|line| line.strip_prefix("etcd_debugging_mvcc_watcher_total "))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map(|value| value as u64)
        .unwrap_or_else(|| panic!("no watcher count in the metrics:\n{text}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_watch_fires_on_grants_releases_and_expiry_but_not_on_renewals() {
    let server = EtcdServer::start().expect("start etcd");
    let (holder, observer) = (store(&server).await, store(&server).await);
    let key = key("leader");
    let watch = observer.watch_changes(&key).await;
    assert!(watch.is_live(), "etcd has change notifications");

    // An exclusive grant and its release.
    let (lease, grant) = fired(&watch, FIRES_WITHIN, async {
        holder
            .try_acquire(&acquire(&key, LockMode::Exclusive, TTL))
            .await
    })
    .await;
    let lease = lease.expect("free");
    assert!(grant, "a grant wakes the observer");

    // A renewal is a keep-alive (no write); an extend to another TTL moves the hold to a new
    // lease (a put of the same key): neither changes the holder.
    let (lease, renewal) = fired(&watch, QUIET_FOR, async {
        let lease = holder.extend(&lease, TTL).await.expect("renewed");
        holder
            .extend(&lease, TTL * 2)
            .await
            .expect("moved to a new lease")
    })
    .await;
    assert!(!renewal, "a renewal wakes nobody");

    let (released, release) = fired(&watch, FIRES_WITHIN, holder.release(&lease)).await;
    assert!(released.expect("released"));
    assert!(release, "a release wakes the observer");

    // Readers and permit holders are holders too: each grant and each release.
    for mode in [LockMode::Shared, LockMode::semaphore(2).unwrap()] {
        let mut leases = Vec::new();
        for _ in 0..2 {
            let (lease, grant) = fired(&watch, FIRES_WITHIN, async {
                holder.try_acquire(&acquire(&key, mode, TTL)).await
            })
            .await;
            leases.push(lease.expect("room for two"));
            assert!(grant, "a {mode} grant wakes the observer");
        }
        for lease in leases {
            let (released, release) = fired(&watch, FIRES_WITHIN, holder.release(&lease)).await;
            assert!(released.expect("released"));
            assert!(release, "a {mode} release wakes the observer");
        }
    }

    // A holder that stops renewing: its lease expires in etcd, which deletes the hold with an
    // event (etcd checks expiry every half second or so, past the 2 s TTL).
    let short = Duration::from_secs(2);
    let (lease, grant) = fired(&watch, FIRES_WITHIN, async {
        holder
            .try_acquire(&acquire(&key, LockMode::Exclusive, short))
            .await
    })
    .await;
    lease.expect("free");
    assert!(grant);
    let ((), expiry) = fired(&watch, short + FIRES_WITHIN, async {}).await;
    assert!(
        expiry,
        "the expiry of the holder's lease wakes the observer"
    );
    assert!(
        observer.inspect(&key).await.unwrap().is_none(),
        "the hold expired"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_watch_takes_no_place_in_line_and_no_lease() {
    let server = EtcdServer::start().expect("start etcd");
    // Stores are fair by default: a waiter key in the line would turn `next` away.
    let (holder, observer, next) = (
        store(&server).await,
        store(&server).await,
        store(&server).await,
    );
    let mut raw = raw(&server).await;
    let key = key("line");
    let lease = holder
        .try_acquire(&acquire(&key, LockMode::Exclusive, TTL))
        .await
        .expect("free");

    let leases_before = raw.leases().await.unwrap().leases().len();
    let watch = observer.watch_changes(&key).await;
    assert!(watch.is_live());
    let waiters = raw
        .get(
            observer.waiter_prefix(&key),
            Some(GetOptions::new().with_prefix().with_count_only()),
        )
        .await
        .unwrap();
    assert_eq!(waiters.count(), 0, "no waiter key for an observer");
    assert_eq!(
        raw.leases().await.unwrap().leases().len(),
        leases_before,
        "no lease for an observer"
    );

    let (released, release) = fired(&watch, FIRES_WITHIN, holder.release(&lease)).await;
    assert!(released.expect("released") && release);
    // Nobody waits, so the next try takes the lock at once, observer or not.
    let taken = tokio::time::timeout(
        FIRES_WITHIN,
        next.try_acquire(&acquire(&key, LockMode::Exclusive, TTL)),
    )
    .await
    .expect("answered at once")
    .expect("taken at once: the observer is not in line");
    assert!(next.release(&taken).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn change_watches_of_a_process_share_one_etcd_watch_cancelled_with_the_last() {
    let server = EtcdServer::start().expect("start etcd");
    let (holder, observer) = (store(&server).await, store(&server).await);
    let key = key("shared-watch");
    let before = watchers(server.addr()).await;

    let first = observer.watch_changes(&key).await;
    let second = observer.watch_changes(&key).await;
    assert!(first.is_live() && second.is_live());
    assert_eq!(
        watchers(server.addr()).await,
        before + 1,
        "one etcd watch for both"
    );

    // Both fire on one grant.
    let lease = {
        let on_second = second.notify().notified();
        tokio::pin!(on_second);
        on_second.as_mut().enable();
        let (lease, grant) = fired(&first, FIRES_WITHIN, async {
            holder
                .try_acquire(&acquire(&key, LockMode::Exclusive, TTL))
                .await
        })
        .await;
        assert!(grant);
        tokio::time::timeout(FIRES_WITHIN, on_second)
            .await
            .expect("the second watch fires too");
        lease.expect("free")
    };

    // The first dropped, the second still fires.
    drop(first);
    let (released, release) = fired(&second, FIRES_WITHIN, holder.release(&lease)).await;
    assert!(
        released.unwrap() && release,
        "the stream outlives one watch"
    );

    // The last dropped: the etcd watch is cancelled (the server notices the stream closed soon
    // after, asynchronously).
    drop(second);
    tokio::time::timeout(FIRES_WITHIN, async {
        while watchers(server.addr()).await > before {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the etcd watch is cancelled with the last change watch");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_watch_survives_the_death_of_each_member_in_turn() {
    let cluster = blocking(|| EtcdCluster::shared(&CLUSTER, 3))
        .await
        .expect("start a 3-member etcd cluster");
    let connect = || async {
        EtcdStore::connect(
            EtcdConfig::from_url(&cluster.url())
                .unwrap()
                .prefix("changes-failover:")
                .response_timeout(Duration::from_secs(1))
                .connect_timeout(Duration::from_millis(500)),
        )
        .await
        .expect("connect to the cluster")
    };
    let (holder, observer) = (connect().await, connect().await);
    let key = key("failover");
    let watch = observer.watch_changes(&key).await;
    assert!(watch.is_live());

    // Every member dies once, so one of them is the member under the watch; it must move to a
    // live member and still report the next grant.
    for victim in 0..cluster.size() {
        let hurt = cluster.clone();
        blocking(move || {
            hurt.kill(victim)?;
            hurt.wait_for_leader()
        })
        .await
        .expect("the two others elect a leader");

        let (lease, grant) = fired(&watch, FIRES_WITHIN, async {
            holder
                .try_acquire(&acquire(&key, LockMode::Exclusive, TTL))
                .await
        })
        .await;
        let lease = lease.unwrap_or_else(|e| panic!("member {victim} dead: {e}"));
        assert!(grant, "member {victim} dead: the grant wakes the observer");
        let (released, release) = fired(&watch, FIRES_WITHIN, holder.release(&lease)).await;
        assert!(released.expect("released"));
        assert!(
            release,
            "member {victim} dead: the release wakes the observer"
        );

        let healing = cluster.clone();
        blocking(move || healing.heal(victim))
            .await
            .expect("the member comes back");
    }
}
