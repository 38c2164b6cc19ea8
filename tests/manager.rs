//! The public `LockManager` API over the embedded store: fail-fast and blocking acquisition,
//! deadlines, hand-off wake-ups, cancellation, guards, `with_lock`, TTL expiry, validation.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::core::{Acquire, Attempt};
use leasehold::layers::LocalCompetitionLayer;
use leasehold::{
    Capabilities, Error, ErrorKind, Lease, LockEvent, LockInfo, LockKey, LockManager, LockOptions,
    LockStore, MemoryStore, Result,
};
use tokio::time::Instant;

/// The default manager, except that an acquisition without an explicit holder is a new holder
/// even in the same task: these tests contend for keys from one task (reentrancy by task, the
/// default, is tested in `reentrant_by_default_in_the_same_task`).
fn manager() -> LockManager {
    LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .task_holders(false)
        .build()
        .unwrap()
}

#[tokio::test]
async fn try_lock_fails_fast_while_held_and_succeeds_after_release() {
    let locks = manager();
    let guard = locks.try_lock("k").await.unwrap();
    assert_eq!(guard.key().as_str(), "DC#f1#test#k");
    let err = locks.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockUnavailable);
    assert_eq!(err.key(), Some("DC#f1#test#k"));
    assert!(guard.release().await.unwrap(), "still ours");
    let again = locks.try_lock("k").await.unwrap();
    assert!(again.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn blocking_lock_is_woken_by_local_release_not_by_polling() {
    // Backoff alone would sleep 10 s: acquiring at 100 ms proves the release woke the waiter.
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .task_holders(false)
        .min_backoff(Duration::from_secs(10))
        .retry_interval(Duration::from_secs(10))
        .build()
        .unwrap();
    let holder = locks.try_lock("k").await.unwrap();
    let start = Instant::now();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let guard = locks.lock("k").await.unwrap();
            let at = start.elapsed();
            guard.release().await.unwrap();
            at
        }
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    holder.release().await.unwrap();
    let acquired_after = waiter.await.unwrap();
    assert_eq!(acquired_after, Duration::from_millis(100));
}

#[tokio::test(start_paused = true)]
async fn blocking_lock_gives_up_at_the_deadline_not_after() {
    let locks = manager();
    let _holder = locks.try_lock("k").await.unwrap();
    let start = Instant::now();
    let err = locks
        .lock_with("k", LockOptions::new().wait(Duration::from_millis(750)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    assert!(err.to_string().contains("still held"), "{err}");
    assert_eq!(
        start.elapsed(),
        Duration::from_millis(750),
        "never sleeps past the deadline"
    );
}

#[tokio::test(start_paused = true)]
async fn blocking_lock_picks_up_a_remote_release_by_backoff() {
    // A holder in "another process": released directly in the store, so no local wake-up.
    let store = MemoryStore::new();
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(store.clone())
        .build()
        .unwrap();
    let key = locks.key("k").unwrap();
    let remote = store
        .try_acquire(&Acquire::new(
            key.clone(),
            leasehold::OwnerToken::generate(),
            Duration::from_secs(60),
        ))
        .await
        .unwrap();
    let start = Instant::now();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock("k").await.map(|g| (start.elapsed(), g)) }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    store.release(&remote).await.unwrap();
    let (after, guard) = waiter.await.unwrap().unwrap();
    assert!(after >= Duration::from_millis(300));
    assert!(
        after <= Duration::from_millis(300) + Duration::from_secs(1),
        "backoff is capped at the retry interval: {after:?}"
    );
    guard.release().await.unwrap();
}

/// A store whose every operation fails with an error of one kind (a connection error: the store
/// is down), counting acquire attempts.
#[derive(Debug)]
struct Unreachable {
    kind: ErrorKind,
    attempts: AtomicU32,
}

impl Default for Unreachable {
    fn default() -> Self {
        Unreachable::failing_with(ErrorKind::Connection)
    }
}

impl Unreachable {
    fn failing_with(kind: ErrorKind) -> Self {
        Unreachable {
            kind,
            attempts: AtomicU32::new(0),
        }
    }

    fn error(&self) -> Error {
        Error::new(self.kind, "cannot reach 127.0.0.1:1")
    }
}

impl LockStore for Unreachable {
    fn name(&self) -> &'static str {
        "unreachable"
    }
    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
    }
    async fn acquire(&self, _: &Acquire) -> Result<Attempt> {
        self.attempts.fetch_add(1, Ordering::SeqCst);
        Err(self.error())
    }
    async fn release(&self, _: &Lease) -> Result<bool> {
        Err(self.error())
    }
    async fn extend(&self, _: &Lease, _: Duration) -> Result<Lease> {
        Err(self.error())
    }
    async fn inspect(&self, _: &LockKey) -> Result<Option<LockInfo>> {
        Err(self.error())
    }
}

