//! The `leasehold` binary against Aerospike: `run`, `inspect`, `list`, `release --force` and
//! `history` (the lock trace of a traced scenario), a missing namespace, credentials kept out of
//! the output, and several seed hosts in the URL. Against the cluster in `AEROSPIKE_HOSTS` when it
//! is set (every host of it, as the URL's seed list; `AEROSPIKE_NAMESPACE`, `AEROSPIKE_USER`,
//! `AEROSPIKE_PASSWORD`), the wire fixture otherwise (`AerospikeTarget`); key names are unique
//! per run.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

use leasehold_testkit::aerospike::{AerospikeFixture, AerospikeTarget};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

mod common;
use common::{leasehold, text};

/// Starts `leasehold [global…] run KEY -- sh -c 'echo ready; exec sleep 30'` and waits for `ready`.
fn holder(store: &str, global: &[&str], key: &str) -> Child {
    fenced_holder(store, global, key).0
}

/// [`holder`], with the fencing token `run` gave its command.
fn fenced_holder(store: &str, global: &[&str], key: &str) -> (Child, u64) {
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
            "echo ready $LEASEHOLD_FENCING_TOKEN; exec sleep 30",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = run.stdout.take().unwrap();
    let token = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.trim().strip_prefix("ready ").map(str::to_owned))
        .expect("the command started")
        .parse()
        .expect("a fencing token");
    (run, token)
}

/// `aerospike://[user:password@]host:port[,host:port…]/<namespace>?<query>` for the target
/// (every seed host it has).
fn url(target: &AerospikeTarget, namespace: &str, query: &str) -> String {
    seeded_url(target, target.hosts(), namespace, query)
}

/// [`url`] with these seed hosts.
fn seeded_url(target: &AerospikeTarget, hosts: &str, namespace: &str, query: &str) -> String {
    let host = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .collect::<Vec<_>>()
        .join(",");
    let credentials = match target.credentials() {
        Some((user, password)) => {
            let enc = |s: &str| {
                percent_encoding::utf8_percent_encode(s, percent_encoding::NON_ALPHANUMERIC)
                    .to_string()
            };
            format!("{}:{}@", enc(user), enc(password))
        }
        None => String::new(),
    };
    format!("aerospike://{credentials}{host}/{namespace}?{query}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_inspect_list_release() {
    let target = AerospikeTarget::from_env().await.unwrap();
    eprintln!("running against {target}");
    let url = url(&target, target.namespace(), "set_suffix=dlm&farm=farm1");
    let name = target.unique("nightly");
    let full = format!("DC#farm1#cli#{name}");
    let (mut run, token) = fenced_holder(&url, &[], &name);
    if let Some(fixture) = target.fixture() {
        assert!(
            fixture
                .record_by_key("DC#farm1#dlm", &format!("cli#{name}"))
                .is_some(),
            "the Java manager's layout"
        );
    }

    let out = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || leasehold(&url, &["inspect", &name, "--json"])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["key"], full.as_str());
    assert_eq!(
        json["fencing_token"], token,
        "inspect shows the holder's token"
    );

    let out = leasehold(&url, &["list"]);
    assert!(text(&out.stdout).contains(&full), "{}", text(&out.stdout));

    let out = leasehold(&url, &["run", &name, "--", "true"]);
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));

    let out = leasehold(&url, &["release", &name, "--force"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with(&format!("released: {full}")));
    assert_eq!(leasehold(&url, &["inspect", &name]).status.code(), Some(1));
    let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM);
    run.wait().unwrap();
}

