//! Waiting on the embedded store: who waits on a key, and the key's line of exclusive waiters.
//!
//! Only the head of the line may take a free key, and a try or a newcomer never passes anyone in
//! line. Without the line, a waiter woken by a release could lose the key
//! to an instance that asked again before the waiter ran.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::core::{Wait, WaiterId};

/// A key some manager waits on.
#[derive(Debug, Default)]
pub(super) struct Watched {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
pub(super) struct State {
    /// Every live watch of the key, and whether it has a place in `line`.
    waiters: HashMap<WaiterId, bool>,
    /// The wake-up every watch of the key shares: a release wakes them all (see
    /// [`State::wake_released`]) with one call, however many wait.
    released: Arc<Notify>,
    /// Exclusive waiters refused so far, in arrival order, each with the deadline of its wait.
    line: VecDeque<(WaiterId, Instant)>,
}

impl Watched {
    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl State {
    /// The wake-up every watch of the key listens to.
    pub(super) fn released(&self) -> Arc<Notify> {
        self.released.clone()
    }

    /// Registers a watch.
    pub(super) fn add(&mut self, waiter: WaiterId) {
        self.waiters.insert(waiter, false);
    }

    /// Forgets a watch (dropped: its wait is over) and its place; if it was first in line, the
    /// next is woken, since it may find the key free and only a release would wake it.
    pub(super) fn remove(&mut self, waiter: WaiterId) {
        self.waiters.remove(&waiter);
        let was_head = self.line.front().is_some_and(|(w, _)| *w == waiter);
        self.line.retain(|(w, _)| *w != waiter);
        if was_head {
            self.wake_head();
        }
    }

    /// Whether `me` (a blocking attempt's wait; `None` for a try) may take a free key: the line
    /// is empty or `me` is first. Waiters whose wait is over leave the head first.
    pub(super) fn may_take(&mut self, me: Option<Wait>, now: Instant) -> bool {
        let mut lapsed = false;
        while self
            .line
            .front()
            .is_some_and(|(_, deadline)| *deadline <= now)
        {
            if let Some((waiter, _)) = self.line.pop_front() {
                if let Some(queued) = self.waiters.get_mut(&waiter) {
                    *queued = false;
                }
            }
            lapsed = true;
        }
        if lapsed {
            self.wake_head();
        }
        self.line
            .front()
            .is_none_or(|(head, _)| me.is_some_and(|me| *head == me.waiter))
    }

    /// Puts a refused blocking waiter at the back of the line, unless it has a place already.
    /// Only a watched wait queues: a caller without a watch could never be woken in turn.
    pub(super) fn join(&mut self, me: Option<Wait>) {
        let Some(me) = me else {
            return;
        };
        let Some(queued) = self.waiters.get_mut(&me.waiter) else {
            return;
        };
        if !*queued {
            *queued = true;
            self.line.push_back((me.waiter, me.deadline));
        }
    }

    /// `me` took the key: its place goes.
    pub(super) fn served(&mut self, me: Option<Wait>) {
        let Some(Wait { waiter: me, .. }) = me else {
            return;
        };
        if let Some(queued) = self.waiters.get_mut(&me) {
            if *queued {
                *queued = false;
                self.line.retain(|(w, _)| *w != me);
            }
        }
    }

    /// The key was released: wakes every waiter. Only the first in line will take it, but the
    /// first may not be listening right now (a task waiting in the manager's line behind another
    /// of its process), and a wake-up only it could use would then be lost until a poll.
    pub(super) fn wake_released(&self) {
        self.released.notify_waiters();
    }

    fn wake_head(&self) {
        self.wake_released();
    }
}
