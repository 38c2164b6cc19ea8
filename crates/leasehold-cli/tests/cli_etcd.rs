//! The `leasehold` binary end to end against a private etcd: `run` holding a lock while a second
//! `run` fails or waits (and sees a higher fencing token), SIGTERM releasing at once, `inspect`,
//! `list` and a forced `release`, `run --permits` and `run --shared` across processes, and an
//! unreachable cluster.

use leasehold_testkit::etcd::EtcdServer;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

mod common;

use common::{command as leasehold, output, started, text};

/// Starts `leasehold run KEY -- sh -c SCRIPT` with a 20 s TTL and waits for `ready`.
fn holder(store: &str, key: &str, script: &str) -> std::process::Child {
    started(store, &[key, "--ttl", "20s"], script)
}

#[test]
fn run_conflicts_waits_and_sees_a_higher_fencing_token() {
    let server = EtcdServer::start().unwrap();
    let url = server.url();
    let mut first = holder(&url, "report", "echo ready; sleep 1");

    let out = output(leasehold(&url).args(["run", "report", "--", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("DC#local#cli#report is held by"),
        "{}",
        text(&out.stderr)
    );

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
    let second: u64 = text(&out.stdout).trim().parse().expect("a fencing token");
    assert!(first.wait().unwrap().success());
    assert!(second > 1, "an etcd revision, above the first holder's");
}

#[test]
fn sigterm_to_run_releases_the_lock_at_once() {
    let server = EtcdServer::start().unwrap();
    let url = server.url();
    let mut run = holder(
        &url,
        "job",
        "trap 'kill $!; exit 5' TERM; echo ready; sleep 30 & wait",
    );
    kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM).unwrap();
    let status = run.wait().unwrap();
    assert_eq!(status.code(), Some(5), "the child's own exit status");
    let out = output(leasehold(&url).args(["inspect", "job"]));
    assert_eq!(
        out.status.code(),
        Some(1),
        "free at once: {}",
        text(&out.stdout)
    );
}

#[test]
fn inspect_list_and_forced_release_against_etcd() {
    let server = EtcdServer::start().unwrap();
    let url = format!("{}?prefix=cli-test:", server.url());
    let mut run = holder(&url, "stuck", "echo ready; exec sleep 30");

    let out = output(leasehold(&url).args(["inspect", "stuck"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let shown = text(&out.stdout);
    for field in ["holder", "host", "pid", "ttl left", "fencing token"] {
        assert!(shown.contains(field), "{field}: {shown}");
    }
    let out = output(leasehold(&url).args(["inspect", "stuck", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["held"], true);
    assert!(json["fencing_token"].as_u64().unwrap() > 0);
    assert!(json["ttl_left_ms"].as_u64().unwrap() > 10_000);

    let out = output(leasehold(&url).args(["list", "DC#local#", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json.as_array().unwrap().len(), 1, "{json}");
    let out = output(leasehold(&url).args(["list", "XDC#", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json.as_array().unwrap().is_empty());
    // Another prefix sees nothing of this one.
    let out = output(leasehold(&server.url()).args(["list", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(json.as_array().unwrap().is_empty(), "{json}");

    let out = output(leasehold(&url).args(["release", "stuck", "--force"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = output(leasehold(&url).args(["inspect", "stuck"]));
    assert_eq!(out.status.code(), Some(1), "broken");
    let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM);
    run.wait().unwrap();
}

#[test]
fn permits_bound_how_many_runs_go_at_once_across_processes() {
    let server = EtcdServer::start().unwrap();
    let url = server.url();
    let tmp = tempfile::tempdir().unwrap();
    let (dir, log) = (tmp.path().join("inside"), tmp.path().join("counts"));
    std::fs::create_dir(&dir).unwrap();
    // Each run adds a file, logs how many it sees, holds, and removes its file.
    let script = format!(
        "f={dir}/$$; touch $f; ls {dir} | wc -l >> {log}; sleep 0.3; rm -f $f",
        dir = dir.display(),
        log = log.display()
    );
    let runs = format!(
        "for i in 1 2; do {bin} run --permits 2 --wait 60s --ttl 10s batch -- sh -c '{script}' || exit 1; done",
        bin = env!("CARGO_BIN_EXE_leasehold")
    );
    let workers: Vec<std::process::Child> = (0..3)
        .map(|_| {
            std::process::Command::new("sh")
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
    assert_eq!(counts.len(), 6, "all 6 runs ran");
    assert!(
        counts.iter().all(|&c| c <= 2),
        "at most 2 at once: {counts:?}"
    );
}

#[test]
fn shared_runs_hold_together_exclude_a_plain_run_and_break_with_release_force() {
    let server = EtcdServer::start().unwrap();
    let url = server.url();
    let readers: Vec<std::process::Child> = (0..2)
        .map(|_| {
            started(
                &url,
                &["--shared", "doc", "--ttl", "20s"],
                "echo ready; exec sleep 30",
            )
        })
        .collect();
    let out = output(leasehold(&url).args(["run", "doc", "--", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));

    let out = output(leasehold(&url).args(["inspect", "doc"]));
    let shown = text(&out.stdout);
    assert!(shown.contains("read-held by 2 reader(s)"), "{shown}");
    let out = output(leasehold(&url).args(["list", "--json"]));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json[0]["mode"], "shared", "{json}");
    assert_eq!(json[0]["holders"].as_array().unwrap().len(), 2, "{json}");

    let out = output(leasehold(&url).args(["release", "doc", "--force"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("released 2 of 2"),
        "{}",
        text(&out.stdout)
    );
    let out = output(leasehold(&url).args(["run", "doc", "--", "true"]));
    assert_eq!(
        out.status.code(),
        Some(0),
        "free for a writer: {}",
        text(&out.stderr)
    );
    for mut reader in readers {
        let _ = kill(Pid::from_raw(reader.id() as i32), Signal::SIGTERM);
        reader.wait().unwrap();
    }
}

#[test]
fn an_unreachable_cluster_has_its_own_status_and_names_the_address() {
    let port = leasehold_testkit::redis::free_port().unwrap();
    let url = format!("etcd://alice:s3cret@127.0.0.1:{port}");
    let out = output(leasehold(&url).args(["inspect", "k"]));
    assert_eq!(out.status.code(), Some(69), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert!(err.contains(&format!("127.0.0.1:{port}")), "{err}");
    assert!(!err.contains("s3cret"), "{err}");
}
