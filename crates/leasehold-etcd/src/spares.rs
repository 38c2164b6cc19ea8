//! Spare leases: the etcd lease of a released hold (or of a refused attempt, which wrote nothing
//! on it), kept for this store's next acquisition of the same TTL.
//!
//! Every hold lives on a lease of its own, so that it expires on its own TTL (see docs/ETCD.md).
//! Granting that lease is a Raft write with its fsync, and so is revoking it after the release:
//! together they would be half the Raft writes of an uncontended lock cycle. A lease whose hold was
//! released carries nothing any more, so instead of being revoked it is kept here, and the next
//! acquisition of the same TTL (in whole seconds) puts its hold on it: the cycle is then the
//! acquire transaction and the release transaction, as with a raw client.
//!
//! What keeps this as safe as a fresh lease per hold:
//! - **One hold per lease.** A lease enters the pool only once nothing can be on it: the release
//!   that deleted the hold saw (in the delete's previous key) that the hold was on that very lease,
//!   and nothing else is ever put on a hold's lease; or the attempt it was taken for was refused,
//!   so nothing was written. An acquisition takes a lease out of the pool before using it, so two
//!   attempts never share one. A lease that may carry something (an acquisition in doubt, a writer
//!   marker) never comes back.
//! - **Never more time than etcd gives.** A spare carries when its TTL last started counting (its
//!   grant, the last renewal of the hold that was on it, or a keep-alive of its own, each counted
//!   from when it was *sent*). A hold put on it counts its TTL from then, so the holder never
//!   believes in a lease etcd has already dropped; a spare older than a tenth of its TTL is not
//!   used (the hold would start with less than nine tenths of what it asked for). A spare handed
//!   back older than a twentieth gets a keep-alive in the background — served by the leader
//!   without a Raft write — which restarts its count (also when the next hold took the lease
//!   before the answer came: its count restarts when it comes back). One older than a tenth
//!   waits for that keep-alive before it carries a hold.
//! - **The hold still ends with its process.** Nothing keeps a spare alive but that occasional
//!   keep-alive, sent while this process lives: a process that dies leaves its holds and spares
//!   to lapse at their TTL.
//! - **Gone spares cost a grant, not a refusal.** A spare someone revoked (or that lapsed) makes
//!   etcd refuse the acquire transaction before applying it ("lease not found"): the attempt grants
//!   a new lease and sends the transaction again.
//!
//! The pool keeps at most [`MAX_SPARES`] leases (the oldest beyond that is revoked); `shutdown`
//! revokes them all; stale ones are revoked when an acquisition finds them.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::waiting::Spare;

/// How many spare leases one store keeps at most: enough for as many acquisitions in flight at
/// once, few enough that an idle process leaves etcd little to expire.
pub(crate) const MAX_SPARES: usize = 32;

/// The spare leases of one store.
#[derive(Debug, Default)]
pub(crate) struct SpareLeases {
    pool: Mutex<Pool>,
    /// Set by `close`: every spare handed in after it is revoked, not kept.
    closed: AtomicBool,
}

#[derive(Debug, Default)]
struct Pool {
    /// The spares, each with whether it waits for its keep-alive before it may carry a hold.
    spares: Vec<(Spare, bool)>,
    /// Leases with a keep-alive in flight: one at a time per lease.
    refreshing: HashSet<i64>,
    /// Keep-alives answered while their lease carried a hold again (it was taken meanwhile): when
    /// it comes back, its count starts at the keep-alive, not at what the hold remembered. Without
    /// this, a lease in steady use would be sent a keep-alive on every release once it is old
    /// enough, and age out anyway.
    refreshed: HashMap<i64, Instant>,
}

/// How old a spare may be and still carry a new hold: a tenth of its TTL.
pub(crate) fn max_age(seconds: i64) -> Duration {
    ttl_of(seconds) / 10
}

/// Past this age a spare handed back gets a keep-alive (half of [`max_age`]), so that a lease in
/// steady use never ages out of the pool.
pub(crate) fn refresh_after(seconds: i64) -> Duration {
    ttl_of(seconds) / 20
}

fn ttl_of(seconds: i64) -> Duration {
    Duration::from_secs(u64::try_from(seconds).unwrap_or(0))
}

/// What became of a lease handed in to the pool (see [`SpareLeases::keep`]).
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Fate {
    /// Kept; nothing else to do.
    Kept,
    /// Kept; send it a keep-alive, then report with [`SpareLeases::refreshed`] or
    /// [`SpareLeases::refresh_failed`].
    Refresh,
    /// Kept, but too old to carry a hold until a keep-alive says it lives: send one, then report.
    RefreshFirst,
    /// Not kept (the store closed, or its TTL has run out): to be revoked.
    Revoke,
}