/// A down store is retried within the wait (a failover is ridden out, see
/// `crates/leasehold-redis/tests/failover_manager.rs` for real outages); when the wait runs out
/// the error is the last store error, not a timeout. Errors a retry cannot help end the wait at
/// once.
#[tokio::test(start_paused = true)]
async fn a_down_store_is_retried_within_the_wait_and_other_errors_end_it_at_once() {
    let store = Arc::new(Unreachable::default());
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(store.clone())
        .build()
        .unwrap();
    let wait = Duration::from_secs(3);
    let started = Instant::now();
    let err = locks
        .lock_with("k", LockOptions::new().wait(wait))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(started.elapsed() >= wait, "the whole wait was used");
    assert!(
        err.to_string().contains("still down after waiting"),
        "{err}"
    );
    let source = std::error::Error::source(&err).expect("the last store error");
    assert!(
        source.to_string().contains("cannot reach 127.0.0.1:1"),
        "{source}"
    );
    assert!(store.attempts.load(Ordering::SeqCst) > 2);

    // A try-lock answers at once.
    let before = store.attempts.load(Ordering::SeqCst);
    let err = locks.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection);
    assert_eq!(store.attempts.load(Ordering::SeqCst), before + 1);

    for kind in [ErrorKind::StoreSetup, ErrorKind::Internal] {
        let store = Arc::new(Unreachable::failing_with(kind));
        let locks = LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .store(store.clone())
            .build()
            .unwrap();
        let err = locks.lock("k").await.unwrap_err();
        assert_eq!(err.kind(), kind);
        assert_eq!(store.attempts.load(Ordering::SeqCst), 1);
    }
}

#[tokio::test(start_paused = true)]
async fn cancelled_wait_leaves_no_lock_and_no_stuck_waiter() {
    let locks = manager();
    let holder = locks.try_lock("k").await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock("k").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    waiter.abort();
    assert!(waiter.await.unwrap_err().is_cancelled());
    holder.release().await.unwrap();
    assert_eq!(locks.inspect("k").await.unwrap(), None, "no lock left held");
    // Dropping a lock() future mid-wait, then waiting again, works normally.
    let fut = locks.lock("k");
    drop(fut);
    let guard = locks.try_lock("k").await.unwrap();
    guard.release().await.unwrap();
}

