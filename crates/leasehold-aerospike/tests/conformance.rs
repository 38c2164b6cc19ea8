//! The store conformance suite against the Aerospike wire fixture — or against a real cluster when
//! `AEROSPIKE_HOSTS` is set (`AEROSPIKE_HOSTS=10.0.0.5:3000 AEROSPIKE_NAMESPACE=test cargo test -p
//! leasehold-aerospike --test conformance`). Never skipped: one or the other always runs.

use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::AerospikeTarget;

/// The cluster in `AEROSPIKE_HOSTS`, or a fixture (kept alive next to the store).
async fn store(fencing: bool, fair: bool) -> (AerospikeStore, AerospikeTarget) {
    let target = AerospikeTarget::from_env()
        .await
        .expect("start the fixture");
    let mut config = AerospikeConfig::new(target.hosts(), target.namespace(), "conf")
        .fencing(fencing)
        .fair(fair)
        .max_error_rate(0);
    if let Some((user, password)) = target.credentials() {
        config = config.credentials(user, password);
    }
    let store = AerospikeStore::connect(config).await.expect("connect");
    (store, target)
}

mod fenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(true, true));
}

mod unfenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(false, true));
}

/// First come, first served (`fair(false)`): the Java manager's behaviour.
mod first_come {
    leasehold_testkit::conformance_tests!(with_guard: super::store(true, false));
}
