//! Holders that die, the behaviour every store runs (included by each store's
//! `tests/graceful_shutdown.rs` with `#[path]`): a process holding locks gets SIGTERM and its locks
//! are free at once (the graceful-shutdown layer releases them); with SIGKILL (no chance to clean
//! up) they stay until their TTL, and then another owner can take them.
//!
//! The test binary is its own lock-holding process: spawned with `LEASEHOLD_HOLDER_ADDRESS` set, it
//! installs the signal handler, takes two locks with the TTL in `LEASEHOLD_HOLDER_TTL` (seconds),
//! prints `locked` and waits (at most two minutes, so it always ends by itself).
//!
//! A store's test file implements [`Deployment`] and invokes `graceful_shutdown_suite!`.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold::core::Acquire;
use leasehold::layers::GracefulShutdownLayer;
use leasehold::{LockKey, LockManager, LockOptions, LockStore, OwnerToken};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const KEYS: [&str; 2] = ["job-a", "job-b"];
/// Tells a spawned copy of the test binary that it is the holder, and where the server listens.
const HOLDER_ENV: &str = "LEASEHOLD_HOLDER_ADDRESS";
const TTL_ENV: &str = "LEASEHOLD_HOLDER_TTL";

/// A private server of one store and the lock store on it.
pub(crate) trait Deployment: Sized {
    /// The lock store the holder and the test use.
    type Store: LockStore;

    /// Starts a private deployment (stopped when dropped); a fixture serves from `runtime` while
    /// the test waits.
    fn start(runtime: &tokio::runtime::Runtime) -> Self;
    /// Where the server listens, handed to the holder process.
    fn address(&self) -> String;
    /// Connects a lock store to the server at `address`.
    fn connect(address: &str) -> impl Future<Output = Self::Store> + Send;
}

/// One `#[test]` per behaviour, on deployments of `$deployment` (a type implementing
/// [`Deployment`]). The including file names this module `suite`.
macro_rules! graceful_shutdown_suite {
    ($deployment:ty) => {
        suite::graceful_shutdown_suite!(@tests $deployment;
            sigterm_releases_every_live_lock_at_once,
            sigkill_leaves_the_locks_until_their_ttl,
        );
    };
    (@tests $deployment:ty; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                suite::$name::<$deployment>(stringify!($name));
            }
        )*
    };
}
pub(crate) use graceful_shutdown_suite;

async fn holder<D: Deployment>(address: String, ttl: u64) {
    let store = D::connect(&address).await;
    let locks = LockManager::builder()
        .client_id("shutdown")
        .farm_id("f1")
        .store(store)
        .default_layers()
        .graceful_shutdown(GracefulShutdownLayer::new().exit_code(0))
        .build()
        .expect("manager");
    let signalled = locks.install_signal_handler().expect("signal handler");
    let mut guards = Vec::new();
    for key in KEYS {
        let opts = LockOptions::new()
            .ttl(Duration::from_secs(ttl))
            .renew(false);
        guards.push(locks.try_lock_with(key, opts).await.expect("lock"));
    }
    println!("locked");
    // The application exits once the signal's shutdown has released its locks.
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(120)) => drop(guards),
        code = signalled.exit_code() => std::process::exit(code),
    }
}

fn spawn_holder(address: &str, ttl: u64, test: &str) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(HOLDER_ENV, address)
        .env(TTL_ENV, ttl.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let ready = lines.any(|line| line.map(|l| l.trim() == "locked").unwrap_or(false));
    assert!(ready, "the holder process took its locks");
    child
}

fn lock_key(entity: &str) -> LockKey {
    LockKey::dc("f1", "shutdown", entity).unwrap()
}

async fn held(store: &impl LockStore) -> Vec<Option<Duration>> {
    let mut ttls = Vec::new();
    for key in KEYS {
        if let Some(info) = store.inspect(&lock_key(key)).await.unwrap() {
            ttls.push(info.ttl_remaining);
        }
    }
    ttls
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Runs the holder role if this process was spawned as one.
fn play_holder<D: Deployment>() -> bool {
    let Ok(address) = std::env::var(HOLDER_ENV) else {
        return false;
    };
    let ttl = std::env::var(TTL_ENV)
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(60);
    runtime().block_on(holder::<D>(address, ttl));
    true
}

/// `test` is the name the test runs under, so the holder runs this same function.
pub(crate) fn sigterm_releases_every_live_lock_at_once<D: Deployment>(test: &str) {
    if play_holder::<D>() {
        return;
    }
    let rt = runtime();
    let server = D::start(&rt);
    let store = rt.block_on(D::connect(&server.address()));
    let mut child = spawn_holder(&server.address(), 60, test);
    assert_eq!(rt.block_on(held(&store)).len(), 2, "both locks held");

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "exits after releasing: {status:?}");
    assert!(
        rt.block_on(held(&store)).is_empty(),
        "free immediately, not after the 60 s TTL"
    );
}

/// `test` is the name the test runs under, so the holder runs this same function.
pub(crate) fn sigkill_leaves_the_locks_until_their_ttl<D: Deployment>(test: &str) {
    if play_holder::<D>() {
        return;
    }
    let rt = runtime();
    let server = D::start(&rt);
    let store = rt.block_on(D::connect(&server.address()));
    let mut child = spawn_holder(&server.address(), 5, test);
    child.kill().unwrap(); // SIGKILL by pid: no handler runs
    child.wait().unwrap();
    let ttls = rt.block_on(held(&store));
    assert_eq!(ttls.len(), 2, "still held after SIGKILL");
    assert!(
        ttls.iter()
            .all(|t| t.is_some_and(|t| t <= Duration::from_secs(5))),
        "held with the holder's TTL: {ttls:?}"
    );
    // The store expires the locks (bounded wait): then another owner takes them.
    rt.block_on(async {
        let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
        while !held(&store).await.is_empty() {
            assert!(tokio::time::Instant::now() < give_up, "free after the TTL");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for key in KEYS {
            let req = Acquire::new(
                lock_key(key),
                OwnerToken::generate(),
                Duration::from_secs(5),
            );
            let lease = store.try_acquire(&req).await.expect("free again");
            assert!(store.release(&lease).await.unwrap());
        }
    });
}
