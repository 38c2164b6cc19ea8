//! Elections between candidate processes on Aerospike, through the wire fixture or a real
//! cluster (`AEROSPIKE_HOSTS`, never skipped): the shared suite
//! (`tests/suites/election_processes.rs`). The fixture listens on a loopback port of the parent
//! test process, so the candidate processes connect to it like to a cluster. Client ids are unique
//! per test, so a persistent cluster's earlier records never interfere.

use std::future::Future;
use std::pin::Pin;

use leasehold::LockManager;
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::AerospikeTarget;

mod common;

#[path = "../../../tests/suites/election_processes.rs"]
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
            client: common::unique("procs"),
        }
    }
}

impl suite::Store for Deployment {
    /// Lines: hosts, namespace, client id, then user and password of a secured cluster.
    fn address(&self) -> String {
        let target = &self.target;
        let mut lines = vec![target.hosts(), target.namespace(), &self.client];
        if let Some((user, password)) = target.credentials() {
            lines.extend([user, password]);
        }
        lines.join("\n")
    }

    fn connect(address: String) -> Pin<Box<dyn Future<Output = LockManager> + Send>> {
        Box::pin(async move {
            let lines: Vec<&str> = address.lines().collect();
            let mut config = AerospikeConfig::new(lines[0], lines[1], FARM);
            if let [_, _, _, user, password] = lines[..] {
                config = config.credentials(user, password);
            }
            let store = AerospikeStore::connect(config).await.expect("connect");
            LockManager::builder()
                .client_id(lines[2])
                .farm_id(FARM)
                .store(store)
                .default_layers()
                .build()
                .expect("manager")
        })
    }
}

suite::election_processes_suite!(Deployment, Deployment::start().await);
