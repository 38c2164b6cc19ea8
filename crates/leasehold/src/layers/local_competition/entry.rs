//! What the cache keeps for a key, and when moka drops it: the entry's value says when what it
//! records ends, and moka's [`Expiry`] reads it from there.

use std::time::Duration;

use moka::notification::RemovalCause;
use moka::sync::Cache;
use moka::Expiry;
use tokio::time::Instant;

use crate::core::{Lease, LockKey, OwnerToken};

/// One key's local state. There is no entry for a key nobody of this process holds.
#[derive(Debug, Clone)]
pub(super) enum Local {
    /// A task of this process asks the store for the key with `token`, or holds the lease it got
    /// (kept in the entry only when a hand-off may need it: see `Held`): the others fail fast
    /// meanwhile. `until` is the end of the TTL it asked for (or extended to).
    Taken { token: OwnerToken, until: Instant },
    /// The store's `lease` is held here (by whoever has a lease with its token), kept for a
    /// hand-off.
    Held { lease: Lease, run: Run },
    /// Released while a task of this process waited for the key: the store's `lease` is kept
    /// for the head of the manager's line to take, without a store release or acquire.
    Offered { lease: Lease, run: Run },
}

/// The local holders one store lease has had so far: how many hand-offs, since when.
#[derive(Debug, Clone, Copy)]
pub(super) struct Run {
    pub(super) hand_offs: u32,
    pub(super) since: Instant,
}

impl Run {
    /// A lease the store has just granted.
    pub(super) fn start(now: Instant) -> Self {
        Run {
            hand_offs: 0,
            since: now,
        }
    }
}

impl Local {
    /// When what the entry records ends: the lease's expiry (or the asked-for one).
    pub(super) fn until(&self) -> Instant {
        match self {
            Local::Taken { until, .. } => *until,
            Local::Held { lease, .. } | Local::Offered { lease, .. } => lease.expires_at(),
        }
    }

    /// Whether it still holds at `now`. Every access checks this against tokio's clock (moka's
    /// own clock drops the entry, but a little later and not in paused-time tests).
    pub(super) fn is_live(&self, now: Instant) -> bool {
        now < self.until()
    }

    /// Whether `token` is this entry's: its asker or its holder.
    pub(super) fn is_of(&self, token: &OwnerToken) -> bool {
        match self {
            Local::Taken { token: own, .. } => own == token,
            Local::Held { lease, .. } => lease.token() == token,
            Local::Offered { .. } => false,
        }
    }
}

/// An entry leaves the cache when what it records ends (its value's [`Local::until`]), whatever
/// was written last.
struct UntilItEnds;

impl Expiry<LockKey, Local> for UntilItEnds {
    fn expire_after_create(
        &self,
        _key: &LockKey,
        value: &Local,
        _created_at: std::time::Instant,
    ) -> Option<Duration> {
        Some(value.until().saturating_duration_since(Instant::now()))
    }

    fn expire_after_update(
        &self,
        _key: &LockKey,
        value: &Local,
        _updated_at: std::time::Instant,
        _duration_until_expiry: Option<Duration>,
    ) -> Option<Duration> {
        Some(value.until().saturating_duration_since(Instant::now()))
    }
}

/// The cache: at most `capacity` keys, each entry dropped when its lease ends. An offered lease
/// the cache drops to make room (nobody takes it any more) goes to `give_back`.
pub(super) fn cache(
    capacity: u64,
    give_back: impl Fn(Lease) + Send + Sync + 'static,
) -> Cache<LockKey, Local> {
    Cache::builder()
        .max_capacity(capacity)
        .expire_after(UntilItEnds)
        .eviction_listener(move |_key, value: Local, cause| {
            if let (Local::Offered { lease, .. }, RemovalCause::Size) = (value, cause) {
                give_back(lease);
            }
        })
        .build()
}
