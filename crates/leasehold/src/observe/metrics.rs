//! OpenTelemetry metrics from lock events.

use opentelemetry::metrics::{Counter, Histogram, Meter, UpDownCounter};
use opentelemetry::KeyValue;

use super::scope::current_scenario;
use crate::core::{ErrorKind, LockEvent, Observer};

/// Records lock events as OpenTelemetry metrics, through the `opentelemetry` API crate: install
/// the SDK and an exporter, hand a [`Meter`] here, and add the result as an observer.
///
/// Instruments (all listed, with units and attributes, in `docs/OBSERVABILITY.md`):
/// `leasehold.acquire.duration` (histogram, s, `outcome`), `leasehold.acquisitions` (`outcome` =
/// acquired / unavailable / timeout / error), `leasehold.contentions`, `leasehold.fast_fails`,
/// `leasehold.readback.recoveries` (`operation`, `held`), `leasehold.unlock_window.skips`,
/// `leasehold.reentries`, `leasehold.handoffs`, `leasehold.releases` (`was_held`),
/// `leasehold.shutdown.releases`, `leasehold.renewals`, `leasehold.locks.lost`,
/// `leasehold.store_down.proceeded` (`error.type`), `leasehold.releases.left_to_expire`
/// (`error.type`), and the up-down counter
/// `leasehold.locks.held`. Every measurement carries the `scenario` of the lock operation
/// ([`current_scenario`](crate::observe::current_scenario); `default` outside one).
///
/// ```
/// use leasehold::{LockManager, observe::OtelMetrics};
/// let meter = opentelemetry::global::meter("my-service");
/// let locks = LockManager::builder()
///     .client_id("app").farm_id("f1")
///     .observer(OtelMetrics::new(&meter).with_attributes([opentelemetry::KeyValue::new("store", "memory")]))
///     .build()?;
/// # Ok::<(), leasehold::Error>(())
/// ```
#[derive(Debug, Clone)]
pub struct OtelMetrics {
    attributes: Vec<KeyValue>,
    acquire_duration: Histogram<f64>,
    acquisitions: Counter<u64>,
    contentions: Counter<u64>,
    fast_fails: Counter<u64>,
    readback_recoveries: Counter<u64>,
    unlock_window_skips: Counter<u64>,
    reentries: Counter<u64>,
    handoffs: Counter<u64>,
    releases: Counter<u64>,
    shutdown_releases: Counter<u64>,
    renewals: Counter<u64>,
    lost: Counter<u64>,
    proceeded: Counter<u64>,
    left_to_expire: Counter<u64>,
    held: UpDownCounter<i64>,
}

impl OtelMetrics {
    /// Creates every instrument on `meter`.
    pub fn new(meter: &Meter) -> Self {
        let counter = |name: &'static str, unit: &'static str, description: &'static str| {
            meter
                .u64_counter(name)
                .with_unit(unit)
                .with_description(description)
                .build()
        };
        OtelMetrics {
            attributes: Vec::new(),
            acquire_duration: meter
                .f64_histogram("leasehold.acquire.duration")
                .with_unit("s")
                .with_description("Time from an acquire call to its outcome, including any wait")
                .with_boundaries(vec![
                    0.000_01, 0.000_05, 0.000_1, 0.000_5, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0,
                    5.0, 10.0, 60.0,
                ])
                .build(),
            acquisitions: counter(
                "leasehold.acquisitions",
                "{acquisition}",
                "Acquire calls by outcome: acquired, unavailable, timeout, error",
            ),
            contentions: counter(
                "leasehold.contentions",
                "{attempt}",
                "Acquire attempts that found the lock held by another owner",
            ),
            fast_fails: counter(
                "leasehold.fast_fails",
                "{attempt}",
                "Attempts refused by local competition without store I/O",
            ),
            readback_recoveries: counter(
                "leasehold.readback.recoveries",
                "{operation}",
                "Operations with a lost reply resolved by reading the record back",
            ),
            unlock_window_skips: counter(
                "leasehold.unlock_window.skips",
                "{release}",
                "Releases not sent because the unlock window had closed",
            ),
            reentries: counter(
                "leasehold.reentries",
                "{acquisition}",
                "Reentrant acquisitions of a key the holder already held",
            ),
            handoffs: counter(
                "leasehold.handoffs",
                "{acquisition}",
                "Leases handed to a local waiter without a store round trip",
            ),
            releases: counter(
                "leasehold.releases",
                "{release}",
                "Releases by whether the lock was still ours",
            ),
            shutdown_releases: counter(
                "leasehold.shutdown.releases",
                "{lock}",
                "Live locks released by graceful shutdown",
            ),
            renewals: counter(
                "leasehold.renewals",
                "{renewal}",
                "Successful lease renewals",
            ),
            lost: counter(
                "leasehold.locks.lost",
                "{lock}",
                "Held locks found lost by renewal",
            ),
            proceeded: counter(
                "leasehold.store_down.proceeded",
                "{acquisition}",
                "Acquisitions that proceeded WITHOUT the lock because the store was down \
                 (on_store_down = proceed): an alert",
            ),
            left_to_expire: counter(
                "leasehold.releases.left_to_expire",
                "{release}",
                "Releases that gave up (a store that stayed down, or an error retrying cannot \
                 cure): the lock is left to expire at its TTL",
            ),
            held: meter
                .i64_up_down_counter("leasehold.locks.held")
                .with_unit("{lock}")
                .with_description("Guards currently held by this process")
                .build(),
        }
    }

    /// Attributes added to every measurement (for example `store`, `service`).
    pub fn with_attributes(mut self, attributes: impl IntoIterator<Item = KeyValue>) -> Self {
        self.attributes = attributes.into_iter().collect();
        self
    }

    /// The configured attributes, the `scenario` of the operation observed, and `extra`.
    fn attrs(&self, extra: &[KeyValue]) -> Vec<KeyValue> {
        let scenario = current_scenario().map_or_else(
            || opentelemetry::Value::from("default"),
            |s| opentelemetry::Value::from(s.to_string()),
        );
        self.attributes
            .iter()
            .cloned()
            .chain(std::iter::once(KeyValue::new("scenario", scenario)))
            .chain(extra.iter().cloned())
            .collect()
    }
}

