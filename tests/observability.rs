//! Observability: OpenTelemetry metrics recorded for a scripted sequence (in-memory exporter).
//! The tracing spans are checked in `tracing_spans.rs`.

use std::time::Duration;

use leasehold::observe::OtelMetrics;
use leasehold::{ErrorKind, LockManager, LockOptions};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

/// A meter whose measurements are exported, on `force_flush`, to the in-memory exporter.
fn in_memory_metrics() -> (
    InMemoryMetricExporter,
    SdkMeterProvider,
    opentelemetry::metrics::Meter,
) {
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let meter = provider.meter("leasehold-test");
    (exporter, provider, meter)
}

/// Sum of every data point of a u64 counter whose attributes include `filter`.
fn counter(metrics: &[ResourceMetrics], name: &str, filter: Option<(&str, &str)>) -> u64 {
    let mut total = 0;
    for rm in metrics {
        for scope in rm.scope_metrics() {
            for metric in scope.metrics().filter(|m| m.name() == name) {
                if let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() {
                    for point in sum.data_points() {
                        let matches = filter.is_none_or(|(k, v)| {
                            point
                                .attributes()
                                .any(|kv| kv.key.as_str() == k && kv.value.as_str() == v)
                        });
                        if matches {
                            total += point.value();
                        }
                    }
                }
            }
        }
    }
    total
}

fn up_down(metrics: &[ResourceMetrics], name: &str) -> i64 {
    let mut total = 0;
    for rm in metrics {
        for scope in rm.scope_metrics() {
            for metric in scope.metrics().filter(|m| m.name() == name) {
                if let AggregatedMetrics::I64(MetricData::Sum(sum)) = metric.data() {
                    total += sum.data_points().map(|p| p.value()).sum::<i64>();
                }
            }
        }
    }
    total
}

