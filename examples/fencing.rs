//! Fencing tokens: how a downstream system rejects a stale lock holder.
//!
//! Run: `cargo run --example fencing`. The story is [`run`], which prints to the writer it is given:
//! stdout here, a buffer in the test suite (`tests/examples.rs` checks the outcome).
//!
//! Holder A takes the lock and stalls (a GC pause, a stalled VM) past its TTL. Holder B takes the
//! lock with a higher fencing token and writes. When A wakes up and writes, believing it still holds
//! the lock, the storage rejects the write because A's token is lower than one it has already seen.

use std::io::Write;
use std::sync::Mutex;
use std::time::Duration;

use leasehold::{LockManager, LockOptions};

/// The protected resource: it remembers the highest fencing token it has accepted.
#[derive(Default)]
struct FencedStorage {
    highest_token: Mutex<u64>,
    value: Mutex<String>,
}

impl FencedStorage {
    fn write(&self, token: u64, value: &str) -> Result<(), String> {
        let mut highest = self.highest_token.lock().expect("not poisoned");
        if token < *highest {
            return Err(format!("rejected: token {token} < highest seen {highest}"));
        }
        *highest = token;
        *self.value.lock().expect("not poisoned") = value.to_owned();
        Ok(())
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(&mut std::io::stdout()).await
}

/// Holder A stalls past its TTL, B takes over, and A's late write is rejected; printed to `out`.
pub(crate) async fn run(out: &mut dyn Write) -> Result<(), Box<dyn std::error::Error>> {
    let locks = LockManager::builder()
        .client_id("fencing")
        .farm_id("local")
        .build()?;
    let storage = FencedStorage::default();
    let short = LockOptions::new().ttl(Duration::from_millis(200));

    let a = locks.try_lock_with("ledger", short.clone()).await?;
    let token_a = a.fencing_token().ok_or("the embedded store fences")?;
    writeln!(
        out,
        "A holds the lock with fencing token {token_a} ... and stalls"
    )?;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // B is another task (the holder A's own task would re-enter a live hold; this one expired).
    let b = tokio::spawn({
        let locks = locks.clone();
        async move { locks.try_lock_with("ledger", short).await }
    })
    .await??;
    let token_b = b.fencing_token().ok_or("fenced")?;
    writeln!(
        out,
        "A's lease expired; B holds the lock with fencing token {token_b}"
    )?;
    writeln!(
        out,
        "B writes: {:?}",
        storage.write(token_b, "written by B")
    )?;

    writeln!(
        out,
        "A wakes up and writes: {:?}",
        storage.write(token_a, "written by A")
    )?;
    let value = storage
        .value
        .lock()
        .map_err(|_| "storage poisoned")?
        .clone();
    let still_ours = a.release().await?;
    writeln!(
        out,
        "storage holds {value:?}; A's release reports still ours = {still_ours}"
    )?;
    b.release().await?;
    Ok(())
}
