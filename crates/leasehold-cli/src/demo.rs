//! `leasehold demo`: the scenarios, narrated, on the embedded store — no server needed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use leasehold::core::{Acquire, Attempt};
use leasehold::layers::{
    CountingLayer, GracefulShutdownLayer, LocalCompetitionLayer, ReadbackLayer,
};
use leasehold::{Error, Holder, LockManager, LockOptions, LockStore, MemoryStore, Result};
use tokio::time::Instant;

use crate::cli::DemoArgs;
use crate::events::EventCounts;
use crate::exit::{self, CliError};

/// One row of the summary table.
struct Row {
    scenario: &'static str,
    outcome: String,
}

pub(crate) async fn demo(args: DemoArgs) -> Result<u8, CliError> {
    let steps = 5;
    let bar = ProgressBar::new(steps);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {msg}")
            .map_err(|e| CliError::new(exit::FAILURE, e.to_string()))?
            .progress_chars("=> "),
    );
    bar.set_prefix("demo");
    let say = |line: String| bar.suspend(|| println!("{line}"));
    let mut rows = Vec::new();
    let fail = |e: Error| CliError::new(exit::FAILURE, format!("demo failed: {}", e.chain()));

    bar.set_message("hot key");
    rows.push(
        hot_key(&say, args.tasks, args.duration)
            .await
            .map_err(fail)?,
    );
    bar.inc(1);
    bar.set_message("reentrancy");
    rows.push(reentrancy(&say).await.map_err(fail)?);
    bar.inc(1);
    bar.set_message("unlock window");
    rows.push(unlock_window(&say).await.map_err(fail)?);
    bar.inc(1);
    bar.set_message("readback");
    rows.push(readback(&say).await.map_err(fail)?);
    bar.inc(1);
    bar.set_message("graceful shutdown");
    rows.push(graceful_shutdown(&say).await.map_err(fail)?);
    bar.inc(1);
    bar.finish_and_clear();

    println!();
    println!("{:<20}  outcome", "scenario");
    println!("{:-<20}  {:-<60}", "", "");
    for row in &rows {
        println!("{:<20}  {}", row.scenario, row.outcome);
    }
    Ok(exit::OK)
}

fn manager(store: impl LockStore, events: &EventCounts) -> Result<LockManager> {
    LockManager::builder()
        .client_id("demo")
        .farm_id("local")
        .store(store)
        .observer(events.clone())
        .default_layers()
        .build()
}

/// Many workers hammer one key with try-lock: local competition answers most of them in memory.
async fn hot_key(say: &impl Fn(String), tasks: usize, duration: Duration) -> Result<Row> {
    say(format!(
        "1. hot key: {tasks} workers try-lock one key for {duration:?}; contenders in this process meet in memory first"
    ));
    let events = EventCounts::default();
    let counting = CountingLayer::new();
    let counts = counting.counts();
    let locks = LockManager::builder()
        .client_id("demo")
        .farm_id("local")
        .observer(events.clone())
        .layer(counting)
        .default_layers()
        .build()?;
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..tasks)
        .map(|_| {
            let locks = locks.clone();
            let stop = stop.clone();
            tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    match locks.try_lock("hot-key").await {
                        Ok(guard) => {
                            tokio::task::yield_now().await;
                            guard.release().await?;
                        }
                        Err(e) if e.is_unavailable() => tokio::task::yield_now().await,
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })
        })
        .collect();
    tokio::time::sleep(duration).await;
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker
            .await
            .map_err(|e| Error::internal(format!("worker: {e}")))??;
    }
    let acquired = events.get("acquired");
    let fast_failed = events.get("fast_failed");
    let contended = events.get("contended");
    let requests = counts.total();
    say(format!(
        "   {acquired} acquisitions; {fast_failed} of {contended} contended attempts failed fast in memory; \
         the store saw {requests} requests ({:.2} per acquisition)",
        requests as f64 / acquired.max(1) as f64
    ));
    Ok(Row {
        scenario: "hot key",
        outcome: format!(
            "{acquired} acquired, {fast_failed} fast-failed locally, {:.2} store requests/acquisition",
            requests as f64 / acquired.max(1) as f64
        ),
    })
}

