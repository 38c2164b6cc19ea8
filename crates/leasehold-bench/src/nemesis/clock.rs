//! One clock for every process on the machine.
//!
//! The coordinator, the fenced resource and every worker process stamp their events with
//! `CLOCK_MONOTONIC`, which the kernel keeps once for the whole machine: a time read in one
//! process can be compared with a time read in another. std's `Instant` reads the same clock but
//! cannot be sent to another process, so times travel as nanoseconds.

use nix::time::{clock_gettime, ClockId};

/// Nanoseconds on the machine-wide monotonic clock.
pub fn now_ns() -> u64 {
    // clock_gettime(CLOCK_MONOTONIC) only fails for an unknown clock id; 0 would show up in the
    // history as an obviously wrong time rather than abort a run.
    clock_gettime(ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64)
        .unwrap_or(0)
}

/// Milliseconds between two clock readings (0 if `to` is earlier).
pub fn ms_between(from: u64, to: u64) -> f64 {
    to.saturating_sub(from) as f64 / 1e6
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward() {
        let a = now_ns();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let b = now_ns();
        assert!(b > a && ms_between(a, b) >= 2.0);
    }
}
