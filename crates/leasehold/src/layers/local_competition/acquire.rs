//! The exclusive acquire: a contender's turn in the key's line, the one store talker, a handed
//! lease taken, and the guards that undo a half-done step on error and cancellation.

use std::sync::Arc;

use tokio::time::Instant;

use crate::core::{
    Acquire, Error, ErrorKind, Lease, LockEvent, LockKey, LockStore, OwnerToken, Result, WaiterId,
};

use super::slot::{Slot, Take, Wait};
use super::LocalCompetition;

impl<S: LockStore> LocalCompetition<S> {
    /// An exclusive acquire (a write lock): a try-lock takes a free key nobody queues for, or
    /// fails fast; a blocking one queues in arrival order and, at the head of the line, asks the
    /// store (or takes a handed lease).
    ///
    /// A blocking caller with a waiter id (the manager's wait loop) keeps its place when the store
    /// refuses, so it is still the head when it asks again; the place goes when its watch drops.
    /// A caller without one holds a place for this call only.
    pub(super) async fn acquire_exclusive(&self, req: &Acquire) -> Result<Lease> {
        if req.deadline.is_some() && self.inner.capabilities().waiter_line {
            // Strict FIFO: the store keeps every waiter's place in the fleet-wide order; a local
            // line would hold waiters back from taking theirs.
            return self.inner.try_acquire(req).await;
        }
        let wait = req.deadline.map(|deadline| Wait {
            waiter: req.waiter.unwrap_or_else(WaiterId::new),
            deadline,
        });
        let mut in_line = wait.map(|wait| InLine {
            layer: self,
            key: &req.key,
            waiter: wait.waiter,
            slot: None,
            armed: true,
        });
        // Woken in its place (by its turn or its timer): the waiter looks at the same entry again
        // without a look-up while it is in the cache (pinned there while the waiter is in line).
        let mut woken = false;
        loop {
            if self.lifecycle.is_closing() {
                return Err(Error::shut_down().with_key(req.key.as_str()));
            }
            let slot = match in_line.as_ref().filter(|_| std::mem::take(&mut woken)) {
                Some(InLine {
                    slot: Some(slot), ..
                }) if !slot.is_gone() => Some(slot.clone()),
                _ => self.shared.slot(&req.key),
            };
            let Some(slot) = slot else {
                drop(in_line);
                tracing::debug!(key = %req.key,
                    "local competition at capacity with every entry in use: straight to the store");
                return self.inner.try_acquire(req).await;
            };
            if let Some(in_line) = in_line.as_mut() {
                in_line.slot = Some(slot.clone());
            }
            // Made before the entry is locked: an entry that leaves the cache after this look
            // wakes it (a `Notified` receives every `notify_waiters` from its making on).
            let gone = slot.gone_wake.notified();
            let (turn, wake_at) = {
                let mut st = slot.lock();
                let now = Instant::now();
                let take = st.try_take(&req.token, req.ttl, wait, now);
                if take != Take::Retired && !self.shared.settle(&req.key, &slot, &mut st, now) {
                    // The entry expired between the look-up and the lock: back out, look again.
                    st.vacate(&req.token);
                    drop(st);
                    slot.gone_wake.notify_waiters();
                    if let Take::Taken {
                        handed: Some(lease),
                    } = take
                    {
                        self.release_in_background(lease);
                    }
                    continue;
                }
                match take {
                    Take::Taken { handed } => (Turn::Taken(handed), now),
                    Take::Busy { wake_at } => {
                        let wake = wait.and_then(|w| st.wake_of(w.waiter));
                        let Some(wake) = wake else {
                            continue; // not in line after all (cannot happen): look again
                        };
                        // Made under the entry's lock: a `Notified` receives every
                        // `notify_waiters` from its making on, so a turn given as soon as the
                        // lock is let go is not missed (no need to poll it first).
                        (Turn::Wait(wake.notified_owned()), wake_at)
                    }
                    Take::Retired => {
                        // Retired entries are marked gone when retired; marked here too, so no
                        // look-up can hand this one out again whatever retired it.
                        slot.mark_gone();
                        continue;
                    }
                    Take::FastFail => {
                        drop(st);
                        self.observers.emit(|| LockEvent::FastFailed {
                            key: req.key.clone(),
                        });
                        return Err(Error::unavailable(&req.key));
                    }
                    Take::TimedOut => {
                        drop(st); // before the place is left, which takes the lock
                        return Err(Error::unavailable(&req.key));
                    }
                    Take::AfterOthers => {
                        // The store names this process when its turn comes; until then asking
                        // would only be refused. The place is kept for the next attempt.
                        if let (Some(in_line), Some(_)) = (in_line.as_mut(), req.waiter) {
                            in_line.keep();
                        }
                        return Err(Error::unavailable(&req.key).behind_others());
                    }
                }
            };
            let turn = match turn {
                Turn::Taken(handed) => return self.taken(&slot, req, handed, in_line).await,
                Turn::Wait(turn) => turn,
            };
            // Woken or not, the line is looked at again before giving up at the deadline: a
            // turn consumed here and not acted on would leave the next waiter asleep. A shutdown
            // ends the wait (and the loop, at its top).
            tokio::select! {
                biased;
                () = self.lifecycle.closing() => {}
                () = gone => {}
                _ = tokio::time::timeout_at(wake_at, turn) => woken = true,
            }
        }
    }

