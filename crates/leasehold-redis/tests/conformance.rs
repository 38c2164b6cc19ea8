//! The store conformance suite against a real, private redis-server: with fencing (the default),
//! without, and in strict FIFO mode.

use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

async fn store(fencing: bool) -> (RedisStore, RedisServer) {
    let server = RedisServer::start().expect("start redis-server");
    let store = RedisStore::connect(RedisConfig::new(server.url()).fencing(fencing))
        .await
        .expect("connect");
    (store, server)
}

mod fenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(true));
}

mod unfenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(false));
}

/// Strict FIFO: one place in the waiter queue per waiting call.
async fn strict_store() -> (RedisStore, RedisServer) {
    let server = RedisServer::start().expect("start redis-server");
    let store = RedisStore::connect(RedisConfig::new(server.url()).strict_fifo(true))
        .await
        .expect("connect");
    (store, server)
}

mod strict_fifo {
    leasehold_testkit::conformance_tests!(with_guard: super::strict_store());
}

/// Fencing keeps no state for keys nobody holds: the last token of a key lives as long as the
/// hold it was issued to, and a token issued after it expired is still above every earlier one
/// (tokens follow the server's clock).
mod bounded_fencing {
    use std::time::Duration;

    use leasehold_redis::{RedisConfig, RedisStore};
    use leasehold_testkit::redis::RedisServer;

    use futures::StreamExt;
    use leasehold_core::{Acquire, LockKey, LockStore, OwnerToken};

    const TTL: Duration = Duration::from_millis(1500);

    fn acquire(key: &LockKey) -> Acquire {
        Acquire::new(key.clone(), OwnerToken::generate(), TTL)
    }

    /// A Redis key's TTL left in ms (-1: none, -2: no such key).
    async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
        redis::cmd("PTTL")
            .arg(key)
            .query_async(conn)
            .await
            .expect("PTTL")
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hundred_thousand_keys_leave_nothing_behind_and_tokens_keep_growing() {
        let (store, server) = super::store(true).await;
        let keys: Vec<LockKey> = (0..100_000)
            .map(|i| LockKey::dc("f1", "orders", &format!("order-{i}")).unwrap())
            .collect();
        let first_round: Vec<u64> = futures::stream::iter(&keys)
            .map(|key| {
                let store = &store;
                async move {
                    let lease = store.try_acquire(&acquire(key)).await.expect("free");
                    assert!(store.release(&lease).await.expect("release"));
                    lease.fencing_token().expect("fenced")
                }
            })
            .buffered(64)
            .collect()
            .await;

        // Past the longest TTL of any hold, the store holds none of our keys.
        tokio::time::sleep(TTL + Duration::from_millis(500)).await;
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let left: u64 = redis::cmd("DBSIZE").query_async(&mut conn).await.unwrap();
        assert_eq!(left, 0, "every key of 100,000 locks expired with its holds");

        // A token issued after the key's last token expired is above all the earlier ones.
        for (key, before) in keys.iter().zip(&first_round).step_by(10_000) {
            let lease = store.try_acquire(&acquire(key)).await.unwrap();
            let after = lease.fencing_token().unwrap();
            assert!(after > *before, "{key}: {after} after {before}");
            let highest = first_round.iter().max().unwrap();
            assert!(after > *highest, "above every token issued before");
            store.release(&lease).await.unwrap();
        }
    }

    /// The counter lives for the TTL of the hold that started it; a later hold renewed past
    /// that (an election's leader, a long job) still says its own token, in either mode.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hold_that_outlives_its_counter_still_says_its_token() {
        let server = RedisServer::start().expect("start redis-server");
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        for fair in [true, false] {
            let store = RedisStore::connect(RedisConfig::new(server.url()).fair(fair))
                .await
                .expect("connect");
            let key = LockKey::dc("f1", "orders", &format!("long-{fair}")).unwrap();
            let fence_key = format!("leasehold:fence:{key}");
            // A short hold starts the key's counter, which lives its 300 ms.
            let short = Acquire::new(
                key.clone(),
                OwnerToken::generate(),
                Duration::from_millis(300),
            );
            let first = store.try_acquire(&short).await.expect("free");
            assert!(store.release(&first).await.expect("release"));
            // The next hold is granted on that counter, then renewed past its end.
            let lease = store.try_acquire(&acquire(&key)).await.expect("free");
            let token = lease.fencing_token().expect("fenced");
            tokio::time::sleep(Duration::from_millis(500)).await;
            let lease = store.extend(&lease, TTL).await.expect("renewed");
            assert_eq!(pttl(&mut conn, &fence_key).await, -2, "the counter ran out");
            let info = store.inspect(&key).await.unwrap().expect("held");
            assert_eq!(info.token.as_ref(), Some(lease.token()), "fair: {fair}");
            assert_eq!(info.fencing_token, Some(token), "fair: {fair}");
            assert!(store.release(&lease).await.expect("release"));
            // The next grant starts the counter again from the clock, above the last token.
            let next = store.try_acquire(&acquire(&key)).await.expect("free");
            assert!(
                next.fencing_token().expect("fenced") > token,
                "fair: {fair}"
            );
            assert!(store.release(&next).await.expect("release"));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_last_token_ahead_of_the_clock_is_still_exceeded() {
        let (store, server) = super::store(true).await;
        let key = LockKey::dc("f1", "orders", "ahead").unwrap();
        // As if the server's clock had gone back: the key's last token is far in its future,
        // on a counter started by a hold of a minute.
        let ahead: u64 = 4_000_000_000_000_000;
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let () = redis::cmd("SET")
            .arg("leasehold:fence:DC#f1#orders#ahead")
            .arg(ahead)
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        let lease = store.try_acquire(&acquire(&key)).await.unwrap();
        assert_eq!(lease.fencing_token(), Some(ahead + 1));
        let pttl = pttl(&mut conn, "leasehold:fence:DC#f1#orders#ahead").await;
        assert!(
            pttl > TTL.as_millis() as i64 && pttl <= 60_000,
            "a grant neither extends nor shortens the counter: {pttl}"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_key_in_constant_use_starts_its_counter_again_and_its_tokens_keep_growing() {
        let (store, server) = super::store(true).await;
        let key = LockKey::dc("f1", "orders", "busy").unwrap();
        let short = Duration::from_millis(300);
        let mut conn = redis::Client::open(server.url())
            .unwrap()
            .get_multiplexed_async_connection()
            .await
            .unwrap();
        let (mut last, mut restarts, mut grants) = (0u64, 0u32, 0u32);
        let started = std::time::Instant::now();
        // Held and released back to back for over three counter lifetimes.
        while started.elapsed() < short * 3 + Duration::from_millis(200) {
            let req = Acquire::new(key.clone(), OwnerToken::generate(), short);
            let lease = store.try_acquire(&req).await.expect("free");
            let token = lease.fencing_token().expect("fenced");
            assert!(token > last, "grant {grants}: {token} after {last}");
            if last != 0 && token != last + 1 {
                restarts += 1;
            }
            let pttl = pttl(&mut conn, "leasehold:fence:DC#f1#orders#busy").await;
            // -2: gone since the grant; never -1 (no TTL).
            assert!(
                pttl != -1 && pttl <= short.as_millis() as i64,
                "the counter lives at most the TTL of the hold that started it: {pttl}"
            );
            assert!(store.release(&lease).await.expect("release"));
            last = token;
            grants += 1;
        }
        assert!(
            restarts >= 2,
            "{grants} grants: the counter started again from the clock {restarts} times, not \
             once per lifetime (extended by its grants?)"
        );
    }
}