/// The same holder takes a key twice: it counts up instead of deadlocking.
async fn reentrancy(say: &impl Fn(String)) -> Result<Row> {
    say("2. reentrancy: one holder takes the same key in a nested call".to_owned());
    let events = EventCounts::default();
    let locks = manager(MemoryStore::new(), &events)?;
    let me = Holder::new();
    let outer = locks
        .try_lock_with("invoice-7", LockOptions::new().holder(me))
        .await?;
    let inner = locks
        .try_lock_with("invoice-7", LockOptions::new().holder(me))
        .await?;
    let other = locks.try_lock("invoice-7").await;
    say(format!(
        "   nested acquire by the same holder: ok (same token: {}); another holder: {}",
        inner.token() == outer.token(),
        match &other {
            Ok(_) => "acquired (unexpected)".to_owned(),
            Err(e) => e.kind().to_string(),
        }
    ));
    inner.release().await?;
    let held_after_inner = locks.inspect("invoice-7").await?.is_some();
    outer.release().await?;
    let free_after_outer = locks.inspect("invoice-7").await?.is_none();
    say(format!(
        "   after the inner release still held: {held_after_inner}; after the outer release free: {free_after_outer}"
    ));
    Ok(Row {
        scenario: "reentrancy",
        outcome: format!(
            "{} reentered, store released only at depth 0: {}",
            events.get("reentered"),
            held_after_inner && free_after_outer
        ),
    })
}

/// A release that comes too late is skipped instead of risking someone else's lock.
async fn unlock_window(say: &impl Fn(String)) -> Result<Row> {
    say(
        "3. unlock window: a holder releases 250 ms into a 300 ms lease (margin 150 ms)".to_owned(),
    );
    let events = EventCounts::default();
    let locks = manager(MemoryStore::new(), &events)?;
    let guard = locks
        .try_lock_with("report", LockOptions::new().ttl(Duration::from_millis(300)))
        .await?;
    tokio::time::sleep(Duration::from_millis(250)).await;
    let released = guard.release().await?;
    say(format!(
        "   release returned still-ours = {released}; skipped releases: {} (the lease may already belong to someone else)",
        events.get("release_skipped")
    ));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let free = locks.inspect("report").await?.is_none();
    say(format!(
        "   the record expired on its own at its TTL: {free}"
    ));
    Ok(Row {
        scenario: "unlock window",
        outcome: format!(
            "{} late release skipped, lock expired at its TTL: {free}",
            events.get("release_skipped")
        ),
    })
}

/// The embedded store, but the reply to the first acquire is lost after the write is applied —
/// what a network timeout does to a real store.
#[derive(Debug, Default)]
struct LostFirstReply {
    inner: MemoryStore,
    lost: AtomicBool,
}

impl leasehold::core::LayeredStore for LostFirstReply {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    fn name(&self) -> &'static str {
        "memory-lossy"
    }
    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        let attempt = self.inner.acquire(req).await?;
        if !self.lost.swap(true, Ordering::SeqCst) {
            return Err(Error::in_doubt("reply lost after the write was applied")
                .with_key(req.key.as_str()));
        }
        Ok(attempt)
    }
}

/// The reply to an acquire is lost; reading the record back shows the lock is ours.
async fn readback(say: &impl Fn(String)) -> Result<Row> {
    say("4. readback: the reply to an acquire is lost after the store applied it".to_owned());
    let events = EventCounts::default();
    let locks = LockManager::builder()
        .client_id("demo")
        .farm_id("local")
        .store(LostFirstReply::default())
        .observer(events.clone())
        .readback(ReadbackLayer::new())
        .build()?;
    let guard = locks.try_lock("payment-9").await?;
    say(format!(
        "   without readback the caller would get an error while holding the lock for its whole TTL; \
         with it: acquired as {} ({} recovered by readback)",
        guard.token(),
        events.get("recovered_by_readback")
    ));
    guard.release().await?;
    Ok(Row {
        scenario: "readback",
        outcome: format!(
            "{} lost reply resolved by reading the record back: lock held, not leaked",
            events.get("recovered_by_readback")
        ),
    })
}

/// Shutdown releases every live lock instead of leaving them for their TTL.
async fn graceful_shutdown(say: &impl Fn(String)) -> Result<Row> {
    say(
        "5. graceful shutdown: three locks are held with a 90 s TTL when the process stops"
            .to_owned(),
    );
    let events = EventCounts::default();
    let store = MemoryStore::new();
    let locks = LockManager::builder()
        .client_id("demo")
        .farm_id("local")
        .store(store.clone())
        .observer(events.clone())
        .graceful_shutdown(GracefulShutdownLayer::new())
        .local_competition(LocalCompetitionLayer::new())
        .build()?;
    let mut guards = Vec::new();
    for job in ["job-1", "job-2", "job-3"] {
        guards.push(locks.try_lock(job).await?);
    }
    let started = Instant::now();
    let released = locks.shutdown().await?;
    let still_held = store.list("").await?.len();
    say(format!(
        "   shutdown released {released} live locks in {:?}; locks left in the store: {still_held} \
         (without it they would block others for 90 s)",
        started.elapsed()
    ));
    drop(guards);
    Ok(Row {
        scenario: "graceful shutdown",
        outcome: format!("{released} live locks released at shutdown, {still_held} left behind"),
    })
}