    /// The key is this caller's locally: take the handed lease, or ask the store as the key's
    /// one store talker.
    async fn taken(
        &self,
        slot: &Arc<Slot>,
        req: &Acquire,
        handed: Option<Lease>,
        mut in_line: Option<InLine<'_, S>>,
    ) -> Result<Lease> {
        if let Some(store) = handed {
            // Out of the line already (taking the offer was its turn).
            if let Some(in_line) = in_line.as_mut() {
                in_line.armed = false;
            }
            return self.take_hand_off(slot, req, store).await;
        }
        let waiter = in_line.as_ref().map(|in_line| in_line.waiter);
        let result = self.acquire_from_store(slot, req, waiter).await;
        if let Some(in_line) = in_line.as_mut() {
            // Refused by the store (another process holds it): a wait that comes back keeps its
            // place at the head, and the process keeps one contender in the store.
            let refused = result.as_ref().is_err_and(Error::is_unavailable);
            if result.is_ok() {
                in_line.armed = false; // served: out of the line
            } else if refused && req.waiter.is_some() {
                in_line.keep();
            }
        }
        result
    }

    /// Asks the store as the key's one local store talker. The holder entry was set up (with an
    /// expiry no later than the lease's) before the request, so success only records the grant;
    /// error and cancellation free the entry. `waiter`: the caller's place, which it leaves
    /// once granted.
    async fn acquire_from_store(
        &self,
        slot: &Arc<Slot>,
        req: &Acquire,
        waiter: Option<WaiterId>,
    ) -> Result<Lease> {
        let mut vacate = Vacate::new(self, &req.key, slot, &req.token);
        let lease = self.inner.try_acquire(req).await?;
        vacate.armed = false;
        slot.lock()
            .granted(&req.token, waiter, lease.is_contended());
        Ok(lease)
    }

