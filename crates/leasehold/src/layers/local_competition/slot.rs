//! One key's local state, as a synchronous state machine.
//!
//! Everything that decides who holds, who waits in which order and who gets a handed-off lease is
//! here, under one mutex, with the time passed in: no future, no runtime, so every transition is
//! tested with plain `#[test]`s. The async code in the parent module only awaits (a wake-up, the
//! lifecycle, the store) and calls in here.
//!
//! ```text
//!            take (try-lock: line empty; blocking: head of the line)
//!   free ───────────▶ held ─────────────────────────────────────────▶ free (once the store answered)
//!    ▲                 │  ▲ take (the head of the line)        release (no waiter, hand-off off or
//!    │ expire          │  │                                     bounded, or other processes queue)
//!    │                 ▼  │ release with waiters and hand-off on
//!    └──────────────── offered
//! ```
//!
//! **The line.** Blocking contenders queue in arrival order, one place per wait (a
//! [`WaiterId`], the same on every attempt of one `lock()` call). Only the head of the line may
//! take the key or an offer, so it is served strictly in arrival order: a task that releases and
//! asks again goes to the back, and a try-lock never passes anyone in line. The head keeps its
//! place while it asks the store and, if the store refuses (another process holds the key), while
//! it waits for the store outside this module: the process then has one contender in the store,
//! the head, and everyone behind it waits in memory. A place lapses at its waiter's deadline, and
//! is given up when the wait ends (the manager drops the wait's watch).
//!
//! Besides who holds it, the state remembers how long the entry must stay in the cache: while
//! anyone holds, is offered or waits for the key, until the end of the longest of those (the
//! parent module pins the cache entry that long); once nobody does, no longer than the last
//! lease and at most [`IDLE_LINGER`] (so a hot key is not re-inserted on every acquisition).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::{Lease, OwnerToken, WaiterId};

/// How long an emptied entry stays cached for reuse (never past the end of its last lease).
pub(super) const IDLE_LINGER: Duration = Duration::from_secs(1);

/// How far past its horizon an entry in use is pinned, for a use that lasts `span` from now: an
/// eighth of it, at most [`IDLE_LINGER`] (a 200 ms lease: 25 ms; 8 s and more: 1 s).
pub(super) fn pin_slack(span: Duration) -> Duration {
    (span / 8).min(IDLE_LINGER)
}

/// One key's entry: its state, and the wake-up for the case it leaves the cache.
#[derive(Debug, Default)]
pub(super) struct Slot {
    state: Mutex<State>,
    /// Wakes every local waiter when the entry leaves the cache (each then looks the key up
    /// again). Turns in the line wake one waiter each, through its own place.
    pub(super) gone_wake: Notify,
    /// Set once the entry is out of the cache (removed, expired or retired): a task holding it
    /// from an earlier look (its own place in line, a thread's last look-up) looks the key up
    /// again instead of using it.
    gone: AtomicBool,
}

impl Slot {
    /// Marks the entry as out of the cache (see [`Slot::is_gone`]).
    pub(super) fn mark_gone(&self) {
        self.gone.store(true, Ordering::Release);
    }

    /// Whether the entry is known to be out of the cache. `false` is not a promise (moka may
    /// have expired it without telling yet); every state change that matters is checked against
    /// the cache by [`Shared::settle`](super::entries::Shared::settle).
    pub(super) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::Acquire)
    }

    /// Locks the state. A panic elsewhere while holding the lock leaves a consistent state (every
    /// transition is one assignment sequence without a fallible step), so poisoning is ignored.
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// When a releasing holder hands its store lease to a local waiter instead of releasing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct HandOff {
    pub(super) enabled: bool,
    pub(super) max_hand_offs: u32,
    pub(super) max_hold: Duration,
}

/// A blocking contender: its wait (the same on every attempt) and when it gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Wait {
    pub(super) waiter: WaiterId,
    pub(super) deadline: Instant,
}

/// The per-key state.
#[derive(Debug, Default)]
pub(super) struct State {
    holder: Option<Holder>,
    /// A store lease handed off by a releasing holder, reserved for the head of the line.
    offer: Option<Offer>,
    /// Blocking contenders in arrival order; the head is the only one that may take the key.
    line: VecDeque<Place>,
    /// No later than the earliest deadline in line (exact after a lapse scan, else a lower
    /// bound): until then no place can lapse, so the line is not scanned.
    soonest_until: Option<Instant>,
    /// No earlier than the latest deadline in line (an upper bound): how long the entry must stay
    /// cached for its waiters.
    latest_until: Option<Instant>,
    /// The waiter last served (its place already taken out of the line by the grant), so its
    /// leaving needs no search of the line.
    last_served: Option<WaiterId>,
    /// This process took its last store lease while other processes queued in the store, and
    /// local waiters remained: a fair store then put the process back at the end of its line, so
    /// the next head waits for the store's word instead of asking only to be refused.
    behind_others: bool,
    /// The end of the latest lease this entry carried.
    last_end: Option<Instant>,
    /// The expiry last given to the cache; `None`: the one it got at creation.
    pinned_until: Option<Instant>,
    /// Out of the cache: nobody may take or wait on this entry any more.
    retired: bool,
}

