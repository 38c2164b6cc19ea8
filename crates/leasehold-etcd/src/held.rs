//! Which etcd lease each hold of this store is on: what a keep-alive renews, and what a release
//! or a spare lease must know about the hold's lease.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use dashmap::DashMap;
use leasehold_core::OwnerToken;
use tokio::time::Instant;

/// The etcd lease each live hold of this store is on, by owner token: what a keep-alive renews.
///
/// An entry goes when its hold is released, found lost, or moved in doubt; a hold that simply
/// lapses (its guard dropped without a release that reached etcd, a process that stopped
/// renewing) leaves its entry behind until it has expired, and every insert that doubles the map
/// since the last sweep drops those: the map stays within about twice the live holds.
#[derive(Debug)]
pub(crate) struct HeldLeases {
    held: DashMap<String, HeldLease>,
    /// The map's size at which the next insert sweeps out expired entries.
    sweep_at: AtomicUsize,
}

/// Below this many entries the map is never swept (sweeping a handful costs more than it saves).
const FIRST_SWEEP: usize = 64;

impl Default for HeldLeases {
    fn default() -> Self {
        HeldLeases {
            held: DashMap::new(),
            sweep_at: AtomicUsize::new(FIRST_SWEEP),
        }
    }
}

/// One hold's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldLease {
    /// The etcd lease id.
    pub(crate) id: i64,
    /// The TTL it was granted with, in whole seconds: what a keep-alive renews it to.
    pub(crate) seconds: i64,
    /// When its TTL last started counting: when its grant, or last renewal, was sent (for a
    /// spare lease: when the grant or keep-alive that started its count was sent).
    pub(crate) since: Instant,
    /// When etcd drops the lease unless it is renewed (`since` + its TTL): past it the entry only
    /// takes room.
    pub(crate) expires_at: Instant,
}

impl HeldLease {
    /// A lease of `seconds` granted (or renewed) at `sent_at`.
    pub(crate) fn new(id: i64, seconds: i64, sent_at: Instant) -> Self {
        let ttl = Duration::from_secs(u64::try_from(seconds).unwrap_or(0));
        // A TTL past what the clock can add is kept for a year: the entry outlives no hold
        // that matters, and a swept live entry only costs the next renewal a move.
        let expires_at = sent_at
            .checked_add(ttl)
            .or_else(|| sent_at.checked_add(Duration::from_secs(365 * 24 * 3600)))
            .unwrap_or(sent_at);
        HeldLease {
            id,
            seconds,
            since: sent_at,
            expires_at,
        }
    }
}

impl HeldLeases {
    /// The hold of `token` now lives on `lease`.
    pub(crate) fn insert(&self, token: &OwnerToken, lease: HeldLease) {
        self.held.insert(token.as_str().to_owned(), lease);
        let size = self.held.len();
        if size >= self.sweep_at.load(Ordering::Relaxed) {
            let now = Instant::now();
            self.held.retain(|_, held| held.expires_at > now);
            let next = (self.held.len() * 2).max(FIRST_SWEEP);
            self.sweep_at.store(next, Ordering::Relaxed);
        }
    }

    /// The lease of `token`'s hold, if this store took or moved it.
    pub(crate) fn get(&self, token: &OwnerToken) -> Option<HeldLease> {
        self.held.get(token.as_str()).map(|held| *held)
    }

    /// A keep-alive sent at `sent_at` renewed lease `id`: its entry (if still on that lease)
    /// expires a TTL later. Never re-adds an entry a release removed meanwhile.
    pub(crate) fn renewed(&self, token: &OwnerToken, id: i64, sent_at: Instant) {
        if let Some(mut held) = self.held.get_mut(token.as_str()) {
            if held.id == id {
                *held = HeldLease::new(id, held.seconds, sent_at);
            }
        }
    }

    /// The hold of `token` is gone (released, lost, or moved in doubt): the lease it was on.
    pub(crate) fn remove(&self, token: &OwnerToken) -> Option<HeldLease> {
        self.held.remove(token.as_str()).map(|(_, held)| held)
    }

    /// How many entries the map keeps (live holds, and lapsed ones not yet swept).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lapsed_holds_are_swept_as_the_map_grows() {
        let held = HeldLeases::default();
        // Holds that lapsed without a release (their guards dropped while etcd was unreachable):
        // a TTL of 0 has lapsed as soon as it is granted.
        for id in 0..FIRST_SWEEP as i64 - 1 {
            held.insert(
                &OwnerToken::generate(),
                HeldLease::new(id, 0, Instant::now()),
            );
        }
        assert_eq!(held.len(), FIRST_SWEEP - 1);
        let live = OwnerToken::generate();
        held.insert(&live, HeldLease::new(1000, 30, Instant::now()));
        assert_eq!(held.len(), 1, "only the live hold is left");
        assert_eq!(held.get(&live).map(|h| h.id), Some(1000));
    }

    #[test]
    fn the_map_stays_within_twice_the_live_holds() {
        let held = HeldLeases::default();
        for round in 0..20 {
            for _ in 0..100 {
                held.insert(
                    &OwnerToken::generate(),
                    HeldLease::new(round, 0, Instant::now()),
                );
            }
        }
        assert!(held.len() <= 2 * FIRST_SWEEP, "{} entries kept", held.len());
    }

    #[test]
    fn a_renewal_moves_the_expiry_only_of_the_lease_it_renewed() {
        let held = HeldLeases::default();
        let token = OwnerToken::generate();
        let then = Instant::now();
        held.insert(&token, HeldLease::new(7, 10, then));
        let now = then + Duration::from_secs(5);
        held.renewed(&token, 8, now);
        assert_eq!(
            held.get(&token).unwrap().expires_at,
            then + Duration::from_secs(10)
        );
        held.renewed(&token, 7, now);
        assert_eq!(
            held.get(&token).unwrap().expires_at,
            now + Duration::from_secs(10)
        );
        held.remove(&token);
        held.renewed(&token, 7, now);
        assert_eq!(
            held.get(&token),
            None,
            "a renewal never re-adds a released hold"
        );
    }
}
