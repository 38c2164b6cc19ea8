//! The store conformance suite against a real 3-member etcd cluster (one shared by the cases of
//! a module, each case under its own key prefix): whole, and with the member behind the first
//! endpoint down for good (every case must pass on the two others, as if nothing happened).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};

use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd_cluster::EtcdCluster;

static CASE: AtomicUsize = AtomicUsize::new(0);

/// A store on `slot`'s cluster (started if no case holds it); with `first_down`, member 0 (the
/// first endpoint of the URL) is killed first.
async fn store(
    slot: &'static Mutex<Weak<EtcdCluster>>,
    first_down: bool,
) -> (EtcdStore, Arc<EtcdCluster>) {
    let cluster = tokio::task::spawn_blocking(move || {
        let cluster = EtcdCluster::shared(slot, 3)?;
        if first_down {
            cluster.kill(0)?;
        }
        Ok::<_, std::io::Error>(cluster)
    })
    .await
    .expect("blocking start")
    .expect("start a 3-member etcd cluster");
    let prefix = format!("conf{}:", CASE.fetch_add(1, Ordering::SeqCst));
    let store = EtcdStore::connect(EtcdConfig::from_url(&cluster.url()).unwrap().prefix(prefix))
        .await
        .expect("connect");
    (store, cluster)
}

mod whole {
    use super::*;

    static CLUSTER: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());

    leasehold_testkit::conformance_tests!(with_guard: super::store(&CLUSTER, false));
}

mod first_endpoint_down {
    use super::*;

    static CLUSTER: Mutex<Weak<EtcdCluster>> = Mutex::new(Weak::new());

    leasehold_testkit::conformance_tests!(with_guard: super::store(&CLUSTER, true));
}
