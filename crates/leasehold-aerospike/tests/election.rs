//! Job locks and elections on Aerospike, through the wire fixture or a real cluster
//! (`AEROSPIKE_HOSTS`, never skipped): the shared suite (`tests/suites/election.rs`). A job lock
//! released early is kept by a record TTL of the rest of its period, whole seconds rounded up.
//! Client ids are unique per test, so a persistent cluster's earlier records never interfere.

use std::future::Future;
use std::pin::Pin;

use leasehold::LockManager;
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::AerospikeTarget;

mod common;

#[path = "../../../tests/suites/election.rs"]
mod suite;

const FARM: &str = "farm1";

/// The fixture or the cluster `AEROSPIKE_HOSTS` names, and this test's client id.
struct Deployment {
    target: AerospikeTarget,
    client: String,
}

impl Deployment {
    async fn start() -> Self {
        Deployment {
            target: common::current_target().await,
            client: common::unique("jobs"),
        }
    }
}

impl suite::Fleet for Deployment {
    fn instance(&self) -> Pin<Box<dyn Future<Output = LockManager> + Send + '_>> {
        Box::pin(async move {
            let target = &self.target;
            let mut config = AerospikeConfig::new(target.hosts(), target.namespace(), FARM);
            if let Some((user, password)) = target.credentials() {
                config = config.credentials(user, password);
            }
            let store = AerospikeStore::connect(config).await.expect("connect");
            LockManager::builder()
                .client_id(&self.client)
                .farm_id(FARM)
                .store(store)
                .default_layers()
                .build()
                .expect("manager")
        })
    }

    /// Aerospike has no notifications: observers read every interval.
    fn announces_changes(&self) -> bool {
        false
    }
}

suite::election_suite!(Deployment::start().await);
