//! Lock TTLs and deadlines: the longest TTL any API accepts, the check every TTL goes through
//! before store I/O, how a TTL is rounded for a store's expiry, and deadlines that never
//! overflow.

use std::time::Duration;

use tokio::time::Instant;

use crate::error::{Error, Result};

/// Longest TTL any leasehold API accepts (30 days). Longer leases are almost always a unit mistake
/// (milliseconds passed as seconds), and a lock that outlives a crash for a month is an outage.
pub const MAX_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// `now + after`, or a point decades away when that does not fit in an [`Instant`]: for
/// user-given deadlines and budgets, where `Duration::MAX` means "no limit" and must not panic.
///
/// ```
/// use std::time::Duration;
/// use tokio::time::Instant;
/// let now = Instant::now();
/// assert_eq!(leasehold_core::instant_after(now, Duration::from_secs(1)), now + Duration::from_secs(1));
/// assert!(leasehold_core::instant_after(now, Duration::MAX) > now + Duration::from_secs(86_400 * 365));
/// ```
pub fn instant_after(now: Instant, after: Duration) -> Instant {
    const DECADES: Duration = Duration::from_secs(30 * 365 * 86_400);
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
pub fn validate_ttl(ttl: Duration) -> Result<()> {
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

/// Whole milliseconds for a store's expiry (`PX`, `PEXPIRE`), rounded up: a store must never
/// expire a lock before the client's lease says it does, and a sub-millisecond TTL never becomes
/// zero (no expiry at all, for some stores). Saturates at `u64::MAX`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(leasehold_core::ttl_millis(Duration::from_micros(1_001)), 2);
/// assert_eq!(leasehold_core::ttl_millis(Duration::from_millis(1_500)), 1_500);
/// ```
pub fn ttl_millis(ttl: Duration) -> u64 {
    u64::try_from(ttl.as_nanos().div_ceil(1_000_000))
        .unwrap_or(u64::MAX)
        .max(1)
}

/// Whole seconds for a store whose expiry counts seconds (etcd leases, Aerospike records),
/// rounded up and at least 1, for the same reason as [`ttl_millis`].
///
/// ```
/// use std::time::Duration;
/// assert_eq!(leasehold_core::ttl_seconds(Duration::from_millis(1_001)), 2);
/// assert_eq!(leasehold_core::ttl_seconds(Duration::from_millis(10)), 1);
/// assert_eq!(leasehold_core::ttl_seconds(Duration::from_secs(90)), 90);
/// ```
pub fn ttl_seconds(ttl: Duration) -> u64 {
    ttl.as_secs()
        .saturating_add(u64::from(ttl.subsec_nanos() > 0))
        .max(1)
}