#[tokio::test]
async fn dropped_guard_is_released_in_the_background() {
    let locks = manager();
    drop(locks.try_lock("k").await.unwrap());
    // The release runs on a spawned task: wait for the lock to become free (bounded).
    let g = locks
        .lock_with("k", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    g.release().await.unwrap();
}

#[test]
fn guard_dropped_outside_a_runtime_neither_blocks_nor_panics() {
    let locks = manager();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let guard = runtime.block_on(locks.try_lock("k")).unwrap();
    drop(runtime);
    drop(guard); // logs a warning; the record expires at its TTL
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let still_held = runtime.block_on(locks.inspect("k")).unwrap();
    assert!(
        still_held.is_some(),
        "nothing could be sent without a runtime"
    );
}

#[tokio::test]
async fn with_lock_releases_after_success_error_and_panic() {
    let locks = manager();
    let fencing = locks
        .with_lock("k", |lease| async move { lease.fencing_token() })
        .await
        .unwrap();
    assert_eq!(fencing, Some(1));
    assert_eq!(locks.inspect("k").await.unwrap(), None);

    let failed: Result<std::result::Result<(), &str>> =
        locks.with_lock("k", |_| async { Err("boom") }).await;
    assert_eq!(failed.unwrap(), Err("boom"));
    assert_eq!(locks.inspect("k").await.unwrap(), None);

    let panicked = tokio::spawn({
        let locks = locks.clone();
        async move {
            locks
                .with_lock("k", |_| async { panic!("work panicked") })
                .await
        }
    })
    .await;
    assert!(panicked.unwrap_err().is_panic());
    assert_eq!(
        locks.inspect("k").await.unwrap(),
        None,
        "released despite the panic"
    );
}

/// 32 tasks × 25 read-modify-writes of a counter, with an await between the read and the write:
/// without mutual exclusion updates are lost; with it the total is exact.
async fn increment_under_the_lock(locks: LockManager) {
    let counter = Arc::new(AtomicU64::new(0));
    let tasks: Vec<_> = (0..32)
        .map(|_| {
            let locks = locks.clone();
            let counter = counter.clone();
            tokio::spawn(async move {
                for _ in 0..25 {
                    let guard = locks.lock("counter").await.unwrap();
                    let seen = counter.load(Ordering::SeqCst);
                    tokio::task::yield_now().await;
                    counter.store(seen + 1, Ordering::SeqCst);
                    assert!(guard.release().await.unwrap());
                }
            })
        })
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 32 * 25);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn many_tasks_incrementing_a_non_atomic_counter_end_exact() {
    increment_under_the_lock(manager()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_default_stack_keeps_the_counter_exact_with_and_without_hand_off() {
    let builder = || {
        LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .default_layers()
    };
    increment_under_the_lock(builder().build().unwrap()).await;
    increment_under_the_lock(
        builder()
            .local_competition(LocalCompetitionLayer::new().hand_off(true))
            .build()
            .unwrap(),
    )
    .await;
}

#[tokio::test(start_paused = true)]
async fn ttl_expiry_frees_the_lock_and_the_late_release_says_false() {
    let locks = manager();
    let short = LockOptions::new().ttl(Duration::from_secs(2));
    let first = locks.try_lock_with("k", short.clone()).await.unwrap();
    tokio::time::advance(Duration::from_millis(1999)).await;
    assert!(locks.try_lock("k").await.is_err());
    tokio::time::advance(Duration::from_millis(1)).await;
    let second = locks.try_lock("k").await.unwrap();
    assert!(second.fencing_token() > first.fencing_token());
    assert!(
        !first.release().await.unwrap(),
        "expired lease is no longer ours"
    );
    assert!(
        locks.inspect("k").await.unwrap().is_some(),
        "the late release did not free the new holder's lock"
    );
    assert!(second.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn extend_keeps_the_lock_past_its_first_ttl() {
    let locks = manager();
    let mut guard = locks
        .try_lock_with("k", LockOptions::new().ttl(Duration::from_secs(1)))
        .await
        .unwrap();
    tokio::time::advance(Duration::from_millis(800)).await;
    guard.extend(Duration::from_secs(1)).await.unwrap();
    tokio::time::advance(Duration::from_millis(800)).await;
    assert!(locks.try_lock("k").await.is_err(), "still held after 1.6 s");
    tokio::time::advance(Duration::from_millis(300)).await;
    let err = guard.extend(Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld);
}

#[tokio::test]
async fn bad_input_is_rejected_before_any_store_io() {
    let store = Arc::new(Unreachable::default());
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(store.clone())
        .build()
        .unwrap();
    let long = "x".repeat(300);
    for entity in ["", "a#b", "with space", long.as_str()] {
        let err = locks.try_lock(entity).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{entity:?}: {err}");
    }
    for ttl in [Duration::ZERO, Duration::from_secs(100 * 24 * 3600)] {
        let err = locks
            .try_lock_with("k", LockOptions::new().ttl(ttl))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{ttl:?}: {err}");
    }
    assert_eq!(store.attempts.load(Ordering::SeqCst), 0, "no store I/O");

    let err = LockManager::builder().farm_id("f1").build().unwrap_err();
    assert!(err.to_string().contains("client id"), "{err}");
    let err = LockManager::builder()
        .client_id("test")
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("farm id"), "{err}");
    let err = LockManager::builder()
        .client_id("te#st")
        .farm_id("f1")
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(LockManager::builder()
        .client_id("test")
        .default_level(leasehold::LockLevel::Xdc)
        .build()
        .is_ok());
    // Settings a deadline is made from: an absurd one is an error at build, never a panic at
    // the first release or wait.
    let builder = || LockManager::builder().client_id("test").farm_id("f1");
    for (built, says) in [
        (
            builder().release_retry(Duration::MAX).build(),
            "release_retry",
        ),
        (
            builder().retry_interval(Duration::MAX).build(),
            "retry_interval",
        ),
        (builder().min_backoff(Duration::ZERO).build(), "min_backoff"),
    ] {
        let err = built.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(err.to_string().contains(says), "{err}");
    }
}

#[tokio::test]
async fn xdc_and_dc_keys_are_different_locks() {
    let locks = manager();
    let dc = locks.try_lock("k").await.unwrap();
    let xdc_key = locks.key_at("k", leasehold::LockLevel::Xdc).unwrap();
    assert_eq!(xdc_key.as_str(), "XDC#test#k");
    let xdc = locks.try_lock(&xdc_key).await.unwrap();
    dc.release().await.unwrap();
    xdc.release().await.unwrap();
}

#[tokio::test]
async fn shutdown_refuses_new_acquisitions() {
    // Without graceful shutdown, which would release the held lock at shutdown.
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .graceful_shutdown(false)
        .build()
        .unwrap();
    let guard = locks.try_lock("k").await.unwrap();
    locks.shutdown().await.unwrap();
    assert!(locks.is_shut_down());
    assert_eq!(
        locks.try_lock("other").await.unwrap_err().kind(),
        ErrorKind::ShutDown
    );
    assert_eq!(
        locks.lock("other").await.unwrap_err().kind(),
        ErrorKind::ShutDown
    );
    assert!(guard.release().await.unwrap(), "held guards still release");
}

#[tokio::test]
async fn observers_see_acquired_contended_released() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    // The bare manager's own events (the layers add theirs: see the layers' tests).
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .without_layers()
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.name()))
        .build()
        .unwrap();
    let guard = locks.try_lock("k").await.unwrap();
    let _ = locks.try_lock("k").await.unwrap_err();
    guard.release().await.unwrap();
    assert_eq!(
        *events.lock().unwrap(),
        [
            "acquired",
            "contended",
            "acquire_failed",
            "released",
            "guard_ended"
        ]
    );
}

#[tokio::test]
async fn reentrant_acquisitions_keep_the_store_acquisitions_fencing_token() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .task_holders(false)
        .default_layers()
        .build()
        .unwrap();
    let me = leasehold::Holder::new();
    let outer = locks
        .try_lock_with("k", LockOptions::new().holder(me))
        .await
        .unwrap();
    let inner = locks
        .try_lock_with("k", LockOptions::new().holder(me))
        .await
        .unwrap();
    assert_eq!(inner.fencing_token(), outer.fencing_token());
    assert_eq!(inner.token(), outer.token());
    assert!(locks.try_lock("k").await.unwrap_err().is_unavailable());
    inner.release().await.unwrap();
    assert!(
        locks.inspect("k").await.unwrap().is_some(),
        "outer still holds"
    );
    outer.release().await.unwrap();
    assert_eq!(locks.inspect("k").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn shutdown_ends_waiting_lock_calls_at_once() {
    let locks = manager();
    let _holder = locks.try_lock("k").await.unwrap();
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock("k").await }
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let started = Instant::now();
    locks.shutdown().await.unwrap();
    assert!(
        started.elapsed() < Duration::from_millis(10),
        "shutdown did not wait for the 90 s wait: {:?}",
        started.elapsed()
    );
    let err = waiter.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
}

#[tokio::test]
async fn unlimited_shutdown_budgets_do_not_panic() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .default_layers()
        .graceful_shutdown(leasehold::layers::GracefulShutdownLayer::new().deadline(Duration::MAX))
        .shutdown_timeout(Duration::MAX)
        .build()
        .unwrap();
    let guard = locks.try_lock("k").await.unwrap();
    assert_eq!(locks.shutdown().await.unwrap(), 1, "the live lock released");
    assert!(
        !guard.release().await.unwrap(),
        "already released at shutdown"
    );
}

