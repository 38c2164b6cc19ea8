//! Change notifications for readers of who holds a lock (an election's observers), the way etcd's
//! own `concurrency.Election.Observe` follows a leader: one etcd watch per lock and process.
//!
//! # What is watched
//! The key range `[<lock>, <lock>#holder$)` — the exclusive record and every reader or permit
//! holder key (`<lock>#holder#…`), and nothing of the line: waiter keys (`#waiter#`) and writers'
//! markers (`#writer#`) sort after `#holder#`, so queue movements never reach the stream. The
//! range may also hold keys of other locks whose names extend this one's with a byte below `#`;
//! their events are dropped here (see [`is_holder_change`]).
//!
//! An event wakes the observers when the holder changes:
//! - a put that creates a hold key (version 1): a grant — a hold is only ever written where none
//!   was, so a put of an existing key is the holder moving its hold to a new lease (an extend to
//!   another TTL) and changes nobody; a renewal for the same TTL is a lease keep-alive and no
//!   event at all;
//! - every delete: a release, a lease revoke, and a lease that expired (etcd deletes the keys on
//!   it, with an event).
//!
//! # What it costs
//! One watch stream per lock and process, shared by every [`ChangeWatch`] of the process on that
//! lock and cancelled when the last one is dropped. It writes nothing: no waiter key, no lease,
//! so an observer never stands in anyone's way.
//!
//! # Failures
//! The stream runs on one member. When it breaks (the member died, lost its leader, or was found
//! failing by any request of this store) it is opened again on a live member from the revision
//! after the last one it saw, so etcd replays what happened in the gap and no change is missed;
//! only when etcd cannot replay it (compacted away) are the observers woken once the new watch
//! is up, to read again. A watch that cannot be created within the store's connect and response
//! timeouts gives [`ChangeWatch::none`]: the observer polls instead.

use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{EventType, WatchOptions, WatchResponse};
use leasehold_core::{ChangeWatch, NotifyRegistry};
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::config::EtcdConfig;
use crate::layout::{holder_prefix, prefix_end};
use crate::members::Members;
use crate::resumable_watch::{self, Follower};

/// The change watches of one store: one etcd watch per observed lock.
pub(crate) struct Changes {
    /// The cluster's members: the watch streams open on one that answers.
    members: Arc<Members>,
    /// How long a new watch may take to be confirmed before the caller gets a dead one.
    watch_timeout: Duration,
    /// Observed locks by record key (`<prefix><lock key>`), each with the wake-up its watches
    /// share.
    observed: NotifyRegistry<Observed>,
}

/// One lock some reader of this process observes: its watch stream.
#[derive(Debug)]
struct Observed {
    /// Becomes `true` once etcd confirmed the watch (and stays so across re-creations: those
    /// resume where the stream broke).
    created: watch::Receiver<bool>,
    /// The task reading the watch stream: aborting it drops the stream, which cancels the watch.
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changes")
            .field("observed", &self.observed.len())
            .finish()
    }
}

impl Changes {
    /// No lock observed yet; watches will open on `members`, within `config`'s timeouts.
    pub(crate) fn new(config: &EtcdConfig, members: Arc<Members>) -> Self {
        Changes {
            members,
            watch_timeout: config.connect_timeout + config.response_timeout,
            observed: NotifyRegistry::new(),
        }
    }

    /// Registers a reader of the holder of the lock whose record key is `lock_key`. The first
    /// registration of the process opens the watch; each one returns once etcd confirmed it, so a
    /// change after this returns is not missed. A watch not confirmed in time gives
    /// [`ChangeWatch::none`].
    ///
    /// Cancel safe: a caller that stops waiting gives its registration back.
    pub(crate) async fn watch(self: &Arc<Self>, lock_key: String) -> ChangeWatch {
        let (notify, mut created) = self.observed.register(
            &lock_key,
            |notify| {
                let (confirm, created) = watch::channel(false);
                let task = tokio::spawn(follow(
                    self.members.clone(),
                    lock_key.clone(),
                    notify.clone(),
                    confirm,
                ));
                Observed { created, task }
            },
            |observed, _| observed.created.clone(),
        );
        // Counted before the wait, so that the last other watch dropped meanwhile does not
        // cancel the stream this caller is waiting for; given back on every way out.
        let registration = Registration {
            changes: self.clone(),
            lock_key,
        };
        let confirmed = tokio::time::timeout(self.watch_timeout, created.wait_for(|up| *up)).await;
        if !matches!(confirmed, Ok(Ok(_))) {
            tracing::debug!(key = %registration.lock_key,
                "the change watch was not confirmed in time; the observer polls instead");
            return ChangeWatch::none();
        }
        ChangeWatch::new(notify, move || drop(registration))
    }

