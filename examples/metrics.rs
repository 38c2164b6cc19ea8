//! OpenTelemetry metrics and the lock trace while a few workers contend for two hot keys.
//!
//! Run: `cargo run --example metrics --features leasehold/otel`
//!
//! The stdout exporter prints every instrument (see docs/OBSERVABILITY.md) each second; at the end
//! the lock trace shows the last events. The demo is [`run`], which takes the exporter and the
//! writer to print to: the test suite (`tests/examples.rs`) gives it an in-memory exporter and a
//! buffer, and checks both.

use std::io::Write;
use std::time::Duration;

use leasehold::observe::{LockTrace, OtelMetrics};
use leasehold::{LockManager, LockOptions};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::exporter::PushMetricExporter;
use opentelemetry_sdk::metrics::{PeriodicReader, SdkMeterProvider};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    run(
        opentelemetry_stdout::MetricExporter::default(),
        &mut std::io::stdout(),
    )
    .await
}

/// Six workers contend for two keys for two seconds, with metrics exported through `exporter`;
/// the workers' tallies and the last lock trace entries are printed to `out`.
pub(crate) async fn run(
    exporter: impl PushMetricExporter,
    out: &mut dyn Write,
) -> Result<(), Box<dyn std::error::Error>> {
    let reader = PeriodicReader::builder(exporter)
        .with_interval(Duration::from_secs(1))
        .build();
    let provider = SdkMeterProvider::builder().with_reader(reader).build();
    let meter = provider.meter("leasehold-example");
    let trace = LockTrace::new(256);

    let locks = LockManager::builder()
        .client_id("metrics-demo")
        .farm_id("local")
        .lock_ttl(Duration::from_secs(2))
        .observer(OtelMetrics::new(&meter))
        .observer(trace.clone())
        .build()?;

    let workers: Vec<_> = (0..6)
        .map(|worker| {
            let locks = locks.clone();
            tokio::spawn(async move {
                let key = if worker % 2 == 0 { "hot-a" } else { "hot-b" };
                let until = tokio::time::Instant::now() + Duration::from_secs(2);
                let (mut won, mut gave_up) = (0, 0);
                while tokio::time::Instant::now() < until {
                    let opts = LockOptions::new().wait(Duration::from_millis(20));
                    match locks.lock_with(key, opts).await {
                        Ok(guard) => {
                            tokio::time::sleep(Duration::from_millis(5)).await;
                            guard.release().await?;
                            won += 1;
                        }
                        Err(e) if e.kind() == leasehold::ErrorKind::Timeout => gave_up += 1,
                        Err(e) => return Err(e),
                    }
                }
                Ok::<_, leasehold::Error>((worker, won, gave_up))
            })
        })
        .collect();
    for worker in workers {
        let (id, won, gave_up) = worker.await??;
        writeln!(
            out,
            "worker {id}: acquired {won} times, gave up {gave_up} times"
        )?;
    }
    provider.shutdown()?;

    writeln!(out, "\nlast lock trace entries:")?;
    for entry in trace.entries().iter().rev().take(5).rev() {
        writeln!(out, "  {} {:<14} {}", entry.key, entry.event, entry.detail)?;
    }
    Ok(())
}
