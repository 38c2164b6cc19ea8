//! # leasehold
//!
//! Distributed locks as leases: a record in a shared store that says "token T holds key K until
//! time E". A [`LockManager`] hands out RAII [`LockGuard`]s over a [`LockStore`] — the embedded
//! [`MemoryStore`] by default, Aerospike or Redis in production — wrapped in scenario layers.
//!
//! ```
//! use std::time::Duration;
//! use leasehold::{LockManager, LockOptions};
//!
//! # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
//! // The recommended stack by default: every scenario layer, reentrancy per task, and a
//! // renewal watchdog for guards taken without an explicit TTL.
//! let locks = LockManager::builder().client_id("billing").farm_id("eu1").build()?;
//!
//! let guard = locks.try_lock("invoice-7").await?;
//! let again = locks.try_lock("invoice-7").await?; // same task: reentrant, counts up
//! drop(again);
//!
//! // Another task fails fast if someone holds it...
//! let other = locks.clone();
//! let fast = tokio::spawn(async move { other.try_lock("invoice-7").await.map(drop) });
//! assert!(fast.await.unwrap().unwrap_err().is_unavailable());
//! // ...or waits up to a deadline.
//! let other = locks.clone();
//! let waiting = tokio::spawn(async move {
//!     let wait = LockOptions::new().wait(Duration::from_millis(50));
//!     other.lock_with("invoice-7", wait).await.map(drop)
//! });
//! assert_eq!(waiting.await.unwrap().unwrap_err().kind(), leasehold::ErrorKind::Timeout);
//! guard.release().await?;
//! # Ok(()) }
//! ```
//!
//! See `docs/DESIGN.md` for how a request flows through the layers.
//!
//! ## Feature flags
//! Every feature is off by default; [`blocking`] and the embedded store need none.
//!
//! | feature | default | what it enables |
//! |---|---|---|
//! | `otel` | off | OpenTelemetry metrics: [`observe::OtelMetrics`](crate::observe), through the `opentelemetry` API crate |
//! | `signal` | off | `LockManager::install_signal_handler`: graceful shutdown on SIGINT/SIGTERM (Ctrl-C on Windows), through `ctrlc` |
#![forbid(unsafe_code)]

mod backoff;
pub mod blocking;
pub mod election;
mod failover;
mod guard;
mod handle;
mod holder;
mod keymap;
pub mod layers;
mod manager;
mod memory;
mod multi_guard;
pub mod observe;
mod renewal;
pub mod scenario;
mod schedule;
mod sweep;
mod waiters;

/// The lock model shared by every store and layer (re-export of `leasehold-core`).
pub use leasehold_core as core;

pub use leasehold_core::{
    option_layer, Acquire, BoxStore, Capabilities, Either, Error, ErrorKind, HolderId, HolderInfo,
    Identity, Layer, LayeredStore, Lease, Lifecycle, LockEvent, LockInfo, LockKey, LockLevel,
    LockMode, LockStore, Observer, Observers, OwnerToken, ReleaseWatch, Result, SkipReason, Stack,
    WaiterId, MAX_PERMITS,
};

pub use election::{Leader, Leadership};
pub use guard::{LockGuard, ReleaseOutcome};
pub use holder::Holder;
#[cfg(feature = "signal")]
pub use manager::SignalShutdown;
pub use manager::{
    LockManager, LockManagerBuilder, LockOptions, ToLockKey, Toggle, DEFAULT_LOCK_TTL,
    DEFAULT_MIN_BACKOFF, DEFAULT_RELEASE_RETRY, DEFAULT_RETRY_INTERVAL, DEFAULT_SHUTDOWN_TIMEOUT,
    DEFAULT_WAIT_FOR_LOCK,
};
pub use memory::MemoryStore;
pub use multi_guard::MultiGuard;

pub(crate) use keymap::KeyMap;

/// The README's code blocks, compiled as doc tests so the README never goes stale.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