#[derive(Debug)]
struct Holder {
    token: OwnerToken,
    /// The store lease when it carries another owner token than the holder's (received by a
    /// hand-off). `None`: the holder's own lease is the store lease (once its acquire returned).
    handed: Option<Lease>,
    /// No later than the store lease's expiry (the clock is read before the store is asked).
    expires_at: Instant,
    hand_offs: u32,
    /// When the store lease was first acquired (for the hand-off hold bound).
    since: Instant,
    /// Other processes queued in the store when it granted this lease: it is theirs next, so it
    /// is not handed off.
    others_queued: bool,
}

#[derive(Debug)]
struct Offer {
    store: Lease,
    hand_offs: u32,
    since: Instant,
}

/// One blocking contender's place in the line.
#[derive(Debug)]
struct Place {
    waiter: WaiterId,
    /// Wakes this contender alone. Fired with `notify_waiters`, which stores no permit: a head
    /// that is away waiting for the store is not woken later by a stale turn.
    wake: Arc<Notify>,
    /// The contender's deadline: the place lapses then.
    until: Instant,
}

/// What a contender gets from [`State::try_take`].
#[derive(Debug, PartialEq)]
pub(super) enum Take {
    /// The key is the caller's locally. `handed`: the store lease it received by hand-off;
    /// `None`: the caller asks the store (it is the key's one store talker now; a blocking caller
    /// keeps the head of the line until [`State::granted`] or [`State::leave`]).
    Taken { handed: Option<Lease> },
    /// Held, offered or queued for, and the caller does not wait: fail without store I/O.
    FastFail,
    /// The caller's deadline has passed: it gives up (and leaves the line).
    TimedOut,
    /// In line behind someone, or the key is held: wait (on [`State::wake_of`]) until `wake_at`
    /// (the deadline or the lease's end, the earlier) and look again.
    Busy { wake_at: Instant },
    /// The head of the line, but this process is queued behind other processes in the store:
    /// wait for the store's word (a notification, or a poll) and ask again, keeping the place.
    AfterOthers,
    /// The entry left the cache: look the key up again.
    Retired,
}

/// What a holder's release does, from [`State::release`].
#[derive(Debug, PartialEq)]
pub(super) enum Release {
    /// Not this entry's holder (stale or foreign lease): the store decides.
    NotHolder,
    /// Handed to the head of the line (the `consecutive`-th hand-off of this store lease): no
    /// store I/O; wake the head ([`State::head_wake`]).
    HandedOff { consecutive: u32 },
    /// Release `store` in the store; the holder stays in place until it answered
    /// ([`State::vacate`]).
    ToStore { store: Lease },
}

/// What a waiter leaving the line leaves behind, from [`State::leave`].
#[derive(Debug, Default)]
pub(super) struct Left {
    /// The new head, when it may take the key now.
    pub(super) wake: Option<Arc<Notify>>,
    /// An offer nobody is left to claim: the caller releases it in the store.
    pub(super) orphan: Option<Lease>,
}

impl State {
    /// Drops a holder or an offer whose lease has run out, and places whose deadline passed: a
    /// crashed, leaked or vanished contender never blocks the key past its lease or deadline.
    pub(super) fn expire(&mut self, now: Instant) {
        self.expire_leases(now);
        self.lapse(now, None);
    }

    fn expire_leases(&mut self, now: Instant) {
        if self.holder.as_ref().is_some_and(|h| h.expires_at <= now) {
            self.holder = None;
        }
        if self
            .offer
            .as_ref()
            .is_some_and(|o| o.store.expires_at() <= now)
        {
            self.offer = None;
        }
    }

    /// Drops the places whose deadline passed, but `caller`'s: a contender woken by its turn just
    /// as its deadline passes still takes the key it was given.
    fn lapse(&mut self, now: Instant, caller: Option<WaiterId>) {
        if self.soonest_until.is_some_and(|soonest| soonest <= now) {
            self.line
                .retain(|p| p.until > now || Some(p.waiter) == caller);
            self.soonest_until = self.line.iter().map(|p| p.until).min();
            self.latest_until = self.line.iter().map(|p| p.until).max();
        }
        self.line_shrank();
    }

    /// Joins `place` at the back of the line.
    fn join(&mut self, place: Place) {
        let until = place.until;
        self.soonest_until = Some(self.soonest_until.map_or(until, |s| s.min(until)));
        self.latest_until = Some(self.latest_until.map_or(until, |l| l.max(until)));
        self.line.push_back(place);
    }

    /// Takes `waiter`'s place out of the line, looking at the head first (the one usually served).
    fn remove(&mut self, waiter: WaiterId) {
        if self.line.front().is_some_and(|p| p.waiter == waiter) {
            self.line.pop_front();
        } else {
            self.line.retain(|p| p.waiter != waiter);
        }
        self.line_shrank();
    }

    /// After places left: an empty line has no bounds and nobody waits behind other processes.
    fn line_shrank(&mut self) {
        if self.line.is_empty() {
            self.behind_others = false;
            self.soonest_until = None;
            self.latest_until = None;
        }
    }

    /// Whether anyone holds, is offered or waits for the key.
    pub(super) fn in_use(&self) -> bool {
        self.holder.is_some() || self.offer.is_some() || !self.line.is_empty()
    }