/// A manager over `scripted` with readback on (one retry, the default).
fn with_readback(scripted: &leasehold_testkit::scripted::ScriptedStore) -> LockManager {
    LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(scripted.clone())
        .readback(leasehold::layers::ReadbackLayer::new())
        .build()
        .unwrap()
}

#[tokio::test]
async fn an_acquisition_abandoned_during_its_readback_is_undone() {
    use leasehold_testkit::scripted::{reply_lost, Op, ScriptedStore};
    let scripted = ScriptedStore::new();
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect_after(std::future::pending(), Ok(None))
        .expect_release(Ok(true));
    let locks = with_readback(&scripted);
    let abandoned = tokio::time::timeout(Duration::from_millis(50), locks.try_lock("k")).await;
    assert!(
        abandoned.is_err(),
        "still reading back when the caller gave up"
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    let calls = scripted.calls();
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Inspect, Op::Release]);
    assert_eq!(
        calls[2].token, calls[0].token,
        "the attempt's own token released: the write may have landed"
    );
    scripted.verify();
}

#[tokio::test]
async fn an_acquisition_left_in_doubt_is_undone_in_the_background() {
    use leasehold_testkit::scripted::{reply_lost, Op, ScriptedStore};
    let scripted = ScriptedStore::new();
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Err(leasehold::Error::connection(
            "scripted: readback failed",
        )))
        .expect_release(Ok(true));
    let locks = with_readback(&scripted);
    let err = locks.try_lock("k").await.unwrap_err();
    assert!(err.is_in_doubt(), "{err}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let calls = scripted.calls();
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Inspect, Op::Release]);
    assert_eq!(calls[2].token, calls[0].token);
    scripted.verify();
}

