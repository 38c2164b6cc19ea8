//! Mutual exclusion across OS processes, the behaviour every store runs (included by each store's
//! `tests/multiprocess.rs` with `#[path]`): several copies of the test binary each increment a
//! shared counter kept in the store's own server under one lock, with a plain read, then a plain
//! write (no atomic increment, no transaction). Without the lock, updates are lost; with it, the
//! final count is exact.
//!
//! The test is its own worker: run normally it is the coordinator (starts a private server, spawns
//! workers, checks the total); spawned with `LEASEHOLD_WORKER_ADDRESS` set it is a worker.
//!
//! A store's test file implements [`Deployment`] and invokes `multiprocess_suite!`.

use std::future::Future;
use std::process::Command;
use std::time::Duration;

use leasehold::{LockManager, LockOptions, LockStore};

const WORKERS: usize = 4;
/// Tells a spawned copy of the test binary that it is a worker, and where the server listens.
const WORKER_ENV: &str = "LEASEHOLD_WORKER_ADDRESS";
/// The counter's key in the store's server.
pub(crate) const COUNTER: &str = "leasehold-test:counter";

/// A private server of one store, the lock store on it, and a plain (non-atomic) counter in it.
pub(crate) trait Deployment: Sized {
    /// The lock store the workers use.
    type Store: LockStore;
    /// A worker's own connection for reading and writing the counter.
    type Counter: Send;
    /// Increments per worker: enough for lost updates to show without the lock.
    const INCREMENTS: usize;

    /// Starts a private deployment (stopped when dropped); a fixture serves from `runtime` while
    /// the workers run.
    fn start(runtime: &tokio::runtime::Runtime) -> Self;
    /// Where the server listens, handed to the workers.
    fn address(&self) -> String;
    /// Connects a lock store to the server at `address`.
    fn connect(address: &str) -> impl Future<Output = Self::Store> + Send;
    /// Opens a counter connection to the server at `address`.
    fn counter(address: &str) -> impl Future<Output = Self::Counter> + Send;
    /// The counter's value, 0 when it was never written.
    fn read(counter: &mut Self::Counter) -> impl Future<Output = u64> + Send;
    /// Overwrites the counter.
    fn write(counter: &mut Self::Counter, value: u64) -> impl Future<Output = ()> + Send;
}

/// One `#[test]` per behaviour, on deployments of `$deployment` (a type implementing
/// [`Deployment`]). The including file names this module `suite`.
macro_rules! multiprocess_suite {
    ($deployment:ty) => {
        #[test]
        fn processes_incrementing_under_the_lock_lose_no_update() {
            suite::processes_incrementing_under_the_lock_lose_no_update::<$deployment>(
                "processes_incrementing_under_the_lock_lose_no_update",
            );
        }
    };
}
pub(crate) use multiprocess_suite;

async fn worker<D: Deployment>(address: String) {
    let store = D::connect(&address).await;
    let locks = LockManager::builder()
        .client_id("multiprocess")
        .farm_id("f1")
        .store(store)
        .default_layers()
        .build()
        .expect("manager");
    let mut counter = D::counter(&address).await;
    for _ in 0..D::INCREMENTS {
        let guard = locks
            .lock_with(
                "counter",
                LockOptions::new()
                    .ttl(Duration::from_secs(10))
                    .wait(Duration::from_secs(120)),
            )
            .await
            .expect("lock");
        let seen = D::read(&mut counter).await;
        tokio::task::yield_now().await;
        D::write(&mut counter, seen + 1).await;
        assert!(guard.release().await.expect("release"), "still ours");
    }
}

/// `test` is the name the test runs under, so the workers run this same function.
pub(crate) fn processes_incrementing_under_the_lock_lose_no_update<D: Deployment>(test: &str) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(address) = std::env::var(WORKER_ENV) {
        runtime.block_on(worker::<D>(address));
        return;
    }
    let server = D::start(&runtime);
    let me = std::env::current_exe().unwrap();
    let children: Vec<_> = (0..WORKERS)
        .map(|_| {
            Command::new(&me)
                .args(["--exact", test, "--nocapture"])
                .env(WORKER_ENV, server.address())
                .spawn()
                .expect("spawn worker")
        })
        .collect();
    for mut child in children {
        assert!(child.wait().unwrap().success(), "a worker failed");
    }
    let total = runtime.block_on(async {
        let mut counter = D::counter(&server.address()).await;
        D::read(&mut counter).await
    });
    assert_eq!(total, (WORKERS * D::INCREMENTS) as u64);
}
