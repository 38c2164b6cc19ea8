//! The `leasehold` binary against the Aerospike wire fixture: `run`, `inspect`, `list` and
//! `release --force`, a missing namespace, and credentials kept out of the output.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Output, Stdio};

use leasehold_testkit::aerospike::AerospikeFixture;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

fn leasehold(store: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_STORE", store)
        .args(args)
        .output()
        .expect("the leasehold binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Starts `leasehold [global…] run KEY -- sh -c 'echo ready; exec sleep 30'` and waits for `ready`.
fn holder(store: &str, global: &[&str], key: &str) -> Child {
    let mut run = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .env("LEASEHOLD_STORE", store)
        .args(global)
        .args([
            "run",
            key,
            "--ttl",
            "20s",
            "--",
            "sh",
            "-c",
            "echo ready; exec sleep 30",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = run.stdout.take().unwrap();
    assert!(BufReader::new(stdout)
        .lines()
        .any(|l| l.map(|l| l.trim() == "ready").unwrap_or(false)));
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_inspect_list_release_against_the_fixture() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let url = format!(
        "aerospike://{}/test?set_suffix=dlm&farm=farm1",
        fixture.host_string()
    );
    let mut run = holder(&url, &[], "nightly");
    assert!(
        fixture
            .record_by_key("DC#farm1#dlm", "cli#nightly")
            .is_some(),
        "the Java manager's layout"
    );

    let out = tokio::task::spawn_blocking({
        let url = url.clone();
        move || leasehold(&url, &["inspect", "nightly", "--json"])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["key"], "DC#farm1#cli#nightly");
    assert_eq!(json["fencing_token"], 1);

    let out = leasehold(&url, &["list"]);
    assert!(
        text(&out.stdout).contains("DC#farm1#cli#nightly"),
        "{}",
        text(&out.stdout)
    );

    let out = leasehold(&url, &["run", "nightly", "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));

    let out = leasehold(&url, &["release", "nightly", "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("released: DC#farm1#cli#nightly"));
    assert_eq!(
        leasehold(&url, &["inspect", "nightly"]).status.code(),
        Some(1)
    );
    let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM);
    run.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_namespace_and_bad_urls_are_reported() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let url = format!("aerospike://{}/nope?farm=farm1", fixture.host_string());
    let out = tokio::task::spawn_blocking(move || leasehold(&url, &["inspect", "k"]))
        .await
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("\"nope\" does not exist"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");

    // The fixture has no login: a URL with credentials cannot connect, and says so without them.
    let url = format!(
        "aerospike://app:s3cret@{}/test?farm=farm1",
        fixture.host_string()
    );
    let out = tokio::task::spawn_blocking(move || leasehold(&url, &["inspect", "k"]))
        .await
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(69), "{err}");
    assert!(
        err.contains(&fixture.host_string()),
        "names the address: {err}"
    );
    assert!(!err.contains("s3cret"), "{err}");
    let out = leasehold(
        &format!("aerospike://{}/test?farm=farm123456", fixture.host_string()),
        &["inspect", "k"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("1-9 bytes"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn farm_id_names_the_set_and_the_bins_alike() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let url = format!("aerospike://{}/test?set_suffix=dlm", fixture.host_string());
    // While held, the record uses the Java manager's bins for the same farm as its set.
    let mut run = holder(&url, &["--farm-id", "eu1"], "job");
    let record = fixture
        .record_by_key("DC#eu1#dlm", "cli#job")
        .expect("set DC#eu1#dlm");
    assert!(record.bin("eu1##data").is_some(), "{record:?}");
    let list = leasehold(&url, &["--farm-id", "eu1", "list"]);
    assert!(
        text(&list.stdout).contains("DC#eu1#cli#job"),
        "{}",
        text(&list.stdout)
    );
    let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM);
    run.wait().unwrap();
}
