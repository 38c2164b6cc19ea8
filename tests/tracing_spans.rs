//! Tracing spans carry the documented fields (capturing subscriber).
//!
//! This test is alone in its binary on purpose: `tracing` caches each callsite's interest
//! process-wide, and a test on another thread that reaches a callsite first (with no subscriber
//! of its own) can leave it disabled for this test's thread-local subscriber.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::LockManager;

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
            .without_layers() // the bare manager's own spans
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
