//! `leasehold scenarios`, `run --config --scenario` and `history`, end to end (the history on a
//! real redis-server).

use std::process::{Command, Output};

use leasehold_testkit::redis::RedisServer;

fn leasehold(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args(args)
        .env_remove("LEASEHOLD_STORE")
        .output()
        .expect("the leasehold binary runs")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

const GOOD: &str = r#"
[[scenario]]
name = "checkout"
keys = "order-*"          # glob on the entity name
mode = "blocking"         # or "try"
ttl = "5s"
wait = "200ms"
on_store_down = "fail"    # or "proceed"

[[scenario]]
name = "jobs"
keys = "job-*"
mode = "try"
ttl = "7s"
trace = true
"#;

fn file(dir: &tempfile::TempDir, name: &str, content: &str) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

#[test]
fn scenarios_prints_a_table_and_names_the_line_of_a_bad_file() {
    let dir = tempfile::tempdir().unwrap();
    let good = file(&dir, "good.toml", GOOD);
    let out = leasehold(&["scenarios", "--config", &good]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.contains("checkout  order-*  blocking  exclusive  5s   200ms"),
        "{table}"
    );
    assert!(table.contains("2 scenario(s)"), "{table}");

    let bad = file(
        &dir,
        "bad.toml",
        "[[scenario]]\nname = \"x\"\nmode = \"blocky\"\n",
    );
    let out = leasehold(&["scenarios", "--config", &bad]);
    assert_eq!(out.status.code(), Some(2));
    let error = text(&out.stderr);
    assert!(error.contains(&format!("{bad}:3:")), "{error}");
    assert!(error.contains("mode"), "{error}");
}

#[test]
fn scenarios_shows_layer_settings_and_run_uses_them() {
    let dir = tempfile::tempdir().unwrap();
    let hot = file(
        &dir,
        "hot.toml",
        r#"
[[scenario]]
name = "hot"
keys = "counter-*"
ttl = "10s"

[scenario.layers]
readback = { retries = 2 }
local_competition = { hand_off = true, max_hand_offs = 4, max_hand_off_hold = "200ms" }
reentrancy = false
"#,
    );
    let out = leasehold(&["scenarios", "--config", &hot]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let table = text(&out.stdout);
    assert!(
        table.contains(
            "readback=retries(2), local_competition=hand_off(max 4, 200ms), reentrancy=off"
        ),
        "{table}"
    );
    let out = leasehold(&[
        "run",
        "--config",
        &hot,
        "--scenario",
        "hot",
        "counter-1",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_KEY",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "DC#local#cli#counter-1");

    let bad = file(
        &dir,
        "bad.toml",
        "[[scenario]]\nname = \"x\"\n[scenario.layers]\nreentrancy = { max_depth = 0 }\n",
    );
    let out = leasehold(&["scenarios", "--config", &bad]);
    assert_eq!(out.status.code(), Some(2));
    let error = text(&out.stderr);
    assert!(error.contains(&format!("{bad}:4:28:")), "{error}");
    assert!(error.contains("layers.reentrancy.max_depth"), "{error}");
}

#[test]
fn run_takes_the_scenarios_settings() {
    let dir = tempfile::tempdir().unwrap();
    let good = file(&dir, "good.toml", GOOD);
    let out = leasehold(&[
        "run",
        "--config",
        &good,
        "--scenario",
        "checkout",
        "anything",
        "--",
        "sh",
        "-c",
        "echo $LEASEHOLD_KEY",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).trim(), "DC#local#cli#anything");
    let out = leasehold(&[
        "run",
        "--config",
        &good,
        "--scenario",
        "nope",
        "k",
        "--",
        "true",
    ]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("checkout, jobs"));
}

#[test]
fn history_prints_what_every_instance_did() {
    let server = RedisServer::start().expect("redis-server");
    let dir = tempfile::tempdir().unwrap();
    let good = file(&dir, "good.toml", GOOD);
    let store = server.url();
    let out = leasehold(&[
        "--store", &store, "run", "--config", &good, "job-1", "--", "true",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let out = leasehold(&["--store", &store, "history", "job-1"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let lines = text(&out.stdout);
    assert!(lines.contains("2 entries"), "{lines}");
    assert!(lines.contains("released"), "{lines}");
    assert!(lines.contains("acquired"), "{lines}");
    let out = leasehold(&["--store", &store, "history", "job-1", "--json"]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let entries = json["entries"].as_array().unwrap();
    assert_eq!(entries[0]["event"], "released");
    assert_eq!(entries[1]["event"], "acquired");
    assert!(entries[1]["pid"].as_u64().is_some());
}

#[test]
fn a_lock_call_its_scenarios_refuse_fails_before_the_store_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let strict = file(
        &dir,
        "strict.toml",
        "strict = true\n[[scenario]]\nname = \"jobs\"\nkeys = \"job-*\"\nmode = \"try\"\n\
         renew_every = \"10s\"\n",
    );
    // Nothing listens on port 1: a command that connected first would fail with 69, not 2.
    let store = "redis://127.0.0.1:1";
    for (args, expect) in [
        // a key no scenario of a strict registry covers
        (vec!["report", "--", "true"], "strict"),
        // a try-only scenario asked to wait
        (vec!["--wait", "5s", "job-1", "--", "true"], "--wait"),
        // its renewal not shorter than the TTL given
        (vec!["--ttl", "5s", "job-1", "--", "true"], "renew_every"),
    ] {
        let mut all = vec!["--store", store, "run", "--config", strict.as_str()];
        all.extend(args.iter().copied());
        let out = leasehold(&all);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(expect), "{args:?}: {err}");
        assert!(!err.contains("127.0.0.1:1"), "not a store error: {err}");
    }
}
