//! The `leasehold` binary end to end, on inputs that need no server: exit statuses, the child's
//! environment, bad input, help text.

use std::process::{Command, Output};

fn leasehold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("LEASEHOLD_STORE")
        .output()
        .expect("the leasehold binary runs")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn run_passes_the_lock_to_the_child_and_propagates_its_exit_status() {
    let out = leasehold(&[
        "run",
        "report",
        "--",
        "sh",
        "-c",
        "echo \"$LEASEHOLD_KEY|$LEASEHOLD_FENCING_TOKEN|$LEASEHOLD_TOKEN\"; exit 7",
    ]);
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    let line = stdout(&out);
    let parts: Vec<&str> = line.trim().split('|').collect();
    assert_eq!(parts[0], "DC#local#cli#report");
    assert_eq!(parts[1], "1");
    let token: Vec<&str> = parts[2].split('/').collect();
    assert_eq!(token.len(), 4, "token is host/pid/uuid/time: {}", parts[2]);
    assert!(token[1].parse::<u32>().is_ok(), "pid: {}", parts[2]);
    let ok = leasehold(&["--level", "xdc", "run", "report", "--", "true"]);
    assert_eq!(ok.status.code(), Some(0));
}

#[test]
fn a_missing_command_exits_127() {
    let out = leasehold(&["run", "k", "--", "/definitely/not/a/command"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(stderr(&out).contains("cannot run"), "{}", stderr(&out));
}

#[test]
fn bad_input_exits_2_with_one_line_and_an_example() {
    for (args, expect) in [
        (
            vec!["--store", "zookeeper://h:2181", "inspect", "k"],
            "unknown scheme",
        ),
        (vec!["--store", "redis://", "inspect", "k"], "needs a host"),
        (
            vec!["--store", "redis://127.0.0.1:6379/?bogus=1", "inspect", "k"],
            "unknown redis parameter \"bogus\" (known: protocol, tls_ca, tls_cert, tls_key)",
        ),
        (
            vec!["--store", "aerospike://127.0.0.1:3000", "inspect", "k"],
            "namespace",
        ),
        (
            vec!["run", "--ttl", "0s", "k", "--", "true"],
            "greater than zero",
        ),
        (vec!["inspect", "a#b"], "not a lock key"),
        (vec!["inspect", "has space"], "whitespace"),
        (vec!["release", "k"], "--force"),
    ] {
        let out = leasehold(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
        assert!(
            err.contains("e.g.") || err.contains("example"),
            "{args:?}: {err}"
        );
    }
    let out = leasehold(&["run", "--ttl", "soon", "k", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("30s"), "{}", stderr(&out));
}

#[test]
fn bad_arguments_are_refused_before_the_store_is_asked() {
    // Nothing listens on port 1: a command that connected first would fail with 69, not 2.
    let store = "redis://127.0.0.1:1";
    for (args, expect) in [
        (vec!["run", "has space", "--", "true"], "whitespace"),
        (vec!["run", "--permits", "0", "k", "--", "true"], "permit"),
        (
            vec!["run", "--ttl", "0s", "k", "--", "true"],
            "greater than zero",
        ),
        (vec!["run", "--label", "", "k", "--", "true"], "label"),
        (
            vec!["run", "--kill-grace", "100000d", "k", "--", "true"],
            "30 days",
        ),
        (vec!["inspect", "a#b"], "not a lock key"),
        (vec!["history", "has space"], "whitespace"),
        (vec!["elect", "has space", "--", "true"], "whitespace"),
        (
            vec!["elect", "--ttl", "0s", "e", "--", "true"],
            "greater than zero",
        ),
        (vec!["elect", "--label", "", "e", "--", "true"], "label"),
        // A lease the unlock window (150 ms) would never let go of.
        (
            vec!["run", "--ttl", "150ms", "k", "--", "true"],
            "every release would be skipped",
        ),
        (
            vec!["elect", "--ttl", "100ms", "e", "--", "true"],
            "every release would be skipped",
        ),
        (vec!["leader", "has space"], "whitespace"),
        (vec!["leader", "--watch", "has space"], "whitespace"),
    ] {
        let mut all = vec!["--store", store];
        all.extend(args.iter().copied());
        let out = leasehold(&all);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!err.contains("127.0.0.1:1"), "not a store error: {err}");
    }
}

#[test]
fn credentials_never_appear_in_output() {
    let out = leasehold(&["--store", "zoo://alice:s3cret@h:1", "inspect", "k"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(!stderr(&out).contains("s3cret"), "{}", stderr(&out));
    assert!(!stdout(&out).contains("s3cret"));
}

#[test]
fn inspect_says_free_with_status_1() {
    let out = leasehold(&["inspect", "k"]);
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(stdout(&out).trim(), "DC#local#cli#k is free");
    let out = leasehold(&["inspect", "k", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["held"], false);
}

#[test]
fn help_teaches_urls_keys_and_exit_statuses() {
    let out = leasehold(&["--help"]);
    let help = stdout(&out);
    for needle in [
        "aerospike://",
        "rediss://",
        "DC#",
        "Exit status",
        "run",
        "inspect",
        "list",
        "release",
    ] {
        assert!(help.contains(needle), "help lacks {needle}: {help}");
    }
    let run_help = stdout(&leasehold(&["run", "--help"]));
    for needle in [
        "LEASEHOLD_FENCING_TOKEN",
        "SIGTERM",
        "SIGHUP",
        "--conflict-exit-code",
        "--kill-on-lost",
        "--lost-exit-code",
    ] {
        assert!(run_help.contains(needle), "run help lacks {needle}");
    }
}

#[test]
fn demo_runs_every_scenario_and_prints_the_summary() {
    let out = leasehold(&["demo", "--tasks", "16", "--duration", "300ms"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = stdout(&out);
    for scenario in [
        "hot key",
        "reentrancy",
        "unlock window",
        "readback",
        "graceful shutdown",
    ] {
        assert!(text.contains(scenario), "summary lacks {scenario}: {text}");
    }
    assert!(text.contains("fast-failed locally"), "{text}");
    assert!(
        text.contains("store released only at depth 0: true"),
        "{text}"
    );
    assert!(text.contains("1 late release skipped"), "{text}");
    assert!(text.contains("1 lost reply resolved"), "{text}");
    assert!(
        text.contains("3 live locks released at shutdown, 0 left behind"),
        "{text}"
    );
}

#[test]
fn bench_reports_a_json_summary() {
    let out = leasehold(&[
        "bench",
        "--tasks",
        "8",
        "--keys",
        "2",
        "--duration",
        "300ms",
        "--hand-off",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json["acquisitions"].as_u64().unwrap() > 0, "{json}");
    assert!(json["acquire_latency_us"]["p50"].as_u64().unwrap() > 0);
    assert!(json["store_requests_per_acquisition"].as_f64().unwrap() > 0.0);
    assert_eq!(json["errors"], serde_json::json!({}));
    let out = leasehold(&["bench", "--tasks", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn run_forwards_hangup_to_the_command() {
    use std::io::{BufRead, BufReader};
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([
            "run",
            "reload",
            "--",
            "sh",
            "-c",
            // `wait` returns as soon as the trap runs, unlike a foreground `sleep`.
            "trap 'echo got-hup; kill $!; exit 7' HUP; echo ready; sleep 30 & wait",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "ready");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    assert_eq!(lines.next().unwrap().unwrap(), "got-hup");
    assert_eq!(
        child.wait().unwrap().code(),
        Some(7),
        "the command's status"
    );
}
