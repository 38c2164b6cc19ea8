//! The uncontended lock cycle on every store, next to a raw baseline written with the same client
//! crate, in one run.
//!
//! Run: `cargo bench -p leasehold-bench --bench uncontended`
//! (`UNCONTENDED_ONLY=redis|etcd|aerospike` runs one store; `AEROSPIKE_HOSTS` adds a real
//! Aerospike cluster after the fixture; `UNCONTENDED_CYCLES=<n>:<row label's start>` runs the
//! rows so labelled `n` cycles each instead of the table, for an instruction count; the private
//! redis-server is then shut down with `SHUTDOWN NOSAVE`, so one started under a profiler by a
//! wrapper `redis-server` first on `PATH` writes the server's count too.) The
//! Aerospike rows run twice on the fixture: as it answers (in memory, on loopback: the client's
//! own cost per round trip), and with every reply held at least 1 ms (about 2 ms a round trip
//! with tokio's millisecond timer: a store across a network, where the round trips are the cost).
//!
//! One process, sequential cycles, nobody else on the key: acquire, then release. Each row locks
//! a key of its own, so that a background request of one row never lands in another's timing.
//! The rows of a store run in interleaved batches (a warm-up batch, then [`BATCHES`], each row
//! once per batch, in alternating order), so drift on a shared machine hits every row alike.
//! Each row reports the median over the batches of the batch's p50 per cycle, the spread of
//! those p50s, and its ratio to the raw baseline's median.
//!
//! The leasehold rows use the recommended manager (`LockManager::builder().store(..).build()`:
//! every layer on, the renewal watchdog on) and vary only what the row names:
//! - `try_lock` + `release`, and `lock()` + `release` (a blocking acquire that nobody makes wait);
//! - `fair(false)` and `fencing(false)`: the store built without its fleet-wide waiter line, or
//!   without fencing tokens;
//! - `without_layers, renewal(false)` (Redis and etcd): the manager's own step alone, no layer
//!   and no watchdog.
//!
//! The raw baselines, the cheapest correct cycle (owner-checked release) with the same crate:
//! - Redis (`redis`, one multiplexed connection): `SET key token NX PX 30000`, then the
//!   compare-and-delete script (`GET` = token → `DEL`): 2 round trips.
//! - etcd (`etcd-client`): one lease granted once and reused by every cycle; a `Txn` putting the
//!   token on that lease if the key's create revision is 0, then a `Txn` deleting the key if its
//!   value is the token: 2 Raft writes (leasehold's cycle too: it reuses a released hold's lease).
//! - Aerospike (`aerospike`): the Java lock manager's cycle, a create-only `put` of the lock
//!   record (the Java manager's bins and the owner token), then a `delete` filtered on the owner
//!   token (the Java manager's own delete is unfiltered; the filter is what makes it correct):
//!   2 round trips.
//!
//! Floor rows, the same crate again, measure what fencing and fair waiting cost the server before
//! any client code of leasehold's runs:
//! - Redis: the fewest commands a fenced, fair acquire needs (the line's head read, `SET NX PX`,
//!   the fence's `INCR`) as one script, and as one `MULTI` transaction (the script-free fast path
//!   a design could take while nobody waits), each with the raw release.
//! - etcd: leasehold's own two transactions as a plain try sends them, built by hand (the hold's
//!   compares against holders, readers and the line, the writer markers' delete, the record read
//!   that says why a refusal was refused; the owner-checked delete), and the same with the four
//!   reads a waiting attempt sends in its `else` branch instead (the record, the first holder,
//!   the writers' count, the line's head).
//!
//! After the timed batches, each store's rows run once more with the server's own count: Redis
//! commands per cycle (`INFO stats`, a script counting with the commands it runs) and the time
//! the Redis server spent running scripts and transactions per cycle (`INFO commandstats`:
//! `EVALSHA` and `EXEC`, each with the commands it runs), and Aerospike
//! round trips per cycle (data requests, as the fixture counts them; background requests that
//! land after the row's cycles count with the next row).

