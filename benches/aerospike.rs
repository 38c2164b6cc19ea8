//! Aerospike benchmark, against the wire-protocol fixture (`leasehold-testkit`) on loopback.
//!
//! Run: `cargo bench -p leasehold-bench --bench aerospike`
//!
//! One uncontended acquire + release, side by side in one run on the same fixture:
//! - `raw`: the `aerospike` client alone, a create-only `put` then a `delete` filtered on the
//!   owner token — the cheapest cycle with owner-checked release (2 round trips);
//! - `unfenced`: leasehold's store with `fencing(false)`: the Java manager's cycle, with fair
//!   waiting's line read in the create's request (2 round trips);
//! - `fenced`: leasehold's store with fencing in hold order: the create (reading the line and the
//!   fence record's generation in the same request), the generation-checked fence increment, then
//!   the filtered delete (3 round trips);
//! - `traced`: `fencing(false)` with the lock trace on: each of the two operations is followed by
//!   the history record's `operate` (4 round trips); with the default bound (the history list at
//!   its 100 entries, rewritten by every entry) and with a bound of 1 (the round trip alone).
//!
//! After the criterion groups it prints the data requests per cycle, counted by the fixture.
//! The fixture answers from memory on the same machine, so the numbers are the client's and the
//! loopback's cost per round trip; against a real cluster each round trip adds its network time.

use std::hint::black_box;
use std::time::{Duration, Instant};

use aerospike::expressions::{eq, string_bin, string_val};
use aerospike::policy::{Expiration, RecordExistsAction};
use aerospike::{as_bin, Client, ClientPolicy, Key, Value, WritePolicy};
use criterion::Criterion;
use leasehold::core::{Acquire, TraceConfig};
use leasehold::{LockKey, LockStore, OwnerToken};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::{AerospikeFixture, Fault, Target};

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime")
}

struct Raw {
    client: Client,
    key: Key,
    create: WritePolicy,
}

impl Raw {
    async fn new(hosts: &str) -> Raw {
        let client = Client::new(&ClientPolicy::default(), &hosts.to_owned())
            .await
            .expect("connect");
        let key = Key::new("test", "DC#f1#raw", Value::from("bench#raw")).expect("key");
        let create = WritePolicy {
            record_exists_action: RecordExistsAction::CreateOnly,
            expiration: Expiration::Seconds(30),
            send_key: true,
            ..WritePolicy::default()
        };
        Raw {
            client,
            key,
            create,
        }
    }

    async fn cycle(&self, token: &str) {
        let bins = [
            as_bin!("f1##data", 1),
            as_bin!("f1##uat", 0),
            as_bin!("lh_token", token),
        ];
        self.client
            .put(&self.create, &self.key, &bins)
            .await
            .expect("free key");
        let mut delete = WritePolicy::default();
        delete.base_policy.filter_expression = Some(eq(
            string_bin("lh_token".to_owned()),
            string_val(token.to_owned()),
        ));
        assert!(self
            .client
            .delete(&delete, &self.key)
            .await
            .expect("delete"));
    }
}

async fn store(hosts: &str, fencing: bool) -> AerospikeStore {
    AerospikeStore::connect(AerospikeConfig::new(hosts, "test", "f1").fencing(fencing))
        .await
        .expect("connect")
}

async fn store_cycle(store: &AerospikeStore, req: &Acquire) {
    let lease = store.try_acquire(req).await.expect("free key");
    black_box(store.release(&lease).await.expect("release"));
}

fn request(entity: &str) -> Acquire {
    Acquire::new(
        LockKey::dc("f1", "bench", entity).expect("key"),
        OwnerToken::generate(),
        Duration::from_secs(30),
    )
}

fn main() {
    let rt = runtime();
    let fixture = rt
        .block_on(AerospikeFixture::start())
        .expect("start the fixture");
    let hosts = fixture.host_string();
    let raw = rt.block_on(Raw::new(&hosts));
    let fenced = rt.block_on(store(&hosts, true));
    let unfenced = rt.block_on(store(&hosts, false));
    let (req_fenced, req_unfenced) = (request("fenced"), request("unfenced"));
    let req_traced = request("traced").with_trace(Some(TraceConfig::default()));
    let one_entry = TraceConfig::new(1, Duration::from_secs(3600)).expect("trace config");
    let req_traced_1 = request("traced-1").with_trace(Some(one_entry));

    let mut criterion = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(4))
        .configure_from_args();
    let mut group = criterion.benchmark_group("aerospike_cycle");
    group.bench_function("raw create-only + filtered delete", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    raw.cycle("raw-token").await;
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("leasehold fencing(false)", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    store_cycle(&unfenced, &req_unfenced).await;
                }
                start.elapsed()
            })
        })
    });
    group.bench_function("leasehold fenced (hold order)", |b| {
        b.iter_custom(|iters| {
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    store_cycle(&fenced, &req_fenced).await;
                }
                start.elapsed()
            })
        })
    });
    for (name, req) in [
        ("leasehold fencing(false), traced (100)", &req_traced),
        ("leasehold fencing(false), traced (1)", &req_traced_1),
    ] {
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                rt.block_on(async {
                    let start = Instant::now();
                    for _ in 0..iters {
                        store_cycle(&unfenced, req).await;
                    }
                    start.elapsed()
                })
            })
        });
    }
    group.finish();
    criterion.final_summary();

    // Round trips per cycle, counted by the fixture: a pass-through rule sees every data request.
    const CYCLES: u32 = 100;
    let count = |label: &str, run: &dyn Fn()| {
        let rule = fixture
            .faults()
            .inject(Fault::PassThrough, Target::NextRequests(u32::MAX));
        let before = fixture.faults().applied();
        run();
        let requests = fixture.faults().applied() - before;
        fixture.faults().remove(rule);
        println!(
            "{label:<40} {:.2} round trips per acquire + release",
            requests as f64 / f64::from(CYCLES)
        );
    };
    count("raw create-only + filtered delete", &|| {
        rt.block_on(async {
            for _ in 0..CYCLES {
                raw.cycle("raw-token").await;
            }
        })
    });
    count("leasehold fencing(false)", &|| {
        rt.block_on(async {
            for _ in 0..CYCLES {
                store_cycle(&unfenced, &req_unfenced).await;
            }
        })
    });
    count("leasehold fenced (hold order)", &|| {
        rt.block_on(async {
            for _ in 0..CYCLES {
                store_cycle(&fenced, &req_fenced).await;
            }
        })
    });
    count("leasehold fencing(false), traced", &|| {
        rt.block_on(async {
            for _ in 0..CYCLES {
                store_cycle(&unfenced, &req_traced).await;
            }
        })
    });
}
