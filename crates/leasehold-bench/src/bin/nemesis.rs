//! `nemesis`: a Jepsen-style run against one store — worker processes take one lock and write to
//! a fenced resource under it while faults are injected into the store's nodes and into the
//! workers — then prints the checker's table (docs/RELIABILITY.md).
//!
//! ```text
//! cargo run -p leasehold-bench --bin nemesis -- --store etcd --faults all --duration 60s --seed 1
//! ```
//!
//! The same binary is re-spawned as each worker and as the Aerospike node, told its role by
//! environment.

use std::net::SocketAddr;
use std::time::Duration;

use clap::Parser;
use leasehold_bench::nemesis::deployment::StoreKind;
use leasehold_bench::nemesis::fault::FaultKind;
use leasehold_bench::nemesis::run::{run, RunConfig};
use leasehold_bench::nemesis::{aerospike_node, report, workload, ROLE_ENV};

/// Inject faults into a store's nodes and its clients while workers write under one lock; check
/// the history.
#[derive(Debug, Parser)]
#[command(name = "nemesis")]
struct Args {
    /// redis, redis-cluster, sentinel, etcd or aerospike (started on loopback for the run).
    #[arg(long)]
    store: StoreKind,
    /// Comma-separated: kill, pause-short, pause-long, failover, blackhole, client-pause; or
    /// `all` (every kind the store supports).
    #[arg(long, default_value = "all")]
    faults: String,
    /// How long the workers run.
    #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
    duration: Duration,
    /// The seed of the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Worker processes.
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// The lease TTL (the watchdog renews every third of it).
    #[arg(long, default_value = "2s", value_parser = humantime::parse_duration)]
    ttl: Duration,
    /// Redis: acknowledge grants on this many replicas (`min_replicas(n, 500ms)`).
    #[arg(long, default_value_t = 0)]
    min_replicas: u32,
    /// Keep the run's histories in this directory (JSON lines per worker, the faults, the
    /// resource's writes and the client pauses).
    #[arg(long)]
    keep: Option<std::path::PathBuf>,
}

fn main() {
    match std::env::var(ROLE_ENV).as_deref() {
        Ok(workload::ROLE) => {
            let config = std::env::var(workload::CONFIG_ENV).expect("the worker's config");
            let config = workload::WorkerConfig::from_env(&config).expect("a worker config");
            workload::main(config).expect("the worker ran");
            return;
        }
        Ok(aerospike_node::ROLE) => {
            let bind: SocketAddr = std::env::var(aerospike_node::BIND_ENV)
                .expect("the node's address")
                .parse()
                .expect("an address");
            aerospike_node::serve(bind).expect("the Aerospike node ran");
            return;
        }
        _ => {}
    }
    let args = Args::parse();
    let faults: Vec<FaultKind> = if args.faults == "all" {
        args.store.faults().to_vec()
    } else {
        FaultKind::parse_list(&args.faults).unwrap_or_else(|e| {
            eprintln!("{e}");
            std::process::exit(2)
        })
    };
    let mut config = RunConfig::new(
        args.store,
        std::env::current_exe().expect("the nemesis binary's path"),
    );
    config.faults = faults;
    config.duration = args.duration;
    config.seed = args.seed;
    config.workers = args.workers;
    config.ttl = args.ttl;
    config.min_replicas = args.min_replicas;
    config.keep = args.keep;
    eprintln!(
        "nemesis: {} for {:?}, {} workers, TTL {:?}, faults {}, seed {}",
        config.label(),
        config.duration,
        config.workers,
        config.ttl,
        config
            .faults
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(","),
        config.seed
    );
    let result = match run(&config) {
        Ok(result) => result,
        Err(error) => {
            eprintln!("nemesis: {error}");
            std::process::exit(1)
        }
    };
    println!("{}", report::HEADER);
    println!("{}", report::row(&result.label, &result.verdict));
    print!("{}", report::details(&result.verdict));
}
