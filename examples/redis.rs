//! leasehold on Redis: two services (managers with their own connections) contend for a lock, one
//! inspects the holder as ops tooling would, and waits for it with a blocking acquire.
//!
//! Run: `cargo run -p leasehold-redis --example redis` — against `REDIS_URL` if set, otherwise a
//! private redis-server it starts on a free loopback port (the `redis-server` package must be
//! installed) and stops at the end. The walk-through is [`run`], given the URL and the writer to
//! print to: the test suite runs it against its own server and checks every line
//! (`crates/leasehold-redis/tests/example.rs`).

use std::io::Write;
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
    run(&url, &mut std::io::stdout()).await
}

/// Two services contend for a lock on the Redis server at `url`; printed to `out`.
pub(crate) async fn run(url: &str, out: &mut dyn Write) -> Result<(), Box<dyn std::error::Error>> {
    let manager = |scenario: &'static str| {
        let url = url.to_owned();
        async move {
            let store =
                RedisStore::connect(RedisConfig::new(url).prefix("leasehold-example:")).await?;
            LockManager::builder()
                .client_id("example")
                .farm_id("local")
                .scenario(scenario)
                .store(store)
                .default_layers()
                .build()
        }
    };
    let a = manager("service-a").await?;
    let b = manager("service-b").await?;

    let guard = a
        .try_lock_with("invoice-7", LockOptions::new().ttl(Duration::from_secs(5)))
        .await?;
    writeln!(
        out,
        "service A holds {} (fencing token {:?})",
        guard.key(),
        guard.fencing_token()
    )?;
    match b.try_lock("invoice-7").await {
        Ok(_) => return Err("service B acquired a lock service A holds".into()),
        Err(e) => writeln!(out, "service B: {e}")?,
    }
    let info = b
        .store()
        .inspect(guard.key())
        .await?
        .ok_or("invoice-7 is held")?;
    writeln!(
        out,
        "inspect from B: held by {} for {:?} more",
        info.token.map(|t| t.to_string()).unwrap_or_default(),
        info.ttl_remaining.unwrap_or_default()
    )?;
    let waiter = tokio::spawn({
        let b = b.clone();
        async move {
            let started = tokio::time::Instant::now();
            let guard = b
                .lock_with("invoice-7", LockOptions::new().wait(Duration::from_secs(5)))
                .await?;
            let (waited, fencing_token) = (started.elapsed(), guard.fencing_token());
            guard.release().await.map(|_| (waited, fencing_token))
        }
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    writeln!(
        out,
        "service A releases: still ours = {}",
        guard.release().await?
    )?;
    let (waited, fencing_token) = waiter.await??;
    writeln!(
        out,
        "service B acquired it {waited:?} after asking (fencing token {fencing_token:?})"
    )?;
    Ok(())
}