fn outcome(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::LockUnavailable => "unavailable",
        ErrorKind::Timeout => "timeout",
        _ => "error",
    }
}

impl Observer for OtelMetrics {
    fn on_event(&self, event: &LockEvent) {
        match event {
            LockEvent::Acquired { waited, .. } => {
                let attrs = self.attrs(&[KeyValue::new("outcome", "acquired")]);
                self.acquire_duration.record(waited.as_secs_f64(), &attrs);
                self.acquisitions.add(1, &attrs);
                self.held.add(1, &self.attrs(&[]));
            }
            LockEvent::AcquireFailed { error, waited, .. } => {
                let mut attrs = self.attrs(&[KeyValue::new("outcome", outcome(*error))]);
                self.acquire_duration.record(waited.as_secs_f64(), &attrs);
                if outcome(*error) == "error" {
                    attrs.push(KeyValue::new("error.type", error.as_str()));
                }
                self.acquisitions.add(1, &attrs);
            }
            LockEvent::Contended { .. } => self.contentions.add(1, &self.attrs(&[])),
            LockEvent::FastFailed { .. } => self.fast_fails.add(1, &self.attrs(&[])),
            LockEvent::RecoveredByReadback {
                operation, held, ..
            } => self.readback_recoveries.add(
                1,
                &self.attrs(&[
                    KeyValue::new("operation", *operation),
                    KeyValue::new("held", *held),
                ]),
            ),
            LockEvent::ReleaseSkipped { .. } => self.unlock_window_skips.add(1, &self.attrs(&[])),
            LockEvent::Reentered { .. } => self.reentries.add(1, &self.attrs(&[])),
            LockEvent::HandedOff { .. } => self.handoffs.add(1, &self.attrs(&[])),
            LockEvent::Released { was_held, .. } => self
                .releases
                .add(1, &self.attrs(&[KeyValue::new("was_held", *was_held)])),
            LockEvent::GuardEnded { .. } => self.held.add(-1, &self.attrs(&[])),
            LockEvent::ReleasedAtShutdown { .. } => self.shutdown_releases.add(1, &self.attrs(&[])),
            LockEvent::Renewed { .. } => self.renewals.add(1, &self.attrs(&[])),
            LockEvent::Lost { .. } => self.lost.add(1, &self.attrs(&[])),
            LockEvent::ProceededWithoutLock { error, .. } => self.proceeded.add(
                1,
                &self.attrs(&[KeyValue::new("error.type", error.as_str())]),
            ),
            LockEvent::LeftToExpire { error, .. } => self.left_to_expire.add(
                1,
                &self.attrs(&[KeyValue::new("error.type", error.as_str())]),
            ),
            _ => {}
        }
    }
}
