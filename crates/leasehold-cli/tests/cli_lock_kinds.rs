//! `leasehold run --permits N` and `run --shared` across real OS processes on a private
//! redis-server: a semaphore bounds how many commands run at once, readers overlap but never a
//! writer, a writer is not starved by readers, a killed holder's permit comes back, and the ops
//! commands show every holder.

use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use leasehold_testkit::redis::RedisServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

mod common;

use common::{command as leasehold, output, started, text};

/// A command that records how many copies of itself run at once: it adds a file to `dir`,
/// appends the count of files it sees to `log`, holds for `hold`, and removes its file.
fn counting_script(dir: &Path, log: &Path, hold: &str) -> String {
    format!(
        "f={dir}/$$; touch $f; ls {dir} | wc -l >> {log}; sleep {hold}; rm -f $f",
        dir = dir.display(),
        log = log.display()
    )
}

#[test]
fn permits_bound_how_many_commands_run_at_once_across_processes() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let tmp = tempfile::tempdir().unwrap();
    let (dir, log) = (tmp.path().join("inside"), tmp.path().join("counts"));
    std::fs::create_dir(&dir).unwrap();
    let script = counting_script(&dir, &log, "0.3");
    // 4 processes × 3 runs each: 12 runs of a 3-permit job.
    let workers: Vec<Child> = (0..4)
        .map(|_| {
            let runs = (0..3)
                .map(|_| {
                    format!(
                        "{bin} run --permits 3 --wait 60s --ttl 10s batch -- sh -c '{script}' || exit 1",
                        bin = env!("CARGO_BIN_EXE_leasehold")
                    )
                })
                .collect::<Vec<_>>()
                .join("; ");
            Command::new("sh")
                .args(["-c", &runs])
                .env("LEASEHOLD_STORE", &url)
                .spawn()
                .unwrap()
        })
        .collect();
    for mut worker in workers {
        assert!(worker.wait().unwrap().success(), "every run finished");
    }
    let counts: Vec<usize> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    assert_eq!(counts.len(), 12, "all 12 runs ran");
    let most = *counts.iter().max().unwrap();
    assert!(most <= 3, "at most 3 at once, saw {most}: {counts:?}");
    assert!(
        most >= 2,
        "permits were shared, not taken one at a time: {counts:?}"
    );
}

#[test]
fn shared_runs_overlap_but_never_a_plain_run_of_the_key() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("events");
    let bin = env!("CARGO_BIN_EXE_leasehold");
    let job = |kind: &str, flag: &str| {
        format!(
            "{bin} run {flag} --wait 60s --ttl 10s doc -- sh -c 'echo {kind}+ >> {log}; sleep 0.2; echo {kind}- >> {log}'",
            log = log.display()
        )
    };
    let mut children = Vec::new();
    for i in 0..8 {
        let (kind, flag) = if i % 4 == 3 {
            ("W", "")
        } else {
            ("R", "--shared")
        };
        let line = format!("{0}; {0}", job(kind, flag));
        children.push(
            Command::new("sh")
                .args(["-c", &line])
                .env("LEASEHOLD_STORE", &url)
                .spawn()
                .unwrap(),
        );
    }
    for mut child in children {
        assert!(child.wait().unwrap().success());
    }
    let (mut readers, mut writer, mut most_readers) = (0, false, 0);
    let events = std::fs::read_to_string(&log).unwrap();
    for event in events.lines() {
        match event {
            "R+" => {
                assert!(!writer, "a reader entered while a writer held: {events}");
                readers += 1;
                most_readers = most_readers.max(readers);
            }
            "R-" => readers -= 1,
            "W+" => {
                assert!(
                    !writer && readers == 0,
                    "a writer entered with others inside: {events}"
                );
                writer = true;
            }
            "W-" => writer = false,
            other => panic!("unexpected line {other:?}"),
        }
    }
    assert_eq!(events.lines().count(), 32, "16 runs, each logged twice");
    assert!(most_readers >= 2, "readers shared the lock: {events}");
}

#[test]
fn a_writer_is_not_starved_by_readers_from_other_processes() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let tmp = tempfile::tempdir().unwrap();
    let stop = tmp.path().join("stop");
    let bin = env!("CARGO_BIN_EXE_leasehold");
    // Three processes keep overlapping reads going until told to stop.
    let readers: Vec<Child> = (0..3)
        .map(|_| {
            let line = format!(
                "while [ ! -e {stop} ]; do {bin} run --shared --wait 30s --ttl 10s feed -- sleep 0.3 || exit 1; done",
                stop = stop.display()
            );
            Command::new("sh")
                .args(["-c", &line])
                .env("LEASEHOLD_STORE", &url)
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_millis(800));
    let begun = Instant::now();
    let out = output(leasehold(&url).args(["run", "--wait", "30s", "feed", "--", "true"]));
    let waited = begun.elapsed();
    std::fs::write(&stop, b"").unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "the writer ran: {}",
        text(&out.stderr)
    );
    for mut reader in readers {
        assert!(reader.wait().unwrap().success(), "readers kept working");
    }
    println!("the writer waited {waited:?} behind three reading processes");
}

