//! Benchmarks of the scenario layers (docs/PERFORMANCE.md has the numbers, docs/LAYERS.md how to
//! read them).
//!
//! Run: `cargo bench -p leasehold-bench --bench layers` (its own package, so tokio is built
//! without the `test-util` feature the test suites enable, as in a production build).
//!
//! (a) `uncontended/*` (criterion): one try-acquire + release of a free key, on a raw dashmap
//!     insert + remove (the floor), on the bare embedded store, and through the full default
//!     stack, store level (as the builder assembles it, and by hand without type erasure) and
//!     manager level. `per_layer/*`: each layer alone over the embedded store. `parts/*`: the
//!     building blocks every acquire + release pays for (clock reads, maps, tokens): what the
//!     default stack's cost is made of.
//! (b) hand-off latency (printed): a holder releases, a task waiting in `lock()` holds the lock;
//!     p50/p99 over many rounds, with local competition off, on, and on with hand-off.
//! (c) hot key (printed): 64 tasks × many acquisitions of one key over a request-counting store
//!     (first, the floor: the same on tokio's FIFO `Mutex`, no store):
//!     acquisitions per second and store requests per acquisition, local competition off / on /
//!     on with hand-off. Each critical section awaits once (`yield_now`), as a real one that does
//!     I/O does: the others then queue, and every release hands over to the next in line.
//!
//! For a profiler, `HOT_ONLY="<row label>"` (e.g. `HOT_ONLY="local competition on"`) runs the
//! floor and that one hot-key row of (c), without (b): `perf record` or `valgrind
//! --tool=callgrind` then sees only it. `HOT_PER_TASK=<n>` sets the acquisitions per task (200),
//! and `HOT_EMPTY=1` leaves the critical sections of (c) empty (no await: how rounds before
//! 2026-11-24 measured, where a releasing task could take the key straight back).

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::Criterion;
use dashmap::DashMap;
use leasehold::core::{Acquire, Attempt, Layer};
use leasehold::layers::{
    CountingLayer, GracefulShutdownLayer, LocalCompetitionLayer, ReadbackLayer, ReentrancyLayer,
    UnlockWindowLayer,
};
use leasehold::{LockKey, LockManager, LockManagerBuilder, LockStore, MemoryStore, OwnerToken};

fn current_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

fn multi_thread() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// The bare manager, as every earlier run measured it: no scenario layer, no renewal watchdog.
/// Layers are turned on explicitly per measurement, so the labels say what runs.
fn bare() -> LockManagerBuilder {
    LockManager::builder()
        .client_id("bench")
        .farm_id("f1")
        .lock_ttl(Duration::from_secs(30))
        .without_layers()
        .renewal(false)
}

/// `LockManager::builder().build()` as a user gets it: every layer and the renewal watchdog.
fn recommended() -> LockManagerBuilder {
    LockManager::builder()
        .client_id("bench")
        .farm_id("f1")
        .lock_ttl(Duration::from_secs(30))
}

/// Times `iters` acquire + release pairs through `store`, inside one `block_on`.
fn store_pairs<S: LockStore>(rt: &tokio::runtime::Runtime, store: &S, iters: u64) -> Duration {
    let req = Acquire::new(
        LockKey::dc("f1", "bench", "uncontended").expect("key"),
        OwnerToken::generate(),
        Duration::from_secs(30),
    );
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            // The store's own operation (what the manager calls): `try_acquire` only reads its
            // answer for callers that make one attempt.
            let Attempt::Granted(lease) = store.acquire(&req).await.expect("free key") else {
                panic!("the key is free");
            };
            black_box(store.release(&lease).await.expect("release"));
        }
        start.elapsed()
    })
}

fn manager_pairs(rt: &tokio::runtime::Runtime, locks: &LockManager, iters: u64) -> Duration {
    rt.block_on(async {
        let key = locks.key("uncontended").expect("key");
        let start = Instant::now();
        for _ in 0..iters {
            let guard = locks.try_lock(&key).await.expect("free key");
            black_box(guard.release().await.expect("release"));
        }
        start.elapsed()
    })
}

