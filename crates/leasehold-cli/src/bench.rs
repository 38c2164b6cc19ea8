//! `leasehold bench`: a contention benchmark against any store.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use indicatif::{ProgressBar, ProgressStyle};
use leasehold::layers::{CountingLayer, LocalCompetitionLayer};
use leasehold::scenario::LayerSetting;
use leasehold::{LockManager, LockOptions};
use serde::Serialize;
use tokio::time::Instant;

use crate::cli::{BenchArgs, Global};
use crate::events::EventCounts;
use crate::exit::{self, CliError};
use crate::store::Target;

/// The summary (`--json` prints exactly this).
#[derive(Debug, Serialize)]
struct Summary {
    store: String,
    tasks: usize,
    keys: usize,
    hand_off: bool,
    duration_s: f64,
    acquisitions: u64,
    acquisitions_per_s: f64,
    acquire_latency_us: Latency,
    store_requests: u64,
    store_requests_per_acquisition: f64,
    fast_fails: u64,
    errors: BTreeMap<String, u64>,
}

#[derive(Debug, Serialize)]
struct Latency {
    p50: u64,
    p99: u64,
    max: u64,
}

pub(crate) async fn bench(global: &Global, args: BenchArgs) -> Result<u8, CliError> {
    if args.tasks == 0 || args.keys == 0 || args.duration.is_zero() {
        return Err(CliError::usage(
            "--tasks, --keys and --duration must be greater than zero (e.g. --tasks 64 --keys 1 --duration 5s)",
        ));
    }
    let target = Target::connect(global).await?;
    let events = EventCounts::default();
    let counting = CountingLayer::new();
    let counts = counting.counts();
    let locks = LockManager::builder()
        .client_id(&target.names.client_id)
        .farm_id(&target.names.farm_id)
        .default_level(target.names.level)
        .store(target.store.clone())
        .layer(counting)
        .observer(events.clone())
        .default_layers()
        .local_competition(if args.no_local_competition {
            LayerSetting::from(false)
        } else {
            LayerSetting::from(LocalCompetitionLayer::new().hand_off(args.hand_off))
        })
        .lock_ttl(Duration::from_secs(10))
        .build()
        .map_err(|e| target.error(e))?;
    let run = format!("bench-{}", std::process::id());
    let keys: Arc<Vec<String>> = Arc::new((0..args.keys).map(|i| format!("{run}-{i}")).collect());

    let bar = ProgressBar::new(args.duration.as_millis() as u64);
    if let Ok(style) = ProgressStyle::with_template("{spinner} [{bar:30}] {elapsed} {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    let acquired = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let deadline = started + args.duration;
    let workers: Vec<_> = (0..args.tasks)
        .map(|task| {
            let locks = locks.clone();
            let keys = keys.clone();
            let acquired = acquired.clone();
            tokio::spawn(async move {
                let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
                    .map_err(|e| e.to_string())?;
                let mut errors: BTreeMap<String, u64> = BTreeMap::new();
                let mut i = task;
                while Instant::now() < deadline {
                    let key = &keys[i % keys.len()];
                    i += 1;
                    let asked = Instant::now();
                    let wait = deadline.saturating_duration_since(asked);
                    match locks.lock_with(key, LockOptions::new().wait(wait)).await {
                        Ok(guard) => {
                            let _ = latency.record(asked.elapsed().as_micros().max(1) as u64);
                            acquired.fetch_add(1, Ordering::Relaxed);
                            if let Err(e) = guard.release().await {
                                *errors.entry(e.kind().as_str().to_owned()).or_insert(0) += 1;
                            }
                        }
                        Err(e) if e.kind() == leasehold::ErrorKind::Timeout => break,
                        Err(e) => {
                            *errors.entry(e.kind().as_str().to_owned()).or_insert(0) += 1;
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                Ok::<_, String>((latency, errors))
            })
        })
        .collect();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        bar.set_position(started.elapsed().as_millis() as u64);
        bar.set_message(format!("{} acquisitions", acquired.load(Ordering::Relaxed)));
    }
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)
        .map_err(|e| CliError::new(exit::FAILURE, e.to_string()))?;
    let mut errors = BTreeMap::new();
    for worker in workers {
        let (h, e) = worker
            .await
            .map_err(|e| CliError::new(exit::FAILURE, format!("bench worker: {e}")))?
            .map_err(|e| CliError::new(exit::FAILURE, e))?;
        latency
            .add(&h)
            .map_err(|e| CliError::new(exit::FAILURE, e.to_string()))?;
        for (kind, n) in e {
            *errors.entry(kind).or_insert(0) += n;
        }
    }
    let elapsed = started.elapsed();
    bar.finish_and_clear();

    let acquisitions = acquired.load(Ordering::Relaxed);
    let requests = counts.total();
    let summary = Summary {
        store: target.url().to_string(),
        tasks: args.tasks,
        keys: args.keys,
        hand_off: args.hand_off,
        duration_s: elapsed.as_secs_f64(),
        acquisitions,
        acquisitions_per_s: acquisitions as f64 / elapsed.as_secs_f64(),
        acquire_latency_us: Latency {
            p50: latency.value_at_quantile(0.5),
            p99: latency.value_at_quantile(0.99),
            max: latency.max(),
        },
        store_requests: requests,
        store_requests_per_acquisition: requests as f64 / acquisitions.max(1) as f64,
        fast_fails: events.get("fast_failed"),
        errors,
    };
    if args.json {
        let json = serde_json::to_string_pretty(&summary)
            .map_err(|e| CliError::new(exit::FAILURE, e.to_string()))?;
        println!("{json}");
    } else {
        println!("store                     {}", summary.store);
        println!(
            "tasks × keys              {} × {} (hand-off {})",
            summary.tasks,
            summary.keys,
            if summary.hand_off { "on" } else { "off" }
        );
        println!(
            "acquisitions              {} in {:.2}s = {:.0}/s",
            summary.acquisitions, summary.duration_s, summary.acquisitions_per_s
        );
        println!(
            "acquire latency           p50 {} µs, p99 {} µs, max {} µs",
            summary.acquire_latency_us.p50,
            summary.acquire_latency_us.p99,
            summary.acquire_latency_us.max
        );
        println!(
            "store requests            {} ({:.2} per acquisition)",
            summary.store_requests, summary.store_requests_per_acquisition
        );
        println!("local fast-fails          {}", summary.fast_fails);
        if summary.errors.is_empty() {
            println!("errors                    none");
        } else {
            for (kind, n) in &summary.errors {
                println!("errors                    {kind}: {n}");
            }
        }
    }
    Ok(exit::OK)
}
