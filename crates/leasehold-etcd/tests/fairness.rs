//! Waiting across processes on a real etcd: every process gets a hot key (none starves), and a
//! crashed waiter leaves the line when its waiter lease lapses.
//!
//! The test binary is its own worker: spawned with `LEASEHOLD_FAIR_ROLE` set, it plays a role
//! (a contending process, or a waiter that will be killed) instead of coordinating.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use leasehold::{ErrorKind, LockManager, LockOptions};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

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

/// A contending process: `TASKS` tasks take the hot key for `HOLD` again and again for `RUN`,
/// then print how many times and the longest wait.
async fn contend(endpoint: String) {
    let locks = manager(&endpoint).await;
    let until = Instant::now() + RUN;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let (mut count, mut worst) = (0u64, Duration::ZERO);
                while Instant::now() < until {
                    let asked = Instant::now();
                    let guard = locks
                        .lock_with("hot", LockOptions::new().wait(Duration::from_secs(30)))
                        .await
                        .expect("no request starves for 30 s");
                    worst = worst.max(asked.elapsed());
                    tokio::time::sleep(HOLD).await;
                    guard.release().await.expect("release");
                    count += 1;
                }
                (count, worst)
            })
        })
        .collect();
    let (mut count, mut worst) = (0, Duration::ZERO);
    for task in tasks {
        let (c, w) = task.await.expect("task");
        count += c;
        worst = worst.max(w);
    }
    println!("RESULT {count} {}", worst.as_millis());
}

/// A waiter that joins the line of `held` and then hangs until killed.
async fn queue_and_hang(endpoint: String) {
    let locks = manager(&endpoint).await;
    let _ = locks
        .lock_with("held", LockOptions::new().wait(Duration::from_secs(600)))
        .await;
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

fn spawn_role(role: &str, test: &str, endpoint: &str) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env("LEASEHOLD_FAIR_ROLE", role)
        .env("LEASEHOLD_FAIR_ENDPOINT", endpoint)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn worker")
}

/// Runs the role this process was spawned for, if any.
fn play_role() -> bool {
    let (Ok(role), Ok(endpoint)) = (
        std::env::var("LEASEHOLD_FAIR_ROLE"),
        std::env::var("LEASEHOLD_FAIR_ENDPOINT"),
    ) else {
        return false;
    };
    match role.as_str() {
        "contend" => runtime().block_on(contend(endpoint)),
        "hang" => runtime().block_on(queue_and_hang(endpoint)),
        other => panic!("unknown role {other}"),
    }
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
            spawn_role(
                "contend",
                "every_process_gets_a_hot_key_none_starves",
                &server.endpoint(),
            )
        })
        .collect();
    let mut counts = Vec::new();
    for child in children {
        let out = child.wait_with_output().expect("worker");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "a worker failed:\n{stdout}");
        let result = stdout
            .split_once("RESULT ")
            .map(|(_, rest)| rest)
            .unwrap_or_else(|| panic!("no result line in:\n{stdout}"));
        let count: u64 = result.split_whitespace().next().unwrap().parse().unwrap();
        counts.push(count);
    }
    // In line (waiter keys in create-revision order), each process gets one turn per round; a late
    // start costs a few rounds at most.
    let (min, max) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
    assert!(
        min > 0 && min * 4 >= max,
        "every process got a fair share of the lock: {counts:?}"
    );
}

#[test]
fn a_crashed_waiter_leaves_the_line_when_its_waiter_lease_lapses() {
    if play_role() {
        return;
    }
    let server = EtcdServer::start().expect("start etcd");
    let endpoint = server.endpoint();
    runtime().block_on(async {
        let holder = manager(&endpoint).await;
        let held = holder.try_lock("held").await.expect("free");
        let mut waiter = spawn_role(
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
        let pid = nix::unistd::Pid::from_raw(waiter.id() as i32);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).unwrap();
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