use std::time::{Duration, Instant};

use aerospike::expressions::{eq, string_bin, string_val};
use aerospike::policy::{AuthMode, Expiration, RecordExistsAction};
use aerospike::{as_bin, Client, ClientPolicy, Key, Value, WritePolicy};
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, Txn, TxnOp};
use leasehold::{LockManager, LockManagerBuilder, LockStore};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::aerospike::{AerospikeFixture, AerospikeTarget, Fault, Target};
use leasehold_testkit::etcd::EtcdServer;
use leasehold_testkit::redis::RedisServer;

/// Measured batches per row (after one warm-up batch).
const BATCHES: usize = 7;
const RELEASE_SCRIPT: &str =
    "if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end return 0";
/// The least a fenced, fair acquire can run as one script: nobody in line (`KEYS[3]`), the hold
/// set, the fence counter (`KEYS[2]`) moved with it.
const FLOOR_ACQUIRE_SCRIPT: &str = "if redis.call('LINDEX', KEYS[3], 0) then return false end \
    if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return false end \
    return redis.call('INCR', KEYS[2])";

/// How a raw Redis row acquires.
enum RawRedisAcquire {
    /// `SET key token NX PX 30000`: the raw baseline.
    Set,
    /// [`FLOOR_ACQUIRE_SCRIPT`]: the floor of any fenced, fair acquire written as a script.
    Script(redis::Script),
    /// The same three commands in a `MULTI` transaction: the floor of a script-free fast path
    /// (on its own it is not fair: a hold taken while the line is not empty would have to be
    /// given back).
    Multi,
}

/// Which transactions a raw etcd row sends.
#[derive(Clone, Copy, PartialEq)]
enum RawEtcdTxns {
    /// A put-if-absent and a compare-and-delete: the raw baseline.
    Raw,
    /// The floor: leasehold's transactions as a plain try sends them, built by hand (the
    /// acquire's `else` branch asks only whether the record exists).
    Floor,
    /// The floor with the reads a waiting attempt sends in its `else` branch instead.
    FloorWithReads,
}

/// One way to take and give back a lock.
enum Cycle {
    RawRedis {
        conn: redis::aio::MultiplexedConnection,
        acquire: RawRedisAcquire,
        release: redis::Script,
        key: String,
        /// The floor rows' fence counter and waiter line.
        fence: String,
        line: String,
    },
    RawEtcd {
        kv: Box<etcd_client::KvClient>,
        lease: i64,
        key: String,
        txns: RawEtcdTxns,
    },
    RawAerospike(Box<RawAerospike>),
    /// The store alone, no manager: `try_acquire` + `release`.
    Store(leasehold::BoxStore, String),
    Try(LockManager, String),
    Lock(LockManager, String),
}

struct RawAerospike {
    client: Client,
    key: Key,
    create: WritePolicy,
    farm: String,
}

