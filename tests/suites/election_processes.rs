//! Elections between candidates in separate OS processes, which every server store runs
//! (included by each store's `tests/election_processes.rs` with `#[path]`): of N candidate
//! processes exactly one leads at a time and terms grow; after SIGKILL of the leader another
//! candidate leads once the dead leader's lease ran out, with a greater term; after SIGTERM the
//! leader resigns and another candidate leads long before its TTL would have run out; a leader
//! paused (SIGSTOP) past its lease finds its leadership lost when it wakes, before it acts as
//! leader again, and a write it sends with its old term is refused by a fenced resource.
//!
//! The test binary is its own candidate: spawned with `LEASEHOLD_ELECTION_ADDRESS` set (what
//! [`Store::connect`] needs), it runs the candidate the other `LEASEHOLD_ELECTION_*` variables
//! describe, prints what it does on stdout, and exits by itself after at most [`LIFETIME`]. The
//! parent stops the candidates still running by pid when a test ends.
//!
//! Leadership intervals are timed on `CLOCK_MONOTONIC` (through nix), which every process on the
//! machine reads alike and which never jumps (`Instant` cannot be compared between processes).
//!
//! A store's test file implements [`Store`] and invokes `election_processes_suite!`.

use std::future::Future;
use std::io::{BufRead, BufReader};
use std::pin::Pin;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use leasehold::{LockManager, LockOptions};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

/// How long a candidate process lives at most, whatever happens.
pub(crate) const LIFETIME: Duration = Duration::from_secs(60);

const ADDRESS: &str = "LEASEHOLD_ELECTION_ADDRESS";
const ROLE: &str = "LEASEHOLD_ELECTION_ROLE";
const TTL_MS: &str = "LEASEHOLD_ELECTION_TTL_MS";
const NAME: &str = "LEASEHOLD_ELECTION_NAME";

/// How many candidate processes each test runs.
const CANDIDATES: usize = 3;
/// How many times each candidate leads in the cycling test.
const ROUNDS: usize = 5;

/// A deployment of one store that candidate processes connect to.
pub(crate) trait Store {
    /// What a candidate process needs to connect to this deployment (a URL, endpoint or
    /// config string), handed to it in an environment variable.
    fn address(&self) -> String;

    /// In a candidate process: a manager of its own, connected to `address`.
    fn connect(address: String) -> Pin<Box<dyn Future<Output = LockManager> + Send>>;
}

/// One `#[test]` per behaviour below, each on a deployment of its own made by `$setup` (an async
/// expression whose value is a `$store`, which implements [`Store`]). The including file names
/// this module `suite`.
macro_rules! election_processes_suite {
    ($store:ty, $setup:expr) => {
        suite::election_processes_suite!(@tests $store, $setup;
            of_n_candidate_processes_exactly_one_leads_at_a_time_and_terms_grow,
            after_sigkill_of_the_leader_another_process_leads_within_its_ttl,
            after_sigterm_the_leader_resigns_and_another_process_leads_before_its_ttl,
            a_leader_paused_past_its_lease_finds_it_lost_and_its_term_is_fenced_off,
        );
    };
    (@tests $store:ty, $setup:expr; $($name:ident,)*) => {
        $(
            #[test]
            fn $name() {
                if suite::run_candidate::<$store>() {
                    return;
                }
                let rt = suite::runtime();
                let _entered = rt.enter();
                let store: $store = rt.block_on(async { $setup });
                suite::$name(&store, stringify!($name));
            }
        )*
    };
}
pub(crate) use election_processes_suite;

/// A runtime for the parent's deployment and for a candidate process.
pub(crate) fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
}

/// Nanoseconds on the machine-wide monotonic clock (`CLOCK_MONOTONIC`), which every process on
/// this machine reads alike and which never jumps.
fn now_ns() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is readable");
    u64::try_from(now.tv_sec()).expect("seconds since boot are positive") * 1_000_000_000
        + u64::try_from(now.tv_nsec()).expect("nanoseconds are positive")
}

