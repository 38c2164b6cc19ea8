//! leasehold on Aerospike, record-compatible with the Java lock manager.
//!
//! Run: `cargo run -p leasehold-aerospike --example aerospike` — against the cluster in
//! `AEROSPIKE_HOSTS` (`host:port[,host:port]`, namespace from `AEROSPIKE_NAMESPACE`, default `test`)
//! if set; otherwise it starts the testkit's Aerospike wire fixture on loopback and says so.

use std::time::Duration;

use leasehold::{LockManager, LockOptions, LockStore};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::AerospikeFixture;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let namespace = std::env::var("AEROSPIKE_NAMESPACE").unwrap_or_else(|_| "test".to_owned());
    let (hosts, _fixture) = match std::env::var("AEROSPIKE_HOSTS") {
        Ok(hosts) => {
            println!("using the Aerospike cluster at {hosts}");
            (hosts, None)
        }
        Err(_) => {
            let fixture = AerospikeFixture::builder()
                .namespace(&namespace)
                .start()
                .await?;
            println!(
                "AEROSPIKE_HOSTS not set: started the leasehold-testkit Aerospike wire fixture at {}",
                fixture.host_string()
            );
            (fixture.host_string(), Some(fixture))
        }
    };
    let store = AerospikeStore::connect(AerospikeConfig::new(hosts, namespace, "farm1")).await?;
    let locks = LockManager::builder()
        .client_id("orders")
        .farm_id("farm1")
        .store(store.clone())
        .default_layers()
        .build()?;

    let guard = locks
        .try_lock_with("order-42", LockOptions::new().ttl(Duration::from_secs(10)))
        .await?;
    println!(
        "holding {} in set DC#farm1#distributed_lock, user key orders#order-42 (fencing token {:?})",
        guard.key(),
        guard.fencing_token()
    );
    let info = store.inspect(guard.key()).await?.expect("held");
    println!(
        "inspect: holder {}, {:?} left",
        info.token.map(|t| t.to_string()).unwrap_or_default(),
        info.ttl_remaining.unwrap_or_default()
    );
    match locks.try_lock("order-42").await {
        Ok(_) => println!("acquired twice (this must not happen)"),
        Err(e) => println!("a second try_lock: {e}"),
    }
    println!(
        "listed: {:?}",
        store
            .list("DC#farm1#")
            .await?
            .iter()
            .map(|l| l.key.to_string())
            .collect::<Vec<_>>()
    );
    println!("release: still ours = {}", guard.release().await?);
    Ok(())
}