fn uncontended(c: &mut Criterion) {
    let rt = current_thread();
    let mut group = c.benchmark_group("uncontended");
    group.bench_function("floor_dashmap_insert_remove", |b| {
        let map: DashMap<LockKey, OwnerToken> = DashMap::new();
        let key = LockKey::dc("f1", "bench", "uncontended").expect("key");
        let token = OwnerToken::generate();
        b.iter_custom(|iters| {
            let start = Instant::now();
            for _ in 0..iters {
                map.insert(key.clone(), token.clone());
                black_box(map.remove(&key));
            }
            start.elapsed()
        })
    });
    group.bench_function("store_bare_memory", |b| {
        let store = MemoryStore::new();
        b.iter_custom(|iters| store_pairs(&rt, &store, iters))
    });
    group.bench_function("store_default_stack", |b| {
        let locks = bare().default_layers().build().expect("manager");
        let store = locks.store().clone();
        b.iter_custom(|iters| store_pairs(&rt, &store, iters))
    });
    group.bench_function("store_default_stack_by_hand", |b| {
        let store = ReentrancyLayer::default().layer(
            LocalCompetitionLayer::default().layer(
                GracefulShutdownLayer::new().layer(
                    UnlockWindowLayer::default()
                        .layer(ReadbackLayer::default().layer(MemoryStore::new())),
                ),
            ),
        );
        b.iter_custom(|iters| store_pairs(&rt, &store, iters))
    });
    group.bench_function("manager_bare_memory", |b| {
        let locks = bare().build().expect("manager");
        b.iter_custom(|iters| manager_pairs(&rt, &locks, iters))
    });
    group.bench_function("manager_default_stack", |b| {
        let locks = bare().default_layers().build().expect("manager");
        b.iter_custom(|iters| manager_pairs(&rt, &locks, iters))
    });
    group.bench_function("manager_recommended_defaults", |b| {
        let locks = recommended().build().expect("manager");
        b.iter_custom(|iters| manager_pairs(&rt, &locks, iters))
    });
    group.finish();
}

/// What each layer alone adds over the bare store (store level, no type erasure).
fn per_layer(c: &mut Criterion) {
    let rt = current_thread();
    let mut group = c.benchmark_group("per_layer");
    macro_rules! alone {
        ($name:literal, $layer:expr) => {
            group.bench_function($name, |b| {
                let store = $layer.layer(MemoryStore::new());
                b.iter_custom(|iters| store_pairs(&rt, &store, iters))
            });
        };
    }
    alone!("readback", ReadbackLayer::default());
    alone!("unlock_window", UnlockWindowLayer::default());
    alone!("graceful_shutdown", GracefulShutdownLayer::new());
    alone!("local_competition", LocalCompetitionLayer::default());
    alone!("reentrancy", ReentrancyLayer::default());
    alone!("counting", CountingLayer::default());
    group.finish();
}

/// The building blocks: what one clock read, one token, one map insert + remove and one cache
/// lookup cost here. The embedded store and the layers are sums of these.
fn parts(c: &mut Criterion) {
    let mut group = c.benchmark_group("parts");
    let key = LockKey::dc("f1", "bench", "uncontended").expect("key");
    let token = OwnerToken::generate();
    group.bench_function("clock_read", |b| b.iter(tokio::time::Instant::now));
    group.bench_function("owner_token", |b| b.iter(OwnerToken::generate));
    group.bench_function("dashmap_siphash_insert_remove", |b| {
        let map: DashMap<LockKey, OwnerToken> = DashMap::new();
        b.iter(|| {
            map.insert(key.clone(), token.clone());
            black_box(map.remove(&key))
        })
    });
    group.bench_function("dashmap_foldhash_insert_remove", |b| {
        let map: DashMap<LockKey, OwnerToken, foldhash::fast::RandomState> = DashMap::default();
        b.iter(|| {
            map.insert(key.clone(), token.clone());
            black_box(map.remove(&key))
        })
    });
    group.bench_function("dashmap_foldhash_get", |b| {
        let map: DashMap<LockKey, Arc<u64>, foldhash::fast::RandomState> = DashMap::default();
        map.insert(key.clone(), Arc::new(1));
        b.iter(|| black_box(map.get(&key).map(|v| v.clone())))
    });
    group.bench_function("moka_get", |b| {
        let cache: moka::sync::Cache<LockKey, Arc<u64>> = moka::sync::Cache::new(10_000);
        cache.insert(key.clone(), Arc::new(1));
        b.iter(|| black_box(cache.get(&key)))
    });
    group.bench_function("moka_insert_invalidate", |b| {
        let cache: moka::sync::Cache<LockKey, Arc<u64>> = moka::sync::Cache::new(10_000);
        let value = Arc::new(1);
        b.iter(|| {
            cache.insert(key.clone(), value.clone());
            cache.invalidate(&key)
        })
    });
    group.finish();
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index]
}

