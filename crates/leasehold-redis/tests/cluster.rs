//! The store conformance suite on a real Redis Cluster (3 masters, 3 replicas) and on a real
//! Sentinel-watched master (2 replicas, 3 sentinels), one of each shared by the tests of this
//! binary; each store gets its own key prefix.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis_cluster::{RedisCluster, RedisSentinel};

static CLUSTER: Mutex<Weak<RedisCluster>> = Mutex::new(Weak::new());
static SENTINEL: Mutex<Weak<RedisSentinel>> = Mutex::new(Weak::new());
static NEXT_PREFIX: AtomicU64 = AtomicU64::new(1);

fn prefix() -> String {
    format!("t{}:", NEXT_PREFIX.fetch_add(1, Ordering::Relaxed))
}

async fn cluster_store() -> (RedisStore, Arc<RedisCluster>) {
    let cluster = RedisCluster::shared(&CLUSTER).expect("start a Redis Cluster");
    let store = RedisStore::connect(RedisConfig::new(cluster.url()).prefix(prefix()))
        .await
        .expect("connect to the cluster");
    (store, cluster)
}

async fn sentinel_store() -> (RedisStore, Arc<RedisSentinel>) {
    let group = RedisSentinel::shared(&SENTINEL).expect("start Redis Sentinel");
    let store = RedisStore::connect(RedisConfig::new(group.url()).prefix(prefix()))
        .await
        .expect("connect through the sentinels");
    (store, group)
}

mod on_cluster {
    leasehold_testkit::conformance_tests!(with_guard: super::cluster_store());
}

mod on_sentinel {
    leasehold_testkit::conformance_tests!(with_guard: super::sentinel_store());
}
