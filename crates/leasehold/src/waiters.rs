//! The process's line per key: the tasks of this manager waiting for a key, in arrival order.
//! Only the head of a line asks the store and listens for its notifications; the others wait in
//! memory for their turn, so the process is one contender in the store per key however many of
//! its tasks wait, and a task that asks later is served later.
//!
//! Every waiter of the line holds the store's watch on the key (so the store knows how many of
//! this process's tasks wait: a fair store puts the process back in its line when one is
//! served while others remain), but only the head listens to it and asks.
//!
//! When the head is served while others remain in this line, the next head does not ask at once
//! only to be refused ([`Place::first_wait`]): if the store marked the grant contended (other
//! processes were queued), the process went to the back of the store's line, and the next head
//! waits for the store's word; otherwise this process holds the key, and it waits for that
//! holder's release (or asks at once if the release came already).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use crate::core::LockKey;
use crate::KeyMap;

/// Key → its line. Entries exist only while someone waits.
#[derive(Debug, Default)]
pub(crate) struct Waiters {
    map: KeyMap<Arc<Line>>,
    /// Entries in `map`, so that a call when nobody waits anywhere skips the map.
    lines: AtomicUsize,
}

/// One key's line.
#[derive(Debug, Default)]
pub(crate) struct Line {
    places: Mutex<Places>,
    /// A task of this process released the key.
    released: Notify,
    /// How many times (for a head to tell whether a release came since it last looked).
    releases: AtomicU64,
    /// The head was served uncontended and left without waking the next head: the next release
    /// does (see [`Place`]'s drop).
    turn_on_release: AtomicBool,
}

/// What a new head waits for before it asks, after the head before it was served (see the
/// module docs): asking at once would only be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FirstWait {
    /// The store's word: the process was served behind other processes in the store's line.
    Store,
    /// A release by the head that was served (this process holds the key): unless the line's
    /// release count has moved past this one already.
    Release(u64),
}

#[derive(Debug, Default)]
struct Places {
    /// Tickets in arrival order, each with its holder's wake-up: only the new head is woken when
    /// the head leaves, not the whole line.
    queue: VecDeque<(u64, Arc<Notify>)>,
    next: u64,
    /// Set by a head that was served while others waited, taken by the next head.
    first_wait: Option<FirstWait>,
}

impl Waiters {
    /// Whether tasks of this process wait for `key`. Costs one atomic read when nobody waits.
    pub(crate) fn anyone_waits(&self, key: &LockKey) -> bool {
        self.lines.load(Ordering::Acquire) > 0 && self.map.contains_key(key)
    }

    /// Takes a place at the back of `key`'s line, held until the returned place is dropped.
    pub(crate) fn join<'a>(&'a self, key: &LockKey) -> Place<'a> {
        let line = self
            .map
            .entry(key.clone())
            .or_insert_with(|| {
                self.lines.fetch_add(1, Ordering::AcqRel);
                Arc::default()
            })
            .clone();
        let turn = Arc::new(Notify::new());
        let ticket = {
            let mut places = line.lock();
            let ticket = places.next;
            places.next += 1;
            places.queue.push_back((ticket, turn.clone()));
            ticket
        };
        Place {
            waiters: self,
            key: key.clone(),
            line: Some(line),
            ticket,
            turn,
        }
    }

    /// A task of this process released `key`: wakes the head of its line.
    pub(crate) fn wake(&self, key: &LockKey) {
        if self.lines.load(Ordering::Acquire) == 0 {
            return;
        }
        // The map's guard is held throughout, not a copy of the line: a copy would keep the last
        // place's drop from removing the line (it removes it only when the map holds the last
        // reference), and a line left empty would refuse every try as if someone waited.
        let Some(line) = self.map.get(key) else {
            return;
        };
        // SeqCst with `turn_on_release` (and its store in `Place`'s drop): either this release
        // sees the flag, or the leaving head sees the count moved and wakes the next itself.
        line.releases.fetch_add(1, Ordering::SeqCst);
        line.released.notify_waiters();
        if line.turn_on_release.load(Ordering::SeqCst) {
            let head = {
                let places = line.lock();
                line.turn_on_release
                    .swap(false, Ordering::SeqCst)
                    .then(|| places.queue.front().map(|(_, turn)| turn.clone()))
                    .flatten()
            };
            if let Some(turn) = head {
                turn.notify_one();
            }
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }
}

impl Line {
    fn lock(&self) -> MutexGuard<'_, Places> {
        self.places.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// One task's place in a key's line; dropping it leaves the line (served, timed out, failed or
/// cancelled alike) and, if it was the head, wakes the next.
#[derive(Debug)]
pub(crate) struct Place<'a> {
    waiters: &'a Waiters,
    key: LockKey,
    line: Option<Arc<Line>>,
    ticket: u64,
    /// Notified (once, with a permit kept if it is not listening yet) when this place becomes the
    /// head, or, when the head before it was served uncontended, when that holder releases the
    /// key (see the module docs).
    turn: Arc<Notify>,
}

