//! The fleet benchmark: P processes × T tasks contend for one hot key, each holder working H ms
//! under the lock, for D seconds — what a service on many instances does to a hot key.
//!
//! `cargo bench -p leasehold-bench --bench fleet` runs every configuration below; set
//! `FLEET=redis` (or `redis-cluster`, a 3-master Redis Cluster; `etcd`; `etcd-cluster`, 3
//! members; `aerospike`) to run one store only, and `FLEET_ONLY=<label>` (a
//! configuration's label, as printed) to run one row. Each configuration starts its
//! own server (a private redis-server or etcd, or the Aerospike wire fixture in this process),
//! spawns the processes (this binary again, told its part by environment), and reports:
//!
//! - acquisitions per second, and the lock's utilization (share of the run some holder held it);
//! - the hand-over gap between one release and the next grant (p50, p99), and across processes;
//! - the worst wait of any request, and the worst wait over the median wait;
//! - Jain's fairness index over acquisitions per process (1.0 = equal shares);
//! - store requests per acquisition (requests that reached the store, counted in each process),
//!   and the server's own count per acquisition: Redis commands (scripts' commands included), or
//!   Aerospike requests (round trips, as the fixture counts them), over the whole run and in
//!   the steady state (from 1 s in to 0.5 s before the end: without each process's start and
//!   shutdown); on one Redis server, also those commands by command (`INFO commandstats`).

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use leasehold::layers::{CountingLayer, LocalCompetitionLayer};
use leasehold::{LockManager, LockOptions};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::aerospike::AerospikeFixture;
use leasehold_testkit::etcd::EtcdServer;
use leasehold_testkit::etcd_cluster::EtcdCluster;
use leasehold_testkit::redis::RedisServer;
use leasehold_testkit::redis_cluster::RedisCluster;

/// One run's shape.
#[derive(Debug, Clone)]
struct Shape {
    label: &'static str,
    store: &'static str,
    processes: usize,
    tasks: usize,
    hold: Duration,
    run: Duration,
    hand_off: bool,
    /// The store-kept fair line (the default) or first come, first served.
    fair: bool,
    /// Redis: strict FIFO (one place in the line per waiting call, not per process).
    strict: bool,
}

/// What one process reports: one line per acquisition, `wait_us start_ns end_ns`, then a line
/// `REQUESTS total acquires releases` (store requests).
fn child(shape_env: &str) {
    // `;` between fields: a cluster's address lists its nodes with commas.
    let mut parts = shape_env.split(';');
    let mut next = || parts.next().expect("child shape").to_owned();
    let (store, address, tasks, hold_us, run_ms, hand_off, fair, strict) = (
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
        next(),
    );
    let tasks: usize = tasks.parse().unwrap();
    let hold = Duration::from_micros(hold_us.parse().unwrap());
    let run = Duration::from_millis(run_ms.parse().unwrap());
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let counting = CountingLayer::new();
        let counts = counting.counts();
        let builder = LockManager::builder().client_id("fleet").farm_id("f1");
        let builder = match store.as_str() {
            "redis" => builder.store(
                RedisStore::connect(
                    RedisConfig::new(address)
                        .fair(fair == "1")
                        .strict_fifo(strict == "1"),
                )
                .await
                .expect("redis"),
            ),
            "etcd" => builder.store(
                EtcdStore::connect(EtcdConfig::new(address.split(',')).fair(fair == "1"))
                    .await
                    .expect("etcd"),
            ),
            "aerospike" => builder.store(
                AerospikeStore::connect(
                    AerospikeConfig::new(address, "test", "f1").fair(fair == "1"),
                )
                .await
                .expect("aerospike"),
            ),
            other => panic!("unknown store {other}"),
        };
        let locks = builder
            .layer(counting)
            .local_competition(LocalCompetitionLayer::new().hand_off(hand_off == "1"))
            .build()
            .expect("manager");
        let until = Instant::now() + run;
        let tasks: Vec<_> = (0..tasks)
            .map(|_| {
                let locks = locks.clone();
                tokio::spawn(async move {
                    let mut seen = Vec::new();
                    while Instant::now() < until {
                        let asked = Instant::now();
                        let guard = locks
                            .lock_with("hot", LockOptions::new().wait(Duration::from_secs(60)))
                            .await
                            .expect("lock");
                        let waited = asked.elapsed();
                        let start = now_ns();
                        // The critical section: real work that takes `hold`.
                        tokio::time::sleep(hold).await;
                        let end = now_ns();
                        guard.release().await.expect("release");
                        seen.push((waited.as_micros() as u64, start, end));
                    }
                    seen
                })
            })
            .collect();
        let mut seen = Vec::new();
        for task in tasks {
            seen.extend(task.await.expect("task"));
        }
        // A service that stops shuts its manager down: what it keeps in the store's lines goes.
        locks.shutdown().await.expect("shutdown");
        let mut out = std::io::stdout().lock();
        for (wait, start, end) in seen {
            writeln!(out, "{wait} {start} {end}").unwrap();
        }
        writeln!(
            out,
            "REQUESTS {} {} {}",
            counts.total(),
            counts.acquires(),
            counts.releases()
        )
        .unwrap();
    });
}

