//! The failover layer's release retries and the explicit extend's, against a scripted store, on
//! paused time.

use std::sync::{Arc, Mutex};

use leasehold_testkit::scripted::{reply_lost, Op, ScriptedStore};

use super::*;
use crate::core::{Acquire, LockKey, OwnerToken};

const TTL: Duration = Duration::from_secs(5);

fn retry(budget: Duration) -> Retry {
    Retry::new(
        Backoff::new(Duration::from_millis(10), Duration::from_secs(1)),
        budget,
    )
}

fn refused() -> Error {
    Error::connection("cannot reach 127.0.0.1:1").with_source(std::io::Error::other("refused"))
}

/// A failover layer over `store` recording its events, and a lease of `ttl` held in it.
fn layer(
    store: &ScriptedStore,
    budget: Duration,
    ttl: Duration,
) -> (Failover<ScriptedStore>, Lease, Arc<Mutex<Vec<LockEvent>>>) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let observers =
        Observers::default().with(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()));
    let key = LockKey::dc("f1", "failover", "k").unwrap();
    let lease = store.lease_for(&Acquire::new(key, OwnerToken::generate(), ttl));
    (
        Failover::new(store.clone(), retry(budget), observers),
        lease,
        events,
    )
}

#[tokio::test(start_paused = true)]
async fn a_release_rides_out_a_short_outage() {
    let store = ScriptedStore::new();
    store
        .expect_release(Err(refused()))
        .expect_release(Err(refused()))
        .expect_release(Ok(true));
    let (failover, lease, events) = layer(&store, Duration::from_secs(10), TTL);
    assert!(failover.release(&lease).await.unwrap());
    assert_eq!(store.count(Op::Release), 3);
    assert!(events.lock().unwrap().is_empty(), "nothing left to expire");
    store.verify();
}

#[tokio::test(start_paused = true)]
async fn a_release_gives_up_at_the_leases_expiry_and_says_the_lock_is_left_to_expire() {
    let store = ScriptedStore::new();
    for _ in 0..200 {
        store.expect_release(Err(refused()));
    }
    let ttl = Duration::from_secs(2);
    let (failover, lease, events) = layer(&store, Duration::from_secs(10), ttl);
    let started = Instant::now();
    let error = failover.release(&lease).await.unwrap_err();
    let spent = started.elapsed();
    assert_eq!(error.kind(), ErrorKind::Connection, "{error}");
    assert!(error.to_string().contains("left to expire in"), "{error}");
    assert!(
        std::error::Error::source(&error).is_some(),
        "the last store error is the cause"
    );
    assert!(
        spent < ttl && spent > ttl / 2,
        "retried until about the expiry: {spent:?}"
    );
    let attempts = store.count(Op::Release) as u32;
    assert!(attempts > 2, "{attempts}");
    let events = events.lock().unwrap();
    match events.as_slice() {
        [LockEvent::LeftToExpire {
            key,
            error,
            expires_in,
            attempts: reported,
        }] => {
            assert_eq!(key, lease.key());
            assert_eq!(*error, ErrorKind::Connection);
            assert!(*expires_in <= ttl - spent + Duration::from_millis(1));
            assert_eq!(*reported, attempts);
        }
        other => panic!("one LeftToExpire event, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn the_budget_caps_a_long_lease_and_zero_means_one_attempt() {
    let store = ScriptedStore::new();
    for _ in 0..200 {
        store.expect_release(Err(refused()));
    }
    let (failover, lease, _) = layer(&store, Duration::from_secs(3), Duration::from_secs(60));
    let started = Instant::now();
    failover.release(&lease).await.unwrap_err();
    assert!(
        started.elapsed() <= Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    let store = ScriptedStore::new();
    store.expect_release(Err(refused()));
    let (failover, lease, events) = layer(&store, Duration::ZERO, TTL);
    let error = failover.release(&lease).await.unwrap_err();
    assert!(error.to_string().contains("left to expire"), "{error}");
    assert_eq!(store.count(Op::Release), 1);
    assert_eq!(events.lock().unwrap().len(), 1);
    store.verify();
}

#[tokio::test(start_paused = true)]
async fn gone_after_a_release_in_doubt_is_ours_while_the_lease_lives() {
    let store = ScriptedStore::new();
    store
        .expect_release(Err(reply_lost()))
        .expect_release(Ok(false));
    let (failover, lease, _) = layer(&store, Duration::from_secs(10), TTL);
    assert!(
        failover.release(&lease).await.unwrap(),
        "our first delete landed"
    );
    store.verify();

    // Only refused connections before: nothing was applied, so `false` is the store's answer.
    let store = ScriptedStore::new();
    store
        .expect_release(Err(refused()))
        .expect_release(Ok(false));
    let (failover, lease, _) = layer(&store, Duration::from_secs(10), TTL);
    assert!(!failover.release(&lease).await.unwrap());
    store.verify();
}

#[tokio::test(start_paused = true)]
async fn an_extend_retries_until_the_lease_expires() {
    let store = ScriptedStore::new();
    store
        .expect_extend(Err(refused()))
        .expect_extend(Err(reply_lost()))
        .grant_extend();
    let (_, lease, _) = layer(&store, Duration::from_secs(10), TTL);
    let renewed = extend(&store, &retry(Duration::from_secs(10)), &lease, TTL)
        .await
        .unwrap();
    assert!(renewed.expires_at() > lease.expires_at());
    store.verify();

    let store = ScriptedStore::new();
    for _ in 0..200 {
        store.expect_extend(Err(refused()));
    }
    let ttl = Duration::from_secs(1);
    let (_, lease, _) = layer(&store, Duration::from_secs(10), ttl);
    let error = extend(&store, &retry(Duration::from_secs(10)), &lease, ttl)
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::Connection);
    assert!(
        Instant::now() <= lease.expires_at(),
        "never past the lease's expiry"
    );
    assert!(store.count(Op::Extend) > 1);
}

#[test]
fn an_in_doubt_write_or_a_readback_that_gave_up_on_one_may_have_applied() {
    assert!(may_have_applied(&reply_lost()));
    let exhausted =
        Error::new(ErrorKind::RetriesExhausted, "readback gave up").with_source(reply_lost());
    assert!(may_have_applied(&exhausted));
    // A store's own retries of requests that were never applied.
    let never_applied =
        Error::new(ErrorKind::RetriesExhausted, "5 attempts").with_source(refused());
    assert!(!may_have_applied(&never_applied));
    assert!(!may_have_applied(&refused()));
}

#[tokio::test(start_paused = true)]
async fn a_release_that_retrying_cannot_cure_says_the_lock_is_left_to_expire_at_once() {
    let store = ScriptedStore::new();
    let denied = Error::new(
        ErrorKind::StoreSetup,
        "NOPERM this user has no permissions to run the 'evalsha' command",
    );
    store.expect_release(Err(denied));
    let (failover, lease, events) = layer(&store, Duration::from_secs(10), TTL);
    let error = failover.release(&lease).await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::StoreSetup, "returned as it is");
    assert_eq!(store.count(Op::Release), 1, "not retried");
    match events.lock().unwrap().as_slice() {
        [LockEvent::LeftToExpire {
            key,
            error,
            expires_in,
            attempts: 1,
        }] => {
            assert_eq!(key, lease.key());
            assert_eq!(*error, ErrorKind::StoreSetup);
            assert_eq!(*expires_in, TTL, "no time passed");
        }
        other => panic!("one LeftToExpire event, got {other:?}"),
    }
    store.verify();
}