impl SpareLeases {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pool> {
        self.pool.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the youngest spare of `seconds` that is at most `max_age` old, out of the pool (so no
    /// other attempt can use it). Also returns the spares found too old to carry a hold (of any
    /// TTL) and not waiting for a keep-alive, taken out too: the caller revokes them.
    pub(crate) fn take(
        &self,
        seconds: i64,
        max_age: Duration,
        now: Instant,
    ) -> (Option<Spare>, Vec<i64>) {
        let mut pool = self.lock();
        let age = |spare: &Spare| now.saturating_duration_since(spare.granted_at);
        let mut stale = Vec::new();
        pool.spares.retain(|(spare, pending)| {
            let keep = *pending || age(spare) <= self::max_age(spare.seconds);
            if !keep {
                stale.push(spare.id);
            }
            keep
        });
        let youngest = pool
            .spares
            .iter()
            .enumerate()
            .filter(|(_, (spare, pending))| {
                !pending && spare.seconds == seconds && age(spare) <= max_age
            })
            .max_by_key(|(_, (spare, _))| spare.granted_at)
            .map(|(i, _)| i);
        (youngest.map(|i| pool.spares.swap_remove(i).0), stale)
    }

    /// Hands in `spare` (a lease nothing lives on): says whether it was kept and whether a
    /// keep-alive should be sent now, and returns the lease pushed out of a full pool (the
    /// oldest), if any.
    pub(crate) fn keep(&self, mut spare: Spare, now: Instant) -> (Fate, Option<i64>) {
        if self.closed.load(Ordering::SeqCst) || spare.seconds <= 0 {
            return (Fate::Revoke, None);
        }
        let mut pool = self.lock();
        if let Some(at) = pool.refreshed.remove(&spare.id) {
            spare.granted_at = spare.granted_at.max(at);
        }
        let age = now.saturating_duration_since(spare.granted_at);
        if age >= ttl_of(spare.seconds) {
            pool.refreshing.remove(&spare.id);
            return (Fate::Revoke, None);
        }
        let usable = age <= max_age(spare.seconds);
        let wants_refresh = !usable || age > refresh_after(spare.seconds);
        // A keep-alive already in flight will report; one is enough.
        let refresh = wants_refresh && pool.refreshing.insert(spare.id);
        pool.spares.push((spare, !usable));
        let pushed_out = if pool.spares.len() > MAX_SPARES {
            pool.spares
                .iter()
                .enumerate()
                .min_by_key(|(_, (spare, _))| spare.granted_at)
                .map(|(i, _)| i)
                .map(|i| pool.spares.swap_remove(i).0.id)
        } else {
            None
        };
        let fate = match (refresh, usable) {
            (false, _) => Fate::Kept,
            (true, true) => Fate::Refresh,
            (true, false) => Fate::RefreshFirst,
        };
        (fate, pushed_out)
    }

    /// A keep-alive of `id`, sent at `sent_at`, found it alive: its count restarts then — in the
    /// pool, or when it comes back if a hold took it meanwhile.
    pub(crate) fn refreshed(&self, id: i64, sent_at: Instant) {
        let mut pool = self.lock();
        pool.refreshing.remove(&id);
        if let Some((spare, pending)) = pool.spares.iter_mut().find(|(spare, _)| spare.id == id) {
            spare.granted_at = spare.granted_at.max(sent_at);
            *pending = false;
            return;
        }
        if pool.refreshed.len() >= 2 * MAX_SPARES {
            // Leases that never came back (their holds lapsed, or were released elsewhere):
            // forgetting a record only costs a keep-alive later.
            pool.refreshed.clear();
        }
        pool.refreshed.insert(id, sent_at);
    }

    /// A keep-alive of `id` failed (the lease is gone, or no member answered): it is not used
    /// again. Returns whether it was in the pool (the caller then revokes it).
    pub(crate) fn refresh_failed(&self, id: i64) -> bool {
        let mut pool = self.lock();
        pool.refreshing.remove(&id);
        pool.refreshed.remove(&id);
        let before = pool.spares.len();
        pool.spares.retain(|(spare, _)| spare.id != id);
        pool.spares.len() != before
    }

    /// Closes the pool: returns every spare (to revoke); later ones are not kept.
    pub(crate) fn close(&self) -> Vec<i64> {
        self.closed.store(true, Ordering::SeqCst);
        let mut pool = self.lock();
        pool.refreshed.clear();
        pool.spares.drain(..).map(|(spare, _)| spare.id).collect()
    }

    /// How many spares the pool holds.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().spares.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spare(id: i64, seconds: i64, granted_at: Instant) -> Spare {
        Spare {
            id,
            seconds,
            granted_at,
        }
    }

    #[test]
    fn the_youngest_spare_of_the_ttl_is_taken_and_only_once() {
        let pool = SpareLeases::default();
        let now = Instant::now();
        let at = |ms| now + Duration::from_millis(ms);
        assert_eq!(pool.keep(spare(1, 30, at(0)), at(0)).0, Fate::Kept);
        assert_eq!(pool.keep(spare(2, 30, at(10)), at(10)).0, Fate::Kept);
        assert_eq!(pool.keep(spare(3, 10, at(20)), at(20)).0, Fate::Kept);
        let max = max_age(30);
        assert_eq!(
            pool.take(30, max, at(30)),
            (Some(spare(2, 30, at(10))), vec![])
        );
        assert_eq!(
            pool.take(30, max, at(30)),
            (Some(spare(1, 30, at(0))), vec![])
        );
        assert_eq!(
            pool.take(30, max, at(30)),
            (None, vec![]),
            "each lease once"
        );
        assert_eq!(pool.take(10, max_age(10), at(30)).0.map(|s| s.id), Some(3));
    }

