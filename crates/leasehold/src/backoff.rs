//! Jittered exponential backoff for waiting on a lock held in another process.

use std::time::Duration;

use rand::Rng;

/// Backoff between attempts of a blocking acquire: exponential from `min` up to `max`, with "equal
/// jitter" (a uniformly random point in the upper half of the step), so contenders spread out
/// instead of polling in lock-step. The seed polls every second; this starts at `min` (10 ms by
/// default) so a briefly held lock is picked up quickly, and never sleeps longer than `max`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Self {
        Backoff {
            min: min.min(max),
            max,
        }
    }

    /// The shortest step, unjittered: how long past a wait's deadline a store request begun at
    /// it may still run (see `manager::acquire`).
    pub(crate) fn shortest(&self) -> Duration {
        self.min
    }

    /// The longest step, jittered like the others: how often a waiter that expects to be
    /// notified asks anyway, in case the notification was lost.
    pub(crate) fn longest(&self) -> Duration {
        self.delay(u32::MAX)
    }

    /// The delay before attempt `attempt + 1` (`attempt` counts failed attempts, from 1).
    pub(crate) fn delay(&self, attempt: u32) -> Duration {
        let exp = self
            .min
            .saturating_mul(1u32 << attempt.saturating_sub(1).min(16))
            .min(self.max);
        let half = exp / 2;
        let jitter_nanos =
            rand::rng().random_range(0..=half.as_nanos().min(u64::MAX as u128) as u64);
        half + Duration::from_nanos(jitter_nanos)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_then_caps_with_jitter() {
        let b = Backoff::new(Duration::from_millis(10), Duration::from_secs(1));
        for _ in 0..100 {
            let d1 = b.delay(1);
            assert!(d1 >= Duration::from_millis(5) && d1 <= Duration::from_millis(10));
            let d4 = b.delay(4);
            assert!(d4 >= Duration::from_millis(40) && d4 <= Duration::from_millis(80));
            let d30 = b.delay(30);
            assert!(d30 >= Duration::from_millis(500) && d30 <= Duration::from_secs(1));
        }
        for _ in 0..100 {
            let longest = b.longest();
            assert!(longest >= Duration::from_millis(500) && longest <= Duration::from_secs(1));
        }
        let spread: std::collections::HashSet<_> = (0..50).map(|_| b.delay(8)).collect();
        assert!(spread.len() > 10, "jittered, not lock-step");
    }
}
