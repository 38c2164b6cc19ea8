//! Cancel safety of the store itself: an acquisition whose caller stops waiting before its
//! answer leaves nothing held, even when the request lands after the caller gave up, and a
//! blocking one leaves no place in the waiter line.

use std::time::Duration;

use leasehold::core::{Acquire, ReleaseWatch, Wait};
use leasehold::{LockKey, LockStore, OwnerToken};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;
use redis::aio::MultiplexedConnection;

/// A private server, a store on it, and an admin connection.
async fn setup() -> (RedisServer, RedisStore, MultiplexedConnection) {
    let server = RedisServer::start().expect("start redis");
    let store = RedisStore::connect(RedisConfig::new(server.url()))
        .await
        .expect("connect");
    let admin = redis::Client::open(server.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    (server, store, admin)
}

/// Writes wait on the server for the next 300 ms (`CLIENT PAUSE ... WRITE`).
async fn pause_writes(admin: &mut MultiplexedConnection) {
    pause(admin, "WRITE").await;
}

/// Commands of `kind` (`WRITE` or `ALL`) wait on the server for the next 300 ms.
async fn pause(admin: &mut MultiplexedConnection, kind: &str) {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(300)
        .arg(kind)
        .query_async(admin)
        .await
        .unwrap();
}

/// One try at `key` by a new owner, for 60 s.
async fn take(store: &RedisStore, key: &LockKey) -> leasehold::Result<leasehold::Lease> {
    let req = Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(60));
    store.try_acquire(&req).await
}

/// A blocking attempt on `key` by a new owner, of the wait `watch` registers.
fn blocking(key: &LockKey, watch: &ReleaseWatch) -> Acquire {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(60))
        .with_wait(Some(Wait::new(deadline, watch.waiter())))
}

/// Waits until `key`'s waiter line is empty, within 3 s: well inside the waiter timeout (5 s)
/// after which a place nobody renews lapses by itself. `what` names what would be left.
async fn until_line_empty(admin: &mut MultiplexedConnection, key: &LockKey, what: &str) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(3);
    loop {
        let line: Vec<String> = redis::cmd("LRANGE")
            .arg(format!("leasehold:queue:{}", key.as_str()))
            .arg(0)
            .arg(-1)
            .query_async(admin)
            .await
            .unwrap();
        if line.is_empty() {
            return;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "{what} is still in line: {line:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_dropped_before_its_answer_leaves_nothing_held() {
    let (_server, store, mut admin) = setup().await;
    let key = LockKey::dc("f1", "cancel", "job").unwrap();
    // Writes wait on the server for 300 ms: the acquisition is sent, and applied only after its
    // caller has given up.
    pause_writes(&mut admin).await;
    let req = Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(60));
    let dropped = tokio::time::timeout(Duration::from_millis(50), store.try_acquire(&req)).await;
    assert!(dropped.is_err(), "the caller stopped waiting");
    // Long before the 60 s lease could run out, the undo has removed what the request took.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.inspect(&key).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the abandoned acquisition was never undone"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let next = take(&store, &key).await.expect("free again");
    assert!(store.release(&next).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_attempt_dropped_before_its_answer_leaves_no_place_in_line() {
    let (_server, store, mut admin) = setup().await;
    let key = LockKey::dc("f1", "cancel", "line").unwrap();
    let held = take(&store, &key).await.unwrap();
    // A wait begins: its watch, then its first attempt, which the server applies only after the
    // caller has given up (writes wait 300 ms): the script queues the process, and nobody reads
    // the answer that says so.
    let watch = store.watch(&key).await;
    pause_writes(&mut admin).await;
    let req = blocking(&key, &watch);
    let dropped = tokio::time::timeout(Duration::from_millis(50), store.acquire(&req)).await;
    assert!(dropped.is_err(), "the caller stopped waiting");
    // The wait ends. Its place is left with it: once the paused write has run, the line is empty
    // long before the waiter timeout would have taken the place out.
    drop(watch);
    tokio::time::sleep(Duration::from_millis(400)).await;
    until_line_empty(&mut admin, &key, "the dropped attempt's place").await;
    assert!(store.release(&held).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_dropped_while_it_subscribes_leaves_no_waiter_registered() {
    let (_server, store, mut admin) = setup().await;
    let key = LockKey::dc("f1", "cancel", "watch").unwrap();
    // The server answers nothing for 300 ms: the subscription of the wait is sent, and its
    // caller gives up before it is confirmed.
    pause(&mut admin, "ALL").await;
    let dropped = tokio::time::timeout(Duration::from_millis(50), store.watch(&key)).await;
    assert!(dropped.is_err(), "the caller stopped waiting");
    tokio::time::sleep(Duration::from_millis(400)).await;
    // A wait of its own now, granted at once: had the dropped watch stayed registered, the
    // process would count another waiter of its own, go back in line with its grant, and stay
    // there after this wait ends.
    let watch = store.watch(&key).await;
    let req = blocking(&key, &watch);
    let lease = match store.acquire(&req).await.unwrap() {
        leasehold::core::Attempt::Granted(lease) => lease,
        refused => panic!("the key is free: {refused:?}"),
    };
    assert!(store.release(&lease).await.unwrap());
    drop(watch);
    until_line_empty(&mut admin, &key, "a place left after every wait ended").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_attempt_whose_answer_is_lost_leaves_no_place_in_line() {
    let (server, holder, mut admin) = setup().await;
    // Replies later than 100 ms are lost: the attempt ends in doubt.
    let store = RedisStore::connect(
        RedisConfig::new(server.url()).response_timeout(Duration::from_millis(100)),
    )
    .await
    .expect("connect");
    let key = LockKey::dc("f1", "cancel", "lost").unwrap();
    let held = take(&holder, &key).await.unwrap();
    // The wait's attempt runs only after its reply was given up for lost (writes wait 300 ms):
    // the script queues the process, and no answer says so.
    let watch = store.watch(&key).await;
    pause_writes(&mut admin).await;
    let err = store.acquire(&blocking(&key, &watch)).await.unwrap_err();
    assert!(err.is_in_doubt(), "{err}");
    // The wait ends there, once the paused script has run (a leave sent sooner would be paused
    // past this store's short timeout too). Its place goes with it, long before the waiter
    // timeout.
    tokio::time::sleep(Duration::from_millis(400)).await;
    drop(watch);
    until_line_empty(&mut admin, &key, "the lost attempt's place").await;
    // So the key is free for a try the moment its holder lets go.
    assert!(holder.release(&held).await.unwrap());
    let next = take(&holder, &key).await.expect("free: nobody is in line");
    assert!(holder.release(&next).await.unwrap());
}
