//! leasehold's benchmarks live in `benches/` at the workspace root; this package only builds them
//! with production features (see `Cargo.toml`). Run `cargo bench -p leasehold-bench`.
