//! etcd benchmark, against a private one-member etcd it starts on free loopback ports (data on
//! the machine's disk, fsync on, as etcd runs in production).
//!
//! Run: `cargo bench -p leasehold-bench --bench etcd`
//!
//! 1. Uncontended acquire + release, side by side on the same server: a raw `etcd-client`
//!    baseline doing exactly the protocol the store does (`LeaseGrant`, a `Txn` on the record's
//!    create revision that puts the token on the lease, a `Txn` comparing the value that deletes
//!    it, the lease revoked in the background) vs leasehold's `try_lock` + `release` through the
//!    default layer stack (and over the bare store).
//!    Then the same pair for a read (`try_read`) and a permit (`try_semaphore(3)`): a read costs
//!    what a lock does; a permit one more read (it counts the taken permits first).
//! 2. A hot key: 64 tasks in one process, bare store vs local competition: acquisitions per
//!    second and store round trips per acquisition.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, DeleteOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use leasehold::layers::CountingLayer;
use leasehold::{LockManager, LockManagerBuilder, LockMode, LockOptions};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

const ROUNDS: usize = 1000;

fn summary(label: &str, mut samples: Vec<Duration>, elapsed: Duration) -> Duration {
    samples.sort_unstable();
    let p = |q: f64| samples[((samples.len() as f64 * q) as usize).min(samples.len() - 1)];
    println!(
        "{label:<52} p50 {:>7.1} µs   p99 {:>7.1} µs   {:>6.0} ops/s",
        p(0.5).as_secs_f64() * 1e6,
        p(0.99).as_secs_f64() * 1e6,
        samples.len() as f64 / elapsed.as_secs_f64()
    );
    p(0.5)
}

async fn raw_baseline(endpoint: &str) -> Duration {
    let client = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let (mut kv, lease) = (client.kv_client(), client.lease_client());
    let key = "bench:raw";
    let mut samples = Vec::with_capacity(ROUNDS);
    let start = Instant::now();
    for i in 0..ROUNDS {
        let token = format!("raw-token-{i}");
        let t = Instant::now();
        let id = lease.clone().grant(30, None).await.unwrap().id();
        let acquire = Txn::new()
            .when([Compare::create_revision(key, CompareOp::Equal, 0)])
            .and_then([TxnOp::put(
                key,
                token.as_str(),
                Some(PutOptions::new().with_lease(id)),
            )]);
        assert!(kv.txn(acquire).await.unwrap().succeeded());
        let release = Txn::new()
            .when([Compare::value(key, CompareOp::Equal, token.as_str())])
            .and_then([TxnOp::delete(
                key,
                Some(DeleteOptions::new().with_prev_key()),
            )]);
        let released = kv.txn(release).await.unwrap();
        assert!(released.succeeded());
        if let Some(TxnOpResponse::Delete(d)) = released.op_responses().first() {
            let id = d.prev_kvs()[0].lease();
            let mut lease = lease.clone();
            tokio::spawn(async move { lease.revoke(id).await });
        }
        samples.push(t.elapsed());
    }
    summary(
        "raw: LeaseGrant + Txn put + Txn delete (+ revoke)",
        samples,
        start.elapsed(),
    )
}

async fn manager(
    endpoint: &str,
    configure: impl FnOnce(LockManagerBuilder) -> LockManagerBuilder,
) -> LockManager {
    let store = EtcdStore::connect(EtcdConfig::new([endpoint]))
        .await
        .unwrap();
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

/// Like [`leasehold_pairs`], for a read or a permit of a 3-permit semaphore.
async fn shared_pairs(label: &str, locks: &LockManager, mode: LockMode) -> Duration {
    let mut samples = Vec::with_capacity(ROUNDS);
    let start = Instant::now();
    for _ in 0..ROUNDS {
        let t = Instant::now();
        let guard = match mode.permits() {
            Some(permits) => locks.try_semaphore("uncontended-permit", permits).await,
            None => locks.try_read("uncontended-read").await,
        }
        .unwrap();
        assert!(guard.release().await.unwrap());
        samples.push(t.elapsed());
    }
    summary(label, samples, start.elapsed())
}

async fn hot_key(
    endpoint: &str,
    label: &str,
    configure: impl FnOnce(LockManagerBuilder) -> LockManagerBuilder,
) {
    let counting = CountingLayer::new();
    let requests = counting.counts();
    let locks = manager(endpoint, |b| configure(b.layer(counting))).await;
    let acquired = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let tasks: Vec<_> = (0..64)
        .map(|_| {
            let locks = locks.clone();
            let acquired = acquired.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let opts = LockOptions::new().wait(Duration::from_secs(30));
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
    let n = acquired.load(Ordering::Relaxed);
    println!(
        "hot key, 64 tasks, {label:<28} {:>7.0} acquisitions/s   {:>6.2} store requests per acquisition",
        n as f64 / elapsed.as_secs_f64(),
        requests.total() as f64 / n.max(1) as f64,
    );
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of benchmarks
    }
    let server = EtcdServer::start().expect("etcd (install Debian's etcd-server package)");
    let endpoint = server.endpoint();
    println!("etcd on {endpoint}; {ROUNDS} sequential rounds each\n");

    // Warm up both paths (connections, etcd's first compactions), then measure interleaved
    // halves so drift on a shared machine hits both sides alike.
    let bare = manager(&endpoint, |b| b).await;
    let stacked = manager(&endpoint, |b| b.default_layers()).await;
    raw_baseline(&endpoint).await;
    leasehold_pairs("(warm-up) leasehold, default stack", &stacked).await;
    println!();
    let raw = raw_baseline(&endpoint).await;
    leasehold_pairs("leasehold try_lock + release, bare store", &bare).await;
    let full = leasehold_pairs("leasehold try_lock + release, default stack", &stacked).await;
    let raw2 = raw_baseline(&endpoint).await;
    let full2 = leasehold_pairs("leasehold try_lock + release, default stack", &stacked).await;
    let raw = (raw + raw2) / 2;
    let full = (full + full2) / 2;
    println!(
        "\ndefault stack p50 / raw p50 = {:.3} (goal ≤ 1.05; mean of two interleaved runs each)\n",
        full.as_secs_f64() / raw.as_secs_f64()
    );

    shared_pairs(
        "leasehold try_read + release, default stack",
        &stacked,
        LockMode::Shared,
    )
    .await;
    let permit = LockMode::semaphore(3).unwrap();
    shared_pairs(
        "leasehold try_semaphore(3) + release, default stack",
        &stacked,
        permit,
    )
    .await;
    println!();

    hot_key(&endpoint, "bare store", |b| b).await;
    hot_key(&endpoint, "local competition", |b| b.default_layers()).await;
}
