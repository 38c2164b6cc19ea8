//! Graceful shutdown across processes: a process holding locks on Redis gets SIGTERM and its locks
//! are free at once; with SIGKILL (no chance to clean up) they stay until their TTL.
//!
//! The test binary is its own lock-holding process: spawned with `LEASEHOLD_HOLDER_URL` set, it
//! installs the signal handler, takes two locks with a 60 s TTL, prints `locked` and waits (at most
//! two minutes, so it always ends by itself).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use leasehold::layers::GracefulShutdownLayer;
use leasehold::{LockKey, LockManager, LockOptions, LockStore};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const KEYS: [&str; 2] = ["job-a", "job-b"];

async fn holder(url: String) {
    let store = RedisStore::connect(RedisConfig::new(url))
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
        let opts = LockOptions::new().ttl(Duration::from_secs(60));
        guards.push(locks.try_lock_with(key, opts).await.expect("lock"));
    }
    println!("locked");
    // The application exits once the signal's shutdown has released its locks.
    tokio::select! {
        () = tokio::time::sleep(Duration::from_secs(120)) => drop(guards),
        code = signalled.exit_code() => std::process::exit(code),
    }
}

fn spawn_holder(url: &str, test: &str) -> Child {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env("LEASEHOLD_HOLDER_URL", url)
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn holder");
    let stdout = child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let ready = lines.any(|line| line.map(|l| l.trim() == "locked").unwrap_or(false));
    assert!(ready, "the holder process took its locks");
    child
}

async fn held(store: &RedisStore) -> Vec<Option<Duration>> {
    let mut ttls = Vec::new();
    for key in KEYS {
        let key = LockKey::dc("f1", "shutdown", key).unwrap();
        if let Some(info) = store.inspect(&key).await.unwrap() {
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

#[test]
fn sigterm_releases_every_live_lock_at_once() {
    if let Ok(url) = std::env::var("LEASEHOLD_HOLDER_URL") {
        return runtime().block_on(holder(url));
    }
    let rt = runtime();
    let server = RedisServer::start().expect("redis-server");
    let store = rt
        .block_on(RedisStore::connect(RedisConfig::new(server.url())))
        .unwrap();
    let mut child = spawn_holder(&server.url(), "sigterm_releases_every_live_lock_at_once");
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
fn sigkill_leaves_the_locks_until_their_ttl() {
    if let Ok(url) = std::env::var("LEASEHOLD_HOLDER_URL") {
        return runtime().block_on(holder(url));
    }
    let rt = runtime();
    let server = RedisServer::start().expect("redis-server");
    let store = rt
        .block_on(RedisStore::connect(RedisConfig::new(server.url())))
        .unwrap();
    let mut child = spawn_holder(&server.url(), "sigkill_leaves_the_locks_until_their_ttl");
    child.kill().unwrap(); // SIGKILL: no handler runs
    child.wait().unwrap();
    let ttls = rt.block_on(held(&store));
    assert_eq!(ttls.len(), 2, "still held after SIGKILL");
    for ttl in ttls {
        assert!(
            ttl.is_some_and(|t| t > Duration::from_secs(50)),
            "held until its TTL: {ttl:?}"
        );
    }
}
