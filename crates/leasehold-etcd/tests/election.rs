//! Job locks and elections on a real etcd: the shared suite (`tests/suites/election.rs`). A job
//! lock released early is moved to an etcd lease of the rest of its period, rounded up to whole
//! seconds.

use std::future::Future;
use std::pin::Pin;

use leasehold::LockManager;
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

#[path = "../../../tests/suites/election.rs"]
mod suite;

/// A private one-member etcd; each instance connects to it on its own.
struct Deployment(EtcdServer);

impl suite::Fleet for Deployment {
    fn instance(&self) -> Pin<Box<dyn Future<Output = LockManager> + Send + '_>> {
        Box::pin(async move {
            let store = EtcdStore::connect(EtcdConfig::new([self.0.endpoint()]))
                .await
                .expect("connect");
            LockManager::builder()
                .client_id("jobs")
                .farm_id("f1")
                .store(store)
                .default_layers()
                .build()
                .expect("manager")
        })
    }
}

suite::election_suite!(Deployment(EtcdServer::start().expect("start etcd")));
