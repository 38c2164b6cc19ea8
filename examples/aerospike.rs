//! leasehold on Aerospike, record-compatible with the Java lock manager.
//!
//! Run: `cargo run -p leasehold-aerospike --example aerospike` — against the cluster in
//! `AEROSPIKE_HOSTS` (`host:port[,host:port]`, namespace from `AEROSPIKE_NAMESPACE`, default `test`)
//! if set; otherwise it starts the testkit's Aerospike wire fixture on loopback and says so. The
//! walk-through is [`run`], given the hosts, the namespace and the writer to print to: the test
//! suite runs it against its own fixture and checks every line
//! (`crates/leasehold-aerospike/tests/example.rs`).

use std::io::Write;
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
    run(&hosts, &namespace, &mut std::io::stdout()).await
}

/// Takes, inspects, contends for, lists and releases a lock on the cluster at `hosts`; printed to
/// `out`.
pub(crate) async fn run(
    hosts: &str,
    namespace: &str,
    out: &mut dyn Write,
) -> Result<(), Box<dyn std::error::Error>> {
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
    writeln!(
        out,
        "holding {} in set DC#farm1#distributed_lock, user key orders#order-42 (fencing token {:?})",
        guard.key(),
        guard.fencing_token()
    )?;
    let info = store
        .inspect(guard.key())
        .await?
        .ok_or("order-42 is held")?;
    writeln!(
        out,
        "inspect: holder {}, {:?} left",
        info.token.map(|t| t.to_string()).unwrap_or_default(),
        info.ttl_remaining.unwrap_or_default()
    )?;
    // Another task is another holder (this task asking again would re-enter its own hold).
    let other = tokio::spawn({
        let locks = locks.clone();
        async move { locks.try_lock("order-42").await.map(drop) }
    })
    .await?;
    match other {
        Ok(()) => return Err("another task acquired a held lock".into()),
        Err(e) => writeln!(out, "another task's try_lock: {e}")?,
    }
    writeln!(
        out,
        "listed: {:?}",
        store
            .list("DC#farm1#")
            .await?
            .iter()
            .map(|l| l.key.to_string())
            .collect::<Vec<_>>()
    )?;
    writeln!(out, "release: still ours = {}", guard.release().await?)?;
    Ok(())
}
