//! `leasehold elect`, `leasehold leader` and `leasehold run --at-least` end to end against a
//! private redis-server: one leader at a time, resigning on exit and on SIGTERM, SIGTERM to the
//! command when leadership is lost, the leader followed with --watch (with each leader's
//! --label), and a job lock kept for its period (with the run's --label shown by inspect).

use std::io::{BufRead, BufReader, Read};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use leasehold_testkit::redis::RedisServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

mod common;

use common::{command as leasehold, leasehold as run_leasehold, text};

/// Bounds every wait of these tests, so a broken election fails instead of hanging.
const BOUND: Duration = Duration::from_secs(60);

/// A child process killed (and reaped) when dropped, so a failing test leaves nothing running.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// Starts `leasehold elect NAME ARGS… -- sh -c 'echo $LEASEHOLD_TERM; echo ready; SCRIPT'` and
/// returns once it runs as leader, with its term.
fn leading(store: &str, name: &str, args: &[&str], script: &str) -> (Reaped, u64) {
    let mut child = Reaped(
        leasehold(store)
            .args(["elect", name])
            .args(args)
            .args(["--", "sh", "-c"])
            .arg(format!("echo $LEASEHOLD_TERM; echo ready; {script}"))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn elect"),
    );
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let term = lines.next().expect("the term").unwrap();
    let term = term.trim().parse().expect("a term");
    assert_eq!(lines.next().expect("ready").unwrap().trim(), "ready");
    (child, term)
}

/// All `child` wrote to stderr (it has ended, or ends to give it).
fn stderr_of(child: &mut Reaped) -> String {
    let mut err = String::new();
    child
        .stderr
        .take()
        .expect("stderr piped")
        .read_to_string(&mut err)
        .unwrap();
    err
}

fn wait_for(child: &mut Reaped) -> i32 {
    let child = &mut child.0;
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status.code().unwrap_or(-1);
        }
        assert!(start.elapsed() < BOUND, "the process did not end");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A file the test creates to let a script go on: `until_file(path)` is the shell side.
