//! One key's local state, as a synchronous state machine.
//!
//! Everything that decides who holds, who waits and who gets a handed-off lease is here, under
//! one mutex, with the time passed in: no future, no runtime, so every transition is tested with
//! plain `#[test]`s. The async code in the parent module only awaits (a wake-up, the lifecycle,
//! the store) and calls in here.
//!
//! ```text
//!            take                       release (no waiter, or hand-off bound reached)
//!   free ───────────▶ held ─────────────────────────────────────────▶ free (once the store answered)
//!    ▲                 │  ▲ take (blocking waiter)
//!    │ expire          │  │
//!    │                 ▼  │ release with waiters and hand-off on
//!    └──────────────── offered
//! ```
//!
//! Besides who holds it, the state remembers how long the entry must stay in the cache: while
//! anyone holds, is offered or waits for the key, until the end of the longest of those (the
//! parent module pins the cache entry that long); once nobody does, no longer than the last
//! lease and at most [`IDLE_LINGER`] (so a hot key is not re-inserted on every acquisition).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::{Lease, OwnerToken};

/// How long an emptied entry stays cached for reuse (never past the end of its last lease).
pub(super) const IDLE_LINGER: Duration = Duration::from_secs(1);

/// How far past its horizon an entry in use is pinned, for a use that lasts `span` from now: an
/// eighth of it, at most [`IDLE_LINGER`] (a 200 ms lease: 25 ms; 8 s and more: 1 s).
pub(super) fn pin_slack(span: Duration) -> Duration {
    (span / 8).min(IDLE_LINGER)
}

/// One key's entry: its state and the wake-up of its local waiters.
#[derive(Debug, Default)]
pub(super) struct Slot {
    state: Mutex<State>,
    /// Wakes local waiters (one at a release, all when the entry leaves the cache).
    pub(super) wake: Notify,
    /// Set once the entry left the cache (or is about to): a waiter then looks the key up again
    /// instead of reusing the entry it waited on. Outside the lock, so the cache's removal
    /// listener can set it from within any cache call.
    gone: AtomicBool,
}

impl Slot {
    /// Marks the entry as out of the cache.
    pub(super) fn set_gone(&self) {
        self.gone.store(true, Ordering::Release);
    }

