//! Holders that die, on Aerospike, through the wire fixture or a real cluster (`AEROSPIKE_HOSTS`,
//! never skipped): the shared suite (`tests/suites/graceful_shutdown.rs`). A lock left by a killed
//! holder stays until its record's TTL runs out. Set suffixes are unique per test, so tests on one
//! cluster, and a persistent cluster's earlier records, never interfere.

use leasehold_aerospike::AerospikeStore;

mod common;
use common::{Deployment, Place};

#[path = "../../../tests/suites/graceful_shutdown.rs"]
mod suite;

impl suite::Deployment for Deployment {
    type Store = AerospikeStore;

    fn start(runtime: &tokio::runtime::Runtime) -> Self {
        Deployment::on(runtime, "down")
    }

    fn address(&self) -> String {
        self.place.encode()
    }

    async fn connect(address: &str) -> AerospikeStore {
        AerospikeStore::connect(Place::decode(address).config("f1"))
            .await
            .expect("connect")
    }
}

suite::graceful_shutdown_suite!(Deployment);
