//! Redis benchmark, against a private redis-server it starts on a free loopback port.
//!
//! Run: `cargo bench -p leasehold-bench --bench redis`
//!
//! 1. Uncontended acquire + release, side by side on the same server: a raw two-round-trip
//!    baseline on one `redis` connection (`SET NX PX`, then the compare-and-delete script) vs
//!    leasehold's `try_lock` + `release` through the default layer stack (and over the bare store).
//! 3. `REDIS_CLUSTER=1`: uncontended `try_lock` + `release` (default stack) on one server (alone
//!    and with one replica) and on a 3-master Redis Cluster (3 replicas, and none), alternating
//!    in one run, and the ratio of their medians; on the cluster both with the store's direct
//!    routing (the default) and through the redis crate's cluster client alone.
//! 2. A hot key: 64 tasks in one process, with local competition off / on / on with hand-off;
//!    acquisitions per second and Redis commands per acquisition (from `INFO stats`).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use leasehold::layers::{CountingLayer, LocalCompetitionLayer};
use leasehold::{LockManager, LockManagerBuilder, LockOptions};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;
use leasehold_testkit::redis_cluster::RedisCluster;

const ROUNDS: usize = 4000;
const RELEASE: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";

fn summary(label: &str, mut samples: Vec<Duration>, elapsed: Duration) -> Duration {
    samples.sort_unstable();
    let p = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!(
        "{label:<44} p50 {:>7.1} µs   p99 {:>7.1} µs   {:>7.0} ops/s",
        p(0.5).as_secs_f64() * 1e6,
        p(0.99).as_secs_f64() * 1e6,
        samples.len() as f64 / elapsed.as_secs_f64()
    );
    p(0.5)
}

async fn raw_baseline(url: &str) -> Duration {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let release = redis::Script::new(RELEASE);
    let mut samples = Vec::with_capacity(ROUNDS);
    let start = Instant::now();
    for i in 0..ROUNDS {
        let token = format!("raw-token-{i}");
        let t = Instant::now();
        let ok: Option<String> = redis::cmd("SET")
            .arg("bench:raw")
            .arg(&token)
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ok.is_some());
        let deleted: i64 = release
            .key("bench:raw")
            .arg(&token)
            .invoke_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(deleted, 1);
        samples.push(t.elapsed());
    }
    summary(
        "raw: SET NX PX + compare-and-delete",
        samples,
        start.elapsed(),
    )
}

async fn manager(
    url: &str,
    configure: impl FnOnce(LockManagerBuilder) -> LockManagerBuilder,
) -> LockManager {
    manager_with(RedisConfig::new(url), configure).await
}

async fn manager_with(
    config: RedisConfig,
    configure: impl FnOnce(LockManagerBuilder) -> LockManagerBuilder,
) -> LockManager {
    let store = RedisStore::connect(config).await.unwrap();
    // The bare manager (no layer, no renewal watchdog); each measurement turns on what it names.
    configure(
        LockManager::builder()
            .client_id("bench")
            .farm_id("f1")
            .store(store)
            .lock_ttl(Duration::from_secs(30))
            .without_layers()
            .renewal(false),
    )
    .build()
    .unwrap()
}

async fn leasehold_pairs(label: &str, locks: &LockManager) -> Duration {
    let mut samples = Vec::with_capacity(ROUNDS);
    let start = Instant::now();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let guard = locks.try_lock("uncontended").await.unwrap();
        assert!(guard.release().await.unwrap());
        samples.push(t.elapsed());
    }
    summary(label, samples, start.elapsed())
}

