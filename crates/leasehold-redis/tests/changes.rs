//! Change announcements against real servers: a [`ChangeWatch`] fires on every grant and release
//! of its key (exclusive, fair or first-come, readers, semaphore permits) taken with
//! `Acquire::announce`, and not on an extend nor for a lock taken without it;
//! it takes no place in the waiter line; on a Redis Cluster it hears keys of every shard; and the
//! last watch dropped ends the key's subscription on the server.

use std::pin::Pin;
use std::time::Duration;

use futures::FutureExt;
use leasehold_core::{Acquire, ChangeWatch, LockKey, LockMode, LockStore, OwnerToken};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;
use leasehold_testkit::redis_cluster::RedisCluster;
use tokio::sync::futures::Notified;

/// How long an announcement may take to arrive: generous, the bound of a failure only.
const HEARD_WITHIN: Duration = Duration::from_secs(5);

fn key(name: &str) -> LockKey {
    format!("DC#f1#t#{name}").parse().unwrap()
}

/// An announced request (an election's lock).
fn request(key: &LockKey, mode: LockMode) -> Acquire {
    Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(30))
        .with_mode(mode)
        .with_announce(true)
}

/// The watch's next notification, registered now (before the change it is to hear).
fn armed(watch: &ChangeWatch) -> Pin<Box<Notified<'_>>> {
    let mut next = Box::pin(watch.notify().notified());
    next.as_mut().enable();
    next
}

async fn heard(next: Pin<Box<Notified<'_>>>, what: &str) {
    tokio::time::timeout(HEARD_WITHIN, next)
        .await
        .unwrap_or_else(|_| panic!("the watch did not fire on {what}"));
}

async fn connect(config: RedisConfig) -> RedisStore {
    RedisStore::connect(config).await.expect("connect")
}

/// Subscribers of `channel` on `node`: `PUBSUB NUMSUB`, or with `sharded` `PUBSUB SHARDNUMSUB`.
async fn subscribers(node: &str, channel: &str, sharded: bool) -> i64 {
    let client = redis::Client::open(node).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let (_, count): (String, i64) = redis::cmd("PUBSUB")
        .arg(if sharded { "SHARDNUMSUB" } else { "NUMSUB" })
        .arg(channel)
        .query_async(&mut conn)
        .await
        .unwrap();
    count
}