#[tokio::test]
async fn a_plain_failure_or_conflict_sends_no_undo() {
    use leasehold_testkit::scripted::{Op, ScriptedStore};
    let scripted = ScriptedStore::new();
    scripted
        .refuse_acquire()
        .expect_acquire(Err(leasehold::Error::connection("scripted: refused")));
    let locks = with_readback(&scripted);
    assert!(locks.try_lock("k").await.unwrap_err().is_unavailable());
    locks.try_lock("k").await.unwrap_err();
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(scripted.ops(), [Op::Acquire, Op::Acquire]);
    scripted.verify();
}

/// A store whose release takes 10 s, to cancel a release midway; counts finished releases.
#[derive(Debug, Default)]
struct SlowRelease {
    inner: MemoryStore,
    finished: AtomicU32,
}

impl leasehold::core::LayeredStore for SlowRelease {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn release(&self, lease: &Lease) -> Result<bool> {
        tokio::time::sleep(Duration::from_secs(10)).await;
        let released = self.inner.release(lease).await;
        self.finished.fetch_add(1, Ordering::SeqCst);
        released
    }
}

#[tokio::test(start_paused = true)]
async fn a_cancelled_release_is_still_sent_in_the_background() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(SlowRelease::default())
        .build()
        .unwrap();
    let guard = locks.try_lock("k").await.unwrap();
    let cancelled = tokio::time::timeout(Duration::from_secs(1), guard.release()).await;
    assert!(cancelled.is_err(), "the release was cut short");
    tokio::time::sleep(Duration::from_secs(15)).await;
    assert_eq!(
        locks.inspect("k").await.unwrap(),
        None,
        "the dropped guard released in the background instead of leaking until the TTL"
    );
}