async fn hot_key(
    server: &RedisServer,
    label: &str,
    configure: impl FnOnce(LockManagerBuilder) -> LockManagerBuilder,
) {
    let counting = CountingLayer::new();
    let requests = counting.counts();
    let locks = manager(&server.url(), |b| configure(b.layer(counting))).await;
    let commands = |s: &RedisServer| -> u64 {
        s.info_field("stats", "total_commands_processed")
            .unwrap()
            .parse()
            .unwrap()
    };
    let acquired = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let before = commands(server);
    let start = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let locks = locks.clone();
            let acquired = acquired.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let opts = LockOptions::new().wait(Duration::from_secs(10));
                    let guard = locks.lock_with("hot", opts).await.unwrap();
                    acquired.fetch_add(1, Ordering::Relaxed);
                    guard.release().await.unwrap();
                }
            })
        })
        .collect();
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop.store(true, Ordering::Relaxed);
    for task in tasks {
        task.await.unwrap();
    }
    let elapsed = start.elapsed();
    // The INFO call itself is one command.
    let used = commands(server) - before - 1;
    let n = acquired.load(Ordering::Relaxed);
    println!(
        "hot key, 64 tasks, {label:<28} {:>8.0} acquisitions/s   {:>6.2} round trips and {:>6.2} Redis commands per acquisition",
        n as f64 / elapsed.as_secs_f64(),
        requests.total() as f64 / n.max(1) as f64,
        used as f64 / n.max(1) as f64
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of benchmarks
    }
    if std::env::var("REDIS_CLUSTER").is_ok_and(|v| v == "1") {
        return cluster_against_one_server().await;
    }
    let server = RedisServer::start().expect("redis-server (install the redis-server package)");
    let url = server.url();
    println!(
        "redis-server {} on {url}; {ROUNDS} sequential rounds each\n",
        server.info_field("server", "redis_version").unwrap()
    );

    let raw = raw_baseline(&url).await;
    let bare = manager(&url, |b| b).await;
    leasehold_pairs("leasehold try_lock + release, bare store", &bare).await;
    let stacked = manager(&url, |b| b.default_layers()).await;
    let full = leasehold_pairs("leasehold try_lock + release, default stack", &stacked).await;
    println!(
        "\ndefault stack p50 / raw p50 = {:.3} (goal ≤ 1.05)\n",
        full.as_secs_f64() / raw.as_secs_f64()
    );

    println!(
        "(Redis counts the commands a script runs as commands too: the fenced acquire script is"
    );
    println!(" EVALSHA + SET + INCR = 3, the release script EVALSHA + GET + DEL = 3.)");
    hot_key(&server, "bare store", |b| b).await;
    hot_key(&server, "local competition", |b| b.default_layers()).await;
    hot_key(&server, "local competition + hand-off", |b| {
        b.default_layers()
            .local_competition(LocalCompetitionLayer::new().hand_off(true))
    })
    .await;
}

/// Uncontended `try_lock` + `release` through the default stack, on one server and on a Redis
/// Cluster, with the raw clients beside them. The rows take turns round by round (the order
/// rotating each round), so every row sees the same machine load even on a busy machine.
async fn cluster_against_one_server() {
    let server = RedisServer::start().expect("redis-server");
    let replicated = RedisServer::start().expect("redis-server");
    let replica = replica_of(&replicated);
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("a Redis Cluster (redis-server, redis-tools)");
    let bare = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(0))
        .await
        .unwrap()
        .expect("a Redis Cluster without replicas");
    // What direct routing does, without leasehold: the one-server client, on the key's master.
    let raw_master = format!(
        "redis://127.0.0.1:{}",
        cluster.master_of(RAW_KEY).expect("the raw key's master")
    );
    let mut rows: Vec<(&str, Row)> = vec![
        (
            "one server",
            Row::Lock(manager(&server.url(), |b| b.default_layers()).await),
        ),
        (
            "one server + 1 replica",
            Row::Lock(manager(&replicated.url(), |b| b.default_layers()).await),
        ),
        (
            "cluster 3+3, direct routing",
            Row::Lock(manager(&cluster.url(), |b| b.default_layers()).await),
        ),
        (
            "cluster 3+3, the crate's cluster client",
            Row::Lock(
                manager_with(RedisConfig::new(cluster.url()).direct_routing(false), |b| {
                    b.default_layers()
                })
                .await,
            ),
        ),
        (
            "cluster 3+0, direct routing",
            Row::Lock(manager(&bare.url(), |b| b.default_layers()).await),
        ),
        ("raw: one server", Row::one(&server.url()).await),
        (
            "raw: cluster 3+3, the crate's cluster client",
            Row::cluster(&cluster.url()).await,
        ),
        (
            "raw: cluster 3+3, the key's master directly",
            Row::one(&raw_master).await,
        ),
    ];
    const BATCHES: usize = 5;
    println!(
        "{BATCHES} batches of {ROUNDS} rounds; each round runs every row once, in rotating order\n"
    );
    let mut p50s: Vec<Vec<Duration>> = vec![Vec::new(); rows.len()];
    for batch in 0..BATCHES {
        println!("batch {batch}");
        let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(ROUNDS); rows.len()];
        let start = Instant::now();
        for round in 0..ROUNDS {
            for k in 0..rows.len() {
                let row = (round + k) % rows.len();
                samples[row].push(rows[row].1.once(round).await);
            }
        }
        let elapsed = start.elapsed();
        for (row, samples) in samples.into_iter().enumerate() {
            p50s[row].push(summary(&format!("  {}", rows[row].0), samples, elapsed));
        }
    }
    let median = |mut v: Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let medians: Vec<Duration> = p50s.into_iter().map(median).collect();
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    let ratio = |a: usize, b: usize| medians[a].as_secs_f64() / medians[b].as_secs_f64();
    println!(
        "\nmedian of the batch p50s (leasehold: try_lock + release, default stack; raw: SET NX PX \
         + DEL)"
    );
    for (row, (name, _)) in rows.iter().enumerate() {
        let (against, what) = if row < 5 {
            (0, "one server")
        } else {
            (5, "raw one server")
        };
        println!(
            "  {name:<46} {:>7.1} µs   {:.3}× {what}",
            us(medians[row]),
            ratio(row, against)
        );
    }
    println!(
        "\ncluster 3+3 / one server: {:.3}× (goal ≤ 1.05); 3+3 / one server + 1 replica: {:.3}×; \
         3+0 / one server: {:.3}×; 3+3 through the crate's cluster client / one server: {:.3}×",
        ratio(2, 0),
        ratio(2, 1),
        ratio(4, 0),
        ratio(3, 0)
    );
    drop(replica);
}