impl Place<'_> {
    fn line(&self) -> &Line {
        self.line.as_deref().expect("present until drop")
    }

    /// Whether this place is first in line.
    pub(crate) fn is_head(&self) -> bool {
        self.line()
            .lock()
            .queue
            .front()
            .is_some_and(|(ticket, _)| *ticket == self.ticket)
    }

    /// Notified when this place becomes the head, or when the holder it waits for releases the key
    /// (the wake-up is kept until it is awaited; see the module docs).
    pub(crate) fn turn(&self) -> &Notify {
        &self.turn
    }

    /// Notified when a task of this process releases the key.
    pub(crate) fn released(&self) -> &Notify {
        &self.line().released
    }

    /// This place (the head) was just served, with a lease the store marked `contended` or
    /// not: if others wait behind it, the next head waits before it asks (see [`FirstWait`]).
    pub(crate) fn served(&self, contended: bool) {
        let line = self.line();
        let mut places = line.lock();
        if places.queue.len() > 1 {
            places.first_wait = Some(if contended {
                FirstWait::Store
            } else {
                FirstWait::Release(line.releases.load(Ordering::SeqCst))
            });
        }
    }

    /// What this new head waits for before asking, if the head before it was served (said to
    /// one head only).
    pub(crate) fn first_wait(&self) -> Option<FirstWait> {
        self.line().lock().first_wait.take()
    }

    /// How many times a task of this process released the key so far (to ask
    /// [`released_since`](Self::released_since) later).
    pub(crate) fn releases(&self) -> u64 {
        self.line().releases.load(Ordering::SeqCst)
    }

    /// Whether a task of this process released the key since the release count `seen`.
    pub(crate) fn released_since(&self, seen: u64) -> bool {
        self.line().releases.load(Ordering::SeqCst) != seen
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let Some(line) = self.line.take() else {
            return;
        };
        let next_head = {
            let mut places = line.lock();
            let was_head = places
                .queue
                .front()
                .is_some_and(|(ticket, _)| *ticket == self.ticket);
            // Tickets are taken in increasing order, and the place leaving is usually the head.
            if was_head {
                places.queue.pop_front();
            } else if let Ok(at) = places
                .queue
                .binary_search_by_key(&self.ticket, |(ticket, _)| *ticket)
            {
                places.queue.remove(at);
            }
            let next = was_head
                .then(|| places.queue.front().map(|(_, turn)| turn.clone()))
                .flatten();
            match (next, places.first_wait) {
                (None, _) => None,
                // A head served uncontended leaves the next head asleep until its holder's
                // release, which wakes it (`Waiters::wake`): woken now, it would only wait for
                // that release, at the cost of a second wake-up per hand-over. (A release that
                // came already is seen here, after the flag is up: the next is woken now.)
                (Some(next), Some(FirstWait::Release(seen))) => {
                    line.turn_on_release.store(true, Ordering::SeqCst);
                    if line.releases.load(Ordering::SeqCst) == seen {
                        None
                    } else {
                        line.turn_on_release.store(false, Ordering::SeqCst);
                        Some(next)
                    }
                }
                (next, _) => next,
            }
        };
        if let Some(turn) = next_head {
            turn.notify_one();
        }
        drop(line);
        // The map's own reference is the last one: nobody waits any more (a new place takes
        // its reference under the map's lock).
        if self
            .waiters
            .map
            .remove_if(&self.key, |_, line| Arc::strong_count(line) == 1)
            .is_some()
        {
            self.waiters.lines.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn lines_live_only_while_someone_waits() {
        let waiters = Waiters::default();
        let key = LockKey::xdc("c", "e").unwrap();
        assert!(!waiters.anyone_waits(&key));
        let a = waiters.join(&key);
        let b = waiters.join(&key);
        assert_eq!(waiters.len(), 1);
        assert!(waiters.anyone_waits(&key));
        drop(a);
        assert_eq!(waiters.len(), 1, "b still waits");
        drop(b);
        assert_eq!(waiters.len(), 0, "cancelled waiters leave nothing behind");
        assert!(!waiters.anyone_waits(&key));
    }

    #[tokio::test]
    async fn the_head_leaving_wakes_the_next_in_arrival_order() {
        let waiters = Waiters::default();
        let key = LockKey::xdc("c", "e").unwrap();
        let a = waiters.join(&key);
        let b = waiters.join(&key);
        let c = waiters.join(&key);
        assert!(a.is_head() && !b.is_head() && !c.is_head());
        let turn = b.turn().notified();
        tokio::pin!(turn);
        turn.as_mut().enable();
        drop(c); // leaving from behind wakes nobody
        drop(a);
        tokio::time::timeout(std::time::Duration::from_secs(5), turn)
            .await
            .expect("woken");
        assert!(b.is_head());
    }

    #[tokio::test]
    async fn a_release_reaches_an_enabled_head() {
        let waiters = Waiters::default();
        let key = LockKey::xdc("c", "e").unwrap();
        let place = waiters.join(&key);
        let woken = place.released().notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        waiters.wake(&key);
        tokio::time::timeout(std::time::Duration::from_secs(5), woken)
            .await
            .expect("woken");
    }
}
