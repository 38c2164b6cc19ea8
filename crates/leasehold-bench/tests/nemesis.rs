//! Short schedules of the nemesis harness, one per store: worker processes take one lock and
//! write to the fenced resource while faults are injected into the store's nodes and into the
//! workers (client pauses past the TTL). Each test starts its own deployment on loopback through
//! the testkit and stops every process by pid; the tests run one at a time (the machine is
//! small, and a timing-sensitive fault must not wait on another test's CPU).
//!
//! What every store must show: no write accepted out of fencing order and no token shared by two
//! holders; every paused client's late write rejected by the fence and its loss reported to its
//! guard when it wakes; nothing left behind. On etcd also: no overlap between holders the
//! cluster kept. The long runs and the numbers are in docs/RELIABILITY.md.

use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use leasehold_bench::nemesis::checker::Verdict;
use leasehold_bench::nemesis::deployment::StoreKind;
use leasehold_bench::nemesis::fault::FaultKind;
use leasehold_bench::nemesis::report;
use leasehold_bench::nemesis::run::{run, RunConfig};

/// One run at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn config(store: StoreKind, seconds: u64, faults: &[FaultKind]) -> RunConfig {
    let mut config = RunConfig::new(store, env!("CARGO_BIN_EXE_nemesis"));
    config.duration = Duration::from_secs(seconds);
    config.faults = faults.to_vec();
    config.seed = 7;
    config
}

/// Runs `config` and checks what every store must show. `unique_tokens`: no two acquisitions
/// may share a fencing token (not asked of a Redis without replica acknowledgement, where a
/// failover can lose the counter's last increment: docs/RELIABILITY.md).
fn run_checked(config: RunConfig, unique_tokens: bool) -> Verdict {
    let _serial = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
    let result = run(&config).expect("the run");
    let v = result.verdict;
    println!("{}", report::HEADER);
    println!("{}", report::row(&result.label, &v));
    print!("{}", report::details(&v));
    let table = format!(
        "{}\n{}",
        report::row(&result.label, &v),
        report::details(&v)
    );
    assert!(v.acquisitions > 0, "the workers got the lock: {table}");
    assert_eq!(
        v.out_of_order, 0,
        "writes accepted out of fencing order: {table}"
    );
    if unique_tokens {
        assert_eq!(v.shared_tokens, 0, "acquisitions sharing a token: {table}");
    }
    assert!(
        v.fault_errors.is_empty(),
        "every fault was injected and healed: {table}"
    );
    assert_eq!(
        v.stuck_workers, 0,
        "every worker stopped on its own: {table}"
    );
    if config.faults.contains(&FaultKind::ClientPause) {
        assert!(v.client_pauses > 0, "a client was paused: {table}");
        assert_eq!(
            v.late_write_rejected, v.client_pauses,
            "every paused holder's late write was rejected by the fence: {table}"
        );
        assert_eq!(
            v.pause_loss_reported, v.client_pauses,
            "every paused holder's guard reported the loss: {table}"
        );
    }
    assert_eq!(v.left_behind, None, "nothing left behind: {table}");
    v
}

#[test]
fn etcd_keeps_mutual_exclusion_and_fencing_under_every_fault() {
    let v = run_checked(config(StoreKind::Etcd, 25, StoreKind::Etcd.faults()), true);
    assert_eq!(v.overlaps_kept, 0, "no overlap between holders etcd kept");
    assert_eq!(v.lost_silent, 0, "no lock lost silently on etcd");
}

#[test]
fn a_single_redis_fences_through_kills_pauses_and_a_black_hole() {
    run_checked(
        config(StoreKind::Redis, 20, StoreKind::Redis.faults()),
        true,
    );
}

#[test]
fn a_redis_cluster_without_replica_acknowledgement_fences_through_failovers() {
    run_checked(
        config(
            StoreKind::RedisCluster,
            20,
            &[FaultKind::Failover, FaultKind::ClientPause],
        ),
        false,
    );
}

#[test]
fn a_redis_cluster_with_min_replicas_fences_through_kills_and_failovers() {
    let mut config = config(
        StoreKind::RedisCluster,
        20,
        &[FaultKind::Kill, FaultKind::Failover, FaultKind::ClientPause],
    );
    config.min_replicas = 1;
    run_checked(config, true);
}

#[test]
fn sentinel_with_min_replicas_fences_through_failovers() {
    // A long pause or a kill of the master takes the group several seconds to settle (the
    // sentinels' down-after, the election, the old master's resync): those run in the long runs.
    let mut config = config(
        StoreKind::Sentinel,
        25,
        &[FaultKind::Failover, FaultKind::ClientPause],
    );
    config.min_replicas = 1;
    run_checked(config, true);
}

#[test]
fn the_aerospike_fixture_fences_through_pauses_and_client_pauses() {
    run_checked(
        config(
            StoreKind::Aerospike,
            15,
            &[
                FaultKind::PauseShort,
                FaultKind::PauseLong,
                FaultKind::ClientPause,
            ],
        ),
        true,
    );
}
