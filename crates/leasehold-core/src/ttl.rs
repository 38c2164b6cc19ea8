//! Lock TTLs and deadlines: the longest TTL any API accepts, the check every TTL goes through
//! before store I/O, and deadlines that never overflow.

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
