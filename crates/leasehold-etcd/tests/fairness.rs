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
