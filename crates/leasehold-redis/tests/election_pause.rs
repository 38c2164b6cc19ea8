//! A leader paused past its lease (SIGSTOP) on a real Redis: while it is stopped another
//! candidate leads with a greater term; when it wakes it finds its leadership lost before it
//! acts as leader again, and a write it sent with its old term is refused by a fenced resource.
//!
//! The test binary is its own candidate process: spawned with `LEASEHOLD_CANDIDATE_URL` set, it
//! campaigns with a 2 s TTL, then every 20 ms prints `write <term>` while `is_leader()` says it
//! leads, and `lost` once it does not (then exits; at most two minutes in all).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use leasehold::{LockManager, LockOptions};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const TEST: &str = "a_leader_paused_past_its_lease_finds_it_lost_and_its_term_is_fenced_off";
const TTL: Duration = Duration::from_secs(2);

async fn manager(url: String) -> LockManager {
    let store = RedisStore::connect(RedisConfig::new(url))
        .await
        .expect("connect");
    LockManager::builder()
        .client_id("pause")
        .farm_id("f1")
        .store(store)
        .default_layers()
        .build()
        .expect("manager")
}

async fn candidate(url: String) {
    let locks = manager(url).await;
    let opts = LockOptions::new().ttl(TTL).wait(Duration::from_secs(60));
    let leadership = locks.campaign_with("primary", opts).await.expect("lead");
    let term = leadership.term().expect("fenced");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while tokio::time::Instant::now() < deadline {
        if !leadership.is_leader() {
            println!("lost");
            return;
        }
        println!("write {term}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// A resource that accepts a write only with a term at least the highest it has seen.
#[derive(Default)]
struct Fenced {
    highest: u64,
}

impl Fenced {
    fn write(&mut self, term: u64) -> bool {
        if term < self.highest {
            return false;
        }
        self.highest = term;
        true
    }
}

#[test]
fn a_leader_paused_past_its_lease_finds_it_lost_and_its_term_is_fenced_off() {
    if let Ok(url) = std::env::var("LEASEHOLD_CANDIDATE_URL") {
        return runtime().block_on(candidate(url));
    }
    let rt = runtime();
    let server = RedisServer::start().expect("redis-server");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture"])
        .env("LEASEHOLD_CANDIDATE_URL", server.url())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn candidate");
    let pid = Pid::from_raw(child.id() as i32);
    // The candidate's lines, read on a thread so the test never blocks on a stopped process.
    let (tx, lines) = mpsc::channel::<String>();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || lines.recv_timeout(Duration::from_secs(60)).expect("a line");
    let mut resource = Fenced::default();
    let old_term: u64 = loop {
        let line = next();
        if let Some(term) = line.strip_prefix("write ") {
            let term = term.parse().unwrap();
            assert!(resource.write(term));
            break term;
        }
    };

    // Paused well past its lease: another candidate leads meanwhile, and writes.
    kill(pid, Signal::SIGSTOP).unwrap();
    let locks = rt.block_on(manager(server.url()));
    let opts = LockOptions::new()
        .ttl(Duration::from_secs(30))
        .wait(Duration::from_secs(60));
    let leadership = rt
        .block_on(locks.campaign_with("primary", opts))
        .expect("leads once the paused leader's lease expired");
    let new_term = leadership.term().unwrap();
    assert!(new_term > old_term);
    assert!(resource.write(new_term));
    // Everything the old leader printed before it was stopped, then the stop's end.
    while let Ok(line) = lines.try_recv() {
        assert_eq!(line, format!("write {old_term}"));
    }
    kill(pid, Signal::SIGCONT).unwrap();

    // On waking it finds its leadership lost before acting as leader again. Only a write it had
    // already decided on when it was stopped (checked `is_leader`, then paused before writing)
    // can still arrive, and the fenced resource refuses its stale term.
    let mut late_writes = 0;
    loop {
        let line = next();
        if line == "lost" {
            break;
        }
        assert_eq!(line, format!("write {old_term}"), "only the old term");
        assert!(!resource.write(old_term), "a stale term is fenced off");
        late_writes += 1;
    }
    assert!(
        late_writes <= 1,
        "the woken leader acted as leader {late_writes} times"
    );
    assert!(!resource.write(old_term), "a stale term is fenced off");
    assert!(child.wait().unwrap().success());
    assert!(rt.block_on(leadership.resign()).unwrap());
}
