//! An acquire that runs twice: the redis crate's cluster client sends a request again when its
//! connection broke after the send, so a lock script whose first run took the lock can run a
//! second time and find the lock held by its own token. The store then reports the attempt in
//! doubt, never refused (a refusal would leave the hold to its TTL with nobody knowing), in every
//! mode (first-come, fair, a blocking waiter, a reader, a permit), and a fair second run leaves
//! the waiter line as it was. Through the readback layer the caller gets the lock.

use std::time::Duration;

use leasehold::core::{Acquire, Layer, Wait, WaiterId};
use leasehold::layers::ReadbackLayer;
use leasehold::{ErrorKind, LockKey, LockMode, LockStore, OwnerToken};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

async fn connect(server: &RedisServer, fair: bool) -> RedisStore {
    RedisStore::connect(RedisConfig::new(server.url()).fair(fair))
        .await
        .expect("connect")
}

fn request(name: &str, mode: LockMode) -> Acquire {
    let key = LockKey::dc("f1", "second-run", name).unwrap();
    Acquire::new(key, OwnerToken::generate(), TTL).with_mode(mode)
}

/// Sends `req` twice: the first run takes the lock, the second is in doubt, and the record is
/// the first run's.
async fn runs_twice(store: &RedisStore, req: &Acquire) {
    let lease = store
        .try_acquire(req)
        .await
        .expect("the first run takes it");
    let again = store.try_acquire(req).await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::InDoubt, "{again}");
    assert!(again.to_string().contains("ran twice"), "{again}");
    let info = store.inspect(&req.key).await.unwrap().expect("held");
    assert!(info.is_owned_by(&req.token), "{info:?}");
    assert!(store.release(&lease).await.unwrap());
}

#[tokio::test]
async fn a_second_run_of_an_acquire_is_in_doubt_in_every_mode() {
    let server = RedisServer::start().expect("start redis-server");
    for fair in [false, true] {
        let store = connect(&server, fair).await;
        let tag = if fair { "fair" } else { "first-come" };
        runs_twice(
            &store,
            &request(&format!("{tag}-exclusive"), LockMode::Exclusive),
        )
        .await;
        runs_twice(&store, &request(&format!("{tag}-reader"), LockMode::Shared)).await;
        runs_twice(
            &store,
            &request(&format!("{tag}-permit"), LockMode::semaphore(2).unwrap()),
        )
        .await;
    }
}

#[tokio::test]
async fn a_blocking_waiters_second_run_leaves_the_line_as_it_was() {
    let server = RedisServer::start().expect("start redis-server");
    let store = connect(&server, true).await;
    let req = request("blocking", LockMode::Exclusive).with_wait(Some(Wait::new(
        Instant::now() + Duration::from_secs(10),
        WaiterId::new(),
    )));
    let lease = store.try_acquire(&req).await.expect("free");
    let again = store.try_acquire(&req).await.unwrap_err();
    assert_eq!(again.kind(), ErrorKind::InDoubt, "{again}");

    let client = redis::Client::open(server.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let line: Vec<String> = redis::cmd("LRANGE")
        .arg(store.queue_key(&req.key))
        .arg(0)
        .arg(-1)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert!(line.is_empty(), "the second run queued: {line:?}");
    assert!(store.release(&lease).await.unwrap());
    // Nobody is left in line: another store's try takes the lock at once.
    let other = connect(&server, true).await;
    let next = other
        .try_acquire(&request("blocking", LockMode::Exclusive))
        .await
        .expect("free, nobody in line");
    assert!(other.release(&next).await.unwrap());
}

#[tokio::test]
async fn through_the_readback_layer_a_second_run_gets_the_lock() {
    let server = RedisServer::start().expect("start redis-server");
    let store = ReadbackLayer::new().layer(connect(&server, true).await);
    let req = request("readback", LockMode::Exclusive);
    let first = store.try_acquire(&req).await.expect("free");
    let second = store.try_acquire(&req).await.expect("read back: ours");
    assert_eq!(second.token(), first.token());
    assert_eq!(second.fencing_token(), first.fencing_token());
    assert!(store.release(&second).await.unwrap());
    assert_eq!(store.inspect(&req.key).await.unwrap(), None);
}
