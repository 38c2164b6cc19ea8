//! Holders that die, on a real etcd: a process holding locks gets SIGTERM and its locks are free
//! at once (the graceful-shutdown layer releases them); with SIGKILL (no chance to clean up) they
//! stay until their lease TTL, and then another process can take them.
//!
//! The test binary is its own lock-holding process: spawned with `LEASEHOLD_HOLDER_ENDPOINT` set,
//! it installs the signal handler, takes two locks with the TTL in `LEASEHOLD_HOLDER_TTL` (seconds),
//! prints `locked` and waits (at most two minutes, so it always ends by itself).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold::layers::GracefulShutdownLayer;
use leasehold::{Acquire, LockKey, LockManager, LockOptions, LockStore, OwnerToken};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const KEYS: [&str; 2] = ["job-a", "job-b"];

async fn holder(endpoint: String, ttl: u64) {
    let store = EtcdStore::connect(EtcdConfig::new([endpoint]))
        .await
        .expect("connect");
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

fn spawn_holder(endpoint: &str, ttl: u64, test: &str) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env("LEASEHOLD_HOLDER_ENDPOINT", endpoint)
        .env("LEASEHOLD_HOLDER_TTL", ttl.to_string())
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

async fn held(store: &EtcdStore) -> Vec<Option<Duration>> {
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
fn play_holder() -> bool {
    let Ok(endpoint) = std::env::var("LEASEHOLD_HOLDER_ENDPOINT") else {
        return false;
    };
    let ttl = std::env::var("LEASEHOLD_HOLDER_TTL")
        .ok()
        .and_then(|t| t.parse().ok())
        .unwrap_or(60);
    runtime().block_on(holder(endpoint, ttl));
    true
}

#[test]
fn sigterm_releases_every_live_lock_at_once() {
    if play_holder() {
        return;
    }
    let rt = runtime();
    let server = EtcdServer::start().expect("etcd");
    let store = rt
        .block_on(EtcdStore::connect(EtcdConfig::new([server.endpoint()])))
        .unwrap();
    let mut child = spawn_holder(
        &server.endpoint(),
        60,
        "sigterm_releases_every_live_lock_at_once",
    );
    assert_eq!(rt.block_on(held(&store)).len(), 2, "both locks held");

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let status = child.wait().unwrap();
    assert!(status.success(), "exits after releasing: {status:?}");
    assert!(
        rt.block_on(held(&store)).is_empty(),
        "free immediately, not after the 60 s TTL"
    );
}

#[test]
fn sigkill_leaves_the_locks_until_their_lease_ttl() {
    if play_holder() {
        return;
    }
    let rt = runtime();
    let server = EtcdServer::start().expect("etcd");
    let store = rt
        .block_on(EtcdStore::connect(EtcdConfig::new([server.endpoint()])))
        .unwrap();
    let mut child = spawn_holder(
        &server.endpoint(),
        5,
        "sigkill_leaves_the_locks_until_their_lease_ttl",
    );
    child.kill().unwrap(); // SIGKILL by pid: no handler runs
    child.wait().unwrap();
    let ttls = rt.block_on(held(&store));
    assert_eq!(ttls.len(), 2, "still held after SIGKILL");
    assert!(
        ttls.iter()
            .all(|t| t.is_some_and(|t| t <= Duration::from_secs(5))),
        "held on leases of the holder's TTL: {ttls:?}"
    );
    // etcd expires the leases (bounded wait): then another owner takes the locks.
    rt.block_on(async {
        let give_up = tokio::time::Instant::now() + Duration::from_secs(20);
        while !held(&store).await.is_empty() {
            assert!(
                tokio::time::Instant::now() < give_up,
                "free after the lease TTL"
            );
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
