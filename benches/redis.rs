//! Redis benchmark, against a private redis-server it starts on a free loopback port.
//!
//! Run: `cargo bench -p leasehold-bench --bench redis`
//!
//! 1. Uncontended acquire + release, side by side on the same server: a raw two-round-trip
//!    baseline on one `redis` connection (`SET NX PX`, then the compare-and-delete script) vs
//!    leasehold's `try_lock` + `release` through the default layer stack (and over the bare store).
//! 3. `REDIS_CLUSTER=1`: uncontended `try_lock` + `release` (default stack) on one server and on a
//!    3-master Redis Cluster (3 replicas), alternating in one run, and the ratio of their medians.
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
    let store = RedisStore::connect(RedisConfig::new(url)).await.unwrap();
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
/// Cluster, in alternating batches so both see the same machine load.
async fn cluster_against_one_server() {
    let server = RedisServer::start().expect("redis-server");
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .unwrap()
        .expect("a Redis Cluster (redis-server, redis-tools)");
    let bare = tokio::task::spawn_blocking(|| RedisCluster::start_with_replicas(0))
        .await
        .unwrap()
        .expect("a Redis Cluster without replicas");
    let one = manager(&server.url(), |b| b.default_layers()).await;
    let many = manager(&cluster.url(), |b| b.default_layers()).await;
    let unreplicated = manager(&bare.url(), |b| b.default_layers()).await;
    let raw_one = raw_cluster_client(&server.url(), false);
    let raw_many = raw_cluster_client(&cluster.url(), true);
    let (mut one_p50, mut many_p50, mut bare_p50) = (Vec::new(), Vec::new(), Vec::new());
    let (mut raw_one_p50, mut raw_many_p50) = (Vec::new(), Vec::new());
    for batch in 0..5 {
        println!("batch {batch}");
        one_p50.push(leasehold_pairs("  one server, default stack", &one).await);
        many_p50.push(leasehold_pairs("  Redis Cluster 3+3, default stack", &many).await);
        bare_p50.push(leasehold_pairs("  Redis Cluster 3+0, default stack", &unreplicated).await);
        raw_one_p50.push(raw_set_del("  raw SET NX PX + DEL, one server", &raw_one).await);
        raw_many_p50.push(raw_set_del("  raw SET NX PX + DEL, cluster 3+3", &raw_many).await);
    }
    let median = |mut v: Vec<Duration>| {
        v.sort_unstable();
        v[v.len() / 2]
    };
    let (one, many, bare) = (median(one_p50), median(many_p50), median(bare_p50));
    let (raw_one, raw_many) = (median(raw_one_p50), median(raw_many_p50));
    let us = |d: Duration| d.as_secs_f64() * 1e6;
    println!(
        "\nmedian of batch p50s: one server {:.1} µs, cluster 3+3 {:.1} µs ({:.3}×, goal ≤ 1.05), \
         cluster without replicas {:.1} µs ({:.3}×); raw client: one server {:.1} µs, cluster {:.1} µs ({:.3}×)",
        us(one),
        us(many),
        many.as_secs_f64() / one.as_secs_f64(),
        us(bare),
        bare.as_secs_f64() / one.as_secs_f64(),
        us(raw_one),
        us(raw_many),
        raw_many.as_secs_f64() / raw_one.as_secs_f64()
    );
}

/// The redis crate's own client, one server or cluster: what a lock costs with no leasehold in
/// the way (`SET NX PX` then `DEL`), to tell the cluster client's share from ours.
enum RawClient {
    One(Box<redis::Client>),
    Cluster(Box<redis::cluster::ClusterClient>),
}

fn raw_cluster_client(url: &str, cluster: bool) -> RawClient {
    if cluster {
        let seeds: Vec<String> = url
            .trim_start_matches("redis+cluster://")
            .split(',')
            .map(|h| format!("redis://{h}"))
            .collect();
        RawClient::Cluster(Box::new(redis::cluster::ClusterClient::new(seeds).unwrap()))
    } else {
        RawClient::One(Box::new(redis::Client::open(url).unwrap()))
    }
}

async fn raw_set_del(label: &str, client: &RawClient) -> Duration {
    async fn pairs(label: &str, conn: &mut impl redis::aio::ConnectionLike) -> Duration {
        let mut samples = Vec::with_capacity(ROUNDS);
        let start = Instant::now();
        for i in 0..ROUNDS {
            let t = Instant::now();
            let ok: Option<String> = redis::cmd("SET")
                .arg("{bench}:raw")
                .arg(i)
                .arg("NX")
                .arg("PX")
                .arg(30_000)
                .query_async(conn)
                .await
                .unwrap();
            assert!(ok.is_some());
            let _: i64 = redis::cmd("DEL")
                .arg("{bench}:raw")
                .query_async(conn)
                .await
                .unwrap();
            samples.push(t.elapsed());
        }
        summary(label, samples, start.elapsed())
    }
    match client {
        RawClient::One(client) => {
            let mut conn = client.get_multiplexed_async_connection().await.unwrap();
            pairs(label, &mut conn).await
        }
        RawClient::Cluster(client) => {
            let mut conn = client.get_async_connection().await.unwrap();
            pairs(label, &mut conn).await
        }
    }
}
