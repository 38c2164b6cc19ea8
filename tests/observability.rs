//! Observability: OpenTelemetry metrics recorded for a scripted sequence (in-memory exporter), and
//! tracing spans carrying the documented fields (capturing subscriber).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::observe::OtelMetrics;
use leasehold::{ErrorKind, LockManager, LockOptions};
use opentelemetry::metrics::MeterProvider as _;
use opentelemetry_sdk::metrics::data::{AggregatedMetrics, MetricData, ResourceMetrics};
use opentelemetry_sdk::metrics::{InMemoryMetricExporter, PeriodicReader, SdkMeterProvider};

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
    let exporter = InMemoryMetricExporter::default();
    let provider = SdkMeterProvider::builder()
        .with_reader(PeriodicReader::builder(exporter.clone()).build())
        .build();
    let meter = provider.meter("leasehold-test");
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
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

/// Captures every span's name and fields (including those recorded later).
#[derive(Clone, Default)]
struct Spans(Arc<Mutex<Vec<CapturedSpan>>>);

/// A span's name and its fields by name.
type CapturedSpan = (String, HashMap<String, String>);

struct Fields<'a>(&'a mut HashMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        self.0.insert(
            field.name().to_owned(),
            format!("{value:?}").trim_matches('"').to_owned(),
        );
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }
}

impl<S> tracing_subscriber::Layer<S> for Spans
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let mut fields = HashMap::new();
        fields.insert("#id".to_owned(), id.into_u64().to_string());
        attrs.record(&mut Fields(&mut fields));
        self.0
            .lock()
            .unwrap()
            .push((attrs.metadata().name().to_owned(), fields));
    }

    fn on_record(
        &self,
        id: &tracing::span::Id,
        values: &tracing::span::Record<'_>,
        _: tracing_subscriber::layer::Context<'_, S>,
    ) {
        let id = id.into_u64().to_string();
        let mut spans = self.0.lock().unwrap();
        if let Some((_, fields)) = spans.iter_mut().rev().find(|(_, f)| f["#id"] == id) {
            values.record(&mut Fields(fields));
        }
    }
}

#[test]
fn spans_carry_key_store_scenario_outcome_and_attempts() {
    use tracing_subscriber::layer::SubscriberExt;
    let spans = Spans::default();
    let subscriber = tracing_subscriber::registry().with(spans.clone());
    let _default = tracing::subscriber::set_default(subscriber);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let locks = LockManager::builder()
            .client_id("test")
            .farm_id("f1")
            .scenario("checkout")
            .build()
            .unwrap();
        let mut guard = locks.try_lock("cart-1").await.unwrap();
        let _ = locks.try_lock("cart-1").await.unwrap_err();
        guard.extend(Duration::from_secs(30)).await.unwrap();
        guard.release().await.unwrap();
    });
    let spans = spans.0.lock().unwrap();
    let find = |name: &str, outcome: &str| {
        spans
            .iter()
            .find(|(n, f)| n == name && f.get("outcome").map(String::as_str) == Some(outcome))
            .unwrap_or_else(|| panic!("no {name} span with outcome {outcome}: {spans:?}"))
            .1
            .clone()
    };
    let ok = find("leasehold.acquire", "acquired");
    assert_eq!(ok["key"], "DC#f1#test#cart-1");
    assert_eq!(ok["store"], "memory");
    assert_eq!(ok["scenario"], "checkout");
    assert_eq!(ok["mode"], "try");
    assert_eq!(ok["attempts"], "1");
    let contended = find("leasehold.acquire", "lock_unavailable");
    assert_eq!(contended["key"], "DC#f1#test#cart-1");
    assert_eq!(find("leasehold.extend", "extended")["store"], "memory");
    assert_eq!(
        find("leasehold.release", "released")["key"],
        "DC#f1#test#cart-1"
    );
    for (_, fields) in spans.iter() {
        for value in fields.values() {
            assert!(!value.contains("password"), "no secrets in span fields");
        }
    }
}