/// In a candidate process (`LEASEHOLD_ELECTION_ADDRESS` set): runs the candidate and returns
/// `true`. In the parent: returns `false`.
pub(crate) fn run_candidate<S: Store>() -> bool {
    let Ok(address) = std::env::var(ADDRESS) else {
        return false;
    };
    let role = std::env::var(ROLE).expect("a role");
    let ttl = Duration::from_millis(std::env::var(TTL_MS).expect("a TTL").parse().expect("ms"));
    let name = std::env::var(NAME).expect("an election name");
    let rt = runtime();
    rt.block_on(async move {
        // Installed before anything else, so a SIGTERM never finds the default action in place.
        let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("a SIGTERM handler");
        let locks = S::connect(address).await;
        let run = async {
            match role.as_str() {
                "cycle" => cycle(&locks, &name, ttl).await,
                "hold" => hold(&locks, &name, ttl, &mut sigterm).await,
                "write" => write(&locks, &name, ttl).await,
                other => panic!("unknown role {other}"),
            }
        };
        // A bounded lifetime: the candidate ends by itself even if the parent never stops it.
        let _ = tokio::time::timeout(LIFETIME, run).await;
        locks.shutdown().await.expect("shutdown");
    });
    true
}

/// Leads [`ROUNDS`] times: on each, times a short spell of leadership between the grant and the
/// resignation and prints `led <start> <end> <term> <pid>`.
async fn cycle(locks: &LockManager, name: &str, ttl: Duration) {
    for _ in 0..ROUNDS {
        let opts = LockOptions::new().ttl(ttl).wait(LIFETIME);
        let leadership = locks.campaign_with(name, opts).await.expect("lead");
        let start = now_ns();
        let term = leadership.term().expect("a store with fencing tokens");
        tokio::time::sleep(Duration::from_millis(10)).await;
        let end = now_ns();
        println!("led {start} {end} {term} {}", std::process::id());
        // Still the leader when the spell ended: the owner-checked release found its own lock.
        assert!(leadership.resign().await.expect("resign"), "led to the end");
    }
}

/// Campaigns once; when it leads prints `leading <term> <start>` and leads until it loses
/// leadership (`lost`) or is sent SIGTERM, on which it resigns (`resigned <true|false>`).
async fn hold(
    locks: &LockManager,
    name: &str,
    ttl: Duration,
    sigterm: &mut tokio::signal::unix::Signal,
) {
    let opts = LockOptions::new().ttl(ttl).wait(LIFETIME);
    let leadership = tokio::select! {
        leadership = locks.campaign_with(name, opts) => leadership.expect("lead"),
        _ = sigterm.recv() => return,
    };
    let term = leadership.term().expect("a store with fencing tokens");
    println!("leading {term} {}", now_ns());
    let terminated = tokio::select! {
        _ = leadership.lost() => false,
        _ = sigterm.recv() => true,
    };
    if terminated {
        println!("resigned {}", leadership.resign().await.expect("resign"));
    } else {
        println!("lost");
    }
}