impl Cycle {
    async fn run(&mut self, i: usize) {
        match self {
            Cycle::RawRedis {
                conn,
                acquire,
                release,
                key,
                fence,
                line,
            } => {
                let token = format!("raw-{i}");
                let taken = match acquire {
                    RawRedisAcquire::Set => redis::cmd("SET")
                        .arg(key.as_str())
                        .arg(&token)
                        .arg("NX")
                        .arg("PX")
                        .arg(30_000)
                        .query_async::<Option<String>>(conn)
                        .await
                        .expect("SET")
                        .is_some(),
                    RawRedisAcquire::Script(script) => script
                        .key(key.as_str())
                        .key(fence.as_str())
                        .key(line.as_str())
                        .arg(&token)
                        .arg(30_000)
                        .invoke_async::<Option<u64>>(conn)
                        .await
                        .expect("acquire script")
                        .is_some(),
                    RawRedisAcquire::Multi => {
                        let (set, head, _fence): (Option<String>, Option<String>, u64) =
                            redis::pipe()
                                .atomic()
                                .cmd("SET")
                                .arg(key.as_str())
                                .arg(&token)
                                .arg("NX")
                                .arg("PX")
                                .arg(30_000)
                                .cmd("LINDEX")
                                .arg(line.as_str())
                                .arg(0)
                                .cmd("INCR")
                                .arg(fence.as_str())
                                .query_async(conn)
                                .await
                                .expect("MULTI");
                        set.is_some() && head.is_none()
                    }
                };
                assert!(taken, "the raw key was free");
                let deleted: i64 = release
                    .key(key.as_str())
                    .arg(&token)
                    .invoke_async(conn)
                    .await
                    .expect("release script");
                assert_eq!(deleted, 1);
            }
            Cycle::RawEtcd {
                kv,
                lease,
                key,
                txns,
            } => {
                let floor = *txns != RawEtcdTxns::Raw;
                let token = format!("raw-{i}");
                let put = TxnOp::put(
                    key.as_str(),
                    token.as_str(),
                    Some(PutOptions::new().with_lease(*lease)),
                );
                let absent = |key: String| Compare::create_revision(key, CompareOp::Equal, 0);
                let acquire = if floor {
                    // No hold, no reader or permit holder, nobody in line; the hold, and the
                    // waiting writers' markers cleared.
                    Txn::new()
                        .when([
                            absent(key.clone()),
                            absent(format!("{key}#holder#")).with_prefix(),
                            absent(format!("{key}#waiter#")).with_prefix(),
                        ])
                        .and_then([
                            put,
                            TxnOp::delete(
                                format!("{key}#writer#"),
                                Some(DeleteOptions::new().with_prefix().with_prev_key()),
                            ),
                        ])
                        .or_else(if *txns == RawEtcdTxns::FloorWithReads {
                            let first = || {
                                GetOptions::new()
                                    .with_prefix()
                                    .with_keys_only()
                                    .with_limit(1)
                            };
                            vec![
                                TxnOp::get(key.as_str(), Some(GetOptions::new().with_count_only())),
                                TxnOp::get(format!("{key}#holder#"), Some(first())),
                                TxnOp::get(
                                    format!("{key}#writer#"),
                                    Some(GetOptions::new().with_prefix().with_count_only()),
                                ),
                                TxnOp::get(format!("{key}#waiter#"), Some(first())),
                            ]
                        } else {
                            vec![TxnOp::get(
                                key.as_str(),
                                Some(GetOptions::new().with_count_only()),
                            )]
                        })
                } else {
                    Txn::new().when([absent(key.clone())]).and_then([put])
                };
                assert!(kv.txn(acquire).await.expect("txn").succeeded());
                let delete = if floor {
                    Some(DeleteOptions::new().with_prev_key())
                } else {
                    None
                };
                let release = Txn::new()
                    .when([Compare::value(
                        key.as_str(),
                        CompareOp::Equal,
                        token.as_str(),
                    )])
                    .and_then([TxnOp::delete(key.as_str(), delete)]);
                assert!(kv.txn(release).await.expect("txn").succeeded());
            }
            Cycle::RawAerospike(raw) => {
                let token = format!("raw-{i}");
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis() as i64);
                let bins = [
                    as_bin!(format!("{}##data", raw.farm), 1),
                    as_bin!(format!("{}##uat", raw.farm), now_ms),
                    as_bin!("lh_token", token.as_str()),
                ];
                raw.client
                    .put(&raw.create, &raw.key, &bins)
                    .await
                    .expect("the raw key was free");
                let mut delete = WritePolicy::default();
                delete.base_policy.filter_expression =
                    Some(eq(string_bin("lh_token".to_owned()), string_val(token)));
                assert!(raw.client.delete(&delete, &raw.key).await.expect("delete"));
            }
            Cycle::Store(store, key) => {
                let key = leasehold::LockKey::dc("f1", "bench", key.as_str()).expect("key");
                let req = leasehold::core::Acquire::new(
                    key,
                    leasehold::OwnerToken::generate(),
                    Duration::from_secs(30),
                );
                let lease = store.try_acquire(&req).await.expect("store try_acquire");
                assert!(store.release(&lease).await.expect("store release"));
            }
            Cycle::Try(locks, key) => {
                let guard = locks.try_lock(key.as_str()).await.expect("try_lock");
                assert!(guard.release().await.expect("release"));
            }
            Cycle::Lock(locks, key) => {
                let guard = locks.lock(key.as_str()).await.expect("lock");
                assert!(guard.release().await.expect("release"));
            }
        }
    }
}

