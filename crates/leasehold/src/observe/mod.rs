//! Observability: what the lock events become.
//!
//! Every layer and the manager report through one hook, [`Observer`](crate::Observer). This module
//! holds the observers leasehold ships:
//!
//! - [`LockTrace`]: a bounded in-memory ring of recent lock events (who acquired what, how long it
//!   waited, how long it held, how it ended) that ops can dump — the "lock trace" Bond added.
//! - `OtelMetrics` (feature `otel`): OpenTelemetry metrics through the `opentelemetry` API crate;
//!   install the SDK and exporter of your choice. Every instrument is listed in
//!   `docs/OBSERVABILITY.md`.
//!
//! Tracing spans (`leasehold.acquire`, `leasehold.release`, `leasehold.extend`) are emitted by the
//! manager and guards directly, with `key`, `store`, `scenario`, `mode`, `outcome` and `attempts`
//! fields and never a secret. Every event is observed with its scenario set
//! ([`current_scenario`]), so metrics carry a `scenario` attribute.

#[cfg(feature = "otel")]
mod metrics;
mod scope;
mod trace;

#[cfg(feature = "otel")]
pub use metrics::OtelMetrics;
pub use scope::current_scenario;
pub(crate) use scope::{in_scenario, keeping_scenario, with_scenario};
pub use trace::{LockTrace, TraceEntry};