/// Campaigns once; when it leads, prints `write <term>` every 20 ms while
/// [`is_leader`](leasehold::Leadership::is_leader) says it leads (each line stands for a write
/// to a fenced resource), and `lost` once it does not.
async fn write(locks: &LockManager, name: &str, ttl: Duration) {
    let opts = LockOptions::new().ttl(ttl).wait(LIFETIME);
    let leadership = locks.campaign_with(name, opts).await.expect("lead");
    let term = leadership.term().expect("a store with fencing tokens");
    loop {
        if !leadership.is_leader() {
            println!("lost");
            return;
        }
        println!("write {term}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
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

/// Candidate processes of one test; those still running are killed (SIGKILL, by pid) and
/// reaped on drop, so a failing test leaves none behind.
struct Candidates {
    children: Vec<Child>,
    lines: mpsc::Receiver<(u32, String)>,
}

impl Candidates {
    fn spawn(test: &str, address: &str, role: &str, ttl: Duration) -> Self {
        // Unique per run, so a persistent cluster's earlier elections never interfere.
        let name = format!("procs-{role}-{:x}-{:x}", std::process::id(), now_ns());
        let (tx, lines) = mpsc::channel();
        let mut children = Vec::new();
        for _ in 0..CANDIDATES {
            let mut child = Command::new(std::env::current_exe().expect("the test binary"))
                .args(["--exact", test, "--nocapture"])
                .env(ADDRESS, address)
                .env(ROLE, role)
                .env(TTL_MS, ttl.as_millis().to_string())
                .env(NAME, &name)
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a candidate");
            let pid = child.id();
            let stdout = child.stdout.take().expect("piped stdout");
            let tx = tx.clone();
            // Read on a thread each, so the parent never blocks on one candidate.
            std::thread::spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    if tx.send((pid, line)).is_err() {
                        break;
                    }
                }
            });
            children.push(child);
        }
        Candidates { children, lines }
    }

    /// The next line any candidate prints that starts with `prefix` (with the rest split into
    /// words), within `bound`.
    fn next(&self, prefix: &str, bound: Duration) -> (u32, Vec<String>) {
        let deadline = std::time::Instant::now() + bound;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let (pid, line) = self
                .lines
                .recv_timeout(left)
                .unwrap_or_else(|e| panic!("no `{prefix}` line within {bound:?}: {e}"));
            if let Some(rest) = line.strip_prefix(prefix) {
                return (pid, rest.split_whitespace().map(String::from).collect());
            }
        }
    }

    /// Waits for candidate `pid` to exit (bounded by its lifetime) and asserts it succeeded.
    fn wait_success(&mut self, pid: u32) {
        let child = self
            .children
            .iter_mut()
            .find(|c| c.id() == pid)
            .expect("a candidate");
        assert!(
            child.wait().expect("wait").success(),
            "candidate {pid} failed"
        );
    }
}

impl Drop for Candidates {
    fn drop(&mut self) {
        for child in &mut self.children {
            if matches!(child.try_wait(), Ok(None)) {
                let _ = child.kill();
            }
            let _ = child.wait();
        }
    }
}

pub(crate) fn of_n_candidate_processes_exactly_one_leads_at_a_time_and_terms_grow(
    store: &impl Store,
    test: &str,
) {
    let mut candidates =
        Candidates::spawn(test, &store.address(), "cycle", Duration::from_secs(10));
    // (start, end, term, pid) of every spell of leadership.
    let mut spells: Vec<(u64, u64, u64, u32)> = (0..CANDIDATES * ROUNDS)
        .map(|_| {
            let (pid, words) = candidates.next("led ", LIFETIME);
            let n: Vec<u64> = words[..3].iter().map(|w| w.parse().unwrap()).collect();
            assert_eq!(words[3], pid.to_string());
            (n[0], n[1], n[2], pid)
        })
        .collect();
    let pids: Vec<u32> = candidates.children.iter().map(Child::id).collect();
    for pid in pids {
        candidates.wait_success(pid);
    }
    spells.sort();
    for pair in spells.windows(2) {
        let (a, b) = (pair[0], pair[1]);
        assert!(a.1 <= b.0, "two leaders at once: {a:?} and {b:?}");
        assert!(
            a.2 < b.2,
            "terms do not grow in time order: {a:?} then {b:?}"
        );
    }
}

