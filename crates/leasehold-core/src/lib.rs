//! The lock model every leasehold store and layer shares.
//!
//! A distributed lock is a lease: a record in a shared store that says "token T holds key K until
//! time E". This crate defines the pieces of that sentence and the contract a store must keep:
//!
//! - [`LockKey`] and [`LockLevel`]: validated storage keys (`DC#<farmId>#<lockId>`, `XDC#<lockId>`).
//! - [`OwnerToken`]: unique per acquisition, readable by a human looking at the store.
//! - [`LockMode`]: exclusive (the write side), shared (readers) or one of N semaphore permits.
//! - [`Lease`]: what an acquisition returns; [`LockInfo`]: what an inspection reads back.
//! - [`LockStore`]: the store trait (acquire, release, extend, inspect, list), its object-safe
//!   twin [`BoxStore`], and [`Capabilities`]; [`Attempt`]: an acquisition's answer, the lease or
//!   a refusal.
//! - [`Layer`] and [`LayeredStore`]: how scenario middlewares wrap a store, forwarding every
//!   operation they do not change; [`option_layer`] for optional ones.
//! - [`Lifecycle`]: the one closing signal and background-task tracker a manager shares with its
//!   layers.
//! - [`Error`] and [`ErrorKind`]: one error type for every store and layer; [`ErrorChain`] shows
//!   an error with its causes on one line.
//! - [`LockEvent`] and [`Observer`]: the one hook through which layers report what they did.
//! - [`TraceConfig`] and [`HistoryEntry`]: the opt-in per-key lock history kept in the store.
//!
//! Users normally depend on the `leasehold` facade crate, which re-exports all of this as
//! `leasehold::core` (for store and layer authors) and what applications use at its root.
#![forbid(unsafe_code)]

mod acquire;
mod attempt;
mod change_watch;
mod detached;
mod dyn_store;
mod error;
mod event;
mod history;
mod key;
mod layer;
mod layered;
mod lease;
mod lifecycle;
mod mode;
mod operation;
mod redact;
mod registry;
mod setting;
mod store;
mod tls;
mod token;
mod ttl;
mod undo;
mod watch;

pub use acquire::{Acquire, HolderId, Wait, WaiterId};
pub use attempt::Attempt;
pub use change_watch::ChangeWatch;
pub use detached::{acquire_detached, UndoIfCancelled};
pub use dyn_store::BoxStore;
pub use error::{Error, ErrorChain, ErrorKind, Result};
pub use event::{LockEvent, Observer, Observers, SkipReason};
pub use history::{HistoryEntry, HistoryEvent, TraceConfig};
pub use key::{LockKey, LockLevel, MAX_KEY_LEN, MAX_PART_LEN};
pub use layer::{option_layer, Either, Identity, Layer, Stack};
pub use layered::LayeredStore;
pub use lease::{wall_time_of, HolderInfo, Lease, LockInfo};
pub use lifecycle::Lifecycle;
pub use mode::{LockMode, MAX_PERMITS};
pub use operation::Operation;
pub use redact::redact_url;
pub use registry::NotifyRegistry;
pub use setting::{validate_at_most, MAX_TIMEOUT};
pub use store::{Capabilities, LockStore};
pub use tls::TlsFailure;
pub use token::{OwnerToken, TokenLabel, MAX_LABEL_LEN};
pub use ttl::{instant_after, ttl_millis, ttl_seconds, validate_ttl, MAX_TTL};
pub use undo::{spawn_undo, undo_finished, undo_running, undo_started, UndoGuard};
pub use watch::ReleaseWatch;
