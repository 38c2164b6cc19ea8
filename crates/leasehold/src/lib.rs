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
//! ## What lives where
//! The rule: an item is at the crate root when an application names it: to build and configure
//! a manager, pick its store, take, hold and release locks, read who holds one, watch what the
//! layers did or handle an error. An item only a store or layer author names (to implement
//! [`LockStore`] or write a layer) lives in [`core`] instead.
//!
//! - The root: [`LockManager`] and its builder, [`LockOptions`], the guards, [`Holder`],
//!   [`Error`], keys and modes, [`LockInfo`] and [`Lease`], [`LockStore`] (to pass a store to the
//!   builder and call [`inspect`](LockStore::inspect)), [`BoxStore`] (a store chosen at run time),
//!   [`MemoryStore`], [`LockEvent`] and [`Observer`], [`TraceConfig`] and the history.
//! - [`core`]: for store and layer authors: the request a store receives ([`core::Acquire`],
//!   [`core::WaiterId`], [`core::HolderId`]), its waiting and change signals
//!   ([`core::ReleaseWatch`], [`core::ChangeWatch`]), the shared [`core::Lifecycle`], and layer
//!   building ([`core::Layer`], [`core::LayeredStore`], [`core::Stack`], [`core::Identity`],
//!   [`core::Either`], [`core::option_layer`], [`core::Observers`]).
//! - [`layers`]: the scenario layers the builder assembles, to configure one or use one alone.
//! - [`scenario`]: named bundles of lock options, in code or from a TOML file.
//! - [`observe`]: the observers leasehold ships: the in-memory lock trace, OpenTelemetry
//!   metrics.
//! - [`election`]: leader election over a lock ([`Leadership`]); watching who leads ([`Leader`]).
//! - [`blocking`]: the same manager for synchronous code, without an async runtime.
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

/// For store and layer authors: the whole lock model (a re-export of `leasehold-core`).
///
/// Everything an application uses is also at the crate root; what only a store or layer author
/// needs is here alone: the request a store receives ([`Acquire`](core::Acquire),
/// [`WaiterId`](core::WaiterId), [`HolderId`](core::HolderId)), its waiting and change signals
/// ([`ReleaseWatch`](core::ReleaseWatch), [`ChangeWatch`](core::ChangeWatch)), the
/// [`Lifecycle`](core::Lifecycle) a manager shares with its layers, and the pieces a layer is
/// built from ([`Layer`](core::Layer), [`LayeredStore`](core::LayeredStore),
/// [`Stack`](core::Stack), [`Identity`](core::Identity), [`Either`](core::Either),
/// [`option_layer`](core::option_layer), [`Observers`](core::Observers)).
pub use leasehold_core as core;

pub use leasehold_core::{
    BoxStore, Capabilities, Error, ErrorKind, HistoryEntry, HistoryEvent, HolderInfo, Lease,
    LockEvent, LockInfo, LockKey, LockLevel, LockMode, LockStore, Observer, OwnerToken, Result,
    SkipReason, TraceConfig, MAX_PERMITS,
};

pub use election::{Leader, Leadership};
pub use guard::{LockGuard, ReleaseOutcome};
pub use holder::Holder;
pub use manager::{
    LockManager, LockManagerBuilder, LockOptions, ToLockKey, DEFAULT_LOCK_TTL, DEFAULT_MIN_BACKOFF,
    DEFAULT_RELEASE_RETRY, DEFAULT_RETRY_INTERVAL, DEFAULT_SHUTDOWN_TIMEOUT, DEFAULT_WAIT_FOR_LOCK,
};
#[cfg(feature = "signal")]
pub use manager::{SignalOutcome, SignalShutdown};
pub use memory::MemoryStore;
pub use multi_guard::MultiGuard;

pub(crate) use keymap::KeyMap;

/// The README's code blocks, compiled as doc tests so the README never goes stale.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
