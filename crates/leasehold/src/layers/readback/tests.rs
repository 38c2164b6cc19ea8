use std::time::Duration;

use super::*;
use crate::layers::test_support::{events, key, req};
use leasehold_testkit::scripted::{reply_lost, Op, ScriptedStore};

use crate::core::{LockInfo, OwnerToken};

fn readback(scripted: &ScriptedStore, retries: u32) -> (Readback<ScriptedStore>, events::Seen) {
    let (wiring, seen) = events::wiring();
    let store = ReadbackLayer::new()
        .retries(retries)
        .layer_wired(scripted.clone(), &wiring);
    (store, seen)
}

fn held_by(token: &OwnerToken) -> Result<Option<LockInfo>> {
    Ok(Some(
        LockInfo::new(key("a"), Some(token.clone())).with_fencing_token(Some(9)),
    ))
}

#[tokio::test(start_paused = true)]
async fn plain_success_and_plain_errors_pass_through() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_acquire(Ok(Attempt::refused()))
        .expect_acquire(Err(Error::connection("refused")));
    let (store, seen) = readback(&scripted, 1);
    assert!(store.try_acquire(&req("a", 1000)).await.is_ok());
    assert!(store
        .try_acquire(&req("a", 1000))
        .await
        .unwrap_err()
        .is_unavailable());
    let err = store.try_acquire(&req("a", 1000)).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::Connection,
        "never retried: nothing was applied"
    );
    assert_eq!(scripted.count(Op::Inspect), 0);
    assert!(seen.names().is_empty());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn in_doubt_acquire_that_landed_is_ours() {
    let scripted = ScriptedStore::new();
    let r = req("a", 2000);
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(held_by(&r.token));
    let (store, seen) = readback(&scripted, 1);
    let started = Instant::now();
    tokio::time::advance(Duration::from_millis(5)).await;
    let lease = store.try_acquire(&r).await.unwrap();
    assert_eq!(lease.token(), &r.token);
    assert_eq!(lease.fencing_token(), Some(9));
    assert!(lease.acquired_at() >= started && lease.acquired_at() <= Instant::now());
    assert_eq!(
        scripted.ops(),
        [Op::Acquire, Op::Inspect],
        "no second write"
    );
    assert_eq!(seen.names(), ["recovered_by_readback"]);
    assert!(matches!(
        seen.all()[0],
        LockEvent::RecoveredByReadback {
            held: true,
            operation: "acquire",
            ..
        }
    ));
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn in_doubt_acquire_that_did_not_land_is_retried_once() {
    let scripted = ScriptedStore::new();
    let r = req("a", 2000);
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Ok(None))
        .grant_acquire();
    let (store, seen) = readback(&scripted, 1);
    let lease = store.try_acquire(&r).await.unwrap();
    assert_eq!(lease.token(), &r.token);
    let calls = scripted.calls();
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Inspect, Op::Acquire]);
    assert_eq!(calls[0].token, calls[2].token, "the retry keeps the token");
    assert_eq!(seen.names(), ["recovered_by_readback"]);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn retries_are_bounded() {
    let scripted = ScriptedStore::new();
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Ok(None))
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Ok(None));
    let (store, _) = readback(&scripted, 1);
    let err = store.try_acquire(&req("a", 2000)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RetriesExhausted);
    assert!(std::error::Error::source(&err).is_some());
    assert_eq!(scripted.count(Op::Acquire), 2);
    scripted.verify();

    let scripted = ScriptedStore::new();
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Ok(None));
    let (store, _) = readback(&scripted, 0);
    let err = store.try_acquire(&req("a", 2000)).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::RetriesExhausted,
        "0 retries: read back, never resend"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn in_doubt_acquire_held_by_another_is_unavailable() {
    let scripted = ScriptedStore::new();
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(held_by(&OwnerToken::generate()));
    let (store, seen) = readback(&scripted, 1);
    let err = store.try_acquire(&req("a", 2000)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockUnavailable);
    assert!(matches!(
        seen.all()[0],
        LockEvent::RecoveredByReadback { held: false, .. }
    ));
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn failed_readback_keeps_the_doubt() {
    let scripted = ScriptedStore::new();
    // The lost reply keeps its own cause (the I/O error under it), for the caller to read.
    let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "socket timed out");
    scripted
        .expect_acquire(Err(reply_lost().with_source(io)))
        .expect_inspect(Err(Error::connection("down")));
    let (store, seen) = readback(&scripted, 1);
    let err = store.try_acquire(&req("a", 2000)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt);
    assert!(
        err.message().contains("reading the record back failed"),
        "{err}"
    );
    let chain = err.chain().to_string();
    assert!(chain.contains("down"), "the readback's failure: {chain}");
    assert!(
        chain.contains("socket timed out"),
        "the lost reply's cause: {chain}"
    );
    assert_eq!(scripted.count(Op::Acquire), 1, "no blind retry");
    assert!(seen.names().is_empty());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn late_landing_first_write_is_recognised() {
    let scripted = ScriptedStore::new();
    let r = req("a", 2000);
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Ok(None))
        .expect_acquire(Ok(Attempt::refused()))
        .expect_inspect(held_by(&r.token));
    let (store, _) = readback(&scripted, 1);
    let lease = store.try_acquire(&r).await.unwrap();
    assert_eq!(lease.token(), &r.token);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn in_doubt_release_is_read_back() {
    let scripted = ScriptedStore::new();
    let r = req("a", 2000);
    let lease = scripted.lease_for(&r);
    // Landed: the record is gone while our lease was still live.
    scripted
        .expect_release(Err(reply_lost()))
        .expect_inspect(Ok(None));
    // Did not land: still ours, sent again after the readback.
    scripted
        .expect_release(Err(reply_lost()))
        .expect_inspect(held_by(&r.token))
        .expect_release(Ok(true));
    // Readback failed.
    scripted
        .expect_release(Err(reply_lost()))
        .expect_inspect(Err(Error::connection("down")));
    let (store, seen) = readback(&scripted, 1);
    assert!(store.release(&lease).await.unwrap());
    assert!(store.release(&lease).await.unwrap());
    assert_eq!(
        store.release(&lease).await.unwrap_err().kind(),
        ErrorKind::InDoubt
    );
    assert_eq!(seen.names().len(), 2);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn in_doubt_release_of_an_expired_lease_is_not_held() {
    let scripted = ScriptedStore::new();
    let lease = scripted.lease_for(&req("a", 100));
    tokio::time::advance(Duration::from_millis(200)).await;
    scripted
        .expect_release(Err(reply_lost()))
        .expect_inspect(held_by(&OwnerToken::generate()));
    let (store, _) = readback(&scripted, 1);
    assert!(!store.release(&lease).await.unwrap());
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_retried_release_finding_the_late_first_delete_reports_released() {
    let scripted = ScriptedStore::new();
    let r = req("a", 2000);
    let lease = scripted.lease_for(&r);
    scripted
        .expect_release(Err(reply_lost()))
        .expect_inspect(held_by(&r.token))
        .expect_release(Ok(false));
    let (store, _) = readback(&scripted, 1);
    assert!(
        store.release(&lease).await.unwrap(),
        "our first delete removed it"
    );
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn release_retries_are_bounded() {
    let scripted = ScriptedStore::new();
    let r = req("a", 2000);
    let lease = scripted.lease_for(&r);
    scripted
        .expect_release(Err(reply_lost()))
        .expect_inspect(held_by(&r.token));
    let (store, _) = readback(&scripted, 0);
    let err = store.release(&lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RetriesExhausted);
    scripted.verify();
}