    /// One registration on `lock_key` is gone; the last one cancels the watch.
    fn unwatch(&self, lock_key: &str) {
        if let Some(observed) = self.observed.unregister(lock_key) {
            observed.task.abort(); // dropping the stream cancels the watch in etcd
        }
    }
}

impl Drop for Changes {
    fn drop(&mut self) {
        // Every registration holds the `Changes`, so none is left by now; this only guards
        // against a stream outliving its store.
        self.observed
            .for_each(|_, observed, _| observed.task.abort());
    }
}

/// One reader's share of a lock's watch, given back when dropped.
struct Registration {
    changes: Arc<Changes>,
    lock_key: String,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.changes.unwatch(&self.lock_key);
    }
}

/// Whether an event on `key` (of `kind`, leaving the key at `version`) changes who holds the lock
/// whose record key is `lock_key`: a hold key of this lock created (a grant) or deleted (a
/// release, a revoke, an expiry). A put of an existing hold key is its holder moving it to another
/// lease; a key of another lock (in the watched range by the ordering of names) concerns nobody.
fn is_holder_change(lock_key: &str, key: &[u8], kind: EventType, version: i64) -> bool {
    let hold = key == lock_key.as_bytes() || key.starts_with(holder_prefix(lock_key).as_bytes());
    hold && match kind {
        EventType::Put => version == 1,
        EventType::Delete => true,
    }
}

/// Reads one lock's watch stream (the record and its holder keys), waking the observers on every
/// change of holder (see [`is_holder_change`]); tells the first registrations once etcd confirmed
/// the watch. Runs until aborted (the last registration gone). A watch opened again after a gap
/// etcd could not replay wakes the observers once, to read again (see [`resumable_watch`]).
async fn follow(
    members: Arc<Members>,
    lock_key: String,
    notify: Arc<Notify>,
    confirm: watch::Sender<bool>,
) {
    let end = prefix_end(&holder_prefix(&lock_key));
    let options = WatchOptions::new().with_range(end);
    let mut observers = Observers {
        lock_key: lock_key.clone(),
        notify,
        confirm,
    };
    resumable_watch::follow(&members, &lock_key, options, "change watch", &mut observers).await;
}

/// The observers of one lock, as its watch loop sees them.
struct Observers {
    lock_key: String,
    notify: Arc<Notify>,
    confirm: watch::Sender<bool>,
}

impl Follower for Observers {
    fn confirmed(&mut self, missed: bool) -> ControlFlow<()> {
        self.confirm.send_replace(true);
        if missed {
            self.notify.notify_waiters();
        }
        ControlFlow::Continue(())
    }

    fn events(&mut self, response: &WatchResponse, _at: i64) -> ControlFlow<()> {
        let changed = response.events().iter().any(|event| {
            event.kv().is_some_and(|kv| {
                is_holder_change(&self.lock_key, kv.key(), event.event_type(), kv.version())
            })
        });
        if changed {
            self.notify.notify_waiters();
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{holder_key, waiter_prefix, writer_key};
    use leasehold_core::LockMode;

    #[test]
    fn only_grants_and_deletions_of_this_locks_holds_are_changes() {
        let lock = "leasehold:XDC#c#e";
        let reader = holder_key(lock, LockMode::Shared, "t");
        let permit = holder_key(lock, LockMode::semaphore(3).unwrap(), "t");
        for hold in [lock, reader.as_str(), permit.as_str()] {
            let hold = hold.as_bytes();
            assert!(is_holder_change(lock, hold, EventType::Put, 1), "a grant");
            assert!(
                is_holder_change(lock, hold, EventType::Delete, 0),
                "a release"
            );
            assert!(
                !is_holder_change(lock, hold, EventType::Put, 2),
                "an extend moving the hold to another lease"
            );
        }
        let waiter = format!("{}1f", waiter_prefix(lock));
        let writer = writer_key(lock, "store");
        for other in [waiter.as_str(), writer.as_str(), "leasehold:XDC#c#e!x"] {
            assert!(!is_holder_change(lock, other.as_bytes(), EventType::Put, 1));
            assert!(!is_holder_change(
                lock,
                other.as_bytes(),
                EventType::Delete,
                0
            ));
        }
    }

    #[test]
    fn the_watched_range_leaves_out_the_line_and_the_writers() {
        let lock = "leasehold:XDC#c#e";
        let end = prefix_end(&holder_prefix(lock));
        let inside = |key: &str| key.as_bytes() >= lock.as_bytes() && key.as_bytes() < &end[..];
        assert!(inside(lock));
        assert!(inside(&holder_key(lock, LockMode::Shared, "t")));
        assert!(inside(&holder_key(
            lock,
            LockMode::semaphore(30).unwrap(),
            "t"
        )));
        assert!(!inside(&format!("{}1f", waiter_prefix(lock))));
        assert!(!inside(&writer_key(lock, "store")));
        assert!(!inside("leasehold:XDC#c#e2"), "a lock named after this one");
    }
}