/// (b) A holder releases; a task waiting in `lock()` gets the lock. Returns sorted latencies.
fn hand_off_latency(label: &str, builder: LockManagerBuilder, rounds: usize) {
    if rounds == 0 {
        return;
    }
    let rt = multi_thread();
    let locks = builder.build().expect("manager");
    let mut samples = rt.block_on(async {
        let key = locks.key("handoff").expect("key");
        let mut samples = Vec::with_capacity(rounds);
        let mut guard = locks.try_lock(&key).await.expect("first");
        for _ in 0..rounds {
            let (tx, rx) = tokio::sync::oneshot::channel();
            let waiter = {
                let locks = locks.clone();
                let key = key.clone();
                tokio::spawn(async move {
                    let guard = locks.lock(&key).await.expect("waiter gets it");
                    let _ = tx.send(Instant::now());
                    guard
                })
            };
            // Let the waiter park (its first attempt fails: the key is held).
            tokio::time::sleep(Duration::from_micros(200)).await;
            let released_at = Instant::now();
            guard.release().await.expect("release");
            let acquired_at = rx.await.expect("waiter reports");
            samples.push(acquired_at.saturating_duration_since(released_at));
            guard = waiter.await.expect("waiter task");
        }
        guard.release().await.expect("release");
        samples
    });
    samples.sort();
    println!(
        "hand-off latency [{label}]: p50 {:?}  p90 {:?}  p99 {:?}  ({rounds} rounds)",
        percentile(&samples, 0.5),
        percentile(&samples, 0.9),
        percentile(&samples, 0.99)
    );
}

/// A store one network round trip away: every request waits `rtt` first.
#[derive(Debug, Clone)]
struct Remote<S> {
    inner: S,
    rtt: Duration,
}

impl<S: LockStore> leasehold::core::LayeredStore for Remote<S> {
    type Inner = S;
    fn inner(&self) -> &S {
        &self.inner
    }
    fn name(&self) -> &'static str {
        "remote"
    }
    async fn acquire(&self, req: &Acquire) -> leasehold::Result<leasehold::core::Attempt> {
        tokio::time::sleep(self.rtt).await;
        self.inner.acquire(req).await
    }
    async fn release(&self, lease: &leasehold::Lease) -> leasehold::Result<bool> {
        tokio::time::sleep(self.rtt).await;
        self.inner.release(lease).await
    }
    async fn extend(
        &self,
        lease: &leasehold::Lease,
        ttl: Duration,
    ) -> leasehold::Result<leasehold::Lease> {
        tokio::time::sleep(self.rtt).await;
        self.inner.extend(lease, ttl).await
    }
    async fn inspect(&self, key: &LockKey) -> leasehold::Result<Option<leasehold::LockInfo>> {
        tokio::time::sleep(self.rtt).await;
        self.inner.inspect(key).await
    }
}

fn remote(builder: LockManagerBuilder) -> LockManagerBuilder {
    builder.store(Remote {
        inner: MemoryStore::new(),
        rtt: Duration::from_millis(1),
    })
}

