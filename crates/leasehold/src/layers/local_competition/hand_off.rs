//! Local hand-off: a release while a task of this process waits for the key keeps the store's
//! lease for the head of the manager's line instead of releasing it (see the module docs of the
//! parent for the policy and its bounds).

use moka::ops::compute::Op;
use tokio::time::Instant;

use crate::core::{Acquire, Error, ErrorKind, Lease, LockKey, LockStore, ReleaseWatch, Result};

use super::entry::{Local, Run};
use super::{release_in_background, LocalCompetition, Released, Undo};

impl<S: LockStore> LocalCompetition<S> {
    /// Takes a lease a local holder left for this waiter, extending it first if less than half
    /// of the requested TTL is left. On error or cancellation the entry goes and the lease is
    /// released.
    pub(super) async fn take_offer(&self, req: &Acquire, lease: Lease) -> Result<Lease> {
        if lease.remaining() >= req.ttl / 2 {
            return Ok(lease);
        }
        let mut undo = Undo::new(self, &req.key, lease.token().clone());
        undo.give_back = Some(lease.clone());
        match self.inner.extend(&lease, req.ttl).await {
            Ok(renewed) => {
                let mut kept = false;
                self.cache.entry_by_ref(&req.key).and_compute_with(|entry| {
                    match entry.map(|e| e.into_value()) {
                        // Still this lease's (the extend may have outlasted it, and another task
                        // be asking now).
                        Some(Local::Held { lease: held, run })
                            if held.token() == renewed.token() =>
                        {
                            kept = true;
                            Op::Put(Local::Held {
                                lease: renewed.clone(),
                                run,
                            })
                        }
                        _ => Op::Nop,
                    }
                });
                if !kept {
                    undo.give_back = Some(renewed);
                    return Err(Error::unavailable(&req.key));
                }
                undo.armed = false;
                Ok(renewed)
            }
            Err(error) if error.kind() == ErrorKind::NotHeld => {
                // Lost under us: ask the store afresh, still as the key's asker.
                undo.give_back = None;
                drop(undo);
                let mut asking = false;
                let now = Instant::now();
                self.cache.entry_by_ref(&req.key).and_compute_with(|entry| {
                    match entry.map(|e| e.into_value()) {
                        Some(local) if local.is_live(now) => Op::Nop,
                        _ => {
                            asking = true;
                            Op::Put(Local::Taken {
                                token: req.token.clone(),
                                until: now + req.ttl,
                            })
                        }
                    }
                });
                if !asking {
                    return Err(Error::unavailable(&req.key));
                }
                self.ask_store(req).await
            }
            // Unknown whether it still holds, and too short to hand out as asked for.
            Err(error) => Err(error),
        }
    }

    /// A holder's release decided in the cache: hand the lease to a waiting task of this
    /// process, or let the store release it.
    pub(super) fn release_locally(&self, lease: &Lease) -> Released {
        let now = Instant::now();
        let policy = self.hand_off;
        let mut decision = Released::NotHolder;
        self.cache
            .entry_by_ref(lease.key())
            .and_compute_with(|entry| match entry.map(|e| e.into_value()) {
                Some(Local::Held { lease: held, run }) if held.token() == lease.token() => {
                    // Under the key's lock, as the last waiter's leaving is: an offer is made
                    // only while someone is there to take it.
                    let waited =
                        policy.enabled && self.waited.get(lease.key()).is_some_and(|n| *n > 0);
                    if waited
                        && !held.is_contended()
                        && run.hand_offs < policy.max_hand_offs
                        && now.saturating_duration_since(run.since) < policy.max_hold
                        && now < held.expires_at()
                    {
                        let run = Run {
                            hand_offs: run.hand_offs + 1,
                            ..run
                        };
                        decision = Released::HandedOff(run.hand_offs);
                        Op::Put(Local::Offered { lease: held, run })
                    } else {
                        decision = Released::ToStore;
                        Op::Remove
                    }
                }
                Some(Local::Taken { token, .. }) if token == *lease.token() => {
                    decision = Released::ToStore;
                    Op::Remove
                }
                _ => Op::Nop,
            });
        decision
    }

    /// `watch` is a waiter's of this process: with hand-off on, releases of the key may hand
    /// their lease to it. The last waiter leaving takes an offer nobody is left to claim back to
    /// the store.
    pub(super) fn offer_to(&self, key: &LockKey, watch: ReleaseWatch) -> ReleaseWatch {
        if !self.hand_off.enabled || self.inner.capabilities().waiter_line {
            // No hand-off, or none to waiters the store lines up itself (they take their places
            // there, never an offer here).
            return watch;
        }
        // A waiter of this process: releases of the key may hand their lease off to it. The
        // last one leaving takes an offer nobody is left to claim back to the store.
        *self.waited.entry(key.clone()).or_default() += 1;
        let (cache, waited, key) = (self.cache.clone(), self.waited.clone(), key.clone());
        let (inner, lifecycle) = (self.inner.clone(), self.lifecycle.clone());
        watch.also_on_drop(move || {
            let mut orphan = None;
            cache.entry_by_ref(&key).and_compute_with(|entry| {
                let last = waited
                    .remove_if_mut(&key, |_, n| {
                        *n -= 1;
                        *n == 0
                    })
                    .is_some();
                match entry.map(|e| e.into_value()) {
                    Some(Local::Offered { lease, .. }) if last => {
                        orphan = Some(lease);
                        Op::Remove
                    }
                    _ => Op::Nop,
                }
            });
            if let Some(lease) = orphan {
                release_in_background(&inner, &lifecycle, lease);
            }
        })
    }
}
