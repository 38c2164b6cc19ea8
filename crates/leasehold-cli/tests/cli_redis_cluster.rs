//! The `leasehold` binary against a private Redis Cluster and a Sentinel group: `run`, `inspect`,
//! `list` and `history` work on every deployment, and the wrong URL kind says which to use.

use leasehold_testkit::redis_cluster::{RedisCluster, RedisSentinel};

mod common;

use common::{command as leasehold, output, text};

fn run_inspect_list(url: &str) {
    let out = output(leasehold(url).args([
        "run",
        "report",
        "--",
        "sh",
        "-c",
        "echo token=$LEASEHOLD_FENCING_TOKEN",
    ]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("token="),
        "{}",
        text(&out.stdout)
    );

    // A held lock shows in inspect and list while `run` holds it.
    let mut holder = common::started(url, &["held", "--ttl", "20s"], "echo ready; sleep 2");
    let out = output(leasehold(url).args(["inspect", "held"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("DC#local#cli#held"),
        "{}",
        text(&out.stdout)
    );
    let out = output(leasehold(url).args(["list"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("DC#local#cli#held"),
        "{}",
        text(&out.stdout)
    );
    let out = output(leasehold(url).args(["run", "held", "--", "true"]));
    assert_eq!(out.status.code(), Some(75), "{}", text(&out.stderr));
    assert!(holder.wait().unwrap().success());
    let out = output(leasehold(url).args(["history", "report"]));
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

#[test]
fn run_inspect_and_list_work_on_a_redis_cluster() {
    let cluster = RedisCluster::start().expect("start a Redis Cluster");
    run_inspect_list(&cluster.url());
    // A single-server URL at a cluster node names the URL to use.
    let out = output(
        leasehold(&format!("redis://{}", cluster.seeds()[0])).args(["run", "k", "--", "true"]),
    );
    assert_ne!(out.status.code(), Some(0));
    assert!(
        text(&out.stderr).contains("redis+cluster://"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn run_inspect_and_list_work_through_sentinel() {
    let group = RedisSentinel::start().expect("start Redis Sentinel");
    run_inspect_list(&group.url());
}
