//! The store conformance suite against the Aerospike wire fixture — or against a real cluster when
//! `AEROSPIKE_HOSTS` is set (`AEROSPIKE_HOSTS=10.0.0.5:3000 AEROSPIKE_NAMESPACE=test cargo test -p
//! leasehold-aerospike --test conformance`). Never skipped: one or the other always runs.

use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::AerospikeFixture;

/// The fixture when no real cluster is configured (kept alive next to the store).
async fn store(fencing: bool) -> (AerospikeStore, Option<AerospikeFixture>) {
    let (hosts, namespace, fixture) = match std::env::var("AEROSPIKE_HOSTS") {
        Ok(hosts) => (
            hosts,
            std::env::var("AEROSPIKE_NAMESPACE").unwrap_or_else(|_| "test".to_owned()),
            None,
        ),
        Err(_) => {
            let fixture = AerospikeFixture::start().await.expect("start the fixture");
            (fixture.host_string(), "test".to_owned(), Some(fixture))
        }
    };
    let config = AerospikeConfig::new(hosts, namespace, "conf")
        .fencing(fencing)
        .max_error_rate(0);
    let store = AerospikeStore::connect(config).await.expect("connect");
    (store, fixture)
}

mod fenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(true));
}

mod unfenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(false));
}
