//! The `leasehold` binary end to end against a private redis-server: `run` holding a lock while a
//! second `run` fails or waits, exit statuses, SIGTERM releasing at once, and the ops commands.

use std::process::Stdio;
use std::time::{Duration, Instant};

use leasehold_testkit::redis::RedisServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

use std::io::{BufRead, BufReader};

mod common;

use common::{command as leasehold, output, started, text};

/// Starts `leasehold run KEY -- sh -c SCRIPT` with a 20 s TTL and waits for `ready`.
fn holder(store: &str, key: &str, script: &str) -> std::process::Child {
    started(store, &[key, "--ttl", "20s"], script)
}

/// Starts a [`holder`] of `key` that runs `then` under the lock, and returns it with the
/// fencing token `run` gave it.
fn fenced_holder(store: &str, key: &str, then: &str) -> (std::process::Child, u64) {
    let file = std::env::temp_dir().join(format!("leasehold-{key}-{}", std::process::id()));
    let script = format!(
        "echo $LEASEHOLD_FENCING_TOKEN > {}; echo ready; {then}",
        file.display()
    );
    let child = holder(store, key, &script);
    let token = std::fs::read_to_string(&file).expect("the token written before ready");
    let _ = std::fs::remove_file(&file);
    (child, token.trim().parse().expect("a fencing token"))
}

#[test]
fn a_second_run_fails_with_the_conflict_status_or_waits() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let (mut first, first_token) = fenced_holder(&url, "report", "sleep 1");

    let out = output(leasehold(&url).args(["run", "report", "--", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains("DC#local#cli#report is held by"), "{err}");
    assert!(err.contains("more"), "says for how long: {err}");

    let out =
        output(leasehold(&url).args(["run", "--conflict-exit-code", "9", "report", "--", "true"]));
    assert_eq!(out.status.code(), Some(9));

    // Waiting long enough: runs once the first releases, and sees a higher fencing token.
    let started = Instant::now();
    let out = output(leasehold(&url).args([
        "run",
        "report",
        "--wait",
        "20s",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_FENCING_TOKEN; exit 3",
    ]));
    assert_eq!(out.status.code(), Some(3), "child status propagates");
    let token: u64 = text(&out.stdout).trim().parse().expect("a fencing token");
    assert!(token > first_token, "{token} after {first_token}");
    assert!(started.elapsed() < Duration::from_secs(15));
    assert!(first.wait().unwrap().success());
}

#[test]
fn sigterm_to_run_is_forwarded_and_the_lock_released_at_once() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let mut run = holder(
        &url,
        "job",
        "trap 'kill $!; exit 5' TERM; echo ready; sleep 30 & wait",
    );
    kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    let status = run.wait().unwrap();
    assert_eq!(
        status.code(),
        Some(5),
        "the child's own exit status after SIGTERM"
    );
    let out = output(leasehold(&url).args(["inspect", "job"]));
    assert_eq!(
        out.status.code(),
        Some(1),
        "free at once: {}",
        text(&out.stdout)
    );
}

/// How many entries `key`'s waiter line holds (`LLEN` of its queue), read past the CLI.
fn in_line(server: &RedisServer, key: &str) -> u64 {
    let reply = server
        .command(&["LLEN", &format!("leasehold:queue:DC#local#cli#{key}")])
        .expect("LLEN");
    reply
        .trim_start_matches(':')
        .parse()
        .expect("an integer reply")
}