    /// Whether the entry left the cache (as far as this process has seen).
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

/// The per-key state.
#[derive(Debug, Default)]
pub(super) struct State {
    holder: Option<Holder>,
    /// A store lease handed off by a releasing holder, reserved for a local waiter.
    offer: Option<Offer>,
    waiting: u32,
    /// The latest deadline of the registered waiters (while any waits).
    wait_until: Option<Instant>,
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
}

#[derive(Debug)]
struct Offer {
    store: Lease,
    hand_offs: u32,
    since: Instant,
}

/// What a contender gets from [`State::try_take`].
#[derive(Debug, PartialEq)]
pub(super) enum Take {
    /// The key is the caller's locally. `handed`: the store lease it received by hand-off;
    /// `None`: the caller asks the store (it is the key's one store talker now).
    Taken { handed: Option<Lease> },
    /// Held or offered to waiters, and the caller does not wait: fail without store I/O.
    FastFail,
    /// Held, and the caller's deadline has passed.
    TimedOut,
    /// Held; the caller may wait until `wake_at` (its deadline or the lease's end, the earlier)
    /// and look again.
    Busy { wake_at: Instant },
    /// The entry left the cache: look the key up again.
    Retired,
}

/// What a holder's release does, from [`State::release`].
#[derive(Debug, PartialEq)]
pub(super) enum Release {
    /// Not this entry's holder (stale or foreign lease): the store decides.
    NotHolder,
    /// Handed to the waiters (the `consecutive`-th hand-off of this store lease): no store I/O;
    /// wake one waiter.
    HandedOff { consecutive: u32 },
    /// Release `store` in the store; the holder stays in place until it answered
    /// ([`State::vacate`]).
    ToStore { store: Lease },
}

impl State {
    /// Drops a holder or an offer whose lease has run out: a crashed or leaked holder never
    /// blocks the key past its lease.
    pub(super) fn expire(&mut self, now: Instant) {
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

    /// Whether anyone holds, is offered or waits for the key.
    pub(super) fn in_use(&self) -> bool {
        self.holder.is_some() || self.offer.is_some() || self.waiting > 0
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
    /// offer or waiter wake-up. Idle: the end of the last lease, and no later than
    /// [`IDLE_LINGER`] from `now`.
    pub(super) fn horizon(&self, now: Instant) -> Instant {
        if self.in_use() {
            let holder = self.holder.as_ref().map(|h| h.expires_at);
            let offer = self.offer.as_ref().map(|o| o.store.expires_at());
            [holder, offer, self.wait_until]
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

    /// A contender for the key. `deadline`: `None` for a try-lock, which never takes an offer
    /// (it is reserved for the waiters) and fails fast; a blocking contender takes a free key or
    /// an offer, else is told how long to wait.
    pub(super) fn try_take(
        &mut self,
        token: &OwnerToken,
        ttl: Duration,
        deadline: Option<Instant>,
        now: Instant,
    ) -> Take {
        if self.retired {
            return Take::Retired;
        }
        self.expire(now);
        if self.holder.is_none() && (self.offer.is_none() || deadline.is_some()) {
            let offer = self.offer.take();
            let holder = match offer {
                Some(o) => Holder {
                    token: token.clone(),
                    expires_at: o.store.expires_at(),
                    handed: Some(o.store),
                    hand_offs: o.hand_offs,
                    since: o.since,
                },
                None => Holder {
                    token: token.clone(),
                    handed: None,
                    expires_at: now + ttl,
                    hand_offs: 0,
                    since: now,
                },
            };
            let handed = holder.handed.clone();
            self.note_end(holder.expires_at);
            self.holder = Some(holder);
            return Take::Taken { handed };
        }
        let Some(deadline) = deadline else {
            return Take::FastFail;
        };
        if deadline <= now {
            return Take::TimedOut;
        }
        let lease_end = self
            .holder
            .as_ref()
            .map(|h| h.expires_at)
            .or_else(|| self.offer.as_ref().map(|o| o.store.expires_at()))
            .unwrap_or(deadline);
        Take::Busy {
            wake_at: deadline.min(lease_end),
        }
    }

    /// Registers a local waiter whose deadline is `deadline`.
    pub(super) fn wait(&mut self, deadline: Instant) {
        self.waiting += 1;
        self.wait_until = self.wait_until.max(Some(deadline));
    }

    /// Unregisters a waiter that took the key (or backs out of a registration).
    pub(super) fn stop_waiting(&mut self) {
        self.waiting = self.waiting.saturating_sub(1);
        if self.waiting == 0 {
            self.wait_until = None;
        }
    }

    /// Unregisters a waiter that gives up (deadline, cancellation, shutdown). The last waiter to
    /// leave takes an offer nobody will claim with it: the caller releases it in the store.
    pub(super) fn leave(&mut self) -> Option<Lease> {
        self.stop_waiting();
        if self.waiting == 0 && self.holder.is_none() {
            self.offer.take().map(|o| o.store)
        } else {
            None
        }
    }

    /// Whether anyone waits.
    #[cfg(test)]
    pub(super) fn has_waiters(&self) -> bool {
        self.waiting > 0
    }

    /// Frees the key if `token` still holds it; returns whether a waiter should be woken.
    pub(super) fn vacate(&mut self, token: &OwnerToken) -> bool {
        if self.holder.as_ref().is_some_and(|h| &h.token == token) {
            self.holder = None;
        }
        self.waiting > 0
    }

    /// The store lease behind `own` (the lease handed to `own`'s holder), if `own`'s token holds
    /// the key: what an extend or release must send to the store.
    pub(super) fn store_lease(&self, own: &Lease) -> Option<Lease> {
        self.holder
            .as_ref()
            .filter(|h| &h.token == own.token())
            .map(|h| h.handed.clone().unwrap_or_else(|| own.clone()))
    }

    /// A holder releases `own`. With hand-off on and waiters present, the store lease goes to
    /// them while the bounds allow (consecutive hand-offs, hold time, lease still running);
    /// otherwise it is released in the store.
    pub(super) fn release(&mut self, own: &Lease, policy: HandOff, now: Instant) -> Release {
        let Some(store) = self.store_lease(own) else {
            return Release::NotHolder;
        };
        let Some(holder) = self.holder.as_ref() else {
            return Release::NotHolder;
        };
        let may_hand_off = policy.enabled
            && self.waiting > 0
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

    /// A state held by a fresh holder (its own lease is the store lease) with one waiter.
    fn held_with_waiter(now: Instant) -> (State, OwnerToken, Lease) {
        let mut st = State::default();
        let a = token();
        assert_eq!(
            st.try_take(&a, TTL, None, now),
            Take::Taken { handed: None }
        );
        st.wait(now + Duration::from_secs(60));
        (st, a.clone(), lease(&a, TTL, now))
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
            st.try_take(&token(), TTL, Some(soon), now),
            Take::Busy { wake_at: soon }
        );
        let late = now + Duration::from_secs(60);
        assert_eq!(
            st.try_take(&token(), TTL, Some(late), now),
            Take::Busy { wake_at: now + TTL },
            "woken at the lease's end, not later"
        );
        assert_eq!(st.try_take(&token(), TTL, Some(now), now), Take::TimedOut);
    }

    #[test]
    fn waiters_register_and_leave() {
        let now = Instant::now();
        let (mut st, _, _) = held_with_waiter(now);
        assert!(st.has_waiters());
        st.wait(now + Duration::from_secs(5));
        assert_eq!(
            st.leave(),
            None,
            "a holder is still there: nothing orphaned"
        );
        assert_eq!(st.leave(), None);
        assert!(!st.has_waiters());
        st.stop_waiting(); // one too many: saturates
        assert!(!st.has_waiters());
    }

    #[test]
    fn release_without_waiters_goes_to_the_store_and_vacate_frees() {
        let now = Instant::now();
        let mut st = State::default();
        let a = token();
        st.try_take(&a, TTL, None, now);
        let own = lease(&a, TTL, now);
        assert_eq!(
            st.release(&own, hand_off(8, Duration::from_secs(60)), now),
            Release::ToStore { store: own.clone() }
        );
        assert!(st.in_use(), "held until the store answered");
        assert!(!st.vacate(&a), "nobody to wake");
        assert!(!st.in_use());
        assert_eq!(
            st.try_take(&token(), TTL, None, now),
            Take::Taken { handed: None }
        );
    }

    #[test]
    fn release_with_waiters_but_hand_off_off_wakes_one_after_the_store() {
        let now = Instant::now();
        let (mut st, a, own) = held_with_waiter(now);
        assert_eq!(
            st.release(&own, NO_HAND_OFF, now),
            Release::ToStore { store: own.clone() }
        );
        assert!(st.vacate(&a), "a waiter to wake");
        st.stop_waiting();
        assert_eq!(
            st.try_take(&token(), TTL, Some(now + TTL), now),
            Take::Taken { handed: None }
        );
    }

    #[test]
    fn hand_off_reserves_the_store_lease_for_a_waiter() {
        let now = Instant::now();
        let (mut st, _, own) = held_with_waiter(now);
        let policy = hand_off(8, Duration::from_secs(60));
        assert_eq!(
            st.release(&own, policy, now),
            Release::HandedOff { consecutive: 1 }
        );
        assert_eq!(
            st.try_take(&token(), TTL, None, now),
            Take::FastFail,
            "a try-lock does not take an offer reserved for the waiters"
        );
        let b = token();
        st.stop_waiting();
        assert_eq!(
            st.try_take(&b, TTL, Some(now + TTL), now),
            Take::Taken {
                handed: Some(own.clone())
            }
        );
        let b_own = own.clone().with_token(b.clone());
        assert_eq!(
            st.store_lease(&b_own),
            Some(own.clone()),
            "the taker's lease maps to the store lease"
        );
        // No waiter left: the next release is a real one, under the store token.
        assert_eq!(
            st.release(&b_own, policy, now),
            Release::ToStore { store: own }
        );
    }

    #[test]
    fn hand_offs_are_bounded_in_number() {
        let now = Instant::now();
        let (mut st, _, mut own) = held_with_waiter(now);
        let policy = hand_off(2, Duration::from_secs(60));
        let store = own.clone();
        for round in 1..=2 {
            assert_eq!(
                st.release(&own, policy, now),
                Release::HandedOff { consecutive: round }
            );
            let next = token();
            st.stop_waiting();
            st.try_take(&next, TTL, Some(now + TTL), now);
            st.wait(now + TTL);
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
        let (mut st, _, own) = held_with_waiter(now);
        let later = now + Duration::from_millis(100);
        assert_eq!(
            st.release(&own, hand_off(8, Duration::from_millis(100)), later),
            Release::ToStore { store: own.clone() }
        );
    }

    #[test]
    fn an_expired_holder_or_offer_is_dropped() {
        let now = Instant::now();
        let (mut st, _, own) = held_with_waiter(now);
        st.release(&own, hand_off(8, Duration::from_secs(60)), now);
        st.stop_waiting();
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
        assert!(
            !st.vacate(&a),
            "the expired holder's vacate changes nothing"
        );
        assert!(st.in_use(), "the new holder stays");
    }

    #[test]
    fn a_cancelled_waiter_gives_back_an_unclaimed_offer() {
        let now = Instant::now();
        let (mut st, _, own) = held_with_waiter(now);
        st.release(&own, hand_off(8, Duration::from_secs(60)), now);
        assert_eq!(
            st.leave(),
            Some(own),
            "the last waiter takes the orphan with it"
        );
        assert!(!st.in_use());
    }

    #[test]
    fn foreign_and_stale_leases_are_not_the_holders() {
        let now = Instant::now();
        let (mut st, a, own) = held_with_waiter(now);
        let foreign = own.clone().with_token(token());
        assert_eq!(st.store_lease(&foreign), None);
        assert_eq!(st.release(&foreign, NO_HAND_OFF, now), Release::NotHolder);
        assert!(!st.renewed(foreign.token(), &foreign));
        assert!(st.vacate(&a));
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
            st.try_take(&token(), TTL, Some(now + Duration::from_secs(60)), now),
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
        // The key changes hands (a waiter keeps it in use meanwhile) within the slack.
        st.wait(now);
        st.vacate(&a);
        let b = token();
        let soon = now + slack;
        st.stop_waiting();
        st.try_take(&b, TTL, Some(soon + TTL), soon);
        assert_eq!(
            st.expiry_change(soon),
            None,
            "a new holder within the slack needs no cache write"
        );
        st.wait(now + Duration::from_secs(60));
        assert_eq!(
            st.expiry_change(now),
            Some(now + Duration::from_secs(61)),
            "a waiter keeps the entry until it wakes up"
        );
        st.pinned(now + Duration::from_secs(61));
        st.stop_waiting();
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
        let (mut st, a, _) = held_with_waiter(now);
        assert!(!st.retire_if_idle(now), "held and waited for");
        st.stop_waiting();
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
