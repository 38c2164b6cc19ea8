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

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use leasehold_core::ChangeWatch;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use crate::config::EtcdConfig;
use crate::layout::{holder_prefix, prefix_end};
use crate::members::{Members, Retry};
use crate::waiting::REWATCH_DELAY;

/// The change watches of one store: one etcd watch per observed lock.
pub(crate) struct Changes {
    /// The cluster's members: the watch streams open on one that answers.
    members: Arc<Members>,
    /// How long a new watch may take to be confirmed before the caller gets a dead one.
    watch_timeout: Duration,
    /// Observed locks by record key (`<prefix><lock key>`).
    observed: Mutex<HashMap<String, Observed>>,
}

/// One lock some reader of this process observes.
#[derive(Debug)]
struct Observed {
    /// Fired on every change of holder; shared by every [`ChangeWatch`] on the lock.
    notify: Arc<Notify>,
    /// Live registrations (change watches, and callers still waiting for the confirmation).
    watchers: usize,
    /// Becomes `true` once etcd confirmed the watch (and stays so across re-creations: those
    /// resume where the stream broke).
    created: watch::Receiver<bool>,
    /// The task reading the watch stream: aborting it drops the stream, which cancels the watch.
    task: JoinHandle<()>,
}

impl std::fmt::Debug for Changes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Changes")
            .field("observed", &self.lock().len())
            .finish()
    }
}

impl Changes {
    /// No lock observed yet; watches will open on `members`, within `config`'s timeouts.
    pub(crate) fn new(config: &EtcdConfig, members: Arc<Members>) -> Self {
        Changes {
            members,
            watch_timeout: config.connect_timeout + config.response_timeout,
            observed: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Observed>> {
        self.observed.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a reader of the holder of the lock whose record key is `lock_key`. The first
    /// registration of the process opens the watch; each one returns once etcd confirmed it, so a
    /// change after this returns is not missed. A watch not confirmed in time gives
    /// [`ChangeWatch::none`].
    ///
    /// Cancel safe: a caller that stops waiting gives its registration back.
    pub(crate) async fn watch(self: &Arc<Self>, lock_key: String) -> ChangeWatch {
        let (notify, mut created) = {
            let mut observed = self.lock();
            let entry = observed.entry(lock_key.clone()).or_insert_with(|| {
                let notify = Arc::new(Notify::new());
                let (confirm, created) = watch::channel(false);
                let task = tokio::spawn(follow(
                    self.members.clone(),
                    lock_key.clone(),
                    notify.clone(),
                    confirm,
                ));
                Observed {
                    notify,
                    watchers: 0,
                    created,
                    task,
                }
            });
            entry.watchers += 1;
            (entry.notify.clone(), entry.created.clone())
        };
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
        let mut observed = self.lock();
        let Some(entry) = observed.get_mut(lock_key) else {
            return;
        };
        entry.watchers = entry.watchers.saturating_sub(1);
        if entry.watchers > 0 {
            return;
        }
        if let Some(entry) = observed.remove(lock_key) {
            entry.task.abort(); // dropping the stream cancels the watch in etcd
        }
    }
}

impl Drop for Changes {
    fn drop(&mut self) {
        // Every registration holds the `Changes`, so none is left by now; this only guards
        // against a stream outliving its store.
        for observed in self.lock().values() {
            observed.task.abort();
        }
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
/// the watch. Runs until aborted (the last registration gone).
///
/// After the stream breaks it watches again, on a live member, from the revision after the last
/// one it saw, so etcd replays the changes of the gap; when it cannot (the gap was compacted, or
/// no watch ever came up) the observers are woken once the new watch is confirmed, to read again.
async fn follow(
    members: Arc<Members>,
    lock_key: String,
    notify: Arc<Notify>,
    confirm: watch::Sender<bool>,
) {
    let end = prefix_end(&holder_prefix(&lock_key));
    // The revision to watch from after a break: one past the last this watch has seen.
    let mut resume: Option<i64> = None;
    // Changes may have been missed: wake the observers once a watch is confirmed again.
    let mut missed = false;
    loop {
        let mut options = WatchOptions::new().with_range(end.clone());
        if let Some(from) = resume {
            options = options.with_start_revision(from);
        }
        let opened = members
            .run_at(Retry::Safe, |mut client| {
                let (key, options) = (lock_key.clone(), options.clone());
                async move { client.watch(key, Some(options)).await }
            })
            .await;
        match opened {
            Ok((mut stream, member)) => {
                let mut failures = members.failures();
                loop {
                    // A member found failing by any request of this store takes the watch down
                    // with it: the watch resumes on another member.
                    let next = tokio::select! {
                        next = stream.message() => next,
                        changed = failures.changed() => {
                            if changed.is_ok() && !members.is_suspect(member) {
                                continue;
                            }
                            tracing::debug!(key = %lock_key, member = members.name(member),
                                "the member under this change watch failed; watching on another");
                            break;
                        }
                    };
                    let response = match next {
                        Ok(Some(response)) => response,
                        Ok(None) => break,
                        Err(error) => {
                            // The stream broke under us: its member goes last for a while, so
                            // the watch is not opened on it again at once.
                            members.failed_by(member, &error);
                            tracing::debug!(key = %lock_key, member = members.name(member),
                                %error, "the change watch broke; watching again");
                            break;
                        }
                    };
                    if response.canceled() {
                        if response.compact_revision() > 0 {
                            // The replay's start was compacted: what happened since is gone.
                            resume = None;
                            missed = true;
                        }
                        break;
                    }
                    if response.created() {
                        confirm.send_replace(true);
                        if resume.is_none() {
                            // A fresh watch sees what happens after the revision it was made at.
                            resume = response.header().map(|h| h.revision() + 1);
                        }
                        if std::mem::take(&mut missed) {
                            notify.notify_waiters();
                        }
                    }
                    let at = response.header().map_or(0, |h| h.revision());
                    let mut changed = false;
                    for event in response.events() {
                        let Some(kv) = event.kv() else { continue };
                        let revision = if kv.mod_revision() > 0 {
                            kv.mod_revision()
                        } else {
                            at
                        };
                        // From events, not the header: a catching-up response's header may be
                        // ahead of the events it carries.
                        resume = Some(resume.map_or(revision + 1, |r| r.max(revision + 1)));
                        changed |=
                            is_holder_change(&lock_key, kv.key(), event.event_type(), kv.version());
                    }
                    if changed {
                        notify.notify_waiters();
                    }
                }
            }
            Err(failed) => {
                tracing::debug!(key = %lock_key, at = %failed.at, error = %failed.error,
                    "could not watch for changes of holder; retrying");
            }
        }
        if resume.is_none() {
            missed = true;
        }
        tokio::time::sleep(REWATCH_DELAY).await;
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
