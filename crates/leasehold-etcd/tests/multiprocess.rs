//! Mutual exclusion across OS processes on a real etcd: the shared suite
//! (`tests/suites/multiprocess.rs`). The counter is read with a plain get and written with a plain
//! put (no transaction).

use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

#[path = "../../../tests/suites/multiprocess.rs"]
mod suite;

impl suite::Deployment for EtcdServer {
    type Store = EtcdStore;
    type Counter = etcd_client::Client;
    const INCREMENTS: usize = 25;

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

    async fn counter(address: &str) -> Self::Counter {
        etcd_client::Client::connect([address], None)
            .await
            .expect("counter connection")
    }

    async fn read(counter: &mut Self::Counter) -> u64 {
        match counter
            .get(suite::COUNTER, None)
            .await
            .expect("get")
            .kvs()
            .first()
        {
            Some(kv) => kv.value_str().unwrap().parse().unwrap(),
            None => 0,
        }
    }

    async fn write(counter: &mut Self::Counter, value: u64) {
        counter
            .put(suite::COUNTER, value.to_string(), None)
            .await
            .expect("put");
    }
}

suite::multiprocess_suite!(EtcdServer);