    /// Whether the entry left the cache.
    pub(super) fn is_retired(&self) -> bool {
        self.retired
    }

    /// Marks the entry as out of the cache.
    pub(super) fn retire(&mut self) {
        self.retired = true;
    }

    /// Retires the entry if nobody uses it (after dropping what expired); returns whether it did.
    pub(super) fn retire_if_idle(&mut self, now: Instant) -> bool {
        self.expire(now);
        if !self.in_use() {
            self.retired = true;
        }
        self.retired
    }

    /// The earliest time the cache may drop this entry. In use: the end of the latest lease,
    /// offer or waiter deadline. Idle: the end of the last lease, and no later than
    /// [`IDLE_LINGER`] from `now`.
    pub(super) fn horizon(&self, now: Instant) -> Instant {
        if self.in_use() {
            let holder = self.holder.as_ref().map(|h| h.expires_at);
            let offer = self.offer.as_ref().map(|o| o.store.expires_at());
            [holder, offer, self.latest_until]
                .into_iter()
                .flatten()
                .max()
                .unwrap_or(now)
        } else {
            let linger = now + IDLE_LINGER;
            self.last_end.map_or(linger, |end| end.min(linger)).max(now)
        }
    }

    /// The expiry the cache entry needs now, if it differs from the one it has: later while in
    /// use (never evicted from under a holder, an offer or a waiter), earlier once idle (never
    /// kept past its lease, nor more than [`IDLE_LINGER`]).
    ///
    /// In use, the entry is pinned a little past the horizon ([`pin_slack`]): on a hot key every
    /// new holder's lease ends a little later than the last one's, and without the slack each of
    /// them would move the expiry (a cache write under the entry's lock). With it, the next
    /// holders within the slack need no write. The slack is taken back as soon as the entry
    /// empties; only a leaked holder's entry keeps it, and is dropped that long after its lease.
    pub(super) fn expiry_change(&self, now: Instant) -> Option<Instant> {
        let horizon = self.horizon(now);
        let in_use = self.in_use();
        match self.pinned_until {
            Some(pinned) if in_use && pinned >= horizon => None,
            Some(pinned) if !in_use && pinned <= horizon => None,
            _ if in_use => Some(horizon + pin_slack(horizon.saturating_duration_since(now))),
            _ => Some(horizon),
        }
    }

    /// Records the expiry the cache entry was given.
    pub(super) fn pinned(&mut self, until: Instant) {
        self.pinned_until = Some(until);
    }

    /// A contender for the key. `wait`: `None` for a try-lock, which takes the key only if it is
    /// free and nobody is in line, else fails fast; a blocking contender joins the line (once)
    /// and takes the key or an offer when it is the head, else is told how long to wait.
    pub(super) fn try_take(
        &mut self,
        token: &OwnerToken,
        ttl: Duration,
        wait: Option<Wait>,
        now: Instant,
    ) -> Take {
        if self.retired {
            return Take::Retired;
        }
        self.expire_leases(now);
        self.lapse(now, wait.map(|w| w.waiter));
        let Some(wait) = wait else {
            if self.holder.is_some() || self.offer.is_some() || !self.line.is_empty() {
                return Take::FastFail;
            }
            self.hold_fresh(token, ttl, now);
            return Take::Taken { handed: None };
        };
        // From the head: a woken head finds itself at once.
        if !self.line.iter().any(|p| p.waiter == wait.waiter) {
            self.join(Place {
                waiter: wait.waiter,
                wake: Arc::new(Notify::new()),
                until: wait.deadline,
            });
        }
        let is_head = self.line.front().is_some_and(|p| p.waiter == wait.waiter);
        if is_head && self.holder.is_none() {
            if let Some(offer) = self.offer.take() {
                self.remove(wait.waiter);
                self.last_served = Some(wait.waiter);
                let expires_at = offer.store.expires_at();
                self.note_end(expires_at);
                self.holder = Some(Holder {
                    token: token.clone(),
                    expires_at,
                    handed: Some(offer.store.clone()),
                    hand_offs: offer.hand_offs,
                    since: offer.since,
                    others_queued: false,
                });
                return Take::Taken {
                    handed: Some(offer.store),
                };
            }
            if std::mem::take(&mut self.behind_others) {
                return Take::AfterOthers;
            }
            self.hold_fresh(token, ttl, now);
            return Take::Taken { handed: None };
        }
        if wait.deadline <= now {
            // The place goes when the caller leaves ([`State::leave`]), which wakes the next head.
            return Take::TimedOut;
        }
        // Woken by a turn, else no later than the lease's end (a leaked holder), nor than the
        // head's deadline (a head that vanished without leaving), nor than its own deadline.
        let lease_end = self
            .holder
            .as_ref()
            .map(|h| h.expires_at)
            .or_else(|| self.offer.as_ref().map(|o| o.store.expires_at()));
        let head_until = self.line.front().map(|p| p.until);
        Take::Busy {
            wake_at: [Some(wait.deadline), lease_end, head_until]
                .into_iter()
                .flatten()
                .min()
                .unwrap_or(wait.deadline),
        }
    }