/// A manager over a store whose releases take 10 s, without graceful shutdown (its own release
/// at shutdown would overlap the one under test).
fn slow_release_manager(shutdown_timeout: Duration) -> (Arc<SlowRelease>, LockManager) {
    let store = Arc::new(SlowRelease::default());
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .graceful_shutdown(false)
        .shutdown_timeout(shutdown_timeout)
        .store(store.clone())
        .build()
        .unwrap();
    (store, locks)
}

#[tokio::test(start_paused = true)]
async fn shutdown_waits_for_a_background_release_started_just_before_it() {
    let (store, locks) = slow_release_manager(Duration::from_secs(30));
    let guard = locks.try_lock("k").await.unwrap();
    drop(guard); // released in the background: 10 s
    let started = Instant::now();
    locks.shutdown().await.unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(10),
        "shutdown waited for the background release"
    );
    assert_eq!(store.finished.load(Ordering::SeqCst), 1);
    assert_eq!(
        store.inner.inspect(&locks.key("k").unwrap()).await.unwrap(),
        None
    );
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        store.finished.load(Ordering::SeqCst),
        1,
        "nothing of the manager ran after shutdown returned"
    );
}

#[tokio::test(start_paused = true)]
async fn shutdown_is_bounded_by_its_timeout_when_a_release_hangs() {
    let (_store, locks) = slow_release_manager(Duration::from_secs(2));
    drop(locks.try_lock("k").await.unwrap());
    let started = Instant::now();
    locks.shutdown().await.unwrap();
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(2),
        "gave up at the timeout"
    );
}

#[tokio::test]
async fn reentrant_by_default_in_the_same_task() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .build()
        .unwrap();
    // The body of a #[tokio::test] / #[tokio::main] runs in no task: its thread is the holder.
    let outer = locks.lock("k").await.unwrap();
    let inner = locks.lock("k").await.unwrap();
    assert_eq!(inner.token(), outer.token(), "one store lease, counted up");
    let other = locks.clone();
    let contender = tokio::spawn(async move { other.try_lock("k").await.map(drop) });
    assert!(contender.await.unwrap().unwrap_err().is_unavailable());
    inner.release().await.unwrap();
    assert!(
        locks.inspect("k").await.unwrap().is_some(),
        "outer still holds"
    );
    outer.release().await.unwrap();
    assert_eq!(locks.inspect("k").await.unwrap(), None);

    // Inside a spawned task, the task is the holder.
    let in_task = locks.clone();
    tokio::spawn(async move {
        let a = in_task.try_lock("t").await.unwrap();
        let b = in_task.try_lock("t").await.unwrap();
        assert_eq!(a.token(), b.token());
    })
    .await
    .unwrap();
}

#[tokio::test]
async fn opting_out_of_the_defaults_is_explicit() {
    let bare = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .without_layers()
        .build()
        .unwrap();
    let held = bare.try_lock("k").await.unwrap();
    assert!(
        bare.try_lock("k").await.unwrap_err().is_unavailable(),
        "no reentrancy layer: the same task is a new holder"
    );
    held.release().await.unwrap();

    let per_call = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .task_holders(false)
        .build()
        .unwrap();
    let held = per_call.try_lock("k").await.unwrap();
    assert!(per_call.try_lock("k").await.unwrap_err().is_unavailable());
    held.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_guard_without_explicit_ttl_is_renewed_by_the_watchdog() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .task_holders(false)
        .lock_ttl(Duration::from_secs(3))
        .build()
        .unwrap();
    let watched = locks.try_lock("watched").await.unwrap();
    let plain = locks
        .try_lock_with("plain", LockOptions::new().ttl(Duration::from_secs(3)))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(
        watched.is_held(),
        "renewed every second while the guard lives"
    );
    assert!(locks.inspect("watched").await.unwrap().is_some());
    assert_eq!(
        locks.inspect("plain").await.unwrap(),
        None,
        "an explicit TTL keeps the Java manager's semantics: it expired"
    );
    assert!(!plain.release().await.unwrap());
    assert!(watched.release().await.unwrap());

    let never = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .lock_ttl(Duration::from_secs(3))
        .renewal(false)
        .build()
        .unwrap();
    let guard = never.try_lock("k").await.unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        never.inspect("k").await.unwrap(),
        None,
        "renewal(false): no watchdog"
    );
    drop(guard);
}