/// The raw rows' key (a hash tag, so the cluster client and the direct row use one slot).
const RAW_KEY: &str = "{bench}:raw";

/// A replica of `master`, in sync before it returns.
fn replica_of(master: &RedisServer) -> RedisServer {
    let port = master.port().to_string();
    let replica = RedisServer::start_with_args(&["--replicaof", "127.0.0.1", &port])
        .expect("a replica redis-server");
    let started = Instant::now();
    while replica
        .info_field("replication", "master_link_status")
        .map_or(true, |s| s != "up")
    {
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the replica did not sync"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    replica
}

/// One row of the cluster comparison: leasehold's manager, or the redis crate's own client (one
/// server, or cluster) with no leasehold in the way (`SET NX PX` then `DEL`), to tell the
/// client's share from ours.
enum Row {
    Lock(LockManager),
    One(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Row {
    async fn one(url: &str) -> Row {
        let client = redis::Client::open(url).unwrap();
        Row::One(client.get_multiplexed_async_connection().await.unwrap())
    }

    async fn cluster(url: &str) -> Row {
        let seeds: Vec<String> = url
            .trim_start_matches("redis+cluster://")
            .split(',')
            .map(|h| format!("redis://{h}"))
            .collect();
        let client = redis::cluster::ClusterClient::new(seeds).unwrap();
        Row::Cluster(client.get_async_connection().await.unwrap())
    }

    /// One acquire + release, timed.
    async fn once(&mut self, round: usize) -> Duration {
        async fn set_del(conn: &mut impl redis::aio::ConnectionLike, round: usize) -> Duration {
            let t = Instant::now();
            let ok: Option<String> = redis::cmd("SET")
                .arg(RAW_KEY)
                .arg(round)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(conn)
                .await
                .unwrap();
            assert!(ok.is_some());
            let _: i64 = redis::cmd("DEL")
                .arg(RAW_KEY)
                .query_async(conn)
                .await
                .unwrap();
            t.elapsed()
        }
        match self {
            Row::Lock(locks) => {
                let t = Instant::now();
                let guard = locks.try_lock("uncontended").await.unwrap();
                assert!(guard.release().await.unwrap());
                t.elapsed()
            }
            Row::One(conn) => set_del(conn, round).await,
            Row::Cluster(conn) => set_del(conn, round).await,
        }
    }
}