struct Row {
    label: String,
    cycle: Cycle,
    p50s: Vec<Duration>,
}

impl Row {
    fn new(label: impl Into<String>, cycle: Cycle) -> Row {
        Row {
            label: label.into(),
            cycle,
            p50s: Vec::new(),
        }
    }

    /// `n` cycles; the batch's p50.
    async fn batch(&mut self, n: usize) -> Duration {
        let mut samples = Vec::with_capacity(n);
        for i in 0..n {
            let t = Instant::now();
            self.cycle.run(i).await;
            samples.push(t.elapsed());
        }
        samples.sort_unstable();
        samples[samples.len() / 2]
    }
}

/// `UNCONTENDED_CYCLES=<n>:<row label's start>`: instead of the table, run the rows whose label
/// starts so `n` cycles each, untimed — for counting the client's instructions per cycle
/// (`valgrind --tool=callgrind`, two runs with different `n`: the difference divided by the
/// difference in `n` is one cycle's, the set-up cancelling out).
fn cycles_only() -> Option<(String, usize)> {
    let spec = std::env::var("UNCONTENDED_CYCLES").ok()?;
    let (n, label) = spec.split_once(':')?;
    Some((label.to_owned(), n.parse().ok()?))
}

fn median(values: &[Duration]) -> Duration {
    let mut v = values.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// A store's counters, read once before and once after a row's counted cycles: their names
/// (one column each) and a read of all of them.
type Counters<'a> = (&'a [&'a str], &'a dyn Fn() -> Vec<f64>);

/// Runs the rows in interleaved batches of `n` cycles and prints the table; the first row is the
/// raw baseline. `counted` runs each row once more under the server's count.
async fn measure(store: &str, rows: &mut [Row], n: usize, counted: Option<Counters<'_>>) {
    if let Some((label, cycles)) = cycles_only() {
        for row in rows.iter_mut().filter(|row| row.label.starts_with(&label)) {
            for i in 0..cycles {
                row.cycle.run(i).await;
            }
            println!("{store}: {cycles} cycles of {}", row.label);
        }
        return;
    }
    println!("\n{store}: {BATCHES} batches × {n} cycles per row (after a warm-up batch)");
    for batch in 0..=BATCHES {
        let order: Vec<usize> = if batch % 2 == 0 {
            (0..rows.len()).collect()
        } else {
            (0..rows.len()).rev().collect()
        };
        for i in order {
            let p50 = rows[i].batch(n).await;
            if batch > 0 {
                rows[i].p50s.push(p50);
            }
        }
    }
    // Per row, each counter's increase per cycle.
    let counts: Vec<Vec<f64>> = match counted {
        Some((_, count)) => {
            let mut counts = Vec::new();
            for row in rows.iter_mut() {
                let before = count();
                for i in 0..n {
                    row.cycle.run(i).await;
                }
                let after = count();
                counts.push(
                    after
                        .iter()
                        .zip(&before)
                        .map(|(a, b)| (a - b) / n as f64)
                        .collect(),
                );
            }
            counts
        }
        None => vec![Vec::new(); rows.len()],
    };
    let raw = median(&rows[0].p50s);
    let units = counted.map_or(String::new(), |(units, _)| units.join(" | "));
    println!(
        "| {:<50} | {:>8} | {:>17} | {:>5} | {units} |",
        "cycle", "p50 µs", "batch p50s µs", "× raw"
    );
    for (row, count) in rows.iter().zip(counts) {
        let (lo, hi) = (
            row.p50s.iter().min().copied().unwrap_or_default(),
            row.p50s.iter().max().copied().unwrap_or_default(),
        );
        let p50 = median(&row.p50s);
        println!(
            "| {:<50} | {:>8.1} | {:>7.1} – {:>7.1} | {:>5.2} | {} |",
            row.label,
            us(p50),
            us(lo),
            us(hi),
            p50.as_secs_f64() / raw.as_secs_f64(),
            count
                .iter()
                .map(|c| format!("{c:.2}"))
                .collect::<Vec<_>>()
                .join(" | "),
        );
    }
}

fn manager(
    store: impl leasehold::LockStore,
    configure: impl FnOnce(LockManagerBuilder) -> LockManagerBuilder,
) -> LockManager {
    configure(
        LockManager::builder()
            .client_id("bench")
            .farm_id("f1")
            .store(store),
    )
    .build()
    .expect("manager")
}

/// The rows every store has: `try_lock` and `lock()` for each named store configuration.
fn leasehold_rows(configs: Vec<(&str, LockManager)>, prefix: &str) -> Vec<Row> {
    let mut rows = Vec::new();
    for (name, locks) in configs {
        let key = |kind: &str| format!("{prefix}-{}-{kind}", name.replace([' ', '(', ')'], ""));
        rows.push(Row::new(
            format!("leasehold {name}: try_lock + release"),
            Cycle::Try(locks.clone(), key("try")),
        ));
        rows.push(Row::new(
            format!("leasehold {name}: lock() + release"),
            Cycle::Lock(locks, key("lock")),
        ));
    }
    rows
}

async fn redis_rows() {
    let server = match RedisServer::start() {
        Ok(server) => server,
        Err(e) => return println!("\nredis: skipped, no redis-server ({e})"),
    };
    let url = server.url();
    let client = redis::Client::open(url.as_str()).expect("redis url");
    let conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("redis connection");
    let store = |configure: fn(RedisConfig) -> RedisConfig| {
        let url = url.clone();
        async move {
            RedisStore::connect(configure(RedisConfig::new(url)))
                .await
                .expect("redis store")
        }
    };
    let configs = vec![
        ("default", manager(store(|c| c).await, |b| b)),
        (
            "fair(false)",
            manager(store(|c| c.fair(false)).await, |b| b),
        ),
        (
            "fencing(false)",
            manager(store(|c| c.fencing(false)).await, |b| b),
        ),
    ];
    let raw = |acquire, key: &str| Cycle::RawRedis {
        conn: conn.clone(),
        acquire,
        release: redis::Script::new(RELEASE_SCRIPT),
        key: key.to_owned(),
        fence: format!("{key}:fence"),
        line: format!("{key}:line"),
    };
    let mut rows = vec![
        Row::new(
            "raw: SET NX PX + compare-and-delete script",
            raw(RawRedisAcquire::Set, "bench:raw"),
        ),
        Row::new(
            "floor, script: LINDEX, SET NX PX, INCR + release",
            raw(
                RawRedisAcquire::Script(redis::Script::new(FLOOR_ACQUIRE_SCRIPT)),
                "bench:floor-script",
            ),
        ),
        Row::new(
            "floor, MULTI: SET NX PX, LINDEX, INCR + release",
            raw(RawRedisAcquire::Multi, "bench:floor-multi"),
        ),
    ];
    rows.push(Row::new(
        "the store alone (no manager): try_acquire + release",
        Cycle::Store(
            leasehold::BoxStore::new(store(|c| c).await),
            "bench-store".to_owned(),
        ),
    ));
    rows.extend(leasehold_rows(configs, "bench"));
    rows.extend(leasehold_rows(
        vec![(
            "without_layers, renewal(false)",
            manager(store(|c| c).await, |b| b.without_layers().renewal(false)),
        )],
        "bench",
    ));
    println!(
        "\nredis-server {} on {url}",
        server
            .info_field("server", "redis_version")
            .unwrap_or_default()
    );
    // The server's commands (the INFO call itself is one), and the time it spent running
    // scripts and transactions (`EVALSHA` and `EXEC`, the commands they run included; Redis's own
    // measure, without reading requests and writing replies): the raw cycle's release, the
    // floors' acquire and release, leasehold's acquire and release. One INFO call reads both.
    let counters = || -> Vec<f64> {
        let info = server
            .command(&["INFO", "stats", "commandstats"])
            .unwrap_or_default();
        let commands = info
            .lines()
            .find_map(|line| line.strip_prefix("total_commands_processed:"))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        let usec = |command: &str| {
            info.lines()
                .find_map(|line| line.strip_prefix(command))
                .and_then(|stats| stats.split(',').find_map(|f| f.strip_prefix("usec=")))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        // A transaction's `EXEC`, as a script's `EVALSHA`, counts the commands it runs.
        vec![
            commands - 1.0,
            usec("cmdstat_evalsha:") + usec("cmdstat_exec:"),
        ]
    };
    measure(
        "redis",
        &mut rows,
        400,
        Some((
            &["Redis commands / cycle", "µs in scripts and EXEC / cycle"],
            &counters,
        )),
    )
    .await;
    if cycles_only().is_some() {
        // Ends the server on its own terms, not by a kill, so a `redis-server` run under a
        // profiler (a wrapper first on `PATH` that starts it under `valgrind --tool=callgrind`)
        // writes its counts: the server's instructions per cycle, as the client's.
        let _ = server.command(&["SHUTDOWN", "NOSAVE"]);
    }
}

async fn etcd_rows() {
    let server = match EtcdServer::start() {
        Ok(server) => server,
        Err(e) => return println!("\netcd: skipped, no etcd ({e})"),
    };
    let endpoint = server.endpoint();
    let client = etcd_client::Client::connect([endpoint.as_str()], None)
        .await
        .expect("etcd client");
    // Granted once, for longer than the run: every raw cycle puts its key on it.
    let lease = client
        .lease_client()
        .grant(600, None)
        .await
        .expect("lease grant")
        .id();
    let store = EtcdStore::connect(EtcdConfig::new([endpoint.as_str()]))
        .await
        .expect("etcd store");
    let raw = |key: &str, txns| Cycle::RawEtcd {
        kv: Box::new(client.kv_client()),
        lease,
        key: key.to_owned(),
        txns,
    };
    let mut rows = vec![
        Row::new(
            "raw: put-if-absent Txn (reused lease) + delete Txn",
            raw("bench:raw", RawEtcdTxns::Raw),
        ),
        Row::new(
            "floor: leasehold's two Txns, by hand (reused lease)",
            raw("bench:floor", RawEtcdTxns::Floor),
        ),
        Row::new(
            "floor + a waiting attempt's refusal reads",
            raw("bench:floor-reads", RawEtcdTxns::FloorWithReads),
        ),
        Row::new(
            "the store alone (no manager): try_acquire + release",
            Cycle::Store(
                leasehold::BoxStore::new(store.clone()),
                "bench-store".to_owned(),
            ),
        ),
    ];
    rows.extend(leasehold_rows(
        vec![
            ("default", manager(store.clone(), |b| b)),
            (
                "without_layers, renewal(false)",
                manager(store, |b| b.without_layers().renewal(false)),
            ),
        ],
        "bench",
    ));
    println!("\netcd on {endpoint} (one member, fsync on)");
    measure("etcd", &mut rows, 100, None).await;
}

/// The Aerospike rows against `hosts` (the fixture, or a real cluster).
async fn aerospike_rows(
    label: &str,
    hosts: &str,
    namespace: &str,
    credentials: Option<(&str, &str)>,
    unique: &dyn Fn(&str) -> String,
    requests: Option<&dyn Fn() -> u64>,
    cycles: usize,
) {
    let mut policy = ClientPolicy::default();
    if let Some((user, password)) = credentials {
        policy.auth_mode = AuthMode::Internal(user.to_owned(), password.to_owned());
    }
    let client = Client::new(&policy, &hosts.to_owned())
        .await
        .expect("aerospike client");
    let raw = RawAerospike {
        client,
        key: Key::new(namespace, "DC#f1#raw", Value::from(unique("bench#raw"))).expect("key"),
        create: WritePolicy {
            record_exists_action: RecordExistsAction::CreateOnly,
            expiration: Expiration::Seconds(30),
            send_key: true,
            ..WritePolicy::default()
        },
        farm: "f1".to_owned(),
    };
    let store = |configure: fn(AerospikeConfig) -> AerospikeConfig| {
        let mut config = AerospikeConfig::new(hosts, namespace, "f1");
        if let Some((user, password)) = credentials {
            config = config.credentials(user, password);
        }
        async move {
            AerospikeStore::connect(configure(config))
                .await
                .expect("aerospike store")
        }
    };
    let configs = vec![
        ("default", manager(store(|c| c).await, |b| b)),
        (
            "fair(false)",
            manager(store(|c| c.fair(false)).await, |b| b),
        ),
        (
            "fencing(false)",
            manager(store(|c| c.fencing(false)).await, |b| b),
        ),
        (
            "fair(false), fencing(false)",
            manager(store(|c| c.fair(false).fencing(false)).await, |b| b),
        ),
    ];
    let mut rows = vec![Row::new(
        "raw: create-only put + filtered delete (Java's)",
        Cycle::RawAerospike(Box::new(raw)),
    )];
    rows.extend(leasehold_rows(configs, &unique("bench")));
    println!("\n{label} at {hosts}, namespace {namespace}");
    let counters = requests.map(|count| move || vec![count() as f64]);
    let counted = counters
        .as_ref()
        .map(|count| (&["round trips / cycle"][..], count as &dyn Fn() -> Vec<f64>));
    measure(label, &mut rows, cycles, counted).await;
}

fn wanted(store: &str) -> bool {
    std::env::var("UNCONTENDED_ONLY").map_or(true, |only| only.split(',').any(|s| s == store))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo test --benches` asks for the list of benchmarks
    }
    println!("uncontended acquire + release, one process, sequential cycles");
    let started = Instant::now();
    if wanted("redis") {
        redis_rows().await;
    }
    if wanted("etcd") {
        etcd_rows().await;
    }
    if wanted("aerospike") {
        // The fixture serves from a runtime of its own (one thread), as a server process would,
        // instead of sharing the client's workers.
        let server_rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("aerospike-fixture")
            .enable_all()
            .build()
            .expect("fixture runtime");
        let fixture = server_rt
            .spawn(AerospikeFixture::start())
            .await
            .expect("fixture task")
            .expect("start the fixture");
        let requests = || fixture.requests();
        aerospike_rows(
            "aerospike (wire fixture)",
            &fixture.host_string(),
            fixture.namespace(),
            None,
            &|name: &str| name.to_owned(),
            Some(&requests),
            1000,
        )
        .await;
        // The same rows against a store across a network (every data request answered at least
        // 1 ms late, the fixture's timer resolution): what round trips cost when the network,
        // not the client, is the price of each.
        let late = fixture.faults().inject(
            Fault::DelayReply(Duration::from_millis(1)),
            Target::NextRequests(u32::MAX),
        );
        aerospike_rows(
            "aerospike (wire fixture, replies 1 ms late)",
            &fixture.host_string(),
            fixture.namespace(),
            None,
            &|name: &str| format!("{name}-late"),
            Some(&requests),
            40,
        )
        .await;
        fixture.faults().remove(late);
        if std::env::var("AEROSPIKE_HOSTS").is_ok_and(|h| !h.trim().is_empty()) {
            let target = AerospikeTarget::from_env().await.expect("target");
            aerospike_rows(
                "aerospike (cluster)",
                target.hosts(),
                target.namespace(),
                target.credentials(),
                &|name: &str| target.unique(name),
                None,
                200,
            )
            .await;
        }
        drop(fixture);
        server_rt.shutdown_background();
    }
    println!("\n(whole run: {:.0} s)", started.elapsed().as_secs_f64());
}
