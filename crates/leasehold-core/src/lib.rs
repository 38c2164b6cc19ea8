//! The lock model every leasehold store and layer shares.
//!
//! A distributed lock is a lease: a record in a shared store that says "token T holds key K until
//! time E". This crate defines the pieces of that sentence and the contract a store must keep:
//!
//! - [`LockKey`] and [`LockLevel`]: validated storage keys (`DC#<farmId>#<lockId>`, `XDC#<lockId>`).
//! - [`OwnerToken`]: unique per acquisition, readable by a human looking at the store.
//! - [`LockMode`]: exclusive (the write side), shared (readers) or one of N semaphore permits.
//! - [`Lease`]: what an acquisition returns; [`LockInfo`]: what an inspection reads back.
//! - [`LockStore`]: the store trait (try-acquire, release, extend, inspect, list), its object-safe
//!   twin [`BoxStore`], and [`Capabilities`].
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
mod store;
mod tls;
mod token;
mod watch;

pub use acquire::{Acquire, HolderId, WaiterId};
pub use change_watch::ChangeWatch;
pub use detached::{acquire_detached, acquire_undone_on_drop};
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
pub use store::{Capabilities, LockStore};
pub use tls::TlsFailure;
pub use token::{OwnerToken, TokenLabel, MAX_LABEL_LEN};
pub use watch::ReleaseWatch;

/// Longest TTL any leasehold API accepts (30 days). Longer leases are almost always a unit mistake
/// (milliseconds passed as seconds), and a lock that outlives a crash for a month is an outage.
pub const MAX_TTL: std::time::Duration = std::time::Duration::from_secs(30 * 24 * 3600);

/// `now + after`, or a point decades away when that does not fit in an [`Instant`]: for
/// user-given deadlines and budgets, where `Duration::MAX` means "no limit" and must not panic.
///
/// [`Instant`]: tokio::time::Instant
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// let now = Instant::now();
/// assert_eq!(leasehold_core::instant_after(now, Duration::from_secs(1)), now + Duration::from_secs(1));
/// assert!(leasehold_core::instant_after(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
/// ```
pub fn instant_after(
    now: tokio::time::Instant,
    after: std::time::Duration,
) -> tokio::time::Instant {
    const DECADES: std::time::Duration = std::time::Duration::from_secs(30 * 365 * 86_400);
    now.checked_add(after)
        .unwrap_or_else(|| now.checked_add(DECADES).unwrap_or(now))
}

/// Checks a TTL before any store I/O: zero and anything above [`MAX_TTL`] are rejected.
///
/// ```
/// use std::time::Duration;
/// assert!(leasehold_core::validate_ttl(Duration::from_secs(2)).is_ok());
/// assert!(leasehold_core::validate_ttl(Duration::ZERO).is_err());
/// ```
pub fn validate_ttl(ttl: std::time::Duration) -> Result<()> {
    if ttl.is_zero() {
        return Err(Error::invalid_argument(
            "lock TTL must be greater than zero (for example 2s for a fast path, 90s by default)",
        ));
    }
    if ttl > MAX_TTL {
        return Err(Error::invalid_argument(format!(
            "lock TTL {ttl:?} is longer than the maximum of 30 days; renew a shorter lease instead"
        )));
    }
    Ok(())
}
