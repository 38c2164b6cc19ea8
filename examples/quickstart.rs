//! leasehold in one minute, on the embedded store (no server needed):
//! try-lock failing fast, a blocking lock acquiring as soon as the holder releases, `with_lock`,
//! and a TTL expiring.
//!
//! Run: `cargo run --example quickstart`

use std::time::Duration;

use leasehold::{LockManager, LockOptions};
use tokio::time::Instant;

#[tokio::main]
async fn main() -> leasehold::Result<()> {
    let locks = LockManager::builder()
        .client_id("quickstart")
        .farm_id("local")
        .lock_ttl(Duration::from_secs(10))
        .build()?;

    println!("1. try_lock fails fast while another task holds the lock");
    let guard = locks.try_lock("invoice-7").await?;
    println!(
        "   task A holds {} (fencing token {:?})",
        guard.key(),
        guard.fencing_token()
    );
    let started = Instant::now();
    match locks.try_lock("invoice-7").await {
        Ok(_) => return Err(leasehold::Error::internal("acquired a held lock")),
        Err(e) => println!("   task B: {e} after {:?}", started.elapsed()),
    }

    println!("2. a blocking lock acquires as soon as the holder releases");
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let asked = Instant::now();
            let guard = locks.lock("invoice-7").await?;
            println!("   task B acquired after waiting {:?}", asked.elapsed());
            guard.release().await
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    println!(
        "   task A releases: still ours = {}",
        guard.release().await?
    );
    waiter.await.expect("task B ran")?;
    println!(
        "   hand-off took {:?} (the Java manager polls every 1 s)",
        released_at.elapsed()
    );

    println!("3. with_lock runs work under the lock and always releases");
    let total = locks
        .with_lock("ledger", |lease| async move {
            println!("   working under {} as {}", lease.key(), lease.token());
            40 + 2
        })
        .await?;
    println!(
        "   work returned {total}; lock free again: {}",
        locks.inspect("ledger").await?.is_none()
    );

    println!("4. a lock whose holder never releases expires at its TTL");
    let forgotten = locks
        .try_lock_with("report", LockOptions::new().ttl(Duration::from_millis(500)))
        .await?;
    let info = locks.inspect("report").await?.expect("held");
    println!(
        "   held by {} for {:?} more",
        info.token.map(|t| t.to_string()).unwrap_or_default(),
        info.ttl_remaining.unwrap_or_default()
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    let next = locks.try_lock("report").await?;
    println!(
        "   after the TTL another task takes it (fencing token {:?} > {:?})",
        next.fencing_token(),
        forgotten.fencing_token()
    );
    println!(
        "   the old holder's late release reports: still ours = {}",
        forgotten.release().await?
    );
    next.release().await?;
    Ok(())
}
