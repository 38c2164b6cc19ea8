//! Waiting across processes: this store's places in each key's waiter queue, and the one pub/sub
//! connection that tells this process when it is its turn.
//!
//! A release (the fair release script) publishes the next entry in line on the channel of the
//! process it belongs to, `<prefix>released:<lock key>:<store id>`: only that process hears it
//! (a channel per key woke every waiting process at every hand-over). By default an entry is a
//! process (the store's id), and the process named wakes all its waiters on the key. In strict FIFO mode an entry is
//! one waiting call (`<store id>#<n>`), and only that call's watch wakes. A message is a hint:
//! waiters always try the store again, and a lost message (the subscriber connection dropped, a
//! publish during a reconnect) only costs one poll interval, bounded by the holder's TTL left and
//! the manager's retry interval.
//!
//! The same connection carries the change subscriptions of readers of who holds a lock (see
//! [`changes`]), remade with it after a reconnect or a failover.
//!
//! [`Waiting`] is what the store holds: its waiter id, the keys it waits on and observes, and the
//! subscriber connection they share; it hands each message to the waiters or the readers it is
//! for. The parts: [`state`] (the data: [`Waiting`] and the types of its fields, a leaf the others
//! import), [`places`] (this process's places in the waiter queues and the watches that hold
//! them), [`changes`] (the keys observed for a change of holder), [`subscriber`] (the connection,
//! and every (re)subscription on it).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use leasehold_core::OwnerToken;
use tokio::time::Instant;

use state::{Changes, Subscriber, Watched};

mod changes;
pub(crate) mod places;
mod state;
pub(crate) mod subscriber;

pub(crate) use state::Waiting;

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("id", &self.id)
            .field("watched", &self.lock().len())
            .finish()
    }
}

impl Waiting {
    pub(crate) fn new(
        prefix: &str,
        subscriber: Subscriber,
        connect_timeout: std::time::Duration,
    ) -> Self {
        Waiting {
            // host/pid/uuid: unique per store instance, readable in the store.
            id: OwnerToken::generate().as_str().to_owned(),
            next_watch: AtomicU64::new(1),
            channel_prefix: format!("{prefix}released:"),
            subscriber,
            watched: Mutex::new(HashMap::new()),
            sink: tokio::sync::Mutex::new(None),
            dropped: AtomicU64::new(0),
            order: tokio::sync::RwLock::new(()),
            changes: Changes::new(prefix),
            swept: Mutex::new(Instant::now()),
            sweep_scheduled: AtomicBool::new(false),
            connect_timeout,
        }
    }

    /// This store's waiter id.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The keys this process observes for a change of holder.
    pub(crate) fn changes(&self) -> &Changes {
        &self.changes
    }

    /// Whether this store has a way to subscribe at all.
    pub(crate) fn can_subscribe(&self) -> bool {
        !matches!(self.subscriber, Subscriber::None)
    }

    /// How many subscriber connections have dropped so far: a subscription sent while this
    /// moved may have gone with the connection.
    pub(crate) fn drops(&self) -> u64 {
        self.dropped.load(Ordering::SeqCst)
    }

    /// The base of a lock's channels (the scripts' `KEYS` argument): each process listens on
    /// `<base>:<store id>`, where the scripts tell it that it is next in line.
    pub(crate) fn channel(&self, lock_key: &str) -> String {
        [self.channel_prefix.as_str(), lock_key].concat()
    }

    /// The channel this process hears a lock's turns on.
    fn own_channel(&self, lock_key: &str) -> String {
        format!("{}{lock_key}:{}", self.channel_prefix, self.id)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Watched>> {
        self.watched.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The lock key of this process's own channel for it.
    fn lock_key_of_channel<'a>(&self, channel: &'a str) -> Option<&'a str> {
        channel
            .strip_prefix(&self.channel_prefix)
            .and_then(|rest| rest.strip_suffix(self.id.as_str()))
            .and_then(|rest| rest.strip_suffix(':'))
    }

    /// A release was announced on `channel` (this process's own for a lock), naming the next
    /// entry in line.
    fn deliver(&self, channel: &str, next: Option<String>) {
        if self.changes.deliver(channel) {
            return; // a change of holder, for readers
        }
        let Some(lock_key) = self.lock_key_of_channel(channel) else {
            return;
        };
        let Some(next) = next else {
            return;
        };
        let Some(rest) = next.strip_prefix(self.id.as_str()) else {
            return; // another process's turn
        };
        let mut map = self.lock();
        let Some(watched) = map.get_mut(lock_key) else {
            return;
        };
        if rest.is_empty() {
            watched.turn_given = true;
            if watched.watchers.is_empty() {
                // Nobody here waits: a place kept after a grant goes now, telling the next in
                // line (it would otherwise hold the line up). Under the map's lock, so a wait
                // starting now either finds the place gone or is woken.
                watched.give_up_parked(&self.id);
                return;
            }
            // The process's turn: every waiter of this process on the key. Which one asks is
            // local competition's call (the head of its line; the others wait in memory and
            // ignore this). Picking one here could pick a task that is not listening, and the
            // turn would be lost.
            watched.wake_all();
        } else if let Some(watcher) = watched.watchers.values().find(|w| w.entry == next) {
            // Strict FIFO: the one waiting call named (its own watch, so nobody else wakes).
            watcher.notify.notify_waiters();
        }
    }
}
