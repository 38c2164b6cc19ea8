//! A fleet in a test: several OS processes contending for one hot key, each reporting how often
//! it got the lock, so a store's fairness across processes can be checked.
//!
//! The test binary is its own worker: [`spawn_role`] starts it again with `LEASEHOLD_FAIR_ROLE`
//! and `LEASEHOLD_FAIR_ADDRESS` set, running only the test that spawned it; at the top of that
//! test, [`role`] tells the worker what to play (and a coordinating run gets `None`). A
//! contending worker runs [`contend`], which prints one `RESULT <count> <worst wait ms>` line
//! that [`results`] reads back.
//!
//! ```no_run
//! use std::time::Duration;
//! use leasehold_testkit::fleet;
//!
//! #[test]
//! fn every_process_gets_the_key() {
//!     if let Some((role, address)) = fleet::role() {
//!         // "contend": connect to `address` and run fleet::contend(...) on fleet::runtime().
//!         return;
//!     }
//!     let children: Vec<_> = (0..4)
//!         .map(|_| fleet::spawn_role("contend", "every_process_gets_the_key", "127.0.0.1:6379"))
//!         .collect();
//!     let counts: Vec<u64> = fleet::results(children).iter().map(|r| r.0).collect();
//!     fleet::assert_fair_shares(&counts);
//! }
//! ```

use std::future::Future;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The role a worker plays.
pub const ROLE_ENV: &str = "LEASEHOLD_FAIR_ROLE";
/// The store address a worker connects to.
pub const ADDRESS_ENV: &str = "LEASEHOLD_FAIR_ADDRESS";

/// The runtime a worker (and the coordinating test) runs on: two worker threads, like a small
/// service.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Starts this test binary again as a worker playing `role` against `address`, running only
/// `test` (the test that calls this), with its stdout piped.
pub fn spawn_role(role: &str, test: &str, address: &str) -> Child {
    spawn_role_with(role, test, address, &[])
}

/// [`spawn_role`] with more environment for the worker (what else its role needs to know).
pub fn spawn_role_with(role: &str, test: &str, address: &str, env: &[(&str, &str)]) -> Child {
    Command::new(std::env::current_exe().expect("the test binary's path"))
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(ROLE_ENV, role)
        .env(ADDRESS_ENV, address)
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn a worker process")
}

/// The role and address this process was spawned with, if it is a worker.
pub fn role() -> Option<(String, String)> {
    Some((
        std::env::var(ROLE_ENV).ok()?,
        std::env::var(ADDRESS_ENV).ok()?,
    ))
}

/// A contending worker's loop: `tasks` tasks run `once` (take the key, hold it, release it)
/// again and again for `run`, then one line `RESULT <acquisitions> <worst wait ms>` is printed.
/// `once` panics on a failed acquisition (the worker then fails).
pub async fn contend<F, Fut>(tasks: usize, run: Duration, once: F)
where
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    let until = Instant::now() + run;
    let tasks: Vec<_> = (0..tasks)
        .map(|_| {
            let once = once.clone();
            tokio::spawn(async move {
                let (mut count, mut worst) = (0u64, Duration::ZERO);
                while Instant::now() < until {
                    let asked = Instant::now();
                    once().await;
                    worst = worst.max(asked.elapsed());
                    count += 1;
                }
                (count, worst)
            })
        })
        .collect();
    let (mut count, mut worst) = (0, Duration::ZERO);
    for task in tasks {
        let (c, w) = task.await.expect("a contending task panicked");
        count += c;
        worst = worst.max(w);
    }
    println!("RESULT {count} {}", worst.as_millis());
}

/// Waits for every worker and reads its `RESULT` line: (acquisitions, worst wait). Panics with
/// the worker's output if it failed or printed no result.
pub fn results(children: Vec<Child>) -> Vec<(u64, Duration)> {
    children
        .into_iter()
        .map(|child| {
            let out = child.wait_with_output().expect("wait for a worker");
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "a worker failed:\n{stdout}");
            let result = stdout
                .split_once("RESULT ")
                .map(|(_, rest)| rest)
                .unwrap_or_else(|| panic!("no result line in:\n{stdout}"));
            let mut fields = result.split_whitespace().map(|f| f.parse::<u64>());
            let count = fields.next().and_then(Result::ok).expect("a count");
            let worst = fields.next().and_then(Result::ok).expect("a worst wait");
            (count, Duration::from_millis(worst))
        })
        .collect()
}

/// Every process got the key, and the least served got at least a quarter of the most served
/// (in line, each process gets one turn per round; a late start costs a few rounds at most).
pub fn assert_fair_shares(counts: &[u64]) {
    let (min, max) = (
        counts.iter().copied().min().unwrap_or(0),
        counts.iter().copied().max().unwrap_or(0),
    );
    assert!(
        min > 0 && min * 4 >= max,
        "every process got a fair share of the lock: {counts:?}"
    );
}
