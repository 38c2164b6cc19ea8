//! Local hand-off: a release while a task of this process waits for the key keeps the store's
//! lease for the head of the manager's line instead of releasing it (see the module docs of the
//! parent for the policy and its bounds).

use tokio::time::Instant;

use crate::core::{Acquire, Attempt, ErrorKind, Lease, LockKey, LockStore, ReleaseWatch, Result};

use super::entry::{Local, Run, Slot};
use super::{release_in_background, LocalCompetition, Released, Undo};

impl<S: LockStore> LocalCompetition<S> {
    /// Takes a lease a local holder left for this waiter: as it is when it was taken for the
    /// TTL this waiter asks for and has at least half of it left; else extended to that TTL
    /// first (so a waiter asking for 2 s never gets the 90 s its predecessor asked for, which a
    /// crash would leave the key held for). On error or cancellation the slot is freed and the
    /// lease released.
    pub(super) async fn take_offer(
        &self,
        req: &Acquire,
        lease: Lease,
        slot: &Slot,
    ) -> Result<Attempt> {
        if lease.ttl() == req.ttl && lease.remaining() >= req.ttl / 2 {
            return Ok(Attempt::Granted(lease));
        }
        let mut undo = Undo::new(self, slot, lease.token().clone());
        undo.give_back = Some(lease.clone());
        match self.inner.extend(&lease, req.ttl).await {
            Ok(renewed) => {
                let (kept, refresh) = {
                    let mut st = slot.lock();
                    match st.take(Instant::now()) {
                        // Still this lease's (the extend may have outlasted it, and another task
                        // be asking now).
                        Some(Local::Held { lease: held, run })
                            if held.token() == renewed.token() =>
                        {
                            let local = Local::Held {
                                lease: renewed.clone(),
                                run,
                            };
                            (true, st.set(Some(local)))
                        }
                        other => (false, st.set(other)),
                    }
                };
                if refresh {
                    self.refresh(&req.key);
                }
                if !kept {
                    undo.give_back = Some(renewed);
                    return Ok(Attempt::refused());
                }
                undo.armed = false;
                Ok(Attempt::Granted(renewed))
            }
            Err(error) if error.kind() == ErrorKind::NotHeld => {
                // Lost under us: ask the store afresh, still as the key's asker.
                undo.give_back = None;
                drop(undo);
                let now = Instant::now();
                let asking = {
                    let mut st = slot.lock();
                    match st.current(now) {
                        Some(_) => None,
                        None => Some(st.set(Some(Local::Taken {
                            token: req.token.clone(),
                            until: now + req.ttl,
                        }))),
                    }
                };
                match asking {
                    None => Ok(Attempt::refused()),
                    Some(refresh) => {
                        if refresh {
                            self.refresh(&req.key);
                        }
                        self.ask_store(req, slot).await
                    }
                }
            }
            // Unknown whether it still holds, and too short to hand out as asked for.
            Err(error) => Err(error),
        }
    }

    /// A holder's release decided in its slot: hand the lease to a waiting task of this process,
    /// or let the store release it.
    pub(super) fn release_locally(&self, lease: &Lease) -> Released {
        let Some(slot) = self.slot_of(lease) else {
            return Released::NotHolder;
        };
        let now = Instant::now();
        let policy = self.hand_off;
        let mut st = slot.lock();
        match st.take(now) {
            Some(Local::Held { lease: held, run }) if held.token() == lease.token() => {
                // Under the slot's lock, as the last waiter's leaving is: an offer is made only
                // while someone is there to take it, in a slot still in the cache.
                if policy.enabled
                    && st.waiters > 0
                    && !st.gone
                    && !held.is_contended()
                    && run.hand_offs < policy.max_hand_offs
                    && now.saturating_duration_since(run.since) < policy.max_hold
                {
                    let run = Run {
                        hand_offs: run.hand_offs + 1,
                        ..run
                    };
                    // Offered until the lease's end, which the slot's expiry already covers.
                    let _ = st.set(Some(Local::Offered { lease: held, run }));
                    Released::HandedOff(run.hand_offs)
                } else {
                    let _ = st.set(Some(Local::Held { lease: held, run }));
                    drop(st);
                    Released::ToStore(slot)
                }
            }
            Some(local) if local.is_of(lease.token()) => {
                // Held here until the store has answered (see `Released::ToStore`).
                let _ = st.set(Some(local));
                drop(st);
                Released::ToStore(slot)
            }
            other => {
                let _ = st.set(other);
                Released::NotHolder
            }
        }
    }

    /// `watch` is a waiter's of this process: with hand-off on, releases of the key may hand
    /// their lease to it (the slot counts its waiters). The last waiter leaving takes an offer
    /// nobody is left to claim back to the store.
    pub(super) fn offer_to(&self, key: &LockKey, watch: ReleaseWatch) -> ReleaseWatch {
        if !self.hand_off.enabled || self.inner.capabilities().waiter_line {
            // No hand-off, or none to waiters the store lines up itself (they take their places
            // there, never an offer here).
            return watch;
        }
        let (slot, ()) = self.with_slot(key, |st| st.waiters += 1);
        // The cache's expiry of the slot follows its waiters too (`entry::State::keep_for`):
        // read once more, so that a slot waited on outlasts a quiet spell.
        self.refresh(key);
        let (inner, lifecycle) = (self.inner.clone(), self.lifecycle.clone());
        watch.also_on_drop(move || {
            let orphan = {
                let mut st = slot.lock();
                st.waiters = st.waiters.saturating_sub(1);
                match st.take(Instant::now()) {
                    Some(Local::Offered { lease, .. }) if st.waiters == 0 => Some(lease),
                    other => {
                        let _ = st.set(other);
                        None
                    }
                }
            };
            if let Some(lease) = orphan {
                release_in_background(&inner, &lifecycle, lease);
            }
        })
    }
}