/// Waits (bounded) until `channel` has `expected` subscribers on `node`: an unsubscription is
/// sent in the background once the last watch is dropped.
async fn subscribers_become(node: &str, channel: &str, sharded: bool, expected: i64) {
    let settled = tokio::time::timeout(HEARD_WITHIN, async {
        while subscribers(node, channel, sharded).await != expected {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    assert!(
        settled.is_ok(),
        "{channel} kept {} subscribers, not {expected}",
        subscribers(node, channel, sharded).await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_fires_on_grants_and_releases_of_every_kind_and_not_on_an_extend() {
    let server = RedisServer::start().expect("start redis-server");
    for fair in [true, false] {
        let observer = connect(RedisConfig::new(server.url()).fair(fair)).await;
        let holder = connect(RedisConfig::new(server.url()).fair(fair)).await;
        let name = if fair { "fair" } else { "first-come" };
        let (k, barrier) = (key(name), key(&format!("{name}-barrier")));
        let watch = observer.watch_changes(&k).await;
        assert!(watch.is_live(), "{name}: subscribed");

        let next = armed(&watch);
        let lease = holder
            .try_acquire(&request(&k, LockMode::Exclusive))
            .await
            .unwrap();
        heard(next, &format!("{name}: an exclusive grant")).await;

        // An extend changes no holder. A grant on another key, announced on the same subscriber
        // connection after anything the extend announced, proves nothing came.
        let next = armed(&watch);
        let lease = holder
            .extend(&lease, Duration::from_secs(60))
            .await
            .unwrap();
        let other = observer.watch_changes(&barrier).await;
        let barrier_heard = armed(&other);
        let barrier_lease = holder
            .try_acquire(&request(&barrier, LockMode::Exclusive))
            .await
            .unwrap();
        heard(barrier_heard, &format!("{name}: the barrier's grant")).await;
        let mut next = next;
        assert!(
            next.as_mut().now_or_never().is_none(),
            "{name}: an extend announced a change"
        );

        drop(next);
        let next = armed(&watch);
        assert!(holder.release(&lease).await.unwrap());
        heard(next, &format!("{name}: an exclusive release")).await;

        let next = armed(&watch);
        let reader = holder
            .try_acquire(&request(&k, LockMode::Shared))
            .await
            .unwrap();
        heard(next, &format!("{name}: a read grant")).await;
        let next = armed(&watch);
        assert!(holder.release(&reader).await.unwrap());
        heard(next, &format!("{name}: a read release")).await;

        let permits = LockMode::Semaphore { permits: 2 };
        let semaphore = key(&format!("{name}-semaphore"));
        let permit_watch = observer.watch_changes(&semaphore).await;
        let next = armed(&permit_watch);
        let permit = holder
            .try_acquire(&request(&semaphore, permits))
            .await
            .unwrap();
        heard(next, &format!("{name}: a permit's grant")).await;
        let next = armed(&permit_watch);
        assert!(holder.release(&permit).await.unwrap());
        heard(next, &format!("{name}: a permit's release")).await;

        // A release of a hold already gone changes nothing, and is not announced either.
        let next = armed(&watch);
        assert!(!holder.release(&lease).await.unwrap());
        let barrier_heard = armed(&other);
        assert!(holder.release(&barrier_lease).await.unwrap());
        heard(barrier_heard, &format!("{name}: the barrier's release")).await;
        let mut next = next;
        assert!(
            next.as_mut().now_or_never().is_none(),
            "{name}: a release that released nothing announced a change"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_taken_without_announce_is_never_published() {
    let server = RedisServer::start().expect("start redis-server");
    for fair in [true, false] {
        let observer = connect(RedisConfig::new(server.url()).fair(fair)).await;
        let holder = connect(RedisConfig::new(server.url()).fair(fair)).await;
        let name = if fair {
            "quiet-fair"
        } else {
            "quiet-first-come"
        };
        let (k, barrier) = (key(name), key(&format!("{name}-barrier")));
        let watch = observer.watch_changes(&k).await;
        let other = observer.watch_changes(&barrier).await;
        let quiet = |mode| request(&k, mode).with_announce(false);
        let next = armed(&watch);
        for mode in [
            LockMode::Exclusive,
            LockMode::Shared,
            LockMode::Semaphore { permits: 2 },
        ] {
            let lease = holder.try_acquire(&quiet(mode)).await.unwrap();
            assert!(!lease.announces());
            assert!(holder.release(&lease).await.unwrap());
        }
        // Announced after everything above on the same subscriber connection: had any of it
        // been published, the key's watch would have fired first.
        let barrier_heard = armed(&other);
        let barrier_lease = holder
            .try_acquire(&request(&barrier, LockMode::Exclusive))
            .await
            .unwrap();
        heard(barrier_heard, &format!("{name}: the barrier's grant")).await;
        let mut next = next;
        assert!(
            next.as_mut().now_or_never().is_none(),
            "{name}: a lock taken without announce was published"
        );
        assert!(holder.release(&barrier_lease).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_takes_no_place_in_the_waiter_line() {
    let server = RedisServer::start().expect("start redis-server");
    let config = RedisConfig::new(server.url());
    let (observer, holder, taker) = (
        connect(config.clone()).await,
        connect(config.clone()).await,
        connect(config).await,
    );
    let k = key("no-place");
    let lease = holder
        .try_acquire(&request(&k, LockMode::Exclusive))
        .await
        .unwrap();
    let watch = observer.watch_changes(&k).await;
    assert!(watch.is_live());

    let next = armed(&watch);
    assert!(holder.release(&lease).await.unwrap());
    heard(next, "the release").await;
    // A try-lock never passes a queued waiter: it succeeds at once only if nobody is in line.
    let taken = taker
        .try_acquire(&request(&k, LockMode::Exclusive))
        .await
        .expect("nobody in line: the try succeeds at once");

    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let line: Vec<String> = redis::cmd("LRANGE")
        .arg(observer.queue_key(&k))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(line.is_empty(), "the waiter line holds {line:?}");
    let deadlines: Vec<String> = redis::cmd("HKEYS")
        .arg(observer.queue_deadline_key(&k))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(
        !deadlines
            .iter()
            .any(|d| d.starts_with(observer.waiter_id())),
        "the observer has a deadline in line: {deadlines:?}"
    );
    assert!(taker.release(&taken).await.unwrap());
    drop(watch);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_last_watch_on_a_key_unsubscribes_it() {
    let server = RedisServer::start().expect("start redis-server");
    let config = RedisConfig::new(server.url());
    let (observer, holder) = (connect(config.clone()).await, connect(config).await);
    let k = key("unsubscribed");
    let channel = observer.change_channel(&k);
    let url = server.url();

    let first = observer.watch_changes(&k).await;
    let second = observer.watch_changes(&k).await;
    assert_eq!(
        subscribers(&url, &channel, false).await,
        1,
        "one subscription per key and store"
    );

    drop(first);
    let next = armed(&second);
    let lease = holder
        .try_acquire(&request(&k, LockMode::Exclusive))
        .await
        .unwrap();
    heard(next, "a grant, with one watch of two left").await;
    assert_eq!(subscribers(&url, &channel, false).await, 1);

    drop(second);
    subscribers_become(&url, &channel, false, 0).await;

    // Watched again: subscribed again.
    let again = observer.watch_changes(&k).await;
    assert_eq!(subscribers(&url, &channel, false).await, 1);
    let next = armed(&again);
    assert!(holder.release(&lease).await.unwrap());
    heard(next, "a release, watched again").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_watch_hears_keys_of_every_shard_and_the_last_one_unsubscribes() {
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("start a Redis Cluster");
    let observer = connect(RedisConfig::new(cluster.url())).await;
    let holder = connect(RedisConfig::new(cluster.url())).await;

    // One key on each master (the 16384 slots are split over three).
    let mut keys: Vec<(LockKey, u16)> = Vec::new();
    for i in 0..200 {
        let k = key(&format!("shard-{i}"));
        let master = cluster.master_of(&observer.lock_key(&k)).unwrap();
        if keys.iter().all(|(_, m)| *m != master) {
            keys.push((k, master));
        }
    }
    assert!(keys.len() >= 2, "keys on different masters: {keys:?}");

    for (k, master) in &keys {
        let watch = observer.watch_changes(k).await;
        assert!(watch.is_live(), "{k}: subscribed");
        let node = cluster.node(*master).unwrap().url();
        let channel = observer.change_channel(k);
        assert_eq!(
            subscribers(&node, &channel, true).await,
            1,
            "{k}: a sharded subscription on the slot's master"
        );

        let next = armed(&watch);
        let lease = holder
            .try_acquire(&request(k, LockMode::Exclusive))
            .await
            .unwrap();
        heard(next, &format!("{k}: a grant on master {master}")).await;
        let next = armed(&watch);
        assert!(holder.release(&lease).await.unwrap());
        heard(next, &format!("{k}: a release on master {master}")).await;

        drop(watch);
        subscribers_become(&node, &channel, true, 0).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_is_subscribed_again_after_the_server_restarts() {
    let mut server = RedisServer::start().expect("start redis-server");
    let observer = connect(RedisConfig::new(server.url())).await;
    let k = key("restarted");
    let channel = observer.change_channel(&k);
    let watch = observer.watch_changes(&k).await;

    // The dropped connection fires the watch (an announcement may have been lost with it).
    let next = armed(&watch);
    server.restart().expect("restart redis-server");
    heard(next, "the lost connection").await;

    // Subscribed again on the new connection, without a new watch: a grant is heard.
    subscribers_become(&server.url(), &channel, false, 1).await;
    // A holder connected after the restart (a data connection learns of it by failing once).
    let holder = connect(RedisConfig::new(server.url())).await;
    let next = armed(&watch);
    let lease = holder
        .try_acquire(&request(&k, LockMode::Exclusive))
        .await
        .unwrap();
    heard(next, "a grant after the restart").await;
    assert!(holder.release(&lease).await.unwrap());
}
