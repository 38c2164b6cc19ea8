//! A store's answer to one acquisition attempt: the lease, or a refusal.

use std::time::Duration;

use crate::error::{Error, Result};
use crate::key::LockKey;
use crate::lease::Lease;

/// What a store answers one acquisition attempt ([`LockStore::acquire`](crate::LockStore::acquire)).
///
/// A refusal is an answer, not a failure: the lock is held (or a waiter line is ahead), and the
/// store says, where it can tell, when asking again can succeed without a release. That and
/// the [`watch`](crate::LockStore::watch)'s notifications are all a store tells a waiter. That
/// others are ahead of a granted lease is on the lease ([`Lease::is_contended`]).
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{Attempt, ErrorKind, LockKey};
///
/// let key = LockKey::xdc("orders", "order-42")?;
/// let refused = Attempt::refused_for(Duration::from_millis(40));
/// assert_eq!(refused.retry_after(), Some(Duration::from_millis(40)));
/// // A caller that makes one attempt reads a refusal as `LockUnavailable`.
/// assert_eq!(refused.into_lease(&key).unwrap_err().kind(), ErrorKind::LockUnavailable);
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub enum Attempt {
    /// The lock was taken: the lease.
    Granted(Lease),
    /// The lock is held by another owner, or others wait ahead in the store's line.
    Refused {
        /// How long until the lock can be free without a release (the holder's lease left, or
        /// the head waiter's deadline), where the store can tell; `Some(Duration::ZERO)`: ask
        /// again at once (the store's own state changed under the attempt); `None`: unknown,
        /// wait for a notification or the caller's backoff.
        retry_after: Option<Duration>,
    },
}

impl Attempt {
    /// A refusal that says nothing about when to ask again.
    pub fn refused() -> Self {
        Attempt::Refused { retry_after: None }
    }

    /// A refusal: asking again in `retry_after` can succeed without a release.
    pub fn refused_for(retry_after: Duration) -> Self {
        Attempt::Refused {
            retry_after: Some(retry_after),
        }
    }

    /// The lease, if granted.
    pub fn lease(&self) -> Option<&Lease> {
        match self {
            Attempt::Granted(lease) => Some(lease),
            Attempt::Refused { .. } => None,
        }
    }

    /// Whether the lock was taken.
    pub fn is_granted(&self) -> bool {
        matches!(self, Attempt::Granted(_))
    }

    /// For a refusal, when asking again can succeed (see [`Attempt::Refused`]); `None` for a
    /// grant or an unknown time.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            Attempt::Granted(_) => None,
            Attempt::Refused { retry_after } => *retry_after,
        }
    }

    /// The lease, or for a refusal [`ErrorKind::LockUnavailable`](crate::ErrorKind::LockUnavailable)
    /// for `key`: the answer as a caller that makes one attempt (`try_lock`) reads it.
    pub fn into_lease(self, key: &LockKey) -> Result<Lease> {
        match self {
            Attempt::Granted(lease) => Ok(lease),
            Attempt::Refused { .. } => Err(Error::unavailable(key)),
        }
    }
}

impl From<Lease> for Attempt {
    fn from(lease: Lease) -> Self {
        Attempt::Granted(lease)
    }
}