    /// Takes a store lease handed off by the previous local holder, extending it first if less
    /// than half of the requested TTL is left.
    async fn take_hand_off(&self, slot: &Arc<Slot>, req: &Acquire, store: Lease) -> Result<Lease> {
        if store.remaining() >= req.ttl / 2 {
            // The holder entry already maps this taker to `store` (set when the slot was taken).
            return Ok(store.with_token(req.token.clone()));
        }
        // Cancelled or failed from here on: the slot is freed and the store lease given back.
        let mut vacate = Vacate::new(self, &req.key, slot, &req.token);
        vacate.give_back = Some(store.clone());
        let renewed = match self.inner.extend(&store, req.ttl).await {
            Ok(renewed) => renewed,
            Err(error) if error.kind() == ErrorKind::NotHeld => {
                // The lease was lost under us: acquire afresh, still as the one store talker.
                vacate.armed = false;
                {
                    let mut st = slot.lock();
                    let now = Instant::now();
                    if !st.restart(&req.token, req.ttl, now) {
                        // Meanwhile the slot went to another contender, who asks the store.
                        return Err(Error::unavailable(&req.key));
                    }
                    self.shared.settle(&req.key, slot, &mut st, now);
                }
                return self.acquire_from_store(slot, req, None).await;
            }
            // Unknown whether it still holds, and too short to hand out as asked for.
            Err(error) => return Err(error),
        };
        vacate.give_back = Some(renewed.clone());
        {
            let mut st = slot.lock();
            if !st.took_renewed(&req.token, &renewed) {
                // The extend outlasted the old lease and the slot went to another contender:
                // this lease is known to nobody here, so it goes back (by the drop of `vacate`).
                drop(st);
                return Err(Error::unavailable(&req.key));
            }
            self.shared.settle(&req.key, slot, &mut st, Instant::now());
        }
        vacate.armed = false;
        Ok(renewed.with_token(req.token.clone()))
    }
}

/// What one look at the line leads to.
enum Turn {
    /// The key is the caller's locally (with the store lease, if handed off).
    Taken(Option<Lease>),
    /// Wait for the caller's turn (made under the entry's lock).
    Wait(tokio::sync::futures::OwnedNotified),
}

/// Frees a slot when dropped while armed: on error and on cancellation. A store lease received
/// by hand-off (`give_back`) is released in the background then: once the slot is free nobody
/// else knows it, and it would block the key, here and elsewhere, for its whole TTL.
pub(super) struct Vacate<'a, S: LockStore> {
    layer: &'a LocalCompetition<S>,
    key: &'a LockKey,
    slot: &'a Arc<Slot>,
    token: &'a OwnerToken,
    pub(super) give_back: Option<Lease>,
    pub(super) armed: bool,
}

impl<'a, S: LockStore> Vacate<'a, S> {
    pub(super) fn new(
        layer: &'a LocalCompetition<S>,
        key: &'a LockKey,
        slot: &'a Arc<Slot>,
        token: &'a OwnerToken,
    ) -> Self {
        Vacate {
            layer,
            key,
            slot,
            token,
            give_back: None,
            armed: true,
        }
    }
}

impl<S: LockStore> Drop for Vacate<'_, S> {
    fn drop(&mut self) {
        if self.armed {
            self.layer.vacate(self.key, self.slot, self.token);
            if let Some(lease) = self.give_back.take() {
                self.layer.release_in_background(lease);
            }
        }
    }
}

/// A blocking contender's place in the line; dropped while armed (the call ends without keeping
/// it: timeout, an error, cancellation, shutdown), the place is left, the next head woken, and
/// an offer nobody is left to claim given back.
struct InLine<'a, S: LockStore> {
    layer: &'a LocalCompetition<S>,
    key: &'a LockKey,
    waiter: WaiterId,
    /// The entry the place is in (the latest looked at).
    slot: Option<Arc<Slot>>,
    armed: bool,
}

impl<S: LockStore> InLine<'_, S> {
    /// The place stays in line after this attempt (for the wait's next one): the wait's watch
    /// leaves it when the wait ends.
    fn keep(&mut self) {
        self.armed = false;
        self.layer.shared.kept.insert(self.waiter);
    }
}

impl<S: LockStore> Drop for InLine<'_, S> {
    fn drop(&mut self) {
        let (true, Some(slot)) = (self.armed, self.slot.as_ref()) else {
            return;
        };
        let left = {
            let mut st = slot.lock();
            let left = st.leave(self.waiter);
            self.layer
                .shared
                .settle(self.key, slot, &mut st, Instant::now());
            left
        };
        if let Some(wake) = left.wake {
            wake.notify_waiters();
        }
        if let Some(orphan) = left.orphan {
            self.layer.release_in_background(orphan);
        }
    }
}