fn now_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
}

struct Hold {
    process: usize,
    wait_us: u64,
    start: u64,
    end: u64,
}

fn percentile(sorted: &[u64], p: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// Runs one configuration and prints its row; returns the acquisitions made.
fn run(shape: &Shape, address: &str, commands: impl Fn() -> Option<u64> + Sync) -> u64 {
    let before = commands();
    let me = std::env::current_exe().unwrap();
    let env = format!(
        "{};{};{};{};{};{};{};{}",
        shape.store,
        address,
        shape.tasks,
        shape.hold.as_micros(),
        shape.run.as_millis(),
        u8::from(shape.hand_off),
        u8::from(shape.fair),
        u8::from(shape.strict)
    );
    let children: Vec<_> = (0..shape.processes)
        .map(|_| {
            Command::new(&me)
                .env("LEASEHOLD_FLEET_CHILD", &env)
                .stdout(Stdio::piped())
                .spawn()
                .expect("spawn a process")
        })
        .collect();
    let spawned = Instant::now();
    // The server's count in the steady state too: from 1 s into the run (every process
    // connected, subscribed and in line) to 0.5 s before its end (none shutting down yet), as
    // (when, count) at each end. The whole run's count also carries each process's start and
    // shutdown once, which a short run with many processes spreads over few acquisitions.
    let sample_at = |after: Duration| {
        std::thread::sleep((spawned + after).saturating_duration_since(Instant::now()));
        commands().map(|count| (now_ns(), count))
    };
    let (from, to) = (
        Duration::from_secs(1),
        shape.run.saturating_sub(Duration::from_millis(500)),
    );
    let (outputs, steady) = std::thread::scope(|scope| {
        let sampler = (to > from).then(|| scope.spawn(|| Some((sample_at(from)?, sample_at(to)?))));
        let outputs: Vec<_> = children
            .into_iter()
            .map(|child| child.wait_with_output().expect("process"))
            .collect();
        let steady = sampler.and_then(|sampler| sampler.join().expect("sampler"));
        (outputs, steady)
    });
    let mut holds = Vec::new();
    let (mut requests, mut acquires, mut releases) = (0u64, 0u64, 0u64);
    let mut per_process = Vec::new();
    for (process, out) in outputs.into_iter().enumerate() {
        assert!(out.status.success(), "a process failed");
        let mut count = 0u64;
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            if let Some(n) = line.strip_prefix("REQUESTS ") {
                let mut n = n.split(' ').map(|x| x.parse::<u64>().unwrap());
                requests += n.next().unwrap();
                acquires += n.next().unwrap();
                releases += n.next().unwrap();
                continue;
            }
            let mut f = line.split(' ').map(|x| x.parse::<u64>().unwrap());
            let (wait_us, start, end) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            holds.push(Hold {
                process,
                wait_us,
                start,
                end,
            });
            count += 1;
        }
        per_process.push(count);
    }
    let after = commands();
    holds.sort_by_key(|h| h.start);
    let n = holds.len() as u64;
    let window = holds.last().map_or(0, |h| h.end) - holds.first().map_or(0, |h| h.start);
    let held: u64 = holds.iter().map(|h| h.end - h.start).sum();
    let mut gaps = Vec::new();
    let mut cross = Vec::new();
    for pair in holds.windows(2) {
        let gap = pair[1].start.saturating_sub(pair[0].end);
        gaps.push(gap);
        if pair[0].process != pair[1].process {
            cross.push(gap);
        }
    }
    gaps.sort_unstable();
    cross.sort_unstable();
    let mut waits: Vec<u64> = holds.iter().map(|h| h.wait_us).collect();
    waits.sort_unstable();
    let sum: f64 = per_process.iter().map(|&c| c as f64).sum();
    let squares: f64 = per_process.iter().map(|&c| (c as f64).powi(2)).sum();
    let jain = if squares > 0.0 {
        sum * sum / (per_process.len() as f64 * squares)
    } else {
        0.0
    };
    let ms = |ns: u64| ns as f64 / 1e6;
    let median_wait = percentile(&waits, 0.5).max(1);
    println!(
        "| {} | {}×{} | {:.0} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.0} | {:.0}× | {:.3} | {:.2} | {} |",
        shape.label,
        shape.processes,
        shape.tasks,
        n as f64 / shape.run.as_secs_f64(),
        held as f64 / window.max(1) as f64,
        ms(percentile(&gaps, 0.5)),
        ms(percentile(&gaps, 0.99)),
        ms(percentile(&cross, 0.5)),
        ms(percentile(&cross, 0.99)),
        waits.last().copied().unwrap_or(0) as f64 / 1e3,
        waits.last().copied().unwrap_or(0) as f64 / median_wait as f64,
        jain,
        requests as f64 / n.max(1) as f64,
        match (before, after) {
            (Some(b), Some(a)) => format!("{:.1}", (a - b) as f64 / n.max(1) as f64),
            _ => "—".to_owned(),
        },
    );
    // When the worst wait ended, from the first grant: a tail at the start is the fleet warming
    // up (connections, watches), one later is the line itself.
    let first = holds.first().map_or(0, |h| h.start);
    let worst_at = holds
        .iter()
        .max_by_key(|h| h.wait_us)
        .map_or(0.0, |h| h.start.saturating_sub(first) as f64 / 1e9);
    let steady = steady.map_or(String::new(), |((t1, c1), (t2, c2))| {
        let granted = holds.iter().filter(|h| (t1..t2).contains(&h.start)).count();
        format!(
            "; server commands per acquisition from 1 s in to 0.5 s before the end: {:.1}",
            c2.saturating_sub(c1) as f64 / granted.max(1) as f64
        )
    });
    println!(
        "  (acquisitions per process: {per_process:?}; store acquires / releases per acquisition: {:.2} / {:.2}; worst wait ended {worst_at:.2} s into the run{steady})",
        acquires as f64 / n.max(1) as f64,
        releases as f64 / n.max(1) as f64
    );
    n
}

