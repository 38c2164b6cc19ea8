//! How a shared write treats the record's TTL, so that the record never ends before its longest
//! holder's entry: the `ttl` filter and expiration each write carries.

use std::time::Duration;

use aerospike::expressions::{gt, int_val, le, ttl, Expression};
use aerospike::policy::{Expiration, RecordExistsAction};
use aerospike::WritePolicy;

use crate::store::ttl_seconds;

/// How a write treats the record's TTL, so that it never ends before the longest holder's entry.
/// `R` is the request's TTL in whole seconds, rounded up; the `ttl` expression is the record's
/// remaining TTL in whole seconds (rounded either way, the conditions hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// Filter `ttl <= R`, expiration `R + 1`: lengthens (or keeps) the record's life. Also
    /// creates an absent record.
    Set,
    /// Filter `ttl > R`, expiration unchanged, update-only: the record already outlives the entry.
    Keep,
}

impl Expiry {
    pub(super) fn apply(self, policy: &mut WritePolicy, ttl: Duration) -> Expression {
        let secs = ttl_seconds(ttl);
        match self {
            Expiry::Set => {
                policy.expiration = Expiration::Seconds(secs.saturating_add(1));
                le(self::ttl(), int_val(i64::from(secs)))
            }
            Expiry::Keep => {
                policy.expiration = Expiration::DontUpdate;
                policy.record_exists_action = RecordExistsAction::UpdateOnly;
                gt(self::ttl(), int_val(i64::from(secs)))
            }
        }
    }

    pub(super) fn for_record(record_ttl: Option<Duration>, ttl: Duration) -> Expiry {
        match record_ttl {
            Some(t) if t.as_secs() > u64::from(ttl_seconds(ttl)) => Expiry::Keep,
            _ => Expiry::Set,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_record_ttl_is_kept_only_when_longer() {
        let ttl = Duration::from_millis(1500);
        assert_eq!(Expiry::for_record(None, ttl), Expiry::Set);
        assert_eq!(
            Expiry::for_record(Some(Duration::from_secs(2)), ttl),
            Expiry::Set
        );
        assert_eq!(
            Expiry::for_record(Some(Duration::from_secs(3)), ttl),
            Expiry::Keep
        );
    }
}
