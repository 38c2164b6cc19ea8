//! Semaphore permits held by this process, so a contender can fail fast in memory when this
//! process alone already holds every permit of a key.
//!
//! Readers need no local competition (they do not exclude each other), and a semaphore's
//! contenders cannot be served one at a time like an exclusive lock's (N of them may hold at
//! once). What local competition can still save is the store request that cannot succeed: when
//! this process's own live permits already number N, the store has no permit left for anyone.

use tokio::time::Instant;

use std::time::Duration;

use crate::core::{Acquire, Lease, OwnerToken};
use crate::KeyMap;

/// Live permits this process holds, per key: each permit's token, local expiry, and the
/// semaphore's permit count it was taken under.
#[derive(Debug, Default)]
pub(super) struct LocalPermits {
    held: KeyMap<Vec<(OwnerToken, Instant, u32)>>,
}

impl LocalPermits {
    /// `Some(retry_after)` when this process already holds `permits` live permits of the key:
    /// how long until the first of them expires.
    pub(super) fn all_held(&self, req: &Acquire, permits: u32) -> Option<Duration> {
        let mut held = self.held.get_mut(&req.key)?;
        let now = Instant::now();
        held.retain(|(_, expires_at, _)| now < *expires_at);
        // Asked with another permit count than the one held: the store answers that (a mode
        // conflict), not a refusal from memory that would make a blocking caller wait its wait.
        if held.len() < permits as usize || held.iter().any(|(_, _, count)| *count != permits) {
            return None;
        }
        let soonest = held.iter().map(|(_, at, _)| *at).min().unwrap_or(now);
        Some(soonest - now)
    }

    /// Records a permit the store granted.
    pub(super) fn granted(&self, lease: &Lease) {
        self.held.entry(lease.key().clone()).or_default().push((
            lease.token().clone(),
            lease.expires_at(),
            lease.mode().permits().unwrap_or(0),
        ));
    }

    /// Moves a permit's local expiry after an extend.
    pub(super) fn extended(&self, lease: &Lease) {
        if let Some(mut held) = self.held.get_mut(lease.key()) {
            if let Some(entry) = held.iter_mut().find(|(token, ..)| token == lease.token()) {
                entry.1 = lease.expires_at();
            }
        }
    }

    /// Forgets a permit (released, or no longer ours).
    pub(super) fn forget(&self, lease: &Lease) {
        self.held.remove_if_mut(lease.key(), |_, held| {
            held.retain(|(token, ..)| token != lease.token());
            held.is_empty()
        });
    }

    /// Forgets every permit (shutdown).
    pub(super) fn clear(&self) {
        self.held.clear();
    }
}
