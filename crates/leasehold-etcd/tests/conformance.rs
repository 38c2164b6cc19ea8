//! The store conformance suite against a real, private etcd: fair (the default) and first-come.

use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

async fn store(fair: bool) -> (EtcdStore, EtcdServer) {
    let server = EtcdServer::start().expect("start etcd");
    let store = EtcdStore::connect(EtcdConfig::from_url(&server.url()).unwrap().fair(fair))
        .await
        .expect("connect");
    (store, server)
}

mod fair {
    leasehold_testkit::conformance_tests!(with_guard: super::store(true));
}

mod first_come {
    leasehold_testkit::conformance_tests!(with_guard: super::store(false));
}
