//! leasehold in one minute, on the embedded store (no server needed): a task re-taking a lock it
//! holds (reentrancy), another task refused at once, a blocking lock acquiring as soon as the
//! holder releases, `with_lock`, and a TTL expiring.
//!
//! Run: `cargo run --example quickstart`. The walk-through is [`run`], which prints to the writer
//! it is given: stdout here, a buffer in the test suite (`tests/examples.rs` checks every line).

use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::{LockEvent, LockManager, LockOptions};
use tokio::time::Instant;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(&mut std::io::stdout()).await
}

/// The walk-through, printed to `out`.
pub(crate) async fn run(out: &mut dyn Write) -> Result<(), Box<dyn std::error::Error>> {
    // The hold count of the last reentrant acquisition, from the manager's events.
    let depth = Arc::new(AtomicU32::new(0));
    let locks = LockManager::builder()
        .client_id("quickstart")
        .farm_id("local")
        .lock_ttl(Duration::from_secs(10))
        .observer({
            let depth = depth.clone();
            move |event: &LockEvent| {
                if let LockEvent::Reentered { depth: now, .. } = event {
                    depth.store(*now, Ordering::Relaxed);
                }
            }
        })
        .build()?;

    writeln!(
        out,
        "1. the holding task may take its lock again; another task may not"
    )?;
    let guard = locks.try_lock("invoice-7").await?;
    writeln!(
        out,
        "   task A holds {} (fencing token {:?})",
        guard.key(),
        guard.fencing_token()
    )?;
    // The same task asking again is the same holder: the hold count goes up, no store I/O.
    let again = locks.try_lock("invoice-7").await?;
    writeln!(
        out,
        "   task A takes it again: reentrant, hold count {}, same lease = {}",
        depth.load(Ordering::Relaxed),
        again.token() == guard.token()
    )?;
    writeln!(
        out,
        "   task A releases the inner hold: still ours = {}; still held in the store = {}",
        again.release().await?,
        locks.inspect("invoice-7").await?.is_some()
    )?;
    // Another task is another holder: refused at once.
    let started = Instant::now();
    let refused = tokio::spawn({
        let locks = locks.clone();
        async move { locks.try_lock("invoice-7").await.map(drop) }
    })
    .await?;
    match refused {
        Ok(()) => return Err("task B acquired a lock task A holds".into()),
        Err(e) => writeln!(out, "   task B: {e} (after {:?})", started.elapsed())?,
    }

    writeln!(
        out,
        "2. a blocking lock acquires as soon as the holder releases"
    )?;
    let waiter = tokio::spawn({
        let locks = locks.clone();
        async move {
            let asked = Instant::now();
            let guard = locks.lock("invoice-7").await?;
            let waited = asked.elapsed();
            guard.release().await.map(|_| waited)
        }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let released_at = Instant::now();
    writeln!(
        out,
        "   task A releases: still ours = {}",
        guard.release().await?
    )?;
    let waited = waiter.await??;
    writeln!(
        out,
        "   task B acquired after waiting {waited:?}; the hand-off took {:?} (the Java manager \
         polls every 1 s)",
        released_at.elapsed()
    )?;

    writeln!(
        out,
        "3. with_lock runs work under the lock and always releases"
    )?;
    let total = locks
        .with_lock("ledger", |lease| async move {
            (format!("{} as {}", lease.key(), lease.token()), 40 + 2)
        })
        .await?;
    writeln!(out, "   worked under {}", total.0)?;
    writeln!(
        out,
        "   work returned {}; lock free again: {}",
        total.1,
        locks.inspect("ledger").await?.is_none()
    )?;

    writeln!(
        out,
        "4. a lock whose holder never releases expires at its TTL"
    )?;
    let forgotten = locks
        .try_lock_with("report", LockOptions::new().ttl(Duration::from_millis(500)))
        .await?;
    let info = locks.inspect("report").await?.ok_or("`report` is held")?;
    writeln!(
        out,
        "   held by {} for {:?} more",
        info.token.map(|t| t.to_string()).unwrap_or_default(),
        info.ttl_remaining.unwrap_or_default()
    )?;
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Another task: the forgotten hold has expired, so this is a new acquisition, not a re-entry.
    let next = tokio::spawn({
        let locks = locks.clone();
        async move {
            let guard = locks.try_lock("report").await?;
            let fencing_token = guard.fencing_token();
            guard.release().await.map(|_| fencing_token)
        }
    })
    .await??;
    writeln!(
        out,
        "   after the TTL another task takes it (fencing token {:?} > {:?})",
        next,
        forgotten.fencing_token()
    )?;
    writeln!(
        out,
        "   the old holder's late release reports: still ours = {}",
        forgotten.release().await?
    )?;
    Ok(())
}
