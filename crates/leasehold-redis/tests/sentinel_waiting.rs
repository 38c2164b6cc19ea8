//! A waiter through Sentinel keeps hearing release announcements when the master dies: its
//! subscriber connection drops with the master, and the store remakes it on the master the
//! sentinels promote as soon as there is one, not at the next wait.

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use leasehold::{LockManager, LockOptions};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis_cluster::RedisSentinel;

/// A manager that retries a down store every 100 ms and, while the store is up, polls a refused
/// wait only every `poll` (the release announcement is what wakes it).
async fn manager(url: &str, poll: Duration) -> LockManager {
    let store = RedisStore::connect(RedisConfig::new(url)).await.unwrap();
    LockManager::builder()
        .client_id("t")
        .farm_id("f1")
        .store(store)
        .min_backoff(Duration::from_millis(100))
        .retry_interval(poll)
        .build()
        .unwrap()
}

/// How long the whole test may take (it passes in about 12 s).
const TEST_LIMIT: Duration = Duration::from_secs(180);

/// Ends the process if the test has not finished `limit` after this, naming what it awaited:
/// a runtime whose workers are all blocked fires no timer, and dropping it waits for them for
/// good, so the last word is a thread of its own. Dropping the guard (the test finished) stops it.
fn watchdog(limit: Duration, stage: Arc<Mutex<&'static str>>) -> std::sync::mpsc::Sender<()> {
    let (finished, done) = std::sync::mpsc::channel::<()>();
    std::thread::spawn(move || {
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = done.recv_timeout(limit) {
            let stage = *stage.lock().unwrap_or_else(PoisonError::into_inner);
            // Not captured: the harness would never print it.
            let _ = writeln!(
                std::io::stderr().lock(),
                "the test did not finish within {limit:?} (its runtime is stuck: no timeout \
                 fired, or its workers never stopped); it was awaiting {stage}"
            );
            std::process::exit(101);
        }
    });
    finished
}

/// Not `#[tokio::test]`: its runtime is dropped inside the test, and dropping a runtime whose
/// workers are stuck waits for them for good. Here the body is bounded by a timeout, the runtime
/// is shut down with a bound, and the watchdog outlives both.
#[test]
fn a_waiter_is_woken_by_the_new_master_after_the_old_one_died() {
    let stage = Arc::new(Mutex::new("the sentinel group to start"));
    let _watchdog = watchdog(TEST_LIMIT + Duration::from_secs(30), stage.clone());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let body = waiter_woken_after_failover(stage.clone());
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        // The timer is made inside the runtime.
        runtime.block_on(async { tokio::time::timeout(TEST_LIMIT, body).await })
    }));
    runtime.shutdown_timeout(Duration::from_secs(10));
    match outcome {
        Ok(Ok(())) => {}
        Ok(Err(_)) => {
            let stage = *stage.lock().unwrap_or_else(PoisonError::into_inner);
            panic!("the test did not finish within {TEST_LIMIT:?}: it was awaiting {stage}");
        }
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

async fn waiter_woken_after_failover(stage: Arc<Mutex<&'static str>>) {
    let at = |what: &'static str| *stage.lock().unwrap_or_else(PoisonError::into_inner) = what;
    let mut group = tokio::task::spawn_blocking(RedisSentinel::start)
        .await
        .unwrap()
        .expect("start Redis Sentinel (redis-server, redis-sentinel)");
    let url = group.url();
    at("the stores to connect through the sentinels");
    let holder = manager(&url, Duration::from_millis(100)).await;
    // Polls once a minute: within the test, only an announcement can hand it the lock.
    let waiter = manager(&url, Duration::from_secs(60)).await;
    at("the holder's try_lock");
    let held = holder.try_lock("after-failover").await.unwrap();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock_with(
                "after-failover",
                LockOptions::new().wait(Duration::from_secs(120)),
            )
            .await
            .expect("its turn comes");
        let got = Instant::now();
        guard.release().await.unwrap();
        got
    });
    // The waiter is in line and subscribed, and both are on the replicas, before the kill.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let old = group.master_port().unwrap();
    at("the sentinels to promote a new master (wait_new_master)");
    group.kill(old).unwrap();
    let (_group, new) = tokio::task::spawn_blocking(move || {
        let new = group.wait_new_master(old);
        (group, new)
    })
    .await
    .unwrap();
    assert_ne!(old, new.expect("the sentinels promoted a replica"));
    // Time for the clients to follow; then the release on the new master must reach the waiter.
    tokio::time::sleep(Duration::from_secs(3)).await;
    at("the holder's release on the new master");
    let released = Instant::now();
    // The release rides out the holder's own move to the new master within its retry budget.
    assert!(
        held.release().await.expect("released on the new master"),
        "the lock was kept through the failover"
    );
    at("the waiter's lock_with (woken by the release announcement)");
    let got = waiting.await.unwrap();
    let after = got.saturating_duration_since(released);
    assert!(
        after < Duration::from_secs(20),
        "woken by the announcement on the new master, not the minute's poll ({after:?})"
    );
}
