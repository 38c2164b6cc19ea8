//! Waiters on the embedded store are served in turn, with the default layers and without local
//! competition: neither a newcomer nor a task that keeps acquiring other keys holds a woken
//! waiter back. Deterministic: one thread, paused time, and counted hand-overs instead of clocks.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::core::Layer;
use leasehold::layers::CountingLayer;
use leasehold::{LockManager, LockOptions, MemoryStore};

/// How long every blocking call here may wait: far longer than any of them needs.
const WAIT: Duration = Duration::from_secs(60);

/// The settings the ring benchmark compares: the default layers, and local competition off.
fn managers() -> [(&'static str, LockManager); 2] {
    let base = || {
        LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .task_holders(false)
    };
    [
        ("default layers", base().build().unwrap()),
        (
            "local competition off",
            base().local_competition(false).build().unwrap(),
        ),
    ]
}

/// Lets every other task of the (single-threaded) runtime run until it waits.
async fn settle() {
    tokio::time::sleep(Duration::from_millis(10)).await;
}

/// A task that releases a key and then keeps acquiring other keys, each free at once, never
/// meets anything that would make it wait: the embedded store answers every call at once. The
/// waiter its release woke must still run soon, not once that task happens to stop. Before the
/// manager's acquisitions took part in tokio's cooperative scheduling, the waiter ran only after
/// all of the other task's acquisitions (the ring benchmark's worst acquire was its whole run).
#[tokio::test(start_paused = true)]
async fn a_woken_waiter_runs_while_the_releaser_keeps_acquiring_other_keys() {
    const OTHERS: usize = 5_000;
    /// tokio lets a task run 128 budget units before it must yield; an acquisition is one.
    const WITHIN: usize = 256;
    for (setting, locks) in managers() {
        let held = locks.try_lock("k").await.unwrap();
        let granted = Arc::new(AtomicBool::new(false));
        let waiter = tokio::spawn({
            let (locks, granted) = (locks.clone(), granted.clone());
            async move {
                let guard = locks
                    .lock_with("k", LockOptions::new().wait(WAIT))
                    .await
                    .unwrap();
                granted.store(true, Ordering::SeqCst);
                guard.release().await.unwrap();
            }
        });
        settle().await;
        assert!(
            !granted.load(Ordering::SeqCst),
            "{setting}: the key is held"
        );
        let releaser = tokio::spawn({
            let (locks, granted) = (locks.clone(), granted.clone());
            async move {
                held.release().await.unwrap();
                for i in 0..OTHERS {
                    if granted.load(Ordering::SeqCst) {
                        return Some(i);
                    }
                    let other = format!("other-{i}");
                    let guard = locks
                        .lock_with(other.as_str(), LockOptions::new().wait(WAIT))
                        .await
                        .unwrap();
                    guard.release().await.unwrap();
                }
                None
            }
        });
        let served_after = releaser.await.unwrap();
        waiter.await.unwrap();
        assert!(
            served_after.is_some_and(|n| n <= WITHIN),
            "{setting}: the woken waiter was served after {served_after:?} of the releaser's \
             {OTHERS} acquisitions of other keys (None: only after all of them)"
        );
    }
}

/// A task that releases a key and asks for it again at once goes behind the task already
/// waiting for it, with a blocking call as with a try.
#[tokio::test(start_paused = true)]
async fn a_waiter_in_line_is_served_before_the_releaser_asking_again() {
    for (setting, locks) in managers() {
        let held = locks.try_lock("k").await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let waiter = tokio::spawn({
            let (locks, order) = (locks.clone(), order.clone());
            async move {
                let guard = locks
                    .lock_with("k", LockOptions::new().wait(WAIT))
                    .await
                    .unwrap();
                order.lock().unwrap().push("waiter");
                settle().await;
                guard.release().await.unwrap();
            }
        });
        settle().await;
        held.release().await.unwrap();
        // The waiter has not run since the release.
        assert!(
            locks.try_lock("k").await.unwrap_err().is_unavailable(),
            "{setting}: a try does not pass the waiter"
        );
        let again = locks
            .lock_with("k", LockOptions::new().wait(WAIT))
            .await
            .unwrap();
        order.lock().unwrap().push("newcomer");
        again.release().await.unwrap();
        waiter.await.unwrap();
        assert_eq!(
            *order.lock().unwrap(),
            ["waiter", "newcomer"],
            "{setting}: served in the order they asked"
        );
    }
}

/// Tasks of one process waiting for a key queue in the manager's line: they are served in the
/// order they asked, and only the head asks the store meanwhile (the process is one contender
/// there, however many of its tasks wait).
#[tokio::test(start_paused = true)]
async fn waiters_of_one_process_are_served_in_order_and_only_the_head_asks_the_store() {
    for local_competition in [true, false] {
        let counting = CountingLayer::new();
        let counts = counting.counts();
        let locks = LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .task_holders(false)
            .store(counting.layer(MemoryStore::new()))
            .local_competition(local_competition)
            .build()
            .unwrap();
        let held = locks.try_lock("k").await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut waiters = Vec::new();
        for i in 0..4 {
            waiters.push(tokio::spawn({
                let (locks, order) = (locks.clone(), order.clone());
                async move {
                    let guard = locks
                        .lock_with("k", LockOptions::new().wait(WAIT))
                        .await
                        .unwrap();
                    order.lock().unwrap().push(i);
                    settle().await;
                    guard.release().await.unwrap();
                }
            }));
            settle().await;
        }
        assert!(
            counts.acquires() <= 3,
            "local competition {local_competition}: the holder's try and at most the head's \
             try and first wait reached the store, not every waiter's: {}",
            counts.acquires()
        );
        held.release().await.unwrap();
        for waiter in waiters {
            waiter.await.unwrap();
        }
        assert_eq!(
            *order.lock().unwrap(),
            [0, 1, 2, 3],
            "local competition {local_competition}: served in the order they asked"
        );
    }
}

/// Tasks taking turns on one hot key, each asking again as soon as it released (by default a
/// task is a holder, so its first plain try is made in case the key is its own already): none
/// takes the key twice in a row while the others wait, with or without local competition.
#[tokio::test(start_paused = true)]
async fn tasks_looping_on_a_hot_key_take_turns() {
    const ROUNDS: usize = 20;
    for local_competition in [true, false] {
        let locks = LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .local_competition(local_competition)
            .build()
            .unwrap();
        let held = locks.try_lock("hot").await.unwrap();
        let order = Arc::new(std::sync::Mutex::new(Vec::new()));
        let tasks: Vec<_> = (0..3)
            .map(|id| {
                let (locks, order) = (locks.clone(), order.clone());
                tokio::spawn(async move {
                    for _ in 0..ROUNDS {
                        let guard = locks
                            .lock_with("hot", LockOptions::new().wait(WAIT))
                            .await
                            .unwrap();
                        order.lock().unwrap().push(id);
                        guard.release().await.unwrap();
                    }
                })
            })
            .collect();
        settle().await; // all three wait
        held.release().await.unwrap();
        for task in tasks {
            task.await.unwrap();
        }
        let order = order.lock().unwrap();
        // Up to the last grants, when one task may be left alone with the key.
        let all_waiting = &order[..ROUNDS * 3 - 2];
        let repeats = all_waiting.windows(2).filter(|w| w[0] == w[1]).count();
        assert_eq!(
            repeats, 0,
            "local competition {local_competition}: a task took the key again while others \
             waited: {all_waiting:?}"
        );
    }
}

/// The ring: 64 tasks walk a ring of keys (task `t` starts at key `t`; each step a blocking
/// acquire, then a release), on the embedded store, with the default layers, with local
/// competition off, and with local competition's cache far smaller than the ring (so most keys
/// have no entry in it), without and with hand-off. For every acquisition it counts the grants
/// of the same key to others while it waited: in a line served in turn that is at most the
/// tasks ahead of it (and the few served between its first try and its joining the line),
/// whatever the number of keys. A waiter that loses to newcomers again and again (no line, or a
/// line that forgets it) shows as hundreds of grants: the others lap the ring and pass it again.
///
/// Every lease is twice as long as a call waits, so a key refused in memory after its release
/// until its lease's end (a slot the cache evicted while a release looked for it) fails the
/// call that waits for it, instead of only slowing the ring down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_waiter_on_a_ring_of_keys_is_passed_more_than_once_by_each_other_task() {
    use leasehold::layers::LocalCompetitionLayer;
    use std::sync::atomic::AtomicU64;

    const TASKS: usize = 64;
    const KEYS: usize = 256;
    /// Six laps of the ring: a waiter left behind meets every other task again and again.
    const STEPS: usize = 6 * KEYS;
    let base = || {
        LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .lock_ttl(2 * WAIT)
    };
    let settings = [
        ("default layers", base().build().unwrap()),
        (
            "local competition off",
            base().local_competition(false).build().unwrap(),
        ),
        (
            "a ring larger than local competition's cache",
            base()
                .local_competition(LocalCompetitionLayer::new().capacity(KEYS as u64 / 16))
                .build()
                .unwrap(),
        ),
        (
            "a ring larger than the cache, with hand-off",
            base()
                .local_competition(
                    LocalCompetitionLayer::new()
                        .capacity(KEYS as u64 / 16)
                        .hand_off(true),
                )
                .build()
                .unwrap(),
        ),
    ];
    for (setting, locks) in settings {
        let grants: Arc<Vec<AtomicU64>> = Arc::new((0..KEYS).map(|_| AtomicU64::new(0)).collect());
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                let (locks, grants) = (locks.clone(), grants.clone());
                tokio::spawn(async move {
                    let mut worst = 0;
                    for step in 0..STEPS {
                        let k = (t + step) % KEYS;
                        let key = format!("ring-{k}");
                        let before = grants[k].load(Ordering::SeqCst);
                        let guard = locks
                            .lock_with(key.as_str(), LockOptions::new().wait(WAIT))
                            .await
                            .unwrap();
                        let passed = grants[k].fetch_add(1, Ordering::SeqCst) - before;
                        worst = worst.max(passed);
                        tokio::task::yield_now().await; // the critical section
                        guard.release().await.unwrap();
                    }
                    worst
                })
            })
            .collect();
        let mut worst = 0;
        for task in tasks {
            worst = worst.max(task.await.unwrap());
        }
        assert!(
            worst < 2 * TASKS as u64,
            "{setting}: an acquisition waited while others were granted its key {worst} times \
             (in a line: at most the {} other tasks ahead of it, and those served between its \
             first try and its joining the line)",
            TASKS - 1
        );
    }
}
