//! Waiting across processes on a real redis-server: every process gets a hot key (none starves),
//! a crashed waiter drops out of the queue by its waiter timeout, a release wakes the next
//! process at once, and a lost notification only costs a poll.
//!
//! The test binary is its own worker (`leasehold_testkit::fleet`): spawned with a role, it plays
//! it (a contending process, or a waiter that will be killed) instead of coordinating.

use std::time::{Duration, Instant};

use leasehold::{ErrorKind, LockManager, LockOptions};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::fleet;
use leasehold_testkit::redis::RedisServer;

const PROCESSES: usize = 4;
const TASKS: usize = 2;
const RUN: Duration = Duration::from_secs(3);
const HOLD: Duration = Duration::from_millis(2);

async fn manager(url: &str, config: impl FnOnce(RedisConfig) -> RedisConfig) -> LockManager {
    let store = RedisStore::connect(config(RedisConfig::new(url)))
        .await
        .expect("connect");
    LockManager::builder()
        .client_id("fair")
        .farm_id("f1")
        .store(store)
        .build()
        .expect("manager")
}

/// A contending process: `TASKS` tasks take the hot key for `HOLD` again and again for `RUN`.
async fn contend(url: String) {
    let locks = manager(&url, |c| c).await;
    fleet::contend(TASKS, RUN, move || {
        let locks = locks.clone();
        async move {
            let guard = locks
                .lock_with("hot", LockOptions::new().wait(Duration::from_secs(20)))
                .await
                .expect("no request starves for 20 s");
            tokio::time::sleep(HOLD).await;
            guard.release().await.expect("release");
        }
    })
    .await;
}

/// A waiter that queues itself on `held` and then hangs until killed.
async fn queue_and_hang(url: String) {
    let locks = manager(&url, |c| c).await;
    let _ = locks
        .lock_with("held", LockOptions::new().wait(Duration::from_secs(600)))
        .await;
}

/// A manager (a process) whose waiters poll after `first`, backing off up to `most`.
async fn polling_every(url: &str, first: Duration, most: Duration) -> LockManager {
    let store = RedisStore::connect(RedisConfig::new(url)).await.unwrap();
    LockManager::builder()
        .client_id("fair")
        .farm_id("f1")
        .store(store)
        .min_backoff(first)
        .retry_interval(most)
        .build()
        .unwrap()
}

/// Runs the role this process was spawned for, if any.
fn play_role() -> bool {
    let Some((role, url)) = fleet::role() else {
        return false;
    };
    match role.as_str() {
        "contend" => fleet::runtime().block_on(contend(url)),
        "hang" => fleet::runtime().block_on(queue_and_hang(url)),
        other => panic!("unknown role {other}"),
    }
    true
}

#[test]
fn every_process_gets_a_hot_key_none_starves() {
    if play_role() {
        return;
    }
    let server = RedisServer::start().expect("start redis-server");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            fleet::spawn_role(
                "contend",
                "every_process_gets_a_hot_key_none_starves",
                &server.url(),
            )
        })
        .collect();
    let counts: Vec<u64> = fleet::results(children).iter().map(|r| r.0).collect();
    // Before fair waiting, one process took most of the acquisitions and the least-served got a
    // hundredth of that (first-come: [5, 494, 41, 4, 445, 494, 13, 32] in the fleet benchmark).
    fleet::assert_fair_shares(&counts);
}

#[test]
fn a_crashed_waiter_leaves_the_queue_by_its_waiter_timeout() {
    if play_role() {
        return;
    }
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    fleet::runtime().block_on(async {
        let holder = manager(&url, |c| c).await;
        let held = holder.try_lock("held").await.expect("free");
        let mut waiter = fleet::spawn_role(
            "hang",
            "a_crashed_waiter_leaves_the_queue_by_its_waiter_timeout",
            &url,
        );
        // Wait until the child is in line, then SIGKILL it: it never leaves by itself.
        let queue = "leasehold:queue:DC#f1#fair#held";
        let deadline = Instant::now() + Duration::from_secs(20);
        while server.command(&["LLEN", queue]).unwrap() != ":1" {
            assert!(Instant::now() < deadline, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let pid = nix::unistd::Pid::from_raw(waiter.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
        waiter.wait().unwrap();
        held.release().await.unwrap();

        // The dead waiter is first in line; it is dropped once its 1 s waiter timeout passes.
        let next = manager(&url, |c| c.waiter_timeout(Duration::from_secs(1))).await;
        let refused = next.try_lock("held").await.unwrap_err();
        assert_eq!(
            refused.kind(),
            ErrorKind::LockUnavailable,
            "a try-lock does not pass a queued waiter"
        );
        let guard = next
            .lock_with("held", LockOptions::new().wait(Duration::from_secs(15)))
            .await
            .expect("the crashed waiter's place lapsed (default waiter timeout 5 s)");
        guard.release().await.unwrap();
    });
}

#[test]
fn a_release_wakes_the_next_process_and_a_lost_notification_costs_a_poll() {
    if play_role() {
        return;
    }
    let server = RedisServer::start().expect("start redis-server");
    let url = server.url();
    fleet::runtime().block_on(async {
        let slow = Duration::from_secs(30);
        let (a, b) = (
            polling_every(&url, slow, slow).await,
            polling_every(&url, slow, slow).await,
        );

        // Notified: B would poll again only after 30 s (and A's lease has 90 s left).
        let held = a.try_lock("k").await.unwrap();
        let waiting = tokio::spawn({
            let b = b.clone();
            async move {
                let asked = Instant::now();
                let guard = b
                    .lock_with("k", LockOptions::new().wait(Duration::from_secs(60)))
                    .await
                    .unwrap();
                let waited = asked.elapsed();
                guard.release().await.unwrap();
                waited
            }
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        held.release().await.unwrap();
        let waited = waiting.await.unwrap();
        assert!(
            waited < Duration::from_secs(20),
            "woken by the release announcement, not the 30 s poll: {waited:?}"
        );

        // The subscriber connection is cut: waiting falls back to polling, never to a missed lock.
        let (first, most) = (Duration::from_millis(100), Duration::from_millis(300));
        let (a, b) = (
            polling_every(&url, first, most).await,
            polling_every(&url, first, most).await,
        );
        let held = a.try_lock("cut").await.unwrap();
        let waiting = tokio::spawn(async move {
            b.lock_with("cut", LockOptions::new().wait(Duration::from_secs(30)))
                .await
                .map(drop)
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
        server
            .command(&["CLIENT", "KILL", "TYPE", "pubsub"])
            .expect("cut the subscriber connections");
        tokio::time::sleep(Duration::from_millis(100)).await;
        held.release().await.unwrap();
        waiting
            .await
            .unwrap()
            .expect("the waiter took the lock by polling");
    });
}
