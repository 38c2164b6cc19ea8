//! The longest durations a store or manager setting accepts, checked when it is built, before
//! any store I/O: a timeout of years is a unit mistake, and one beyond what an `Instant` can
//! hold would panic at the first deadline made from it.

use std::time::Duration;

use crate::error::{Error, Result};

/// The longest request, connect or waiter timeout a store accepts (10 minutes): a lock store
/// that takes longer to answer is down, and a waiter's place kept that long after a crash
/// holds the line up as long.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(600);

/// Checks that the setting `name` is at most `max`, with an error naming the setting, its value
/// and the bound. Zero and lower bounds are each setting's own rule.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{validate_at_most, MAX_TIMEOUT};
/// assert!(validate_at_most("response timeout", Duration::from_secs(2), MAX_TIMEOUT).is_ok());
/// let error = validate_at_most("response timeout", Duration::MAX, MAX_TIMEOUT).unwrap_err();
/// assert!(error.to_string().contains("response timeout"));
/// assert!(error.to_string().contains("10 minutes"));
/// ```
pub fn validate_at_most(name: &str, value: Duration, max: Duration) -> Result<()> {
    if value > max {
        return Err(Error::invalid_argument(format!(
            "{name} {value:?} is longer than {}, the longest accepted: check its unit",
            spoken(max)
        )));
    }
    Ok(())
}

/// A bound as people say it: "30 days", "10 minutes", else as `Debug` prints it.
fn spoken(d: Duration) -> String {
    let secs = d.as_secs();
    if d.subsec_nanos() != 0 || secs == 0 {
        return format!("{d:?}");
    }
    let (n, unit) = if secs.is_multiple_of(86_400) {
        (secs / 86_400, "day")
    } else if secs.is_multiple_of(3_600) {
        (secs / 3_600, "hour")
    } else if secs.is_multiple_of(60) {
        (secs / 60, "minute")
    } else {
        (secs, "second")
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_are_said_in_their_units() {
        assert_eq!(spoken(crate::MAX_TTL), "30 days");
        assert_eq!(spoken(MAX_TIMEOUT), "10 minutes");
        assert_eq!(spoken(Duration::from_secs(3_600)), "1 hour");
        assert_eq!(spoken(Duration::from_secs(61)), "61 seconds");
        assert_eq!(spoken(Duration::from_millis(1_500)), "1.5s");
    }

    #[test]
    fn the_bound_itself_is_accepted() {
        assert!(validate_at_most("x", MAX_TIMEOUT, MAX_TIMEOUT).is_ok());
        assert!(validate_at_most("x", MAX_TIMEOUT + Duration::from_nanos(1), MAX_TIMEOUT).is_err());
    }
}
