//! Elections between candidate processes on a real etcd: the shared suite
//! (`tests/suites/election_processes.rs`). Each candidate process connects to the test's private
//! one-member etcd by its endpoint.

use std::future::Future;
use std::pin::Pin;

use leasehold::LockManager;
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

#[path = "../../../tests/suites/election_processes.rs"]
mod suite;

/// A private one-member etcd.
struct Deployment(EtcdServer);

impl suite::Store for Deployment {
    fn address(&self) -> String {
        self.0.endpoint()
    }

    fn connect(address: String) -> Pin<Box<dyn Future<Output = LockManager> + Send>> {
        Box::pin(async move {
            let store = EtcdStore::connect(EtcdConfig::new([address]))
                .await
                .expect("connect");
            LockManager::builder()
                .client_id("procs")
                .farm_id("f1")
                .store(store)
                .default_layers()
                .build()
                .expect("manager")
        })
    }
}

suite::election_processes_suite!(
    Deployment,
    Deployment(EtcdServer::start().expect("start etcd"))
);