#[tokio::test(start_paused = true)]
async fn shutdown_marks_renewed_guards_lost() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .build()
        .unwrap();
    let guard = locks.try_lock("k").await.unwrap();
    assert_eq!(
        locks.shutdown().await.unwrap(),
        1,
        "released by graceful shutdown"
    );
    let lost = tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("the watchdog stops at shutdown and says so");
    assert!(lost.to_string().contains("shut down"), "{lost}");
    assert!(
        !guard.release().await.unwrap(),
        "already released at shutdown"
    );
}

/// Two managers (two "instances") sharing one embedded store, polling slowly unless woken.
fn two_instances(store: &MemoryStore) -> (LockManager, LockManager) {
    let instance = || {
        LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .store(store.clone())
            .min_backoff(Duration::from_secs(10))
            .retry_interval(Duration::from_secs(10))
            .build()
            .unwrap()
    };
    (instance(), instance())
}

#[tokio::test(start_paused = true)]
async fn a_waiter_in_another_manager_is_woken_by_the_release_not_by_polling() {
    let store = MemoryStore::new();
    let (a, b) = two_instances(&store);
    let held = a.try_lock("k").await.unwrap();
    let start = Instant::now();
    let waiter = tokio::spawn(async move {
        let guard = b.lock("k").await.unwrap();
        let at = start.elapsed();
        guard.release().await.unwrap();
        at
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    assert_eq!(
        waiter.await.unwrap(),
        Duration::from_millis(100),
        "woken by the store's notification (polling alone would take 10 s)"
    );
}

/// The embedded store keeps a line per key: a waiter woken by a release takes the key even if the
/// releasing instance asks again before the waiter runs (before the line, it could lose the key
/// that way again and again).
#[tokio::test(start_paused = true)]
async fn a_waiter_in_line_is_not_passed_by_an_instance_asking_again() {
    let store = MemoryStore::new();
    let (a, b) = two_instances(&store);
    let held = a.try_lock("k").await.unwrap();
    let waiter = tokio::spawn(async move {
        let guard = b.lock("k").await.unwrap();
        guard.release().await.unwrap();
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    held.release().await.unwrap();
    // The waiter has not run since the release; the releasing instance asks again at once.
    let again = a.try_lock("k").await;
    assert!(
        again.unwrap_err().is_unavailable(),
        "the key is the waiter's turn, not the newcomer's"
    );
    waiter.await.unwrap();
    let _free = a.try_lock("k").await.expect("free once the waiter is done");
}

#[tokio::test(start_paused = true)]
async fn a_waiter_tries_again_when_the_holders_lease_runs_out() {
    let store = MemoryStore::new();
    let (a, b) = two_instances(&store);
    let abandoned = a
        .try_lock_with("k", LockOptions::new().ttl(Duration::from_millis(300)))
        .await
        .unwrap();
    let start = Instant::now();
    let guard = b.lock("k").await.unwrap();
    let waited = start.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited <= Duration::from_millis(310),
        "the holder's TTL left shaped the wait, not the 10 s backoff: {waited:?}"
    );
    drop(abandoned);
    guard.release().await.unwrap();
}

#[tokio::test]
async fn after_shutdown_a_guard_without_renewal_is_no_longer_held() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .build()
        .unwrap();
    let guard = locks
        .try_lock_with("k", LockOptions::new().ttl(Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(guard.is_held());
    assert_eq!(locks.shutdown().await.unwrap(), 1, "released at shutdown");
    assert!(!guard.is_held(), "its lock was released by the shutdown");
    let lost = tokio::time::timeout(Duration::from_secs(1), guard.lost())
        .await
        .expect("lost() resolves at shutdown, not at the 30 s TTL");
    assert_eq!(lost.kind(), ErrorKind::NotHeld, "{lost}");
}