pub(crate) fn after_sigkill_of_the_leader_another_process_leads_within_its_ttl(
    store: &impl Store,
    test: &str,
) {
    let ttl = Duration::from_secs(2);
    let candidates = Candidates::spawn(test, &store.address(), "hold", ttl);
    let (leader, words) = candidates.next("leading ", LIFETIME);
    let old_term: u64 = words[0].parse().unwrap();
    let killed_at = now_ns();
    kill(Pid::from_raw(leader as i32), Signal::SIGKILL).expect("SIGKILL the leader");

    // The dead leader's lease runs out after its TTL; a generous bound on top for a loaded
    // machine.
    let (next, words) = candidates.next("leading ", ttl + Duration::from_secs(20));
    assert_ne!(next, leader, "a killed process led again");
    let term: u64 = words[0].parse().unwrap();
    let started: u64 = words[1].parse().unwrap();
    assert!(
        started > killed_at,
        "the new leadership began before the kill"
    );
    assert!(term > old_term, "term {term} after {old_term}");
}

pub(crate) fn after_sigterm_the_leader_resigns_and_another_process_leads_before_its_ttl(
    store: &impl Store,
    test: &str,
) {
    // A TTL no test waits out: only a resignation can let another candidate lead in time.
    let ttl = Duration::from_secs(60);
    let mut candidates = Candidates::spawn(test, &store.address(), "hold", ttl);
    let (leader, words) = candidates.next("leading ", LIFETIME);
    let old_term: u64 = words[0].parse().unwrap();
    let terminated_at = now_ns();
    kill(Pid::from_raw(leader as i32), Signal::SIGTERM).expect("SIGTERM the leader");

    let mut resigned = false;
    let mut new_leader = None;
    while !resigned || new_leader.is_none() {
        let (pid, line) = candidates
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("a resignation and a new leader well before the 60 s TTL");
        if let Some(rest) = line.strip_prefix("resigned ") {
            assert_eq!(pid, leader);
            assert_eq!(rest, "true", "the terminated leader still led");
            resigned = true;
        } else if let Some(rest) = line.strip_prefix("leading ") {
            assert_ne!(pid, leader);
            let words: Vec<u64> = rest
                .split_whitespace()
                .map(|w| w.parse().unwrap())
                .collect();
            assert!(
                words[1] > terminated_at,
                "the new leadership began before SIGTERM"
            );
            assert!(words[0] > old_term, "term {} after {old_term}", words[0]);
            new_leader = Some(pid);
        }
    }
    // The terminated candidate shuts its manager down and exits cleanly.
    candidates.wait_success(leader);
}

pub(crate) fn a_leader_paused_past_its_lease_finds_it_lost_and_its_term_is_fenced_off(
    store: &impl Store,
    test: &str,
) {
    let ttl = Duration::from_secs(2);
    let mut candidates = Candidates::spawn(test, &store.address(), "write", ttl);
    let mut resource = Fenced::default();
    let (leader, words) = candidates.next("write ", LIFETIME);
    let old_term: u64 = words[0].parse().unwrap();
    assert!(resource.write(old_term));

    // Paused well past its lease: another candidate leads meanwhile, with a greater term, and
    // writes. Whatever the paused leader printed before it stopped carries its old term.
    leasehold_testkit::process::pause(leader).expect("SIGSTOP the leader");
    let new_term = loop {
        let (pid, words) = candidates.next("write ", ttl + Duration::from_secs(20));
        let term: u64 = words[0].parse().unwrap();
        if pid == leader {
            assert_eq!(term, old_term, "written before the pause");
            continue;
        }
        assert!(term > old_term, "term {term} after {old_term}");
        assert!(resource.write(term));
        break term;
    };
    leasehold_testkit::process::resume(leader).expect("SIGCONT the leader");

    // On waking it finds its leadership lost before acting as leader again. Only a write it had
    // already decided on when it was stopped (checked `is_leader`, then paused before writing)
    // can still arrive, and the fenced resource refuses its stale term.
    let mut late_writes = 0;
    loop {
        let (pid, line) = candidates
            .lines
            .recv_timeout(Duration::from_secs(20))
            .expect("the woken leader says it lost");
        if pid != leader {
            if let Some(term) = line.strip_prefix("write ") {
                assert_eq!(term, new_term.to_string(), "one new leader");
            }
            continue;
        }
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
    candidates.wait_success(leader);
}
