//! The process's line per key: the tasks of this manager waiting for a key, in arrival order.
//! Only the head of a line asks the store and listens for its notifications; the others wait in
//! memory for their turn, so the process is one contender in the store per key however many of
//! its tasks wait, and a task that asks later is served later.
//!
//! Every waiter of the line holds the store's watch on the key (so the store knows how many of
//! this process's tasks wait: a fair store puts the process back in its line when one is
//! served while others remain), but only the head listens to it and asks.
//!
//! When the head is granted a lease the store marks contended (other processes were queued)
//! while others remain in this line, the process went to the back of the store's line: the next
//! head waits for the store's word instead of asking only to be refused ([`Place::after_others`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
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
    /// The head changed: the new head is woken to ask the store.
    turn: Notify,
    /// A task of this process released the key.
    released: Notify,
    /// The last head was served behind other processes in the store's line (see the module
    /// docs): the next head waits for the store before asking.
    after_others: AtomicBool,
}

#[derive(Debug, Default)]
struct Places {
    queue: VecDeque<u64>,
    next: u64,
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
        let ticket = {
            let mut places = line.lock();
            let ticket = places.next;
            places.next += 1;
            places.queue.push_back(ticket);
            ticket
        };
        Place {
            waiters: self,
            key: key.clone(),
            line: Some(line),
            ticket,
        }
    }

    /// A task of this process released `key`: wakes the head of its line.
    pub(crate) fn wake(&self, key: &LockKey) {
        if self.lines.load(Ordering::Acquire) == 0 {
            return;
        }
        if let Some(line) = self.map.get(key) {
            line.released.notify_waiters();
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
}

impl Place<'_> {
    fn line(&self) -> &Line {
        self.line.as_deref().expect("present until drop")
    }

    /// Whether this place is first in line.
    pub(crate) fn is_head(&self) -> bool {
        self.line().lock().queue.front() == Some(&self.ticket)
    }

    /// Notified when the head changes (make and enable a `Notified` before looking at
    /// [`is_head`](Self::is_head), so a change in between is not missed).
    pub(crate) fn turn(&self) -> &Notify {
        &self.line().turn
    }

    /// Notified when a task of this process releases the key.
    pub(crate) fn released(&self) -> &Notify {
        &self.line().released
    }

    /// This place's head was just granted a lease the store marked contended: if others wait
    /// behind it, the next head waits for the store's word first (see the module docs).
    pub(crate) fn served_behind_others(&self) {
        let line = self.line();
        if line.lock().queue.len() > 1 {
            line.after_others.store(true, Ordering::Release);
        }
    }

    /// Whether this new head should wait for the store before asking (and forgets it: it is
    /// said to one head only).
    pub(crate) fn after_others(&self) -> bool {
        self.line().after_others.swap(false, Ordering::AcqRel)
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        let Some(line) = self.line.take() else {
            return;
        };
        let next_head = {
            let mut places = line.lock();
            let was_head = places.queue.front() == Some(&self.ticket);
            places.queue.retain(|t| *t != self.ticket);
            was_head && !places.queue.is_empty()
        };
        if next_head {
            line.turn.notify_waiters();
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