    fn hold_fresh(&mut self, token: &OwnerToken, ttl: Duration, now: Instant) {
        self.note_end(now + ttl);
        self.holder = Some(Holder {
            token: token.clone(),
            handed: None,
            expires_at: now + ttl,
            hand_offs: 0,
            since: now,
            others_queued: false,
        });
    }

    /// The wake-up of `waiter`'s place, if it has one.
    pub(super) fn wake_of(&self, waiter: WaiterId) -> Option<Arc<Notify>> {
        // From the back: the caller has usually just joined.
        self.line
            .iter()
            .rev()
            .find(|p| p.waiter == waiter)
            .map(|p| p.wake.clone())
    }

    /// The head's wake-up, when the head may take the key now (nobody holds it).
    pub(super) fn head_wake(&self) -> Option<Arc<Notify>> {
        if self.holder.is_some() {
            return None;
        }
        self.line.front().map(|p| p.wake.clone())
    }

    /// The store granted `token`'s request; `others_queued`: other processes were in the store's
    /// line then ([`Lease::is_contended`]). A blocking taker (`waiter`) leaves the line. If local
    /// waiters remain behind a contended grant, the process went back to the end of the store's
    /// line, and the next head waits for the store's word ([`Take::AfterOthers`]).
    pub(super) fn granted(
        &mut self,
        token: &OwnerToken,
        waiter: Option<WaiterId>,
        others_queued: bool,
    ) {
        if let Some(waiter) = waiter {
            self.remove(waiter);
            self.last_served = Some(waiter);
        }
        if let Some(h) = self.holder.as_mut().filter(|h| &h.token == token) {
            h.others_queued = others_queued;
        }
        self.behind_others = others_queued && !self.line.is_empty();
    }

    /// `waiter` leaves the line (its wait ended: deadline, cancellation, an error, shutdown). If
    /// the key is free, the head is to be woken (it may be a new one); the last waiter to
    /// leave takes an offer nobody will claim with it (the caller releases it in the store).
    pub(super) fn leave(&mut self, waiter: WaiterId) -> Left {
        if self.last_served != Some(waiter) {
            self.remove(waiter);
        }
        self.line_shrank();
        if self.line.is_empty() {
            let orphan = if self.holder.is_none() {
                self.offer.take().map(|o| o.store)
            } else {
                None
            };
            return Left { wake: None, orphan };
        }
        // Woken whether or not the leaver was the head: its place may have lapsed already (then
        // nobody saw the head change), and a head with nothing to do looks and sleeps again.
        Left {
            wake: self.head_wake(),
            orphan: None,
        }
    }

    /// How many contenders wait in line.
    #[cfg(test)]
    pub(super) fn line_len(&self) -> usize {
        self.line.len()
    }

    /// Frees the key if `token` still holds it; returns the head's wake-up if the head may now
    /// take it.
    pub(super) fn vacate(&mut self, token: &OwnerToken) -> Option<Arc<Notify>> {
        if self.holder.as_ref().is_some_and(|h| &h.token == token) {
            self.holder = None;
        }
        self.head_wake()
    }

    /// The store lease behind `own` (the lease handed to `own`'s holder), if `own`'s token holds
    /// the key: what an extend or release must send to the store.
    pub(super) fn store_lease(&self, own: &Lease) -> Option<Lease> {
        self.holder
            .as_ref()
            .filter(|h| &h.token == own.token())
            .map(|h| h.handed.clone().unwrap_or_else(|| own.clone()))
    }

    /// A holder releases `own`. With hand-off on and someone in line, the store lease goes to
    /// the head while the bounds allow (consecutive hand-offs, hold time, lease still running)
    /// and no other process queued for it in the store (they were first); otherwise it is
    /// released in the store.
    pub(super) fn release(&mut self, own: &Lease, policy: HandOff, now: Instant) -> Release {
        let Some(store) = self.store_lease(own) else {
            return Release::NotHolder;
        };
        let Some(holder) = self.holder.as_ref() else {
            return Release::NotHolder;
        };
        let may_hand_off = policy.enabled
            && !self.line.is_empty()
            && !holder.others_queued
            && holder.hand_offs < policy.max_hand_offs
            && now.saturating_duration_since(holder.since) < policy.max_hold
            && now < store.expires_at();
        if !may_hand_off {
            return Release::ToStore { store };
        }
        let consecutive = holder.hand_offs + 1;
        let since = holder.since;
        self.holder = None;
        self.note_end(store.expires_at());
        self.offer = Some(Offer {
            store,
            hand_offs: consecutive,
            since,
        });
        Release::HandedOff { consecutive }
    }

    /// The store renewed the lease of `token`'s holder to `renewed`: the holder's expiry follows,
    /// and a handed store lease is replaced. Returns whether `token` still holds the key.
    pub(super) fn renewed(&mut self, token: &OwnerToken, renewed: &Lease) -> bool {
        let Some(h) = self.holder.as_mut().filter(|h| &h.token == token) else {
            return false;
        };
        h.expires_at = renewed.expires_at();
        if h.handed.is_some() {
            h.handed = Some(renewed.clone());
        }
        let end = h.expires_at;
        self.note_end(end);
        true
    }