fn histogram_count(metrics: &[ResourceMetrics], name: &str, outcome: &str) -> u64 {
    let mut total = 0;
    for rm in metrics {
        for scope in rm.scope_metrics() {
            for metric in scope.metrics().filter(|m| m.name() == name) {
                if let AggregatedMetrics::F64(MetricData::Histogram(h)) = metric.data() {
                    for point in h.data_points() {
                        if point
                            .attributes()
                            .any(|kv| kv.key.as_str() == "outcome" && kv.value.as_str() == outcome)
                        {
                            total += point.count();
                        }
                    }
                }
            }
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_record_a_scripted_sequence() {
    let (exporter, provider, meter) = in_memory_metrics();
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .without_layers() // the bare manager's own metrics
        .observer(OtelMetrics::new(&meter))
        .build()
        .unwrap();

    // 2 acquired, 1 unavailable (try), 1 timeout (wait), 1 still held, 1 released.
    let held = locks.try_lock("a").await.unwrap();
    assert!(locks.try_lock("a").await.unwrap_err().is_unavailable());
    let err = locks
        .lock_with("a", LockOptions::new().wait(Duration::from_millis(30)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout);
    let other = locks.try_lock("b").await.unwrap();
    other.release().await.unwrap();

    provider.force_flush().unwrap();
    let metrics = exporter.get_finished_metrics().unwrap();
    let acq = "leasehold.acquisitions";
    assert_eq!(counter(&metrics, acq, Some(("outcome", "acquired"))), 2);
    assert_eq!(counter(&metrics, acq, Some(("outcome", "unavailable"))), 1);
    assert_eq!(counter(&metrics, acq, Some(("outcome", "timeout"))), 1);
    assert_eq!(counter(&metrics, acq, Some(("outcome", "error"))), 0);
    let contentions = counter(&metrics, "leasehold.contentions", None);
    assert!(
        contentions >= 2,
        "try + at least one waiting attempt: {contentions}"
    );
    assert_eq!(
        counter(&metrics, "leasehold.releases", Some(("was_held", "true"))),
        1
    );
    assert_eq!(
        up_down(&metrics, "leasehold.locks.held"),
        1,
        "`a` still held"
    );
    assert_eq!(
        histogram_count(&metrics, "leasehold.acquire.duration", "acquired"),
        2
    );
    assert_eq!(
        histogram_count(&metrics, "leasehold.acquire.duration", "timeout"),
        1
    );
    held.release().await.unwrap();
}

/// Sum of a u64 counter's data points carrying every attribute of `filters`.
fn counter_where(metrics: &[ResourceMetrics], name: &str, filters: &[(&str, &str)]) -> u64 {
    let mut total = 0;
    for rm in metrics {
        for scope in rm.scope_metrics() {
            for metric in scope.metrics().filter(|m| m.name() == name) {
                if let AggregatedMetrics::U64(MetricData::Sum(sum)) = metric.data() {
                    for point in sum.data_points() {
                        let all = filters.iter().all(|(k, v)| {
                            point
                                .attributes()
                                .any(|kv| kv.key.as_str() == *k && kv.value.as_str() == *v)
                        });
                        if all {
                            total += point.value();
                        }
                    }
                }
            }
        }
    }
    total
}

/// Contention, fast-fails, waits and lost locks of one scenario read apart from the others'.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_carries_the_scenario() {
    use leasehold::scenario::{AcquireMode, Scenario, ScenarioRegistry};
    use leasehold::LockStore as _;

    let (exporter, provider, meter) = in_memory_metrics();
    let registry = ScenarioRegistry::new()
        .with(Scenario::new("feed").keys("feed-*").mode(AcquireMode::Try))
        .unwrap()
        .with(
            Scenario::new("checkout")
                .keys("order-*")
                .wait(Duration::from_millis(30))
                .layers(leasehold::scenario::LayerSettings::new().local_competition(false)),
        )
        .unwrap()
        .with(
            Scenario::new("nightly")
                .keys("job-*")
                .ttl(Duration::from_secs(5))
                .renew_every(Duration::from_millis(10)),
        )
        .unwrap();
    let store = leasehold::MemoryStore::new();
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(store.clone())
        .scenarios(registry)
        .observer(OtelMetrics::new(&meter))
        .build()
        .unwrap();

    // feed: a second task fails fast locally.
    let feed = locks.acquire("feed-1").await.unwrap();
    let other = locks.clone();
    let refused = tokio::spawn(async move { other.acquire("feed-1").await.map(drop) });
    assert!(refused.await.unwrap().unwrap_err().is_unavailable());
    feed.release().await.unwrap();

    // checkout: a second task contends in the store and waits until its deadline.
    let order = locks.acquire("order-1").await.unwrap();
    let other = locks.clone();
    let waited = tokio::spawn(async move { other.acquire("order-1").await.map(drop) });
    assert_eq!(
        waited.await.unwrap().unwrap_err().kind(),
        ErrorKind::Timeout
    );
    order.release().await.unwrap();

    // nightly: the record vanishes under a renewing guard, which loses the lock.
    let job = locks.acquire("job-1").await.unwrap();
    assert!(store.release(&job.lease()).await.unwrap());
    job.lost().await;
    drop(job);

    provider.force_flush().unwrap();
    let metrics = exporter.get_finished_metrics().unwrap();
    let by = |name: &str, scenario: &str| counter_where(&metrics, name, &[("scenario", scenario)]);
    assert!(by("leasehold.fast_fails", "feed") >= 1);
    assert_eq!(by("leasehold.fast_fails", "checkout"), 0);
    assert!(by("leasehold.contentions", "checkout") >= 1);
    assert_eq!(
        counter_where(
            &metrics,
            "leasehold.acquisitions",
            &[("scenario", "checkout"), ("outcome", "timeout")]
        ),
        1
    );
    assert_eq!(
        counter_where(
            &metrics,
            "leasehold.acquisitions",
            &[("scenario", "feed"), ("outcome", "unavailable")]
        ),
        1
    );
    assert_eq!(by("leasehold.locks.lost", "nightly"), 1);
    assert_eq!(by("leasehold.locks.lost", "checkout"), 0);
    assert_eq!(by("leasehold.acquisitions", "nightly"), 1);
    assert!(by("leasehold.releases", "feed") >= 1);
}

/// `leasehold.locks.held` counts guards, so every way a guard ends counts it down: a release
/// kept for its hold period, a release the store failed, a guard given up to a drop; and the
/// embedded store's plain release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_held_count_goes_back_to_zero_however_a_guard_ends() {
    use leasehold::core::{Error, ErrorKind};
    use leasehold_testkit::scripted::ScriptedStore;

    let (exporter, provider, meter) = in_memory_metrics();
    let held_now = || {
        provider.force_flush().unwrap();
        let metrics = exporter.get_finished_metrics().unwrap();
        let last = metrics.len().saturating_sub(1);
        up_down(&metrics[last..], "leasehold.locks.held")
    };

    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .observer(OtelMetrics::new(&meter))
        .build()
        .unwrap();
    let kept = locks
        .try_lock_with(
            "job",
            LockOptions::new().hold_at_least(Duration::from_secs(60)),
        )
        .await
        .unwrap();
    let plain = locks.try_lock("plain").await.unwrap();
    let dropped = locks.try_lock("dropped").await.unwrap();
    assert_eq!(held_now(), 3);
    assert!(matches!(
        kept.release_outcome().await.unwrap(),
        leasehold::ReleaseOutcome::Kept { .. }
    ));
    assert!(plain.release().await.unwrap());
    drop(dropped);
    locks.shutdown().await.unwrap();
    assert_eq!(held_now(), 0, "kept, released and dropped guards all ended");

    // A release the store refuses for good: the guard ends with the error.
    let store = ScriptedStore::new();
    store
        .grant_acquire()
        .expect_release(Err(Error::new(ErrorKind::Internal, "the script failed")));
    let failing = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .without_layers()
        .renewal(false)
        .store(store.clone())
        .observer(OtelMetrics::new(&meter))
        .build()
        .unwrap();
    let guard = failing.try_lock("k").await.unwrap();
    assert_eq!(held_now(), 1);
    assert!(guard.release().await.is_err());
    assert_eq!(held_now(), 0, "a guard whose release failed ended too");
    store.verify();
}

/// A release the manager sends in the background (here the undo of an attempt whose reply was
/// lost) reports in the scenario of the call it undoes, not `default`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_release_reports_in_its_calls_scenario() {
    use leasehold::core::{Error, ErrorKind};
    use leasehold::scenario::{Scenario, ScenarioRegistry};
    use leasehold_testkit::scripted::{reply_lost, Op, ScriptedStore};

    let (exporter, provider, meter) = in_memory_metrics();
    let store = ScriptedStore::new();
    store
        .expect_acquire(Err(reply_lost()))
        .expect_release(Err(Error::new(ErrorKind::Internal, "the script failed")));
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .without_layers()
        .store(store.clone())
        .scenarios(
            ScenarioRegistry::new()
                .with(Scenario::new("feed").keys("feed-*"))
                .unwrap(),
        )
        .observer(OtelMetrics::new(&meter))
        .build()
        .unwrap();
    let err = locks.try_lock("feed-1").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    // The undo runs in the background: the shutdown waits for it.
    locks.shutdown().await.unwrap();
    assert_eq!(store.count(Op::Release), 1, "the undo was sent");
    provider.force_flush().unwrap();
    let metrics = exporter.get_finished_metrics().unwrap();
    let left = |scenario: &str| {
        counter_where(
            &metrics,
            "leasehold.releases.left_to_expire",
            &[("scenario", scenario)],
        )
    };
    assert_eq!(
        left("feed"),
        1,
        "the undo's alert carries the call's scenario"
    );
    assert_eq!(left("default"), 0);
    store.verify();
}