fn gate(name: &str) -> std::path::PathBuf {
    let path = std::env::temp_dir().join(format!("leasehold-elect-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

fn until_file(path: &std::path::Path) -> String {
    format!("while [ ! -f {} ]; do sleep 0.05; done", path.display())
}

#[test]
fn one_leader_at_a_time_and_leadership_is_given_up_when_the_command_exits() {
    let server = RedisServer::start().unwrap();
    let url = server.url();

    let out = run_leasehold(&url, &["leader", "primary"]);
    assert_eq!(out.status.code(), Some(1), "nobody leads yet");
    assert_eq!(text(&out.stdout).trim(), "primary: no leader");

    // A long TTL: only a resignation frees it within the test.
    let done = gate("exits");
    let (mut first, first_term) = leading(
        &url,
        "primary",
        &["--ttl", "120s"],
        &format!("{}; exit 3", until_file(&done)),
    );
    let out = run_leasehold(&url, &["leader", "primary"]);
    assert_eq!(out.status.code(), Some(0));
    let shown = text(&out.stdout);
    assert!(shown.contains(&format!("pid {}", first.id())), "{shown}");
    assert!(shown.contains(&format!("term {first_term}")), "{shown}");

    // A second candidate gives up after its wait.
    let out = run_leasehold(&url, &["elect", "primary", "--wait", "300ms", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));

    // The command exits (status 3): elect exits with it, having resigned.
    std::fs::write(&done, "").unwrap();
    assert_eq!(
        wait_for(&mut first),
        3,
        "elect exits with the command's status"
    );
    let _ = std::fs::remove_file(&done);
    let out = run_leasehold(&url, &["leader", "primary"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "resigned: {}",
        text(&out.stdout)
    );

    // The next leader has a greater term.
    let out = run_leasehold(
        &url,
        &["elect", "primary", "--", "sh", "-c", "echo $LEASEHOLD_TERM"],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let next_term: u64 = text(&out.stdout).trim().parse().unwrap();
    assert!(next_term > first_term);
}

#[test]
fn sigterm_to_the_leader_hands_leadership_over_at_once() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let (mut first, first_term) = leading(&url, "primary", &["--ttl", "120s"], "exec sleep 100");
    // A candidate waiting its turn.
    let mut second = Reaped(
        leasehold(&url)
            .args(["elect", "primary", "--", "sh", "-c", "echo $LEASEHOLD_TERM"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(300));
    kill(Pid::from_raw(first.id() as i32), Signal::SIGTERM).unwrap();
    // The command got the SIGTERM (status 143), elect resigned and exits with it.
    assert_eq!(wait_for(&mut first), 143);
    // Long before the 120 s TTL: the second candidate led and ran.
    assert_eq!(wait_for(&mut second), 0);
    let mut term = String::new();
    second
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut term)
        .unwrap();
    assert!(term.trim().parse::<u64>().unwrap() > first_term);
}

#[test]
fn a_leader_that_loses_leadership_stops_its_command_and_exits_76() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let (mut leader, _) = leading(&url, "primary", &["--ttl", "3s"], "exec sleep 100");
    // An operator breaks the election lock.
    let out = run_leasehold(&url, &["release", "election/primary", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The next renewal finds it gone: SIGTERM to the command, exit status 76.
    assert_eq!(wait_for(&mut leader), 76);
    let err = stderr_of(&mut leader);
    assert!(err.contains("leadership was lost"), "{err}");
}

#[test]
fn leader_watch_prints_every_change() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let mut watch = Reaped(
        leasehold(&url)
            .args(["leader", "primary", "--watch", "--interval", "50ms"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut changes = BufReader::new(watch.stdout.take().unwrap()).lines();
    let mut next = || changes.next().expect("a line").expect("read");
    assert_eq!(next(), "primary: no leader");
    let mut last_term = 0;
    for round in 1..=2 {
        let done = gate(&format!("watch-{round}"));
        let address = format!("http://10.0.0.{round}:8080");
        let (mut leader, term) = leading(
            &url,
            "primary",
            &["--ttl", "120s", "--label", &address],
            &until_file(&done),
        );
        assert!(term > last_term);
        last_term = term;
        let line = next();
        assert!(line.contains(&format!("[{address}]")), "{line}");
        assert!(line.contains(&format!("term {term}")), "{line}");
        assert!(line.contains(&format!("pid {}", leader.id())), "{line}");
        std::fs::write(&done, "").unwrap();
        assert_eq!(wait_for(&mut leader), 0);
        let _ = std::fs::remove_file(&done);
        assert_eq!(next(), "primary: no leader");
    }
    drop(watch);
}

#[test]
fn run_at_least_keeps_a_finished_jobs_lock_for_its_period() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let out = run_leasehold(
        &url,
        &[
            "run",
            "--at-least",
            "3s",
            "--label",
            "run 42",
            "nightly",
            "--",
            "true",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    // The kept lock says which run took it.
    let out = run_leasehold(&url, &["inspect", "nightly"]);
    assert!(
        text(&out.stdout).contains("label          run 42"),
        "{}",
        text(&out.stdout)
    );
    // A label that cannot be written is refused before the store is asked.
    let long = "x".repeat(300);
    let out = run_leasehold(&url, &["run", "--label", &long, "other", "--", "true"]);
    assert_ne!(out.status.code(), Some(0));
    assert!(text(&out.stderr).contains("256"), "{}", text(&out.stderr));
    // A second instance in the same period: refused.
    let out = run_leasehold(&url, &["run", "nightly", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    // Once the period has passed, it runs.
    let out = run_leasehold(&url, &["run", "nightly", "--wait", "30s", "--", "true"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn a_sigkilled_leaders_leadership_passes_on_when_its_ttl_runs_out() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let pid_file = gate("sigkill");
    // The command writes its pid (`exec` makes the shell's pid the sleep's), to be stopped at
    // the end: SIGKILL of `elect` leaves it running, as it would any child.
    let (mut first, first_term) = leading(
        &url,
        "primary",
        &["--ttl", "3s"],
        &format!("echo $$ > {}; exec sleep 60", pid_file.display()),
    );
    // Written just after `ready`: read once complete.
    let started = Instant::now();
    let command_pid: i32 = loop {
        assert!(started.elapsed() < BOUND, "the command never wrote its pid");
        let written = std::fs::read_to_string(&pid_file).unwrap_or_default();
        if let Some(pid) = written.strip_suffix('\n').and_then(|p| p.parse().ok()) {
            break pid;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = std::fs::remove_file(&pid_file);
    kill(Pid::from_raw(first.id() as i32), Signal::SIGKILL).unwrap();
    wait_for(&mut first);
    // No resignation: the next candidate leads once the 3 s lease has run out.
    let out = run_leasehold(
        &url,
        &[
            "elect",
            "primary",
            "--wait",
            "30s",
            "--",
            "sh",
            "-c",
            "echo $LEASEHOLD_TERM",
        ],
    );
    let _ = kill(Pid::from_raw(command_pid), Signal::SIGKILL);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let term: u64 = text(&out.stdout).trim().parse().unwrap();
    assert!(term > first_term);
}

#[test]
fn a_leadership_broken_between_renewals_is_reported_when_the_command_ends() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    // Renewals 40 s apart: only the resignation can notice the broken lock.
    let done = gate("broken");
    let (mut leader, _) = leading(
        &url,
        "primary",
        &["--ttl", "120s"],
        &format!("{}; exit 0", until_file(&done)),
    );
    let out = run_leasehold(&url, &["release", "election/primary", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    std::fs::write(&done, "").unwrap();
    assert_eq!(wait_for(&mut leader), 76, "not a protected success");
    let _ = std::fs::remove_file(&done);
    let err = stderr_of(&mut leader);
    assert!(err.contains("no longer led `primary`"), "{err}");
}

#[test]
fn a_leader_whose_command_cannot_start_resigns() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let out = run_leasehold(
        &url,
        &[
            "elect",
            "primary",
            "--ttl",
            "120s",
            "--",
            "/nonexistent/leasehold-test-command",
        ],
    );
    assert_eq!(out.status.code(), Some(127), "{}", text(&out.stderr));
    let out = run_leasehold(&url, &["leader", "primary"]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "resigned, not left for its TTL: {}",
        text(&out.stdout)
    );
}