    /// A handed store lease was lost in the store: `token`'s holder acquires afresh (still the
    /// key's one store talker). Returns whether `token` still holds the key.
    pub(super) fn restart(&mut self, token: &OwnerToken, ttl: Duration, now: Instant) -> bool {
        let Some(h) = self.holder.as_mut().filter(|h| &h.token == token) else {
            return false;
        };
        h.handed = None;
        h.expires_at = now + ttl;
        h.since = now;
        h.hand_offs = 0;
        self.note_end(now + ttl);
        true
    }

    /// A handed store lease was extended to `renewed` for `token`'s holder. Returns whether
    /// `token` still holds the key (if not, nobody here knows `renewed`).
    pub(super) fn took_renewed(&mut self, token: &OwnerToken, renewed: &Lease) -> bool {
        let Some(h) = self.holder.as_mut().filter(|h| &h.token == token) else {
            return false;
        };
        h.expires_at = renewed.expires_at();
        h.handed = Some(renewed.clone());
        self.note_end(renewed.expires_at());
        true
    }

    fn note_end(&mut self, end: Instant) {
        self.last_end = self.last_end.max(Some(end));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::LockKey;

    const TTL: Duration = Duration::from_secs(10);
    const MINUTE: Duration = Duration::from_secs(60);

    fn token() -> OwnerToken {
        OwnerToken::generate()
    }

    fn lease(token: &OwnerToken, ttl: Duration, at: Instant) -> Lease {
        Lease::new(
            LockKey::dc("f1", "test", "a").unwrap(),
            token.clone(),
            ttl,
            at,
        )
    }

    fn hand_off(max_hand_offs: u32, max_hold: Duration) -> HandOff {
        HandOff {
            enabled: true,
            max_hand_offs,
            max_hold,
        }
    }

    const NO_HAND_OFF: HandOff = HandOff {
        enabled: false,
        max_hand_offs: 8,
        max_hold: Duration::from_secs(1),
    };

    fn wait(deadline: Instant) -> Wait {
        Wait {
            waiter: WaiterId::new(),
            deadline,
        }
    }

    /// A state held by a fresh holder (its own lease is the store lease) with one waiter in line.
    fn held_with_waiter(now: Instant) -> (State, OwnerToken, Lease, Wait) {
        let mut st = State::default();
        let a = token();
        assert_eq!(
            st.try_take(&a, TTL, None, now),
            Take::Taken { handed: None }
        );
        let w = wait(now + MINUTE);
        assert_eq!(
            st.try_take(&token(), TTL, Some(w), now),
            Take::Busy { wake_at: now + TTL }
        );
        (st, a.clone(), lease(&a, TTL, now), w)
    }

    #[test]
    fn free_to_taken_then_try_lock_fails_fast() {
        let now = Instant::now();
        let mut st = State::default();
        assert!(!st.in_use());
        assert_eq!(
            st.try_take(&token(), TTL, None, now),
            Take::Taken { handed: None }
        );
        assert!(st.in_use());
        assert_eq!(st.try_take(&token(), TTL, None, now), Take::FastFail);
    }

    #[test]
    fn a_blocking_contender_is_told_to_wait_until_the_lease_ends_or_its_deadline() {
        let now = Instant::now();
        let mut st = State::default();
        st.try_take(&token(), TTL, None, now);
        let soon = now + Duration::from_secs(2);
        assert_eq!(
            st.try_take(&token(), TTL, Some(wait(soon)), now),
            Take::Busy { wake_at: soon }
        );
        let mut st = State::default();
        st.try_take(&token(), TTL, None, now);
        assert_eq!(
            st.try_take(&token(), TTL, Some(wait(now + MINUTE)), now),
            Take::Busy { wake_at: now + TTL },
            "woken at the lease's end, not later"
        );
        assert_eq!(
            st.try_take(&token(), TTL, Some(wait(now)), now),
            Take::TimedOut
        );
    }

    #[test]
    fn the_line_is_served_in_arrival_order_and_a_try_lock_never_passes_it() {
        let now = Instant::now();
        let (mut st, a, own, first) = held_with_waiter(now);
        let second = wait(now + MINUTE);
        let (t1, t2) = (token(), token());
        assert!(matches!(
            st.try_take(&t2, TTL, Some(second), now),
            Take::Busy { .. }
        ));
        assert_eq!(st.line_len(), 2);
        assert_eq!(
            st.release(&own, NO_HAND_OFF, now),
            Release::ToStore { store: own }
        );
        let head = st.vacate(&a).expect("the head is woken");
        assert!(Arc::ptr_eq(&head, &st.wake_of(first.waiter).unwrap()));
        assert_eq!(
            st.try_take(&token(), TTL, None, now),
            Take::FastFail,
            "free, but someone is in line"
        );
        assert!(
            matches!(st.try_take(&t2, TTL, Some(second), now), Take::Busy { .. }),
            "the second in line waits for the first"
        );
        assert_eq!(
            st.try_take(&t1, TTL, Some(first), now),
            Take::Taken { handed: None }
        );
        assert_eq!(st.line_len(), 2, "the head keeps its place while it asks");
        st.granted(&t1, Some(first.waiter), false);
        assert_eq!(st.line_len(), 1, "granted: out of the line");
        let again = wait(now + MINUTE);
        st.vacate(&t1);
        assert!(
            matches!(st.try_take(&t1, TTL, Some(again), now), Take::Busy { .. }),
            "asking again goes to the back"
        );
        assert_eq!(
            st.try_take(&t2, TTL, Some(second), now),
            Take::Taken { handed: None }
        );
    }

    #[test]
    fn a_refused_head_keeps_its_place_and_the_line_waits_behind_it() {
        let now = Instant::now();
        let mut st = State::default();
        let (head, next) = (wait(now + MINUTE), wait(now + MINUTE));
        let (t1, t2) = (token(), token());
        assert_eq!(
            st.try_take(&t1, TTL, Some(head), now),
            Take::Taken { handed: None }
        );
        assert!(matches!(
            st.try_take(&t2, TTL, Some(next), now),
            Take::Busy { .. }
        ));
        // The store refused: the talker's hold goes, its place stays at the head.
        st.vacate(&t1);
        assert!(matches!(
            st.try_take(&t2, TTL, Some(next), now),
            Take::Busy { .. }
        ));
        let t3 = token();
        assert_eq!(
            st.try_take(&t3, TTL, Some(head), now),
            Take::Taken { handed: None },
            "the head's next attempt"
        );
        // The head gives up (its watch dropped): the next one is woken and may take the key.
        st.vacate(&t3);
        let left = st.leave(head.waiter);
        assert!(Arc::ptr_eq(
            &left.wake.unwrap(),
            &st.wake_of(next.waiter).unwrap()
        ));
        assert_eq!(
            st.try_take(&t2, TTL, Some(next), now),
            Take::Taken { handed: None }
        );
    }

    #[test]
    fn a_place_lapses_at_its_deadline_and_the_next_head_is_woken_on_leave() {
        let now = Instant::now();
        let mut st = State::default();
        let (soon, later) = (wait(now + TTL), wait(now + MINUTE));
        let holder = token();
        st.try_take(&holder, MINUTE, None, now);
        st.try_take(&token(), TTL, Some(soon), now);
        assert_eq!(
            st.try_take(&token(), TTL, Some(later), now),
            Take::Busy { wake_at: now + TTL },
            "no later than the head's deadline"
        );
        let after = now + TTL;
        assert_eq!(
            st.try_take(&token(), TTL, Some(soon), after),
            Take::TimedOut
        );
        st.vacate(&holder);
        let left = st.leave(soon.waiter);
        assert!(left.wake.is_some(), "the new head is woken");
        assert_eq!(
            st.try_take(&token(), TTL, Some(later), after),
            Take::Taken { handed: None }
        );
    }

    #[test]
    fn a_place_lapses_at_its_deadline_after_the_one_that_bounded_the_line_was_served() {
        // The line keeps a bound on its soonest deadline so most looks need no scan; serving
        // the place that set it leaves the bound early, never late.
        let now = Instant::now();
        let mut st = State::default();
        let (first, soon, later) = (
            wait(now + Duration::from_secs(1)),
            wait(now + TTL),
            wait(now + MINUTE),
        );
        let (a, b) = (token(), token());
        for (t, w) in [(&a, first), (&b, soon), (&token(), later)] {
            st.try_take(t, TTL, Some(w), now);
        }
        st.granted(&a, Some(first.waiter), false);
        st.leave(first.waiter);
        assert_eq!(st.line_len(), 2);
        let at = now + Duration::from_secs(2);
        assert_eq!(
            st.try_take(&token(), TTL, Some(later), at),
            Take::Busy { wake_at: now + TTL },
            "still in time: nothing lapsed"
        );
        assert_eq!(st.line_len(), 2);
        st.vacate(&a);
        let after = now + TTL;
        assert_eq!(
            st.try_take(&token(), TTL, Some(later), after),
            Take::Taken { handed: None },
            "the place whose deadline passed lapsed, so the last is the head"
        );
        assert_eq!(st.line_len(), 1);
    }

    #[test]
    fn an_entry_in_use_is_pinned_past_every_waiter_and_released_once_the_line_empties() {
        let now = Instant::now();
        let mut st = State::default();
        let holder = token();
        st.try_take(&holder, TTL, None, now);
        let (near, far) = (wait(now + TTL), wait(now + MINUTE));
        st.try_take(&token(), TTL, Some(near), now);
        st.try_take(&token(), TTL, Some(far), now);
        assert!(
            st.horizon(now) >= now + MINUTE,
            "pinned for the farthest waiter"
        );
        st.leave(far.waiter);
        assert!(
            st.horizon(now) >= now + TTL,
            "never earlier than a waiter still in line"
        );
        st.leave(near.waiter);
        st.vacate(&holder);
        assert!(!st.in_use());
        assert!(
            st.horizon(now) <= now + IDLE_LINGER,
            "idle: no bound of a past line keeps it"
        );
    }

    #[test]
    fn behind_other_processes_the_next_head_waits_for_the_stores_word_once() {
        let now = Instant::now();
        let mut st = State::default();
        let (a, b) = (token(), token());
        let (first, second) = (wait(now + MINUTE), wait(now + MINUTE));
        st.try_take(&a, TTL, Some(first), now);
        st.try_take(&b, TTL, Some(second), now);
        st.granted(&a, Some(first.waiter), true);
        let own = lease(&a, TTL, now);
        assert_eq!(
            st.release(&own, hand_off(8, MINUTE), now),
            Release::ToStore { store: own },
            "others queued in the store first: no hand-off"
        );
        st.vacate(&a);
        assert_eq!(st.try_take(&b, TTL, Some(second), now), Take::AfterOthers);
        assert_eq!(
            st.try_take(&b, TTL, Some(second), now),
            Take::Taken { handed: None },
            "once woken by the store, it asks"
        );
        // Uncontended grants, or nobody left behind, set nothing.
        st.granted(&b, Some(second.waiter), true);
        st.vacate(&b);
        let c = wait(now + MINUTE);
        assert_eq!(
            st.try_take(&token(), TTL, Some(c), now),
            Take::Taken { handed: None }
        );
    }

    #[test]
    fn the_last_waiter_to_leave_gives_back_an_unclaimed_offer() {
        let now = Instant::now();
        let (mut st, _, own, w) = held_with_waiter(now);
        assert_eq!(
            st.release(&own, hand_off(8, MINUTE), now),
            Release::HandedOff { consecutive: 1 }
        );
        let left = st.leave(w.waiter);
        assert_eq!(
            left.orphan,
            Some(own),
            "the last waiter takes the orphan with it"
        );
        assert!(left.wake.is_none());
        assert!(!st.in_use());
        let (mut st, _, _, w) = held_with_waiter(now);
        let left = st.leave(w.waiter);
        assert!(
            left.orphan.is_none() && left.wake.is_none(),
            "a holder is still there"
        );
        assert_eq!(st.line_len(), 0);
    }

    #[test]
    fn release_without_waiters_goes_to_the_store_and_vacate_frees() {
        let now = Instant::now();
        let mut st = State::default();
        let a = token();
        st.try_take(&a, TTL, None, now);
        let own = lease(&a, TTL, now);
        assert_eq!(
            st.release(&own, hand_off(8, MINUTE), now),
            Release::ToStore { store: own.clone() }
        );
        assert!(st.in_use(), "held until the store answered");
        assert!(st.vacate(&a).is_none(), "nobody to wake");
        assert!(!st.in_use());
        assert_eq!(
            st.try_take(&token(), TTL, None, now),
            Take::Taken { handed: None }
        );
    }

    #[test]
    fn hand_off_reserves_the_store_lease_for_the_head() {
        let now = Instant::now();
        let (mut st, _, own, w) = held_with_waiter(now);
        let later = wait(now + MINUTE);
        st.try_take(&token(), TTL, Some(later), now);
        let policy = hand_off(8, MINUTE);
        assert_eq!(
            st.release(&own, policy, now),
            Release::HandedOff { consecutive: 1 }
        );
        assert!(st.head_wake().is_some());
        assert_eq!(
            st.try_take(&token(), TTL, None, now),
            Take::FastFail,
            "a try-lock does not take an offer reserved for the line"
        );
        assert!(
            matches!(
                st.try_take(&token(), TTL, Some(later), now),
                Take::Busy { .. }
            ),
            "nor does the second in line"
        );
        let b = token();
        assert_eq!(
            st.try_take(&b, TTL, Some(w), now),
            Take::Taken {
                handed: Some(own.clone())
            }
        );
        assert_eq!(st.line_len(), 1, "the taker left the line");
        let b_own = own.clone().with_token(b.clone());
        assert_eq!(
            st.store_lease(&b_own),
            Some(own.clone()),
            "the taker's lease maps to the store lease"
        );
        st.leave(later.waiter);
        // No waiter left: the next release is a real one, under the store token.
        assert_eq!(
            st.release(&b_own, policy, now),
            Release::ToStore { store: own }
        );
    }

    #[test]
    fn hand_offs_are_bounded_in_number() {
        let now = Instant::now();
        let (mut st, _, mut own, mut w) = held_with_waiter(now);
        let policy = hand_off(2, MINUTE);
        let store = own.clone();
        for round in 1..=2 {
            assert_eq!(
                st.release(&own, policy, now),
                Release::HandedOff { consecutive: round }
            );
            let next = token();
            assert!(matches!(
                st.try_take(&next, TTL, Some(w), now),
                Take::Taken { handed: Some(_) }
            ));
            w = wait(now + TTL);
            st.try_take(&token(), TTL, Some(w), now);
            own = store.clone().with_token(next);
        }
        assert_eq!(
            st.release(&own, policy, now),
            Release::ToStore { store },
            "the bound is reached"
        );
    }

    #[test]
    fn hand_offs_are_bounded_in_hold_time() {
        let now = Instant::now();
        let (mut st, _, own, _) = held_with_waiter(now);
        let later = now + Duration::from_millis(100);
        assert_eq!(
            st.release(&own, hand_off(8, Duration::from_millis(100)), later),
            Release::ToStore { store: own.clone() }
        );
    }

    #[test]
    fn an_expired_holder_or_offer_is_dropped() {
        let now = Instant::now();
        let (mut st, _, own, w) = held_with_waiter(now);
        st.release(&own, hand_off(8, MINUTE), now);
        st.leave(w.waiter);
        let after = now + TTL;
        st.expire(after);
        assert!(!st.in_use(), "the offer ran out with its lease");

        let mut st = State::default();
        let a = token();
        st.try_take(&a, TTL, None, now);
        assert_eq!(
            st.try_take(&token(), TTL, None, after - Duration::from_millis(1)),
            Take::FastFail
        );
        assert_eq!(
            st.try_take(&token(), TTL, None, after),
            Take::Taken { handed: None },
            "a leaked holder blocks no longer than its lease"
        );
        st.vacate(&a);
        assert!(st.in_use(), "the expired holder's vacate changes nothing");
    }

    #[test]
    fn foreign_and_stale_leases_are_not_the_holders() {
        let now = Instant::now();
        let (mut st, a, own, _) = held_with_waiter(now);
        let foreign = own.clone().with_token(token());
        assert_eq!(st.store_lease(&foreign), None);
        assert_eq!(st.release(&foreign, NO_HAND_OFF, now), Release::NotHolder);
        assert!(!st.renewed(foreign.token(), &foreign));
        assert!(st.vacate(&a).is_some(), "the head is woken");
        assert_eq!(st.release(&own, NO_HAND_OFF, now), Release::NotHolder);
    }

    #[test]
    fn renewals_move_the_holders_expiry() {
        let now = Instant::now();
        let mut st = State::default();
        let a = token();
        st.try_take(&a, TTL, None, now);
        let renewed = lease(&a, Duration::from_secs(30), now);
        assert!(st.renewed(&a, &renewed));
        assert_eq!(
            st.try_take(&token(), TTL, Some(wait(now + MINUTE)), now),
            Take::Busy {
                wake_at: now + Duration::from_secs(30)
            }
        );
        // A lost handed lease: acquired afresh with the requested TTL.
        assert!(st.restart(&a, TTL, now));
        assert!(!st.restart(&token(), TTL, now));
        assert!(st.took_renewed(&a, &renewed));
        assert_eq!(st.store_lease(&lease(&a, TTL, now)), Some(renewed));
    }

    #[test]
    fn the_cache_expiry_covers_every_use_and_no_more_once_idle() {
        let now = Instant::now();
        let mut st = State::default();
        assert_eq!(st.expiry_change(now), Some(now + IDLE_LINGER), "fresh");
        let a = token();
        st.try_take(&a, TTL, None, now);
        let slack = pin_slack(TTL);
        assert_eq!(slack, IDLE_LINGER, "an eighth of 10 s, at most the linger");
        assert_eq!(
            st.expiry_change(now),
            Some(now + TTL + slack),
            "pinned past the lease"
        );
        st.pinned(now + TTL + slack);
        assert_eq!(st.expiry_change(now), None, "already pinned");
        // The key changes hands within the slack (a waiter keeps it in use meanwhile).
        let b = token();
        let soon = now + slack;
        let w = wait(soon + TTL);
        st.try_take(&b, TTL, Some(w), now);
        st.vacate(&a);
        st.try_take(&b, TTL, Some(w), soon);
        st.granted(&b, Some(w.waiter), false);
        assert_eq!(
            st.expiry_change(soon),
            None,
            "a new holder within the slack needs no cache write"
        );
        let long = wait(now + MINUTE);
        st.try_take(&token(), TTL, Some(long), now);
        assert_eq!(
            st.expiry_change(now),
            Some(now + Duration::from_secs(61)),
            "a waiter keeps the entry until its deadline"
        );
        st.pinned(now + Duration::from_secs(61));
        st.leave(long.waiter);
        st.vacate(&b);
        let later = now + Duration::from_secs(2);
        assert_eq!(
            st.expiry_change(later),
            Some(later + IDLE_LINGER),
            "emptied: brought down to the linger"
        );
        st.pinned(later + IDLE_LINGER);
        assert_eq!(st.expiry_change(later), None);
        // An emptied entry whose last lease ends sooner stays no longer than that lease.
        let mut st = State::default();
        let c = token();
        let short = Duration::from_millis(100);
        st.try_take(&c, short, None, now);
        assert_eq!(pin_slack(short), Duration::from_micros(12_500));
        assert_eq!(st.expiry_change(now), Some(now + short + pin_slack(short)));
        st.pinned(now + short + pin_slack(short));
        st.vacate(&c);
        assert_eq!(
            st.expiry_change(now),
            Some(now + short),
            "emptied: the slack is taken back"
        );
    }

    #[test]
    fn a_retired_entry_is_taken_by_nobody_and_only_an_idle_one_retires() {
        let now = Instant::now();
        let (mut st, a, _, w) = held_with_waiter(now);
        assert!(!st.retire_if_idle(now), "held and waited for");
        st.leave(w.waiter);
        st.vacate(&a);
        assert!(st.retire_if_idle(now));
        assert!(st.is_retired());
        assert_eq!(st.try_take(&token(), TTL, None, now), Take::Retired);
        let mut st = State::default();
        st.try_take(&token(), TTL, None, now);
        assert!(
            st.retire_if_idle(now + TTL),
            "a holder whose lease ran out no longer keeps the entry"
        );
    }
}
