//! leasehold's benchmarks live in `benches/` at the workspace root; this package builds them
//! with production features (see `Cargo.toml`). Run `cargo bench -p leasehold-bench`.
//!
//! It also holds the fault-injection harness, [`nemesis`]: `cargo run -p leasehold-bench --bin
//! nemesis -- --store etcd --faults all --duration 60s` (docs/RELIABILITY.md).

pub mod nemesis;