/// The server's commands per acquisition, by command (`INFO commandstats` since the last
/// `CONFIG RESETSTAT`), most called first: where a row's commands go.
fn command_breakdown(server: &RedisServer, acquisitions: u64) -> String {
    let stats = server
        .command(&["INFO", "commandstats"])
        .expect("INFO commandstats");
    let mut calls: Vec<(String, u64)> = stats
        .lines()
        .filter_map(|line| {
            let (name, rest) = line.strip_prefix("cmdstat_")?.split_once(':')?;
            let calls = rest
                .strip_prefix("calls=")?
                .split(',')
                .next()?
                .parse()
                .ok()?;
            Some((name.to_owned(), calls))
        })
        // The bench's own `INFO` and `CONFIG RESETSTAT`.
        .filter(|(name, _)| name != "info" && !name.starts_with("config"))
        .collect();
    calls.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    calls
        .iter()
        .map(|(name, n)| format!("{name} {:.2}", *n as f64 / acquisitions.max(1) as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

fn main() {
    if let Ok(shape) = std::env::var("LEASEHOLD_FLEET_CHILD") {
        child(&shape);
        return;
    }
    let only = std::env::var("FLEET").ok();
    let wanted = |store: &str| only.as_deref().is_none_or(|o| o == store);
    // `FLEET_ONLY=<configuration label>` runs that one row (for back-to-back comparisons).
    let only_row = std::env::var("FLEET_ONLY").ok();
    let row_wanted = |shape: &Shape| only_row.as_deref().is_none_or(|o| o == shape.label);
    let hold = Duration::from_millis(2);
    let secs = std::env::var("FLEET_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5);
    let fleet = |label, store, hand_off, fair| Shape {
        label,
        store,
        processes: 8,
        tasks: 4,
        hold,
        run: Duration::from_secs(secs),
        hand_off,
        fair,
        strict: false,
    };
    println!(
        "| configuration | P×T | acq/s | utilization | gap p50 / p99 ms | cross-process gap p50 / p99 ms | worst wait ms | worst / median wait | Jain | store requests / acq | server commands / acq |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if wanted("redis") {
        let server = RedisServer::start().expect("redis-server");
        let commands = || {
            server
                .info_field("stats", "total_commands_processed")
                .ok()
                .and_then(|v| v.parse().ok())
        };
        for shape in [
            fleet("redis, default stack (fair)", "redis", false, true),
            fleet("redis, fair + hand-off", "redis", true, true),
            Shape {
                strict: true,
                ..fleet("redis, strict FIFO", "redis", false, true)
            },
            fleet(
                "redis, first-come (fair off, as before)",
                "redis",
                false,
                false,
            ),
            // One waiter per process: every acquisition is a fresh wait of its process.
            Shape {
                label: "redis, 32 processes × 1 task",
                processes: 32,
                tasks: 1,
                ..fleet("", "redis", false, true)
            },
            Shape {
                label: "redis, one process, 64 tasks",
                processes: 1,
                tasks: 64,
                ..fleet("", "redis", false, true)
            },
        ] {
            if !row_wanted(&shape) {
                continue;
            }
            server
                .command(&["CONFIG", "RESETSTAT"])
                .expect("reset stats");
            let n = run(&shape, &server.url(), commands);
            println!(
                "  (commands per acquisition: {})",
                command_breakdown(&server, n)
            );
            server.command(&["FLUSHALL"]).expect("flush");
        }
    }
    if wanted("redis-cluster") {
        let cluster = RedisCluster::start().expect("a Redis Cluster (redis-server, redis-tools)");
        // Commands the masters ran (a replica's replayed writes are not requests).
        let commands = || {
            let masters: Vec<u16> = cluster
                .topology()
                .ok()?
                .into_iter()
                .filter(|n| n.master)
                .map(|n| n.port)
                .collect();
            masters
                .iter()
                .map(|port| {
                    cluster
                        .node(*port)?
                        .info_field("stats", "total_commands_processed")
                        .ok()?
                        .parse::<u64>()
                        .ok()
                })
                .sum()
        };
        for shape in [
            fleet("redis cluster, default stack (fair)", "redis", false, true),
            fleet("redis cluster, fair + hand-off", "redis", true, true),
        ] {
            if !row_wanted(&shape) {
                continue;
            }
            run(&shape, &cluster.url(), commands);
        }
    }
    if wanted("etcd-cluster") {
        for shape in [
            fleet("etcd 3 members, default stack (fair)", "etcd", false, true),
            fleet("etcd 3 members, fair + hand-off", "etcd", true, true),
        ] {
            if !row_wanted(&shape) {
                continue;
            }
            let cluster = EtcdCluster::start(3).expect("etcd (install the etcd-server package)");
            run(&shape, &cluster.endpoints().join(","), || None);
        }
    }
    if wanted("etcd") {
        for shape in [
            fleet("etcd, default stack (fair)", "etcd", false, true),
            fleet("etcd, fair + hand-off", "etcd", true, true),
            fleet("etcd, first-come (fair off)", "etcd", false, false),
            // The same line with one waiter per process: how the worst wait scales with waiters.
            Shape {
                label: "etcd, fair, 8 processes × 1 task",
                tasks: 1,
                ..fleet("", "etcd", false, true)
            },
        ] {
            if !row_wanted(&shape) {
                continue;
            }
            // A fresh one-member cluster per configuration (on the machine's disk, fsync on).
            let server = EtcdServer::start().expect("etcd (install the etcd-server package)");
            run(&shape, &server.endpoint(), || None);
        }
    }
    if wanted("aerospike") {
        let fixture = runtime
            .block_on(AerospikeFixture::start())
            .expect("fixture");
        let _enter = runtime.enter();
        let requests = || Some(fixture.requests());
        for shape in [
            fleet(
                "aerospike fixture, default stack (fair)",
                "aerospike",
                false,
                true,
            ),
            fleet(
                "aerospike fixture, fair + hand-off",
                "aerospike",
                true,
                true,
            ),
            fleet(
                "aerospike fixture, first-come (fair off)",
                "aerospike",
                false,
                false,
            ),
        ] {
            if !row_wanted(&shape) {
                continue;
            }
            run(&shape, &fixture.host_string(), requests);
            fixture.clear();
        }
    }
}