/// Waits until `key`'s waiter line holds an entry: a `run --wait` or a candidate waits in it.
fn until_in_line(server: &RedisServer, key: &str) {
    let started = Instant::now();
    while in_line(server, key) == 0 {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "nobody joined the line of {key}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn sigterm_while_waiting_exits_143_and_leaves_the_waiter_line_at_once() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let mut holder = holder(&url, "queued", "echo ready; sleep 30");
    // A `run` waiting for the lock, and a candidate waiting to lead, each take a place in the
    // line; SIGTERM ends each wait with the signal's status, and its place goes before it exits
    // (else the next in line would be refused behind it for the waiter timeout).
    let mut candidate_holder = command_elect(&url, "leader-q", "echo ready; sleep 30");
    for (key, args) in [
        (
            "queued",
            vec!["run", "queued", "--wait", "30s", "--", "true"],
        ),
        ("election/leader-q", vec!["elect", "leader-q", "--", "true"]),
    ] {
        let mut waiting = leasehold(&url)
            .args(&args)
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        until_in_line(&server, key);
        kill(Pid::from_raw(waiting.id() as i32), Signal::SIGTERM).unwrap();
        let status = waiting.wait().unwrap();
        assert_eq!(status.code(), Some(143), "{args:?}: 128 + SIGTERM");
        assert_eq!(
            in_line(&server, key),
            0,
            "{args:?}: the place went with the wait"
        );
    }
    for child in [&mut holder, &mut candidate_holder] {
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let _ = child.wait();
    }
}

#[test]
fn a_second_signal_while_stopping_a_wait_exits_at_once() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let mut holder = holder(&url, "stuck", "echo ready; sleep 30");
    let mut waiting = leasehold(&url)
        .args(["run", "stuck", "--wait", "30s", "--", "true"])
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    until_in_line(&server, "stuck");
    // The store stops answering: leaving the line cannot finish, so the first SIGTERM's stop
    // would wait out the shutdown timeout; a second signal ends it.
    server.pause().unwrap();
    let pid = Pid::from_raw(waiting.id() as i32);
    kill(pid, Signal::SIGTERM).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let second = Instant::now();
    kill(pid, Signal::SIGINT).unwrap();
    let status = waiting.wait().unwrap();
    let waited = second.elapsed();
    server.resume().unwrap();
    assert_eq!(status.code(), Some(143), "the first signal's status");
    assert!(
        waited < Duration::from_secs(3),
        "exited {waited:?} after the second signal, not at the shutdown timeout (5 s)"
    );
    let mut err = String::new();
    std::io::Read::read_to_string(&mut waiting.stderr.take().unwrap(), &mut err).unwrap();
    assert!(err.contains("without waiting for the store"), "{err}");
    let _ = kill(Pid::from_raw(holder.id() as i32), Signal::SIGTERM);
    let _ = holder.wait();
}

/// Starts `leasehold elect NAME -- sh -c SCRIPT` and waits for `ready`.
fn command_elect(store: &str, name: &str, script: &str) -> std::process::Child {
    let mut child = leasehold(store)
        .args(["elect", name, "--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn elect");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "ready", "elect leads");
    child
}

