//! `examples/etcd.rs` runs as a test against a private etcd, its printed lines checked.
//! The example's body is compiled in from the very file `cargo run --example etcd` builds.

#[allow(dead_code)] // the example's `main`
#[path = "../../../examples/etcd.rs"]
mod example;

use leasehold::{LockKey, LockStore};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_etcd_example_runs_and_says_what_happened() {
    let server = EtcdServer::start().expect("start etcd");
    let mut out = Vec::new();
    example::run(&[server.endpoint()], &mut out)
        .await
        .expect("the example runs");
    let text = String::from_utf8(out).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[0].starts_with("service A holds DC#local#example#invoice-7 (fencing token Some("),
        "{text}"
    );
    assert!(
        lines[1].starts_with("service B: lock unavailable on DC#local#example#invoice-7"),
        "{text}"
    );
    assert!(lines[2].starts_with("inspect from B: held by "), "{text}");
    assert_eq!(lines[3], "service A releases: still ours = true", "{text}");
    assert!(lines[4].starts_with("service B acquired it "), "{text}");
    // B's fencing token is above A's.
    let token = |line: &str| -> u64 {
        let at = line.find("fencing token Some(").unwrap() + "fencing token Some(".len();
        line[at..].split(')').next().unwrap().parse().unwrap()
    };
    assert!(token(lines[4]) > token(lines[0]), "{text}");
    // Nothing is left held.
    let store =
        EtcdStore::connect(EtcdConfig::new([server.endpoint()]).prefix("leasehold-example:"))
            .await
            .unwrap();
    let key = LockKey::dc("local", "example", "invoice-7").unwrap();
    assert_eq!(store.inspect(&key).await.unwrap(), None);
}
