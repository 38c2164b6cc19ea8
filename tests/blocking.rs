//! `leasehold::blocking` over the embedded store: plain threads, no runtime of the test's own.
//! Contention is between OS threads (each thread is its own holder).

use std::panic::{self, AssertUnwindSafe};
use std::thread;
use std::time::{Duration, Instant};

use leasehold::{blocking, ErrorKind, LockManager, LockOptions, MemoryStore};

fn manager() -> blocking::LockManager {
    blocking::LockManager::new(LockManager::builder().client_id("test").farm_id("f1")).unwrap()
}

/// Whether another thread can take `key` at once (and releases it again).
fn free_elsewhere(locks: &blocking::LockManager, key: &str) -> bool {
    thread::scope(|s| {
        s.spawn(|| match locks.try_lock(key) {
            Ok(guard) => guard.release().unwrap(),
            Err(e) if e.is_unavailable() => false,
            Err(e) => panic!("unexpected error: {e}"),
        })
        .join()
        .unwrap()
    })
}

#[test]
fn try_lock_is_refused_to_another_thread_while_held() {
    let locks = manager();
    let guard = locks.try_lock("k").unwrap();
    assert!(guard.is_held());
    assert_eq!(guard.fencing_token(), Some(1));
    assert!(!free_elsewhere(&locks, "k"));
    // The same thread is the same holder: reentrant.
    let again = locks.try_lock("k").unwrap();
    again.release().unwrap(); // not a drop: that would count down in the background
    assert!(guard.release().unwrap());
    assert!(free_elsewhere(&locks, "k"));
}

#[test]
fn lock_with_waits_for_a_holder_on_another_thread() {
    let locks = manager();
    let first = locks.try_lock("k").unwrap();
    let first_token = first.fencing_token().unwrap();
    thread::scope(|s| {
        let waiter = s.spawn(|| {
            let started = Instant::now();
            let guard = locks
                .lock_with("k", LockOptions::new().wait(Duration::from_secs(10)))
                .unwrap();
            (
                guard.fencing_token().unwrap(),
                started.elapsed(),
                guard.release(),
            )
        });
        thread::sleep(Duration::from_millis(200));
        assert!(first.release().unwrap());
        let (token, waited, released) = waiter.join().unwrap();
        assert!(
            token > first_token,
            "fencing token grows: {token} after {first_token}"
        );
        assert!(waited >= Duration::from_millis(150), "waited {waited:?}");
        assert!(released.unwrap());
    });
    // A wait that runs out is a timeout.
    let held = locks.try_lock("k").unwrap();
    let err = thread::scope(|s| {
        s.spawn(|| {
            locks
                .lock_with("k", LockOptions::new().wait(Duration::from_millis(50)))
                .map(drop)
                .unwrap_err()
        })
        .join()
        .unwrap()
    });
    assert_eq!(err.kind(), ErrorKind::Timeout);
    drop(held);
}

#[test]
fn with_lock_releases_after_the_work_and_after_a_panic() {
    let locks = manager();
    let seen = locks
        .with_lock("k", |guard| {
            assert!(guard.is_held());
            assert!(!free_elsewhere(&locks, "k"));
            guard.fencing_token()
        })
        .unwrap();
    assert_eq!(seen, Some(1));
    assert!(free_elsewhere(&locks, "k"));

    let panicked = panic::catch_unwind(AssertUnwindSafe(|| {
        locks.with_lock("k", |_guard| -> () { panic!("boom") })
    }));
    assert!(panicked.is_err());
    assert!(
        free_elsewhere(&locks, "k"),
        "released before the panic continued"
    );
}

#[test]
fn a_dropped_guard_is_released_in_the_background() {
    let locks = manager();
    let guard = locks.try_lock("k").unwrap();
    drop(guard);
    let taken = thread::scope(|s| {
        s.spawn(|| {
            locks
                .lock_with("k", LockOptions::new().wait(Duration::from_secs(5)))
                .and_then(|g| g.release())
        })
        .join()
        .unwrap()
    });
    assert!(taken.unwrap());
}

#[test]
fn the_watchdog_renews_a_short_lease_between_calls() {
    let locks = blocking::LockManager::new(
        LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .lock_ttl(Duration::from_millis(500))
            .renewal(true),
    )
    .unwrap();
    let mut guard = locks.try_lock("k").unwrap();
    // No call runs for 1.5 s: the runtime's worker renews the 500 ms lease meanwhile.
    thread::sleep(Duration::from_millis(1500));
    assert!(guard.is_held());
    assert!(guard.wait_lost(Duration::from_millis(100)).is_none());
    assert!(!free_elsewhere(&locks, "k"), "still held after 3 TTLs");
    guard.extend(Duration::from_secs(5)).unwrap();
    assert!(guard.lease().remaining() > Duration::from_secs(1));
    assert!(guard.release().unwrap());
}

#[test]
fn calls_from_async_code_are_refused_with_a_clear_error() {
    let locks = manager();
    let guard = locks.try_lock("k").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let err = locks.try_lock("other").map(drop).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        assert!(
            err.to_string().contains("cannot be called from async code"),
            "{err}"
        );
        let err = locks.lock("other").map(drop).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        let err = locks.with_lock("other", |_| ()).unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        let err = blocking::LockManager::new(LockManager::builder().client_id("t").farm_id("f1"))
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
        // Dropping a guard here neither panics nor blocks: it is released on the manager's
        // runtime.
        drop(guard);
    });
    drop(runtime);
    let taken = locks
        .lock_with("k", LockOptions::new().wait(Duration::from_secs(5)))
        .unwrap();
    assert!(taken.release().unwrap());
}

#[test]
fn shutdown_releases_held_locks() {
    let store = MemoryStore::new();
    let builder = || {
        LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .store(store.clone())
    };
    let locks = blocking::LockManager::new(builder()).unwrap();
    let guard = locks.try_lock("k").unwrap();
    assert_eq!(locks.shutdown().unwrap(), 1);
    assert!(locks.is_shut_down());
    let err = locks.try_lock("other").map(drop).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
    // Another manager over the same store finds the key free.
    let other = blocking::LockManager::new(builder()).unwrap();
    assert!(other.try_lock("k").unwrap().release().unwrap());
    drop(guard);
    assert_eq!(locks.shutdown().unwrap(), 0, "calling it again is harmless");
}
