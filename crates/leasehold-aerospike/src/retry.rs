//! Retrying transient failures: a number of attempts for acquisitions (the seed's 5 × 80 ms),
//! a time budget with growing pauses for releases, extensions and connecting.

use std::time::Duration;

use tokio::time::Instant;

use crate::config::AerospikeConfig;

/// The longest pause between two attempts of a time-budgeted operation.
const MAX_PAUSE: Duration = Duration::from_secs(1);
/// The shortest pause of a time-budgeted operation (a zero retry delay must not spin).
const MIN_PAUSE: Duration = Duration::from_millis(10);

/// How often, and for how long, an operation may try again.
#[derive(Debug)]
pub(crate) struct Backoff {
    /// A time budget: attempts start until then. `None`: a number of attempts.
    deadline: Option<Instant>,
    /// Attempts allowed in all (counted budget only).
    attempts: u32,
    /// Attempts made so far.
    made: u32,
    /// The next pause.
    pause: Duration,
    started: Instant,
}

impl Backoff {
    /// The configured number of attempts, with the configured pause between them.
    pub(crate) fn attempts(config: &AerospikeConfig) -> Self {
        Backoff {
            deadline: None,
            attempts: config.retries.max(1),
            made: 1,
            pause: config.retry_delay,
            started: Instant::now(),
        }
    }

    /// Attempts until `deadline`, the pause doubling from the configured delay up to 1 s.
    pub(crate) fn until(config: &AerospikeConfig, deadline: Instant) -> Self {
        Backoff {
            deadline: Some(deadline),
            attempts: u32::MAX,
            made: 1,
            pause: config.retry_delay.clamp(MIN_PAUSE, MAX_PAUSE),
            started: Instant::now(),
        }
    }

    /// Pauses before the next attempt and returns `true`, or returns `false` at once when the
    /// budget is spent. A time budget's last pause ends at its deadline.
    pub(crate) async fn wait(&mut self) -> bool {
        match self.deadline {
            None => {
                if self.made >= self.attempts {
                    return false;
                }
                tokio::time::sleep(self.pause).await;
            }
            Some(deadline) => {
                let now = Instant::now();
                if now >= deadline {
                    return false;
                }
                tokio::time::sleep(self.pause.min(deadline - now)).await;
                self.pause = (self.pause * 2).min(MAX_PAUSE);
            }
        }
        self.made += 1;
        true
    }

    /// Attempts made so far (the first included).
    pub(crate) fn made(&self) -> u32 {
        self.made
    }

    /// What was spent, for messages: `3 attempt(s) in 420 ms`.
    pub(crate) fn spent(&self) -> String {
        format!(
            "{} attempt(s) in {} ms",
            self.made(),
            self.elapsed().as_millis()
        )
    }

    /// Time since the first attempt.
    pub(crate) fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_counted_budget_allows_its_attempts() {
        let config = AerospikeConfig::new("a:1", "ns", "f").retries(3, Duration::from_millis(80));
        let mut backoff = Backoff::attempts(&config);
        assert!(backoff.wait().await);
        assert!(backoff.wait().await);
        assert!(!backoff.wait().await, "three attempts in all");
        assert_eq!(backoff.made(), 3);
        assert_eq!(backoff.elapsed(), Duration::from_millis(160));
    }

    #[tokio::test(start_paused = true)]
    async fn a_time_budget_doubles_its_pause_up_to_one_second_and_ends_at_its_deadline() {
        let config = AerospikeConfig::new("a:1", "ns", "f").retries(5, Duration::from_millis(100));
        let start = Instant::now();
        let mut backoff = Backoff::until(&config, start + Duration::from_millis(2500));
        let mut pauses = Vec::new();
        let mut last = start;
        while backoff.wait().await {
            pauses.push((Instant::now() - last).as_millis());
            last = Instant::now();
        }
        assert_eq!(pauses, [100, 200, 400, 800, 1000]);
        assert_eq!(Instant::now() - start, Duration::from_millis(2500));
    }
}
