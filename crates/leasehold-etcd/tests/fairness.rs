//! Waiting across processes on a real etcd: every process gets a hot key (none starves), and a
//! crashed waiter leaves the line when its waiter lease lapses.
//!
//! The test binary is its own worker (`leasehold_testkit::fleet`): spawned with a role, it plays
//! it (a contending process, or a waiter that will be killed) instead of coordinating.

use std::time::{Duration, Instant};

use leasehold::{ErrorKind, LockManager, LockOptions};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use leasehold_testkit::fleet;

const PROCESSES: usize = 4;
const TASKS: usize = 2;
const RUN: Duration = Duration::from_secs(3);
const HOLD: Duration = Duration::from_millis(2);

async fn manager(endpoint: &str) -> LockManager {
    let store = EtcdStore::connect(EtcdConfig::new([endpoint]))
        .await
        .expect("connect");
    LockManager::builder()
        .client_id("fair")
        .farm_id("f1")
        .store(store)
        .build()
        .expect("manager")
}

/// A waiter that joins the line of `held` and then hangs until killed.
async fn queue_and_hang(endpoint: String) {
    let locks = manager(&endpoint).await;
    let _ = locks
        .lock_with("held", LockOptions::new().wait(Duration::from_secs(600)))
        .await;
}

/// Runs the role this process was spawned for, if any (see `leasehold_testkit::fleet`).
fn play_role() -> bool {
    let Some((role, endpoint)) = fleet::role() else {
        return false;
    };
    fleet::runtime().block_on(async move {
        match role.as_str() {
            "contend" => {
                let locks = manager(&endpoint).await;
                fleet::contend(TASKS, RUN, move || {
                    let locks = locks.clone();
                    async move {
                        let guard = locks
                            .lock_with("hot", LockOptions::new().wait(Duration::from_secs(30)))
                            .await
                            .expect("no request starves for 30 s");
                        tokio::time::sleep(HOLD).await;
                        guard.release().await.expect("release");
                    }
                })
                .await
            }
            "hang" => queue_and_hang(endpoint).await,
            other => panic!("unknown role {other}"),
        }
    });
    true
}

#[test]
fn every_process_gets_a_hot_key_none_starves() {
    if play_role() {
        return;
    }
    let server = EtcdServer::start().expect("start etcd");
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            fleet::spawn_role(
                "contend",
                "every_process_gets_a_hot_key_none_starves",
                &server.endpoint(),
            )
        })
        .collect();
    // In line (waiter keys in create-revision order), each process gets one turn per round.
    let counts: Vec<u64> = fleet::results(children).iter().map(|r| r.0).collect();
    fleet::assert_fair_shares(&counts);
}

#[test]
fn a_crashed_waiter_leaves_the_line_when_its_waiter_lease_lapses() {
    if play_role() {
        return;
    }
    let server = EtcdServer::start().expect("start etcd");
    let endpoint = server.endpoint();
    fleet::runtime().block_on(async {
        let holder = manager(&endpoint).await;
        let held = holder.try_lock("held").await.expect("free");
        let mut waiter = fleet::spawn_role(
            "hang",
            "a_crashed_waiter_leaves_the_line_when_its_waiter_lease_lapses",
            &endpoint,
        );
        // Wait until the child is in line, then SIGKILL it: it never leaves by itself.
        let mut raw = etcd_client::Client::connect([endpoint.clone()], None)
            .await
            .unwrap();
        let line = "leasehold:DC#f1#fair#held#waiter#";
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let waiting = raw
                .get(line, Some(etcd_client::GetOptions::new().with_prefix()))
                .await
                .unwrap();
            if waiting.count() == 1 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the waiter never joined the line"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        waiter.kill().unwrap(); // SIGKILL, by pid
        waiter.wait().unwrap();
        held.release().await.unwrap();

        // The dead waiter is first in line until its waiter lease (5 s) lapses.
        let next = manager(&endpoint).await;
        let refused = next.try_lock("held").await.unwrap_err();
        assert_eq!(
            refused.kind(),
            ErrorKind::LockUnavailable,
            "a try-lock does not pass a waiter in line"
        );
        let guard = next
            .lock_with("held", LockOptions::new().wait(Duration::from_secs(30)))
            .await
            .expect("the crashed waiter's place lapsed with its lease");
        guard.release().await.unwrap();
    });
}

/// A manager with its own store (its own place in line, as another process would have) whose
/// store requests are counted.
async fn counted(
    endpoint: &str,
) -> (
    LockManager,
    std::sync::Arc<leasehold::layers::RequestCounts>,
) {
    let store = EtcdStore::connect(EtcdConfig::new([endpoint]))
        .await
        .expect("connect");
    let counting = leasehold::layers::CountingLayer::new();
    let counts = counting.counts();
    let locks = LockManager::builder()
        .client_id("fair")
        .farm_id("f1")
        .store(store)
        .layer(counting)
        .build()
        .expect("manager");
    (locks, counts)
}

/// How many processes wait in `key`'s line, read straight from etcd.
async fn line_length(raw: &mut etcd_client::Client, key: &str) -> i64 {
    let line = format!("leasehold:DC#f1#fair#{key}#waiter#");
    raw.get(
        line,
        Some(
            etcd_client::GetOptions::new()
                .with_prefix()
                .with_count_only(),
        ),
    )
    .await
    .unwrap()
    .count()
}

