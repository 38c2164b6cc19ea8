//! leasehold on Redis: two services (managers with their own connections) contend for a lock, one
//! inspects the holder as ops tooling would, and waits for it with a blocking acquire.
//!
//! Run: `cargo run -p leasehold-redis --example redis` — against `REDIS_URL` if set, otherwise a
//! private redis-server it starts on a free loopback port (the `redis-server` package must be
//! installed) and stops at the end.

use std::time::Duration;

use leasehold::{LockManager, LockOptions, LockStore};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, _server) = match std::env::var("REDIS_URL") {
        Ok(url) => {
            println!("using REDIS_URL");
            (url, None)
        }
        Err(_) => {
            let server = RedisServer::start()?;
            println!(
                "REDIS_URL not set: started a private redis-server at {}",
                server.url()
            );
            (server.url(), Some(server))
        }
    };
    let manager = |client: &str| {
        let url = url.clone();
        let client = client.to_owned();
        async move {
            let store =
                RedisStore::connect(RedisConfig::new(url).prefix("leasehold-example:")).await?;
            LockManager::builder()
                .client_id("example")
                .farm_id("local")
                .scenario(if client == "a" {
                    "service-a"
                } else {
                    "service-b"
                })
                .store(store)
                .default_layers()
                .build()
        }
    };
    let a = manager("a").await?;
    let b = manager("b").await?;

    let guard = a
        .try_lock_with("invoice-7", LockOptions::new().ttl(Duration::from_secs(5)))
        .await?;
    println!(
        "service A holds {} (fencing token {:?})",
        guard.key(),
        guard.fencing_token()
    );
    match b.try_lock("invoice-7").await {
        Ok(_) => println!("service B acquired it too (this must not happen)"),
        Err(e) => println!("service B: {e}"),
    }
    let info = b.store().inspect(guard.key()).await?.expect("held");
    println!(
        "inspect from B: held by {} for {:?} more",
        info.token.map(|t| t.to_string()).unwrap_or_default(),
        info.ttl_remaining.unwrap_or_default()
    );
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let started = tokio::time::Instant::now();
            let guard = b
                .lock_with("invoice-7", LockOptions::new().wait(Duration::from_secs(5)))
                .await?;
            println!(
                "service B acquired it {:?} after asking (fencing token {:?})",
                started.elapsed(),
                guard.fencing_token()
            );
            guard.release().await
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    println!(
        "service A releases: still ours = {}",
        guard.release().await?
    );
    waiter.await??;
    Ok(())
}