/// (c) 64 tasks × `per_task` acquisitions of one key, one await inside each critical section
/// (none with `HOT_EMPTY`).
fn hot_key(label: &str, builder: LockManagerBuilder, per_task: usize) {
    const TASKS: usize = 64;
    if std::env::var("HOT_ONLY").is_ok_and(|only| only != label) {
        return;
    }
    let yield_inside = std::env::var_os("HOT_EMPTY").is_none();
    let rt = multi_thread();
    let counting = CountingLayer::new();
    let counts = counting.counts();
    let locks = builder.layer(counting).build().expect("manager");
    let elapsed = rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let locks = locks.clone();
                tokio::spawn(async move {
                    for _ in 0..per_task {
                        let guard = locks.lock("hot").await.expect("hot lock");
                        black_box(guard.fencing_token());
                        if yield_inside {
                            tokio::task::yield_now().await;
                        }
                        guard.release().await.expect("release");
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        start.elapsed()
    });
    let acquisitions = (TASKS * per_task) as f64;
    println!(
        "hot key [{label}]: {:.0} acquisitions/s; store requests per acquisition: {:.3} \
         (acquire {:.3}, release {:.3}, extend {:.3})",
        acquisitions / elapsed.as_secs_f64(),
        counts.total() as f64 / acquisitions,
        counts.acquires() as f64 / acquisitions,
        counts.releases() as f64 / acquisitions,
        counts.extends() as f64 / acquisitions,
    );
}

/// The floor under (c): 64 tasks × `per_task` lock + unlock of one in-process async mutex, no
/// store. tokio's `Mutex` serves waiters in FIFO order, as local competition's line does; with
/// one await inside the critical section (without it, a task never holds the mutex across a
/// yield and nobody ever waits), every release hands over to the oldest waiter, which must be
/// woken: what a fair hand-over costs on a 2-worker runtime, without any lock-store work.
fn hot_key_floor(per_task: usize) {
    const TASKS: usize = 64;
    let rt = multi_thread();
    let mutex = std::sync::Arc::new(tokio::sync::Mutex::new(0u64));
    let elapsed = rt.block_on(async {
        let start = Instant::now();
        let tasks: Vec<_> = (0..TASKS)
            .map(|_| {
                let mutex = mutex.clone();
                tokio::spawn(async move {
                    for _ in 0..per_task {
                        let mut held = mutex.lock().await;
                        *held += 1;
                        black_box(*held);
                        // One await while holding, as any real critical section has: the
                        // others queue, and every release hands over to the oldest waiter.
                        tokio::task::yield_now().await;
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.expect("task");
        }
        start.elapsed()
    });
    println!(
        "hot key floor [tokio::sync::Mutex, FIFO, no store]: {:.0} acquisitions/s",
        (TASKS * per_task) as f64 / elapsed.as_secs_f64(),
    );
}

fn main() {
    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .configure_from_args();
    uncontended(&mut criterion);
    per_layer(&mut criterion);
    parts(&mut criterion);
    criterion.final_summary();

    // The printed measurements run without a criterion filter, or with the filter `printed`.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    if !(filters.is_empty() || filters.iter().any(|f| f == "printed")) {
        return;
    }

    let rounds = if std::env::var("HOT_ONLY").is_ok() {
        0
    } else {
        2000
    };
    hand_off_latency("local competition off", bare(), rounds);
    hand_off_latency(
        "local competition on",
        bare().local_competition(LocalCompetitionLayer::new()),
        rounds,
    );
    hand_off_latency(
        "local competition on, hand-off",
        bare().local_competition(LocalCompetitionLayer::new().hand_off(true)),
        rounds,
    );
    hand_off_latency("default stack", bare().default_layers(), rounds);
    hand_off_latency(
        "default stack + hand-off",
        bare()
            .default_layers()
            .local_competition(LocalCompetitionLayer::new().hand_off(true)),
        rounds,
    );

    let per_task = std::env::var("HOT_PER_TASK")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(200);
    hot_key_floor(per_task);
    hot_key("local competition off", bare(), per_task);
    hot_key(
        "local competition on",
        bare().local_competition(LocalCompetitionLayer::new()),
        per_task,
    );
    hot_key(
        "local competition on, hand-off",
        bare().local_competition(LocalCompetitionLayer::new().hand_off(true)),
        per_task,
    );
    hot_key(
        "default stack + hand-off",
        bare()
            .default_layers()
            .local_competition(LocalCompetitionLayer::new().hand_off(true)),
        per_task,
    );
    hot_key("recommended defaults", recommended(), per_task);

    // The same over a store 1 ms away (tokio's timer granularity): where local competition pays.
    let per_task = 5;
    hot_key(
        "1 ms store, local competition off",
        remote(bare()),
        per_task,
    );
    hot_key(
        "1 ms store, local competition on",
        remote(bare()).local_competition(LocalCompetitionLayer::new()),
        per_task,
    );
    hot_key(
        "1 ms store, local competition on, hand-off",
        remote(bare()).local_competition(LocalCompetitionLayer::new().hand_off(true)),
        per_task,
    );
}