/// Each farm's DC locks are a set of their own: a key or prefix naming another farm than the
/// URL's is read from that farm's set, and `--farm-id` contradicting it is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_or_prefix_of_another_farm_is_read_from_that_farm() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let url = url(&target, target.namespace(), "set_suffix=dlm&farm=farm1");
    let name = target.unique("elsewhere");
    let full = format!("DC#farm2#cli#{name}");
    let (mut run, token) = fenced_holder(&url, &["--farm-id", "farm2"], &name);
    let cli = |args: Vec<String>| {
        let url = url.clone();
        async move {
            tokio::task::spawn_blocking(move || {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                leasehold(&url, &args)
            })
            .await
            .unwrap()
        }
    };

    let out = cli(vec!["list".into(), "DC#farm2".into()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains(&full), "{}", text(&out.stdout));

    let out = cli(vec!["inspect".into(), full.clone(), "--json".into()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["fencing_token"], token);
    assert!(
        json["acquired_at_ms"].is_u64(),
        "read from farm2's bins: {json}"
    );

    let out = cli(vec![
        "--farm-id".into(),
        "farm1".into(),
        "list".into(),
        "DC#farm2#".into(),
    ])
    .await;
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("names farm `farm2`"));

    let out = cli(vec!["release".into(), full.clone(), "--force".into()]).await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM);
    run.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_namespace_and_bad_urls_are_reported() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let missing = url(&target, "nope", "farm=farm1");
    let out = tokio::task::spawn_blocking(move || leasehold(&missing, &["inspect", "k"]))
        .await
        .unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("\"nope\" does not exist"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    let out = leasehold(
        &url(&target, target.namespace(), "farm=farm123456"),
        &["inspect", "k"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(text(&out.stderr).contains("1-9 bytes"));
}

/// Fixture only: it needs a node whose user and password the test sets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn user_and_password_log_in_and_never_show() {
    let fixture = AerospikeFixture::builder()
        .credentials("app", "s3cret-pw")
        .start()
        .await
        .unwrap();
    let hosts = fixture.host_string();
    let run = |url: String, args: &'static [&'static str]| async move {
        tokio::task::spawn_blocking(move || leasehold(&url, args))
            .await
            .unwrap()
    };
    let out = run(
        format!("aerospike://app:s3cret-pw@{hosts}/test?farm=farm1"),
        &["run", "secured", "--", "true"],
    )
    .await;
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));

    // A wrong password: refused, said so, and neither password shows.
    let out = run(
        format!("aerospike://app:wr0ng-pw@{hosts}/test?farm=farm1"),
        &["inspect", "k"],
    )
    .await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("authentication failed"), "{err}");
    assert!(err.contains(&hosts), "names the address: {err}");
    assert!(
        !err.contains("wr0ng-pw") && !err.contains("s3cret-pw"),
        "{err}"
    );

    // No credentials for a secured cluster: refused too, never a false "not held".
    let out = run(
        format!("aerospike://{hosts}/test?farm=farm1"),
        &["inspect", "k"],
    )
    .await;
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(70), "{err}");
    assert!(err.contains("not authenticated"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn farm_id_names_the_set_and_the_bins_alike() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let url = url(&target, target.namespace(), "set_suffix=dlm");
    let name = target.unique("job");
    // While held, the record uses the Java manager's bins for the same farm as its set.
    let mut run = holder(&url, &["--farm-id", "eu1"], &name);
    if let Some(fixture) = target.fixture() {
        let record = fixture
            .record_by_key("DC#eu1#dlm", &format!("cli#{name}"))
            .expect("set DC#eu1#dlm");
        assert!(record.bin("eu1##data").is_some(), "{record:?}");
    }
    let list = leasehold(&url, &["--farm-id", "eu1", "list"]);
    assert!(
        text(&list.stdout).contains(&format!("DC#eu1#cli#{name}")),
        "{}",
        text(&list.stdout)
    );
    let inspect = leasehold(&url, &["--farm-id", "eu1", "inspect", &name, "--json"]);
    assert_eq!(inspect.status.code(), Some(0), "{}", text(&inspect.stderr));
    let json: serde_json::Value = serde_json::from_slice(&inspect.stdout).unwrap();
    assert!(
        json["acquired_at_ms"].is_number(),
        "from the eu1##uat bin: {json}"
    );
    let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM);
    run.wait().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_prints_the_trace_kept_in_the_namespace() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let url = url(&target, target.namespace(), "set_suffix=dlm&farm=farm1");
    let name = target.unique("job");
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("scenarios.toml");
    std::fs::write(
        &config,
        "[[scenario]]\nname = \"jobs\"\nkeys = \"job-*\"\nttl = \"7s\"\ntrace = true\n",
    )
    .unwrap();
    let config = config.display().to_string();
    let out = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || leasehold(&url, &["run", "--config", &config, &name, "--", "true"])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    if let Some(fixture) = target.fixture() {
        assert!(
            fixture
                .record_by_key("DC#farm1#dlm#trace", &format!("cli#{name}"))
                .is_some(),
            "the history record, beside the lock set"
        );
    }
    let (lines, json) = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || {
            (
                leasehold(&url, &["history", &name]),
                leasehold(&url, &["history", &name, "--json"]),
            )
        }
    })
    .await
    .unwrap();
    assert_eq!(lines.status.code(), Some(0), "{}", text(&lines.stderr));
    let lines = text(&lines.stdout);
    assert!(
        lines.contains(&format!("DC#farm1#cli#{name}: 2 entries")),
        "{lines}"
    );
    let json: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let entries = json["entries"].as_array().unwrap();
    assert_eq!(entries[0]["event"], "released", "{json}");
    assert_eq!(entries[1]["event"], "acquired", "{json}");
    assert!(entries[1]["pid"].as_u64().is_some(), "{json}");
}

/// A loopback port nothing listens on: connecting is refused.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr.to_string()
}

/// The seed node is down, the others serve: `run` gets the lock through another seed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_down_first_seed_is_passed_over() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let hosts = format!("{},{}", closed_port(), target.hosts());
    let url = seeded_url(&target, &hosts, target.namespace(), "farm=farm1");
    let name = target.unique("seeded");
    let out = tokio::task::spawn_blocking({
        let (url, name) = (url.clone(), name.clone());
        move || leasehold(&url, &["run", &name, "--", "true"])
    })
    .await
    .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let mut run = holder(&url, &[], &name);
    if let Some(fixture) = target.fixture() {
        assert!(
            fixture
                .record_by_key("DC#farm1#distributed_lock", &format!("cli#{name}"))
                .is_some(),
            "held through the second seed"
        );
    }
    let out = leasehold(&url, &["inspect", &name]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let _ = kill(Pid::from_raw(run.id() as i32), Signal::SIGTERM);
    run.wait().unwrap();
    let out = leasehold(&url, &["inspect", &name]);
    assert_eq!(
        out.status.code(),
        Some(1),
        "released: {}",
        text(&out.stdout)
    );
}

#[test]
fn a_bad_seed_list_is_refused_before_any_io() {
    for (raw, expect) in [
        (
            "aerospike://127.0.0.1:3000,,127.0.0.1:3001/test",
            "seed host 2",
        ),
        (
            "aerospike://u:s3cret@127.0.0.1:3000,127.0.0.1:99999/test",
            "is not host:port",
        ),
    ] {
        let out = leasehold(raw, &["inspect", "k"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{raw}: {err}");
        assert!(err.contains(expect), "{raw}: {err}");
        assert!(!err.contains("s3cret"), "{err}");
        assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
    }
}