/// A private etcd, its endpoint and a raw client to look at it.
async fn private_etcd() -> (EtcdServer, String, etcd_client::Client) {
    let server = EtcdServer::start().expect("start etcd");
    let endpoint = server.endpoint();
    let raw = etcd_client::Client::connect([endpoint.clone()], None)
        .await
        .unwrap();
    (server, endpoint, raw)
}

/// Waits (bounded) until `n` processes wait in `key`'s line.
async fn until_queued(raw: &mut etcd_client::Client, key: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while line_length(raw, key).await < n {
        assert!(
            Instant::now() < deadline,
            "{n} processes never queued on {key}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_wakes_the_next_in_line_not_everyone_behind_it() {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("line").await.expect("free");

    // Five processes queue one after another, each taking the lock and letting it go at once;
    // the last one, queued behind all of them, is the one watched.
    const AHEAD: i64 = 5;
    let mut ahead = Vec::new();
    for place in 1..=AHEAD {
        let (locks, _) = counted(&endpoint).await;
        ahead.push(tokio::spawn(async move {
            let guard = locks
                .lock_with("line", LockOptions::new().wait(Duration::from_secs(30)))
                .await
                .expect("its turn comes");
            guard.release().await.expect("release");
        }));
        until_queued(&mut raw, "line", place).await;
    }
    let (last, counts) = counted(&endpoint).await;
    let waiting = tokio::spawn(async move {
        let guard = last
            .lock_with("line", LockOptions::new().wait(Duration::from_secs(30)))
            .await
            .expect("its turn comes");
        guard.release().await.expect("release");
    });
    until_queued(&mut raw, "line", AHEAD + 1).await;
    let queued = counts.acquires();

    held.release().await.expect("release");
    for waiter in ahead {
        waiter.await.expect("each waiter ahead got its turn");
    }
    waiting.await.expect("the last waiter got its turn");

    // Five hand-overs ahead of it deleted ten keys under the lock (each holder's record and each
    // taker's place). Woken by all of them it would have asked ten times; woken only when the
    // one just ahead of it left and then by the release it waited for, it asks twice, plus at
    // most a couple of safety-net polls (every 0.5–1 s) on a slow machine.
    let asked = counts.acquires() - queued;
    assert!(
        (2..=4).contains(&asked),
        "the last waiter asked {asked} times during five hand-overs ahead of it"
    );
}

/// Every lease etcd holds now.
async fn leases(raw: &mut etcd_client::Client) -> std::collections::HashSet<i64> {
    raw.leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|lease| lease.id())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_line_takes_its_turn_on_the_lease_it_granted_while_waiting() {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("spare").await.expect("free");
    let (waiter, _) = counted(&endpoint).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock_with("spare", LockOptions::new().wait(Duration::from_secs(30)))
            .await
            .expect("its turn comes");
        let _ = tx.send(());
        tokio::time::sleep(Duration::from_secs(60)).await; // hold until the test ends
        drop(guard);
    });
    until_queued(&mut raw, "spare", 1).await;
    let before_its_turn = leases(&mut raw).await;

    held.release().await.expect("release");
    rx.await.expect("the waiter took the lock");
    let record = raw.get("leasehold:DC#f1#fair#spare", None).await.unwrap();
    let lease = record.kvs().first().expect("the waiter's hold").lease();
    assert!(
        before_its_turn.contains(&lease),
        "the hand-over granted a new lease ({lease}) instead of using the one kept in line"
    );
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_revokes_the_lease_it_kept() {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("given-up").await.expect("free");
    let holding = leases(&mut raw).await;
    let (waiter, _) = counted(&endpoint).await;
    let refused = waiter
        .lock_with(
            "given-up",
            LockOptions::new().wait(Duration::from_millis(300)),
        )
        .await
        .expect_err("held all along");
    assert_eq!(refused.kind(), ErrorKind::Timeout);
    // What is left of the waiter is its waiter lease (kept alive for the next wait); the lease
    // its refused attempt kept for its turn is revoked (in the background: poll for it).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let extra = leases(&mut raw).await.difference(&holding).count();
        if extra <= 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{extra} leases of the waiter outlived its wait"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_name_extends_anothers_does_not_wake_its_waiters() {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("look").await.expect("free");
    let (waiter, counts) = counted(&endpoint).await;
    let waiting = tokio::spawn(async move {
        waiter
            .lock_with("look", LockOptions::new().wait(Duration::from_secs(30)))
            .await
            .expect("its turn comes")
            .release()
            .await
            .expect("release");
    });
    until_queued(&mut raw, "look", 1).await;
    // Its read of the line (after joining) is done once it asked twice; from then on only a
    // deletion under `look` may wake it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counts.acquires() < 2 {
        assert!(
            Instant::now() < deadline,
            "the waiter never looked at its line"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = counts.acquires();
    // `look2`'s record sits under `look`'s watch prefix: ten releases of it.
    for _ in 0..10 {
        holder
            .try_lock("look2")
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        counts.acquires() - asked <= 1,
        "ten releases of another lock woke the waiter {} times",
        counts.acquires() - asked
    );
    held.release().await.unwrap();
    waiting.await.expect("the waiter got its turn");
}
