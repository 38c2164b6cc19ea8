//! Holders that die, on a real etcd: the shared suite (`tests/suites/graceful_shutdown.rs`). A
//! lock left by a killed holder stays until its lease expires.

use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

#[path = "../../../tests/suites/graceful_shutdown.rs"]
mod suite;

impl suite::Deployment for EtcdServer {
    type Store = EtcdStore;

    fn start(_: &tokio::runtime::Runtime) -> Self {
        EtcdServer::start().expect("start etcd")
    }

    fn address(&self) -> String {
        self.endpoint()
    }

    async fn connect(address: &str) -> EtcdStore {
        EtcdStore::connect(EtcdConfig::new([address.to_owned()]))
            .await
            .expect("connect")
    }
}

suite::graceful_shutdown_suite!(EtcdServer);
