//! Read-write locks, semaphores and multi-locks through the manager and every default layer, on
//! the embedded store.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{
    ErrorKind, Holder, LockEvent, LockManager, LockMode, LockOptions, LockStore, MemoryStore,
};
use tokio::time::Instant;

fn manager() -> LockManager {
    LockManager::builder()
        .client_id("kinds")
        .farm_id("f1")
        .farm_id("f1")
        .min_backoff(Duration::from_millis(1))
        .retry_interval(Duration::from_millis(20))
        .build()
        .unwrap()
}

/// Runs `f` in `n` tasks at once and returns the most that were inside at the same time.
async fn peak<F, Fut>(n: usize, f: F) -> usize
where
    F: Fn(Arc<AtomicUsize>, Arc<AtomicUsize>) -> Fut,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let tasks: Vec<_> = (0..n)
        .map(|_| tokio::spawn(f(inside.clone(), most.clone())))
        .collect();
    for task in tasks {
        task.await.unwrap();
    }
    most.load(Ordering::SeqCst)
}

async fn critical_section(inside: &AtomicUsize, most: &AtomicUsize) {
    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
    most.fetch_max(now, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(5)).await;
    inside.fetch_sub(1, Ordering::SeqCst);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_never_admits_more_than_its_permits_and_everyone_finishes() {
    let locks = manager();
    let most = peak(12, |inside, most| {
        let locks = locks.clone();
        async move {
            for _ in 0..3 {
                locks
                    .with_permit("encoders", 3, |lease| {
                        let (inside, most) = (inside.clone(), most.clone());
                        async move {
                            assert_eq!(lease.mode(), LockMode::Semaphore { permits: 3 });
                            critical_section(&inside, &most).await
                        }
                    })
                    .await
                    .expect("every task gets a permit in time");
            }
        }
    })
    .await;
    assert_eq!(most, 3, "three at once, never four");
    assert_eq!(locks.inspect("encoders").await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readers_overlap_but_never_a_writer() {
    let locks = manager();
    let readers_in = Arc::new(AtomicUsize::new(0));
    let writer_in = Arc::new(AtomicBool::new(false));
    let overlap_seen = Arc::new(AtomicBool::new(false));
    let mut tasks = Vec::new();
    for i in 0..8 {
        let (locks, readers_in, writer_in, overlap_seen) = (
            locks.clone(),
            readers_in.clone(),
            writer_in.clone(),
            overlap_seen.clone(),
        );
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                if i % 4 == 0 {
                    let guard = locks.lock("doc").await.unwrap();
                    assert_eq!(readers_in.load(Ordering::SeqCst), 0, "writer with readers");
                    assert!(!writer_in.swap(true, Ordering::SeqCst), "two writers");
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    writer_in.store(false, Ordering::SeqCst);
                    guard.release().await.unwrap();
                } else {
                    let guard = locks.read("doc").await.unwrap();
                    assert!(!writer_in.load(Ordering::SeqCst), "reader with a writer");
                    if readers_in.fetch_add(1, Ordering::SeqCst) > 0 {
                        overlap_seen.store(true, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                    readers_in.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.unwrap();
                }
            }
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert!(
        overlap_seen.load(Ordering::SeqCst),
        "readers did share the lock"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_is_not_starved_by_a_steady_stream_of_readers() {
    let locks = manager();
    let stop = Arc::new(AtomicBool::new(false));
    // Readers overlap one another continuously: without writer preference the key would never
    // be free.
    let mut readers = Vec::new();
    for _ in 0..4 {
        let (locks, stop) = (locks.clone(), stop.clone());
        readers.push(tokio::spawn(async move {
            let mut reads = 0u32;
            while !stop.load(Ordering::SeqCst) {
                let guard = locks.read("hot-doc").await.unwrap();
                tokio::time::sleep(Duration::from_millis(10)).await;
                guard.release().await.unwrap();
                reads += 1;
            }
            reads
        }));
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    let started = Instant::now();
    let writer = locks
        .lock_with("hot-doc", LockOptions::new().wait(Duration::from_secs(10)))
        .await
        .expect("the writer gets in");
    let waited = started.elapsed();
    writer.release().await.unwrap();
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        assert!(reader.await.unwrap() > 0);
    }
    // Informational: the bound is the readers' hold time plus one notification, not the test.
    println!("writer waited {waited:?} behind 4 overlapping readers");
}

#[tokio::test]
async fn reentrancy_counts_reads_and_writes_and_refuses_mixing() {
    let locks = manager();
    let outer = locks.read("cfg").await.unwrap();
    let inner = locks.read("cfg").await.expect("read under read re-enters");
    assert_eq!(outer.token(), inner.token(), "the same hold");
    let err = locks.try_lock("cfg").await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::ModeConflict,
        "write under own read: {err}"
    );
    assert!(err.to_string().contains("Release the read"), "{err}");
    // Another holder may read at the same time.
    let other = locks
        .read_with("cfg", LockOptions::new().holder(Holder::new()))
        .await
        .unwrap();
    assert_eq!(
        locks.inspect("cfg").await.unwrap().unwrap().holders.len(),
        2
    );
    inner.release().await.unwrap();
    assert!(locks
        .inspect("cfg")
        .await
        .unwrap()
        .unwrap()
        .is_owned_by(outer.token()));
    outer.release().await.unwrap();
    other.release().await.unwrap();

    let write = locks.lock("cfg").await.unwrap();
    let again = locks
        .lock("cfg")
        .await
        .expect("write under write re-enters");
    let err = locks.try_read("cfg").await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::ModeConflict,
        "read under own write: {err}"
    );
    again.release().await.unwrap();
    write.release().await.unwrap();

    // Permits are never reentrant: the same task takes a second permit.
    let a = locks.try_semaphore("pool", 2).await.unwrap();
    let b = locks.try_semaphore("pool", 2).await.unwrap();
    assert_ne!(a.token(), b.token());
    assert!(locks
        .try_semaphore("pool", 2)
        .await
        .unwrap_err()
        .is_unavailable());
}

#[tokio::test]
async fn local_competition_fails_a_permit_fast_when_this_process_holds_them_all() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let locks = LockManager::builder()
        .client_id("kinds")
        .farm_id("f1")
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.name()))
        .build()
        .unwrap();
    let _a = locks.try_semaphore("gpu", 2).await.unwrap();
    let _b = locks.try_semaphore("gpu", 2).await.unwrap();
    assert!(locks
        .try_semaphore("gpu", 2)
        .await
        .unwrap_err()
        .is_unavailable());
    assert!(events.lock().unwrap().contains(&"fast_failed"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_locks_in_opposite_orders_never_deadlock() {
    let locks = manager();
    let mut tasks = Vec::new();
    for i in 0..6 {
        let locks = locks.clone();
        tasks.push(tokio::spawn(async move {
            let keys = if i % 2 == 0 {
                ["acct-a", "acct-b", "acct-c"]
            } else {
                ["acct-c", "acct-b", "acct-a"]
            };
            for _ in 0..10 {
                let all = locks.lock_all(keys).await.expect("no deadlock");
                assert_eq!(all.len(), 3);
                tokio::time::sleep(Duration::from_millis(1)).await;
                assert!(all.release().await.unwrap());
            }
        }));
    }
    for task in tasks {
        tokio::time::timeout(Duration::from_secs(30), task)
            .await
            .expect("multi-locks finished")
            .unwrap();
    }
    let fences = locks
        .with_all(["acct-b", "acct-a"], |leases| async move {
            leases
                .iter()
                .map(|l| l.key().entity_id().to_owned())
                .collect::<Vec<_>>()
        })
        .await
        .unwrap();
    assert_eq!(fences, ["acct-a", "acct-b"]);
    assert_eq!(
        locks.inspect("acct-a").await.unwrap(),
        None,
        "released after the work"
    );
}

#[tokio::test]
async fn a_failed_multi_lock_leaves_nothing_held() {
    let locks = manager();
    let other = locks
        .try_lock_with("m-2", LockOptions::new().holder(Holder::new()))
        .await
        .unwrap();
    let err = locks.try_lock_all(["m-3", "m-1", "m-2"]).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert_eq!(err.key(), Some(locks.key("m-2").unwrap().as_str()));
    assert!(err.to_string().contains("had taken 1 key"), "{err}");
    assert_eq!(locks.inspect("m-1").await.unwrap(), None, "m-1 given back");
    assert_eq!(locks.inspect("m-3").await.unwrap(), None, "m-3 never taken");
    other.release().await.unwrap();
    let err = locks
        .lock_all_with(["x", "y"], LockOptions::new().mode(LockMode::Shared))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    let empty: [&str; 0] = [];
    assert_eq!(
        locks.try_lock_all(empty).await.unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
}

#[tokio::test]
async fn a_multi_lock_is_exclusive_whatever_a_matching_scenario_takes() {
    use leasehold::scenario::{Scenario, ScenarioRegistry};
    let locks = LockManager::builder()
        .client_id("kinds")
        .farm_id("f1")
        .scenarios(
            ScenarioRegistry::new()
                .with(Scenario::new("reads").keys("acct-*").lock(LockMode::Shared))
                .unwrap(),
        )
        .build()
        .unwrap();
    let first = locks.try_lock_all(["acct-1", "acct-2"]).await.unwrap();
    assert!(first.guards().iter().all(|g| g.fencing_token().is_some()));
    let second = locks
        .lock_all_with(
            ["acct-2", "acct-1"],
            LockOptions::new()
                .holder(Holder::new())
                .wait(Duration::from_millis(50)),
        )
        .await;
    assert!(second.is_err(), "a second holder got in beside the first");
    // The scenario still rules the single-key calls: two readers share.
    first.release().await.unwrap();
    let a = locks.try_lock("acct-1").await.unwrap();
    let b = locks
        .try_lock_with("acct-1", LockOptions::new().holder(Holder::new()))
        .await
        .unwrap();
    assert_eq!(
        locks
            .inspect("acct-1")
            .await
            .unwrap()
            .unwrap()
            .holders
            .len(),
        2
    );
    drop((a, b));
}

#[tokio::test]
async fn bad_permits_are_refused_before_any_store_io() {
    let locks = manager();
    for permits in [0, leasehold::MAX_PERMITS + 1] {
        let err = locks.try_semaphore("p", permits).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{permits}: {err}");
    }
    let err = locks.semaphore("p", 0).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[tokio::test(start_paused = true)]
async fn readers_and_permits_are_renewed_and_report_loss() {
    let store = MemoryStore::new();
    let locks = LockManager::builder()
        .client_id("kinds")
        .farm_id("f1")
        .store(store.clone())
        .build()
        .unwrap();
    let opts = || {
        LockOptions::new()
            .ttl(Duration::from_millis(300))
            .renew(true)
    };
    let reader = locks
        .try_lock_with("r", opts().mode(LockMode::Shared))
        .await
        .unwrap();
    let permit = locks
        .try_lock_with("s", opts().mode(LockMode::semaphore(2).unwrap()))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        reader.is_held() && permit.is_held(),
        "renewed past their TTL"
    );
    assert!(locks
        .inspect("r")
        .await
        .unwrap()
        .unwrap()
        .is_owned_by(reader.token()));
    // An operator breaks the permit holder's record: renewal reports the loss.
    store.release(&permit.lease()).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(2), permit.lost()).await;
    assert_eq!(lost.expect("loss reported").kind(), ErrorKind::NotHeld);
    reader.release().await.unwrap();
}

#[tokio::test]
async fn shutdown_gives_back_every_reader_and_permit() {
    let locks = manager();
    let h = || LockOptions::new().holder(Holder::new());
    let r1 = locks.read_with("shared", h()).await.unwrap();
    let r2 = locks.read_with("shared", h()).await.unwrap();
    let p1 = locks.try_semaphore("sem", 3).await.unwrap();
    let p2 = locks.try_semaphore("sem", 3).await.unwrap();
    let released = locks.shutdown().await.unwrap();
    assert_eq!(released, 4, "every hold given back, not one per key");
    assert_eq!(locks.inspect("shared").await.unwrap(), None);
    assert_eq!(locks.inspect("sem").await.unwrap(), None);
    drop((r1, r2, p1, p2));
}

/// Every lock kind has its `_with` form, and each honours its options and keeps its kind: a mode
/// in the options never turns a read into a write or a permit into an exclusive hold.
#[tokio::test]
async fn every_kind_has_a_with_form_that_keeps_its_kind_and_honours_the_options() {
    let locks = manager();
    let ttl = Duration::from_secs(42);
    let opts = || LockOptions::new().ttl(ttl).mode(LockMode::Exclusive);
    let guards = [
        (
            locks.try_read_with("r", opts()).await.unwrap(),
            LockMode::Shared,
        ),
        (
            locks.read_with("r2", opts()).await.unwrap(),
            LockMode::Shared,
        ),
        (
            locks
                .try_lock_with("w", LockOptions::new().ttl(ttl))
                .await
                .unwrap(),
            LockMode::Exclusive,
        ),
        (
            locks
                .lock_with("w2", LockOptions::new().ttl(ttl))
                .await
                .unwrap(),
            LockMode::Exclusive,
        ),
        (
            locks.try_semaphore_with("s", 3, opts()).await.unwrap(),
            LockMode::semaphore(3).unwrap(),
        ),
        (
            locks.semaphore_with("s2", 3, opts()).await.unwrap(),
            LockMode::semaphore(3).unwrap(),
        ),
    ];
    for (guard, mode) in guards {
        assert_eq!(guard.mode(), mode, "{:?}", guard.lease().key());
        assert_eq!(guard.lease().ttl(), ttl, "{:?}", guard.lease().key());
        assert!(guard.release().await.unwrap());
    }
    // A permit count of zero is refused before any store I/O, in the `_with` forms too.
    let err = locks
        .try_semaphore_with("s", 0, LockOptions::new())
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
}

#[tokio::test]
async fn with_hand_off_a_writers_release_reaches_a_waiting_reader() {
    use leasehold::layers::LocalCompetitionLayer;
    let locks = LockManager::builder()
        .client_id("kinds")
        .farm_id("f1")
        .local_competition(LocalCompetitionLayer::new().hand_off(true))
        .build()
        .unwrap();
    let writer = locks.try_lock("catalog").await.unwrap();
    let reader = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .holder(Holder::new())
                .wait(Duration::from_secs(5));
            locks.read_with("catalog", opts).await
        })
    };
    // The reader waits behind the writer.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !reader.is_finished(),
        "the reader waits while the writer holds"
    );
    // The writer's lease, offered to this process's waiters, is no use to a reader: it goes
    // back to the store, and the reader gets the key at once, not after its wait.
    let released = Instant::now();
    assert!(writer.release().await.unwrap());
    let read = tokio::time::timeout(Duration::from_secs(2), reader)
        .await
        .expect("the reader got the key long before its 5 s wait ran out")
        .unwrap()
        .expect("a read hold");
    assert!(released.elapsed() < Duration::from_secs(2));
    assert_eq!(read.mode(), LockMode::Shared);
    read.release().await.unwrap();
}

#[tokio::test]
async fn a_handed_off_lease_has_the_ttl_its_taker_asked_for() {
    use leasehold::layers::LocalCompetitionLayer;
    let locks = LockManager::builder()
        .client_id("kinds")
        .farm_id("f1")
        .renewal(false)
        .local_competition(LocalCompetitionLayer::new().hand_off(true))
        .build()
        .unwrap();
    let long = locks
        .try_lock_with("job", LockOptions::new().ttl(Duration::from_secs(90)))
        .await
        .unwrap();
    let taker = {
        let locks = locks.clone();
        tokio::spawn(async move {
            let opts = LockOptions::new()
                .holder(Holder::new())
                .ttl(Duration::from_secs(2))
                .wait(Duration::from_secs(5));
            locks.lock_with("job", opts).await
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(long.release().await.unwrap());
    let taken = tokio::time::timeout(Duration::from_secs(2), taker)
        .await
        .expect("handed off")
        .unwrap()
        .unwrap();
    assert_eq!(taken.lease().ttl(), Duration::from_secs(2));
    let left = locks
        .inspect("job")
        .await
        .unwrap()
        .and_then(|info| info.ttl_remaining)
        .expect("held, with a TTL");
    assert!(
        left <= Duration::from_secs(2),
        "a crash would leave the key held for {left:?}"
    );
    taken.release().await.unwrap();
}

#[tokio::test]
async fn another_permit_count_is_a_mode_conflict_even_when_every_permit_is_held_here() {
    let locks = manager();
    let a = locks.try_semaphore("pool", 2).await.unwrap();
    let b = locks
        .try_semaphore_with("pool", 2, LockOptions::new().holder(Holder::new()))
        .await
        .unwrap();
    // Every permit of semaphore(2) is held here: a caller asking for semaphore(1) is told the
    // count is wrong, not refused from memory (which would make a blocking call wait it out).
    let err = locks
        .semaphore_with(
            "pool",
            1,
            LockOptions::new()
                .holder(Holder::new())
                .wait(Duration::from_secs(2)),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ModeConflict, "{err}");
    drop((a, b));
}

/// A multi-lock whose early key's lease runs out while it waits for a later key never returns
/// a guard over a key it no longer holds: it gives every key back and says which was lost.
#[tokio::test(start_paused = true)]
async fn a_multi_lock_that_lost_an_early_key_while_waiting_gives_all_back() {
    let locks = manager();
    // Another holder has "b" for 2 s; the multi-lock's leases last 1 s, unrenewed.
    let other = leasehold::LockOptions::new()
        .ttl(Duration::from_secs(2))
        .holder(leasehold::Holder::new());
    let b = locks.try_lock_with("b", other).await.unwrap();
    let opts = leasehold::LockOptions::new()
        .ttl(Duration::from_secs(1))
        .wait(Duration::from_secs(5));
    let err = locks.lock_all_with(["a", "b"], opts).await.unwrap_err();
    assert_eq!(err.kind(), leasehold::ErrorKind::NotHeld, "{err}");
    assert!(err.key().is_some_and(|k| k.ends_with("#a")), "{err}");
    assert!(
        err.to_string().contains("every key was given back"),
        "{err}"
    );
    assert!(locks.inspect("a").await.unwrap().is_none());
    assert!(locks.inspect("b").await.unwrap().is_none());
    drop(b);
    // A hold period cannot be given back with the keys: refused before any I/O.
    let opts = leasehold::LockOptions::new().hold_at_least(Duration::from_secs(60));
    let err = locks.lock_all_with(["a", "b"], opts).await.unwrap_err();
    assert_eq!(err.kind(), leasehold::ErrorKind::InvalidArgument, "{err}");
}