#[test]
fn a_killed_holders_permit_returns_at_its_ttl_and_a_terminated_ones_at_once() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    // SIGTERM: released at once.
    let mut holder = started(
        &url,
        &["--permits", "1", "--ttl", "3s", "gpu"],
        "echo ready; sleep 30",
    );
    kill(Pid::from_raw(holder.id() as i32), Signal::SIGTERM).unwrap();
    holder.wait().unwrap();
    let out = output(leasehold(&url).args(["run", "--permits", "1", "gpu", "--", "true"]));
    assert_eq!(
        out.status.code(),
        Some(0),
        "free at once: {}",
        text(&out.stderr)
    );

    // SIGKILL: nothing releases it; the permit comes back when its own lease expires.
    let mut holder = started(
        &url,
        &["--permits", "1", "--ttl", "2s", "gpu"],
        "echo ready; exec sleep 30",
    );
    kill(Pid::from_raw(holder.id() as i32), Signal::SIGKILL).unwrap();
    holder.wait().unwrap();
    let out = output(leasehold(&url).args(["run", "--permits", "1", "gpu", "--", "true"]));
    assert_eq!(
        out.status.code(),
        Some(75),
        "still held right after the kill"
    );
    assert!(
        text(&out.stderr).contains("permits taken"),
        "{}",
        text(&out.stderr)
    );
    let begun = Instant::now();
    let out = output(leasehold(&url).args([
        "run",
        "--permits",
        "1",
        "--wait",
        "20s",
        "gpu",
        "--",
        "true",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        begun.elapsed() < Duration::from_secs(15),
        "back at its TTL, not later"
    );
}

#[test]
fn a_lock_held_as_another_kind_is_the_conflict_status() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let mut holder = started(&url, &["--ttl", "20s", "mixed"], "echo ready; sleep 30");
    let out = output(leasehold(&url).args(["run", "--permits", "2", "mixed", "--", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("exclusive"),
        "{}",
        text(&out.stderr)
    );
    kill(Pid::from_raw(holder.id() as i32), Signal::SIGTERM).unwrap();
    holder.wait().unwrap();
}

#[test]
fn inspect_list_and_release_show_every_holder() {
    let server = RedisServer::start().unwrap();
    let url = server.url();
    let mut a = started(
        &url,
        &["--shared", "--ttl", "20s", "cfg"],
        "echo ready; sleep 30",
    );
    let mut b = started(
        &url,
        &["--shared", "--ttl", "20s", "cfg"],
        "echo ready; sleep 30",
    );
    let mut p = started(
        &url,
        &["--permits", "4", "--ttl", "20s", "pool"],
        "echo ready; sleep 30",
    );

    let out = output(leasehold(&url).args(["inspect", "cfg"]));
    let shown = text(&out.stdout);
    assert!(shown.contains("read-held by 2 reader(s)"), "{shown}");
    assert_eq!(shown.matches("pid").count(), 2, "{shown}");
    let out = output(leasehold(&url).args(["inspect", "--json", "pool"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["mode"], "semaphore");
    assert_eq!(json["permits"], 4);
    assert_eq!(json["holders"].as_array().unwrap().len(), 1);

    let out = output(leasehold(&url).args(["list"]));
    let listed = text(&out.stdout);
    assert_eq!(
        listed.lines().filter(|l| l.contains("#cfg ")).count(),
        2,
        "{listed}"
    );
    assert!(listed.contains("semaphore(4)"), "{listed}");

    // A plain run of a read-held key is the write side: refused while readers hold.
    let out = output(leasehold(&url).args(["run", "cfg", "--", "true"]));
    assert_eq!(out.status.code(), Some(75));
    assert!(
        text(&out.stderr).contains("is read by 2 holder(s)"),
        "{}",
        text(&out.stderr)
    );
    // Another permit count for the same semaphore is an error, not a silent change.
    let out = output(leasehold(&url).args(["run", "--permits", "2", "pool", "--", "true"]));
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("semaphore(4)"),
        "{}",
        text(&out.stderr)
    );

    let out = output(leasehold(&url).args(["release", "--force", "cfg"]));
    assert!(
        text(&out.stdout).contains("released 2 of 2"),
        "{}",
        text(&out.stdout)
    );
    let out = output(leasehold(&url).args(["inspect", "cfg"]));
    assert_eq!(out.status.code(), Some(1), "free");
    for child in [&mut a, &mut b, &mut p] {
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        child.wait().unwrap();
    }
    let out = output(leasehold(&url).args(["run", "--permits", "0", "pool", "--", "true"]));
    assert_eq!(
        out.status.code(),
        Some(2),
        "bad permits are a usage error: {}",
        text(&out.stderr)
    );
}
