//! `leasehold::blocking` over the embedded store: plain threads, no runtime of the test's own.
//! Contention is between OS threads (each thread is its own holder), for every lock kind.

use std::panic::{self, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use leasehold::{blocking, ErrorKind, LockManager, LockMode, LockOptions, MemoryStore};

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
fn a_manager_dropped_with_its_guard_inside_async_code_still_releases() {
    let store = MemoryStore::new();
    let builder = || {
        LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .lock_ttl(Duration::from_secs(60))
            .store(store.clone())
    };
    let locks = blocking::LockManager::new(builder()).unwrap();
    let guard = locks.try_lock("k").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // The last handles go inside async code, where the manager's runtime cannot be waited for
    // on this thread: the release must still reach the store, not wait for the 60 s TTL.
    runtime.block_on(async move {
        drop(guard);
        drop(locks);
    });
    drop(runtime);
    let other = blocking::LockManager::new(builder()).unwrap();
    let taken = other
        .lock_with("k", LockOptions::new().wait(Duration::from_secs(10)))
        .expect("released by the dropped manager's shutdown, long before the TTL");
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

/// A manager whose leases last 500 ms unless the watchdog renews them.
fn short_lease_manager() -> blocking::LockManager {
    blocking::LockManager::new(
        LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .lock_ttl(Duration::from_millis(500))
            .renewal(true),
    )
    .unwrap()
}

/// Runs `attempt` on another thread (another holder) and returns its outcome.
fn on_another_thread<T: Send>(attempt: impl FnOnce() -> T + Send) -> T {
    thread::scope(|s| s.spawn(attempt).join().unwrap())
}

#[test]
fn readers_hold_together_and_a_writer_holds_alone() {
    let locks = manager();
    let reader = locks.read("catalog").unwrap();
    assert_eq!(reader.mode(), LockMode::Shared);
    assert_eq!(reader.fencing_token(), None, "readers are not fenced");
    // Another thread reads alongside...
    let second = on_another_thread(|| locks.try_read("catalog").unwrap());
    assert_eq!(second.mode(), LockMode::Shared);
    // ...but cannot write while readers hold.
    let refused = on_another_thread(|| locks.try_lock("catalog").map(drop).unwrap_err());
    assert!(refused.is_unavailable(), "{refused}");
    // The same thread writing under its own read would wait for itself: refused.
    let own = locks.try_lock("catalog").map(drop).unwrap_err();
    assert_eq!(own.kind(), ErrorKind::ModeConflict);

    // A waiting writer gets in once both readers are gone, and holds alone.
    thread::scope(|s| {
        let writer = s.spawn(|| {
            let guard = locks
                .lock_with("catalog", LockOptions::new().wait(Duration::from_secs(10)))
                .unwrap();
            let fenced = guard.fencing_token();
            let reader_refused = on_another_thread(|| {
                locks
                    .try_read("catalog")
                    .map(drop)
                    .unwrap_err()
                    .is_unavailable()
            });
            (fenced, reader_refused, guard.release().unwrap())
        });
        thread::sleep(Duration::from_millis(100));
        assert!(reader.release().unwrap());
        assert!(second.release().unwrap());
        let (fenced, reader_refused, released) = writer.join().unwrap();
        assert!(fenced.is_some(), "writers are fenced");
        assert!(reader_refused, "a reader is refused while the writer holds");
        assert!(released);
    });
    // with_read releases after the work.
    let mode = locks.with_read("catalog", |guard| guard.mode()).unwrap();
    assert_eq!(mode, LockMode::Shared);
    assert!(free_elsewhere(&locks, "catalog"));
}

#[test]
fn a_semaphore_never_admits_more_than_its_permits() {
    let locks = manager();
    let inside = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);
    thread::scope(|s| {
        for _ in 0..8 {
            s.spawn(|| {
                for _ in 0..3 {
                    locks
                        .with_permit("encoder", 3, |guard| {
                            assert_eq!(guard.mode(), LockMode::semaphore(3).unwrap());
                            let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                            most.fetch_max(now, Ordering::SeqCst);
                            thread::sleep(Duration::from_millis(20));
                            inside.fetch_sub(1, Ordering::SeqCst);
                        })
                        .unwrap();
                }
            });
        }
    });
    let most = most.load(Ordering::SeqCst);
    assert!(most <= 3, "{most} holders at once");
    assert!(most >= 2, "permits are held at once: at most {most}");

    // Full: a fourth is refused at once; another permit count is a conflict.
    let permits: Vec<_> = (0..3)
        .map(|_| locks.try_semaphore("encoder", 3).unwrap())
        .collect();
    assert!(locks
        .try_semaphore("encoder", 3)
        .map(drop)
        .unwrap_err()
        .is_unavailable());
    let conflict = locks.try_semaphore("encoder", 4).map(drop).unwrap_err();
    assert_eq!(conflict.kind(), ErrorKind::ModeConflict);
    // A dropped permit comes back to a waiter.
    let mut permits = permits.into_iter();
    drop(permits.next());
    let waited = on_another_thread(|| {
        locks
            .lock_with(
                "encoder",
                LockOptions::new()
                    .mode(LockMode::semaphore(3).unwrap())
                    .wait(Duration::from_secs(5)),
            )
            .and_then(|guard| guard.release())
    });
    assert!(waited.unwrap());
    for permit in permits {
        assert!(permit.release().unwrap());
    }
}

#[test]
fn a_multi_lock_holds_every_key_or_none() {
    let locks = manager();
    let both = locks.lock_all(["acct-2", "acct-1"]).unwrap();
    let keys: Vec<_> = both.keys().map(|k| k.entity_id().to_owned()).collect();
    assert_eq!(keys, ["acct-1", "acct-2"], "canonical order");
    assert_eq!(both.len(), 2);
    assert!(!both.is_empty());
    assert!(both.is_held());
    assert!(both.leases().iter().all(|l| l.fencing_token().is_some()));
    assert!(!free_elsewhere(&locks, "acct-1"));
    assert!(!free_elsewhere(&locks, "acct-2"));
    assert!(both.release().unwrap());
    assert!(free_elsewhere(&locks, "acct-1") && free_elsewhere(&locks, "acct-2"));

    // One key held elsewhere: nothing is taken.
    let one = locks.try_lock("acct-2").unwrap();
    let refused = on_another_thread(|| {
        locks
            .try_lock_all(["acct-1", "acct-2"])
            .map(drop)
            .unwrap_err()
    });
    assert!(refused.is_unavailable(), "{refused}");
    assert!(
        free_elsewhere(&locks, "acct-1"),
        "the key taken first was given back"
    );
    let timed_out = on_another_thread(|| {
        locks
            .lock_all_with(
                ["acct-1", "acct-2"],
                LockOptions::new().wait(Duration::from_millis(100)),
            )
            .map(drop)
            .unwrap_err()
    });
    assert_eq!(timed_out.kind(), ErrorKind::Timeout);
    assert!(one.release().unwrap());

    // with_all releases after the work and after a panic; a dropped guard releases too.
    let held = locks
        .with_all(["acct-1", "acct-2"], |all| {
            all.is_held() && !free_elsewhere(&locks, "acct-1")
        })
        .unwrap();
    assert!(held);
    assert!(free_elsewhere(&locks, "acct-1") && free_elsewhere(&locks, "acct-2"));
    let panicked = panic::catch_unwind(AssertUnwindSafe(|| {
        locks.with_all(["acct-1", "acct-2"], |_all| -> () { panic!("boom") })
    }));
    assert!(panicked.is_err());
    assert!(free_elsewhere(&locks, "acct-1") && free_elsewhere(&locks, "acct-2"));
    drop(locks.try_lock_all(["acct-1", "acct-2"]).unwrap());
    let again = on_another_thread(|| {
        locks
            .lock_all_with(
                ["acct-1", "acct-2"],
                LockOptions::new().wait(Duration::from_secs(5)),
            )
            .and_then(|all| all.release())
    });
    assert!(again.unwrap());
}

#[test]
fn every_kind_of_guard_is_renewed_while_its_thread_is_busy() {
    let locks = short_lease_manager();
    let reader = locks.read("catalog").unwrap();
    let permit = locks.semaphore("encoder", 1).unwrap();
    let all = locks.lock_all(["acct-1", "acct-2"]).unwrap();
    assert!(reader.lease().ttl() <= Duration::from_millis(500));
    // The holding thread is busy for 3 TTLs, making no call: the runtime's worker renews.
    thread::sleep(Duration::from_millis(1500));
    assert!(reader.is_held() && permit.is_held() && all.is_held());
    assert!(reader.wait_lost(Duration::from_millis(50)).is_none());
    assert!(permit.wait_lost(Duration::from_millis(50)).is_none());
    assert!(all.wait_lost(Duration::from_millis(50)).is_none());
    on_another_thread(|| {
        let writer = locks.try_lock("catalog").map(drop).unwrap_err();
        assert!(writer.is_unavailable(), "the reader still holds: {writer}");
        let second = locks.try_semaphore("encoder", 1).map(drop).unwrap_err();
        assert!(
            second.is_unavailable(),
            "the permit is still held: {second}"
        );
        for key in ["acct-1", "acct-2"] {
            let taken = locks.try_lock(key).map(drop).unwrap_err();
            assert!(taken.is_unavailable(), "{key} is still held: {taken}");
        }
    });
    assert!(reader.release().unwrap(), "still ours after 3 TTLs");
    assert!(permit.release().unwrap(), "still ours after 3 TTLs");
    assert!(all.release().unwrap(), "still ours after 3 TTLs");
}

#[test]
fn every_lock_kind_is_refused_from_async_code() {
    let locks = manager();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let kinds = [
            locks.read("k").map(drop).unwrap_err(),
            locks.try_read("k").map(drop).unwrap_err(),
            locks.lock("k").map(drop).unwrap_err(),
            locks.semaphore("k", 2).map(drop).unwrap_err(),
            locks.try_semaphore("k", 2).map(drop).unwrap_err(),
            locks.lock_all(["a", "b"]).map(drop).unwrap_err(),
            locks.try_lock_all(["a", "b"]).map(drop).unwrap_err(),
            locks.with_read("k", |_| ()).unwrap_err(),
            locks.with_permit("k", 2, |_| ()).unwrap_err(),
            locks.with_all(["a", "b"], |_| ()).unwrap_err(),
        ];
        for err in kinds {
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        }
    });
}

#[test]
fn every_kind_has_a_with_form_that_keeps_its_kind() {
    let locks = manager();
    let ttl = Duration::from_secs(42);
    let opts = || LockOptions::new().ttl(ttl);
    let guards = [
        (locks.try_read_with("r", opts()).unwrap(), LockMode::Shared),
        (locks.lock_with("w", opts()).unwrap(), LockMode::Exclusive),
        (
            locks.try_lock_with("w2", opts()).unwrap(),
            LockMode::Exclusive,
        ),
        (
            locks.semaphore_with("s", 2, opts()).unwrap(),
            LockMode::semaphore(2).unwrap(),
        ),
        (
            locks.try_semaphore_with("s2", 2, opts()).unwrap(),
            LockMode::semaphore(2).unwrap(),
        ),
    ];
    for (guard, mode) in guards {
        assert_eq!(guard.lease().mode(), mode);
        assert_eq!(guard.lease().ttl(), ttl);
        assert!(guard.release().unwrap());
    }
}
