//! Holders that die, on Aerospike, through the wire fixture or a real cluster (`AEROSPIKE_HOSTS`,
//! never skipped): the shared suite (`tests/suites/graceful_shutdown.rs`). A lock left by a killed
//! holder stays until its record's TTL runs out. Set suffixes are unique per test, so tests on one
//! cluster, and a persistent cluster's earlier records, never interfere.

use leasehold_aerospike::AerospikeStore;
use leasehold_testkit::aerospike::AerospikeTarget;

mod common;
use common::Place;

#[path = "../../../tests/suites/graceful_shutdown.rs"]
mod suite;

/// The fixture (if no cluster is named) serving from the test's runtime, and this test's place.
struct Deployment {
    _target: AerospikeTarget,
    place: Place,
}

impl suite::Deployment for Deployment {
    type Store = AerospikeStore;

    fn start(runtime: &tokio::runtime::Runtime) -> Self {
        let target = common::target(runtime);
        let place = Place::new(&target, "down");
        Deployment {
            _target: target,
            place,
        }
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