    #[test]
    fn a_spare_too_old_to_carry_a_hold_is_not_used_and_is_handed_back_to_revoke() {
        let pool = SpareLeases::default();
        let now = Instant::now();
        pool.keep(spare(1, 30, now), now);
        pool.keep(spare(2, 10, now), now);
        // 1.5 s on: past a tenth of 10 s (the second), within a tenth of 30 s (the first).
        let later = now + Duration::from_millis(1500);
        let (taken, stale) = pool.take(10, max_age(10), later);
        assert_eq!(taken, None);
        assert_eq!(stale, vec![2]);
        // The caller's own limit applies too (a TTL of 30 s asked as 25 s: a tenth of that).
        let (taken, _) = pool.take(30, Duration::from_millis(1000), later);
        assert_eq!(taken, None);
        assert_eq!(pool.take(30, max_age(30), later).0.map(|s| s.id), Some(1));
    }

    #[test]
    fn an_aging_spare_is_refreshed_once_and_an_old_one_used_only_after_its_refresh() {
        let pool = SpareLeases::default();
        let now = Instant::now();
        let at = |ms| now + Duration::from_millis(ms);
        // 30 s: refreshed past 1.5 s, usable up to 3 s, gone at 30 s.
        assert_eq!(pool.keep(spare(1, 30, now), at(1000)).0, Fate::Kept);
        assert_eq!(pool.keep(spare(2, 30, now), at(2000)).0, Fate::Refresh);
        assert_eq!(pool.keep(spare(3, 30, now), at(5000)).0, Fate::RefreshFirst);
        assert_eq!(pool.keep(spare(4, 30, now), at(30_000)).0, Fate::Revoke);
        assert_eq!(pool.len(), 3);
        // 3 waits for its keep-alive: not taken, not swept as stale.
        let (taken, stale) = pool.take(30, max_age(30), at(5000));
        assert_eq!(
            taken.map(|s| s.id),
            None,
            "1 and 2 are too old by now, 3 waits"
        );
        assert_eq!(stale.len(), 2);
        pool.refreshed(3, at(5000));
        let (taken, _) = pool.take(30, max_age(30), at(5500));
        assert_eq!(taken, Some(spare(3, 30, at(5000))));
    }

    #[test]
    fn a_keep_alive_answered_while_a_hold_had_the_lease_counts_when_it_comes_back() {
        let pool = SpareLeases::default();
        let now = Instant::now();
        let at = |ms| now + Duration::from_millis(ms);
        // Handed back at 2 s (a keep-alive is due), taken at once by the next hold.
        assert_eq!(pool.keep(spare(1, 30, now), at(2000)).0, Fate::Refresh);
        assert_eq!(
            pool.take(30, max_age(30), at(2000)).0.map(|s| s.id),
            Some(1)
        );
        // The keep-alive answers while the hold has it, and the hold is released at 2.5 s with the
        // count it started with: the keep-alive's count applies, and no second keep-alive is due.
        pool.refreshed(1, at(2000));
        assert_eq!(pool.keep(spare(1, 30, now), at(2500)).0, Fate::Kept);
        assert_eq!(
            pool.take(30, max_age(30), at(4500)),
            (Some(spare(1, 30, at(2000))), vec![])
        );
        // One keep-alive in flight at a time.
        assert_eq!(pool.keep(spare(1, 30, at(2000)), at(4000)).0, Fate::Refresh);
        assert_eq!(
            pool.take(30, max_age(30), at(4000)).0.map(|s| s.id),
            Some(1)
        );
        assert_eq!(pool.keep(spare(1, 30, at(2000)), at(4100)).0, Fate::Kept);
        // A failed keep-alive: out of the pool (to revoke); a hold that has it keeps it.
        assert!(pool.refresh_failed(1));
        assert!(!pool.refresh_failed(1));
        assert_eq!(pool.len(), 0);
    }

    #[test]
    fn a_full_pool_pushes_out_its_oldest_and_a_closed_one_keeps_nothing() {
        let pool = SpareLeases::default();
        let now = Instant::now();
        for id in 0..MAX_SPARES as i64 {
            let at = now + Duration::from_millis(id as u64);
            assert_eq!(pool.keep(spare(id, 30, at), at), (Fate::Kept, None));
        }
        let at = now + Duration::from_millis(100);
        assert_eq!(pool.keep(spare(100, 30, at), at), (Fate::Kept, Some(0)));
        assert_eq!(pool.len(), MAX_SPARES);
        let mut all = pool.close();
        all.sort_unstable();
        assert_eq!(all.len(), MAX_SPARES);
        assert_eq!(all.first(), Some(&1));
        assert_eq!(pool.keep(spare(7, 30, at), at), (Fate::Revoke, None));
        assert_eq!(pool.len(), 0);
    }
}