#[test]
fn inspect_list_and_forced_release_against_redis() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let (mut run, token) = fenced_holder(&url, "stuck", "exec sleep 30");

    let out = output(leasehold(&url).args(["inspect", "stuck"]));
    assert_eq!(out.status.code(), Some(0));
    let shown = text(&out.stdout);
    let fence = format!("fencing token  {token}");
    for field in ["holder", "host", "pid", "ttl left", fence.as_str()] {
        assert!(shown.contains(field), "{field}: {shown}");
    }
    let out = output(leasehold(&url).args(["inspect", "stuck", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["held"], true);
    assert_eq!(json["fencing_token"], token);
    assert!(json["ttl_left_ms"].as_u64().unwrap() > 10_000);

    let out = output(leasehold(&url).args(["list"]));
    assert!(
        text(&out.stdout).contains("DC#local#cli#stuck"),
        "{}",
        text(&out.stdout)
    );
    let out = output(leasehold(&url).args(["list", "DC#local#", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 1);
    let out = output(leasehold(&url).args(["list", "XDC#", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json.as_array().unwrap().is_empty());

    let out = output(leasehold(&url).args(["release", "stuck"]));
    assert_eq!(out.status.code(), Some(2), "refuses without --force");
    let out = output(leasehold(&url).args(["release", "stuck", "--force"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("released: DC#local#cli#stuck is held by"));
    let out = output(leasehold(&url).args(["inspect", "stuck"]));
    assert_eq!(out.status.code(), Some(1), "broken");
    let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM);
    run.wait().unwrap();
}

#[test]
fn an_unreachable_store_has_its_own_status_and_names_the_address() {
    let port = leasehold_testkit::redis::free_port().unwrap();
    let url = format!("redis://alice:s3cret@127.0.0.1:{port}");
    let out = output(leasehold(&url).args(["inspect", "k"]));
    assert_eq!(out.status.code(), Some(69));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
}

/// Runs `script` under the lock `fragile` (TTL 3 s, renewed every second) with `options`, waits
/// until it prints `ready`, breaks the lock as an operator would, and returns `run`'s exit status
/// and stderr once it has ended.
fn run_and_break_the_lock(options: &[&str], script: &str) -> (Option<i32>, String) {
    run_and_break_the_lock_then("3s", options, script, || {})
}

/// [`run_and_break_the_lock`] with the lock's `ttl`, and `then` run once the lock is broken.
fn run_and_break_the_lock_then(
    ttl: &str,
    options: &[&str],
    script: &str,
    then: impl FnOnce(),
) -> (Option<i32>, String) {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let mut child = leasehold(&url)
        .args(["run", "fragile", "--ttl", ttl])
        .args(options)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let ready = BufReader::new(stdout)
        .lines()
        .any(|l| l.map(|l| l.trim() == "ready").unwrap_or(false));
    if !ready {
        let status = child.wait().unwrap();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        panic!("the command never started ({status}): {err}");
    }
    // The next renewal (every ttl/3) finds the lock gone.
    let out = output(leasehold(&url).args(["release", "fragile", "--force"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    then();
    let status = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status.code(), err)
}

#[test]
fn a_lock_lost_while_the_command_runs_is_reported_and_kill_on_lost_stops_the_command() {
    let (status, err) = run_and_break_the_lock(&["--kill-on-lost"], "echo ready; exec sleep 30");
    assert_eq!(status, Some(76), "the lost-lock status: {err}");
    assert!(err.contains("the lock was lost"), "{err}");
    assert!(err.contains("--kill-on-lost"), "{err}");
    assert!(
        err.contains("exited with status 143"),
        "the command got SIGTERM: {err}"
    );
}

#[test]
fn kill_on_lost_follows_up_with_sigkill_when_the_command_ignores_sigterm() {
    let (status, err) = run_and_break_the_lock(
        &["--kill-on-lost", "--kill-grace", "500ms"],
        "trap '' TERM; echo ready; while :; do sleep 0.1; done",
    );
    assert_eq!(status, Some(76), "the lost-lock status: {err}");
    assert!(err.contains("sending SIGKILL"), "{err}");
    assert!(
        err.contains("exited with status 137"),
        "the command was killed: {err}"
    );
}

#[test]
fn a_lock_broken_between_renewals_is_reported_when_the_command_ends() {
    let gate = std::env::temp_dir().join(format!("leasehold-run-broken-{}", std::process::id()));
    let _ = std::fs::remove_file(&gate);
    // Renewals 40 s apart: only the release at the end can notice the broken lock.
    let script = format!(
        "echo ready; while [ ! -f {} ]; do sleep 0.05; done; exit 0",
        gate.display()
    );
    let (status, err) =
        run_and_break_the_lock_then("120s", &[], &script, || std::fs::write(&gate, "").unwrap());
    let _ = std::fs::remove_file(&gate);
    assert_eq!(status, Some(76), "not a protected success: {err}");
    assert!(err.contains("no longer held by this command"), "{err}");
}

#[test]
fn a_command_that_succeeds_after_its_lock_was_lost_does_not_exit_0() {
    // Succeeds 4 s later; the renewal notices the broken lock first.
    let (status, err) =
        run_and_break_the_lock(&["--lost-exit-code", "9"], "echo ready; sleep 4; exit 0");
    assert_eq!(status, Some(9), "{err}");
    assert!(err.contains("exited with status 0"), "{err}");
    assert!(err.contains("the lock was lost"), "{err}");
}
