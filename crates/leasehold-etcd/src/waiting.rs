//! Waiting across processes, the etcd way: a waiter key per process in each lock's line, and one
//! watch stream per watched lock.
//!
//! A process whose blocking attempt failed puts `<lock key>#waiter#<lease id>` on its waiter
//! lease (one lease per store, kept alive in the background), in the failed transaction itself:
//! the key's create revision is its place in line, as in etcd's own `concurrency.Mutex`. Its next
//! attempts first read (no write) whether the record is gone and it is first in line; only then
//! do they grant a lease and send the transaction, which takes the lock only if the record is
//! still absent and no waiter key in the line is older than its own (a range compare).
//!
//! A watch on the lock's key prefix (delete events only) wakes the waiters of the process when a
//! deletion concerns it: the last waiter ahead of it left, or a hold went while it is first in
//! line (see [`crate::ahead`]: only the process whose turn it may be wakes). A wake-up is a hint:
//! the waiter always asks etcd again, and a lost one costs a poll interval.
//!
//! A process in line keeps the lease its refused attempt granted (a *spare*), so that when its
//! turn comes the hand-over costs one transaction and not a lease grant too: each is a Raft write
//! with an fsync. A spare is used only while young (a tenth of its TTL), and the lease it gives
//! counts its TTL from the grant, so it never claims longer than etcd keeps it.

use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use etcd_client::{EventType, WatchFilterType, WatchOptions, WatchResponse};
use leasehold_core::{NotifyRegistry, OwnerToken, ReleaseWatch};
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::ahead::{Ahead, Learned};
use crate::config::{lease_seconds, EtcdConfig};
use crate::layout::waiter_prefix;
use crate::members::{Members, Retry};
use crate::resumable_watch::{self, revision_of, Follower};
use crate::waiter_lease::WaiterLease;

/// This process's place in one lock's line: its waiter key and that key's create revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) key: String,
    pub(crate) revision: i64,
}

/// One lock some task of this process waits on (its live watches, blocking `lock()` calls in
/// this process, are counted by the registry).
#[derive(Debug, Default)]
struct Watched {
    /// Our waiter key, once a blocking attempt put it.
    place: Option<Place>,
    /// Our waiter key, when an attempt that may have put it ended in doubt (no place known):
    /// taken out of the line with the last waiter, as a known place is.
    unconfirmed: Option<String>,
    /// Who is ahead of `place`: which deletions wake this process.
    ahead: Ahead,
    /// A lease a refused attempt granted, kept for the next attempt.
    spare: Option<Spare>,
    /// The task reading the watch stream.
    task: Option<JoinHandle<()>>,
}

/// A lease granted for an attempt that was refused, kept for this process's next attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Spare {
    /// The lease.
    pub(crate) id: i64,
    /// Its TTL in whole seconds, as granted.
    pub(crate) seconds: i64,
    /// When its grant was sent: the lease's TTL counts from about then.
    pub(crate) granted_at: Instant,
}

/// This store's waiting state.
pub(crate) struct Waiting {
    /// The value of this store's waiter keys: host/pid/uuid, for people reading the line.
    id: String,
    /// The cluster's members: requests and streams go to one that answers.
    members: Arc<Members>,
    waiter_ttl: i64,
    watch_timeout: Duration,
    /// The locks this process waits on, each with the wake-up its watches share.
    watched: NotifyRegistry<Watched>,
    session: tokio::sync::Mutex<Option<WaiterLease>>,
    /// Set by `close`: a spare handed in after it is revoked, not kept.
    closed: AtomicBool,
    /// A waiter lease etcd said is gone (it refused a put on it) before its keeper noticed: the
    /// next place is taken on a new one.
    session_gone: AtomicI64,
}

impl std::fmt::Debug for Waiting {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Waiting")
            .field("id", &self.id)
            .field("watched", &self.watched.len())
            .finish()
    }
}

impl Waiting {
    pub(crate) fn new(config: &EtcdConfig, members: Arc<Members>) -> Self {
        Waiting {
            id: OwnerToken::generate().as_str().to_owned(),
            members,
            waiter_ttl: lease_seconds(config.waiter_timeout).unwrap_or(5),
            watch_timeout: config.connect_timeout + config.response_timeout,
            watched: NotifyRegistry::new(),
            session: tokio::sync::Mutex::new(None),
            closed: AtomicBool::new(false),
            session_gone: AtomicI64::new(0),
        }
    }

    /// Registers a waiter on `lock_key`; the first one of the process opens the watch (confirmed
    /// by etcd before this returns, so no release after it is missed).
    pub(crate) async fn watch(self: &Arc<Self>, lock_key: String) -> ReleaseWatch {
        let (notify, created) = self.watched.register(
            &lock_key,
            |_| Watched::default(),
            |entry, notify| {
                if entry.task.is_some() {
                    return None;
                }
                let (tx, rx) = tokio::sync::oneshot::channel();
                entry.task = Some(tokio::spawn(watch_loop(
                    Arc::downgrade(self),
                    self.members.clone(),
                    lock_key.clone(),
                    notify.clone(),
                    tx,
                )));
                Some(rx)
            },
        );
        // Undone by the watch's drop from here on: a caller that stops waiting before etcd
        // confirms (its deadline came, or it was cancelled) leaves nothing registered.
        let watch = {
            let (waiting, key) = (self.clone(), lock_key.clone());
            ReleaseWatch::new(notify, move || waiting.unwatch(&key))
        };
        if let Some(created) = created {
            if tokio::time::timeout(self.watch_timeout, created)
                .await
                .is_err()
            {
                tracing::debug!(key = %lock_key,
                    "the watch was not confirmed in time; waiting by polling until it is");
            }
        }
        watch
    }

    fn unwatch(self: &Arc<Self>, lock_key: &str) {
        let Some(entry) = self.watched.unregister(lock_key) else {
            return;
        };
        if let Some(task) = entry.task {
            task.abort(); // dropping the stream cancels the watch
        }
        if let Some(spare) = entry.spare {
            self.members.revoke_lease_later(spare.id);
        }
        // The last waiter of this process is gone: leave the line, so the next process need not
        // wait for the waiter lease to lapse (the process's waiter lease outlives its waits).
        if let Some(key) = entry.place.map(|place| place.key).or(entry.unconfirmed) {
            self.remove_key_later(key);
        }
    }

    /// Keeps `spare` for the next attempt on `lock_key` while a task of this process waits on it
    /// (of two, the younger: it has more of its TTL left); the one not kept is revoked, as is
    /// every spare handed in after the store closed.
    pub(crate) fn keep_spare(&self, lock_key: &str, spare: Spare) {
        // `closed` is read under the registry's lock, as `close` collects the spares under it:
        // a spare is either collected there or refused here.
        let unused = self
            .watched
            .with(lock_key, |entry| {
                if self.closed.load(Ordering::SeqCst) {
                    return Some(spare);
                }
                match entry.spare {
                    Some(kept) if kept.granted_at >= spare.granted_at => Some(spare),
                    _ => entry.spare.replace(spare),
                }
            })
            .unwrap_or(Some(spare));
        if let Some(unused) = unused {
            self.members.revoke_lease_later(unused.id);
        }
    }

    /// The spare lease kept for `lock_key`, if it has `seconds` of TTL and is younger than
    /// `max_age`; one that is not is revoked.
    pub(crate) fn take_spare(
        &self,
        lock_key: &str,
        seconds: i64,
        max_age: Duration,
    ) -> Option<Spare> {
        let spare = self.watched.with(lock_key, |entry| entry.spare.take())??;
        if spare.seconds == seconds && spare.granted_at.elapsed() <= max_age {
            return Some(spare);
        }
        self.members.revoke_lease_later(spare.id);
        None
    }

    fn remove_key_later(&self, key: String) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the key lapses with the waiter lease
        };
        let members = self.members.clone();
        leasehold_core::spawn_undo(&runtime, async move {
            // Deleting our own waiter key twice deletes nothing the second time.
            let deleted = members
                .run(Retry::Safe, |client| {
                    let (key, mut kv) = (key.clone(), client.kv_client());
                    async move { kv.delete(key, None).await }
                })
                .await;
            if let Err(error) = deleted.map_err(|failed| failed.error) {
                tracing::debug!(%key, %error,
                    "could not leave the waiter line; the place lapses with the waiter lease");
            }
        });
    }

    /// Whether a task of this process watches `lock_key` (only then may a blocking attempt join
    /// the line: the last watch to go takes the process out of it again).
    pub(crate) fn is_watched(&self, lock_key: &str) -> bool {
        self.watched.contains(lock_key)
    }

    /// This process's place in `lock_key`'s line, if it has one.
    pub(crate) fn current_place(&self, lock_key: &str) -> Option<Place> {
        self.watched
            .with(lock_key, |entry| entry.place.clone())
            .flatten()
    }

    /// The waiter key this store puts in `lock_key`'s line on waiter lease `session`.
    pub(crate) fn waiter_key(lock_key: &str, session: i64) -> String {
        format!("{}{session:x}", waiter_prefix(lock_key))
    }

    /// The value of this store's waiter keys.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// Records the place a failed attempt took in `lock_key`'s line; if nobody of this process
    /// waits any more, takes the key out of the line again.
    pub(crate) fn set_place(&self, lock_key: &str, place: Place) {
        let unwatched = self.watched.with(lock_key, |entry| {
            if entry.place.as_ref() != Some(&place) {
                entry.ahead.forget();
            }
            entry.place = Some(place.clone());
            entry.unconfirmed = None;
        });
        if unwatched.is_none() {
            self.remove_key_later(place.key);
        }
    }

    /// An attempt that would have put waiter key `key` in `lock_key`'s line ended in doubt: the
    /// key may be there with no place on record. It is taken out with the last waiter (at once
    /// if nobody of this process waits any more), unless a later attempt records its place.
    pub(crate) fn maybe_joined(&self, lock_key: &str, key: String) {
        let unwatched = self.watched.with(lock_key, |entry| {
            entry.unconfirmed = Some(key.clone());
        });
        if unwatched.is_none() {
            self.remove_key_later(key);
        }
    }

    /// Forgets `place` (taken the lock, or lost the place): the next blocking attempt queues again.
    pub(crate) fn forget(&self, lock_key: &str, place: &Place) {
        self.watched.with(lock_key, |entry| {
            if entry.place.as_ref() == Some(place) {
                entry.place = None;
                entry.ahead.forget();
            }
        });
    }

    /// A read of `lock_key`'s line at revision `read_at` found `keys` ahead of `place`: what that
    /// says once the deletions seen since are applied (`None` if the place changed meanwhile).
    pub(crate) fn learn_ahead(
        &self,
        lock_key: &str,
        place: &Place,
        keys: impl IntoIterator<Item = Vec<u8>>,
        read_at: i64,
    ) -> Option<Learned> {
        self.watched
            .with(lock_key, |entry| {
                (entry.place.as_ref() == Some(place)).then(|| entry.ahead.learn(keys, read_at))
            })
            .flatten()
    }

    /// Whether the watch alone says it is `place`'s turn on `lock_key` (see [`Ahead::take_turn`]).
    pub(crate) fn take_turn(&self, lock_key: &str, place: &Place) -> bool {
        self.watched
            .with(lock_key, |entry| {
                entry.place.as_ref() == Some(place) && entry.ahead.take_turn()
            })
            .unwrap_or(false)
    }

    /// The watch may have missed deletions of `lock_key` (it could not be resumed where it broke):
    /// nothing is known about who is ahead until the line is read again.
    fn line_unknown(&self, lock_key: &str) {
        self.watched.with(lock_key, |entry| entry.ahead.forget());
    }

    /// The watch saw `key` deleted at `revision`: whether this process's waiters should wake.
    /// Our own waiter key never wakes them.
    fn deleted(&self, lock_key: &str, key: &[u8], revision: i64) -> bool {
        // The watch's prefix is the record key, so it also sees locks whose names start with
        // this one's (`…#line2` under `…#line`): none of their deletions concerns this lock.
        let ours = key == lock_key.as_bytes()
            || key
                .strip_prefix(lock_key.as_bytes())
                .is_some_and(|rest| rest.starts_with(b"#"));
        if !ours {
            return false;
        }
        let waiter = key.starts_with(waiter_prefix(lock_key).as_bytes());
        self.watched
            .with(lock_key, |entry| {
                let own = entry
                    .place
                    .as_ref()
                    .is_some_and(|p| p.key.as_bytes() == key);
                !own && entry.ahead.deleted(key, revision, waiter)
            })
            .unwrap_or(false)
    }

    /// Waiter lease `id` is gone (etcd said so): the next place is taken on a new one.
    pub(crate) fn session_lost(&self, id: i64) {
        self.session_gone.store(id, Ordering::SeqCst);
    }

    /// The waiter lease, granted (and kept alive in the background) when first needed or after it
    /// was lost.
    pub(crate) async fn session(&self) -> Result<i64, etcd_client::Error> {
        let mut session = self.session.lock().await;
        if let Some(current) = &*session {
            if current.is_alive() && current.id() != self.session_gone.load(Ordering::SeqCst) {
                return Ok(current.id());
            }
        }
        let lease = WaiterLease::grant(self.members.clone(), self.waiter_ttl).await?;
        let id = lease.id();
        if let Some(old) = session.replace(lease) {
            old.stop();
        }
        Ok(id)
    }

    /// Revokes the waiter lease: every waiter key of this store leaves its line.
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        let mut spares: Vec<i64> = Vec::new();
        self.watched.for_each(|_, entry, _| {
            spares.extend(entry.spare.take().map(|spare| spare.id));
        });
        for id in spares {
            if let Err(failed) = self.members.revoke_lease(id).await {
                tracing::debug!(lease = id, at = %failed.at, error = %failed.error,
                    "could not revoke a spare lease; it lapses at its TTL");
            }
        }
        let Some(session) = self.session.lock().await.take() else {
            return;
        };
        session.stop();
        if let Err(failed) = self.members.revoke_lease(session.id()).await {
            tracing::debug!(at = %failed.at, error = %failed.error,
                "could not revoke the waiter lease; it lapses at its TTL");
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if let Ok(session) = self.session.try_lock() {
            if let Some(session) = &*session {
                session.stop();
            }
        }
        self.watched.for_each(|_, entry, _| {
            if let Some(task) = &entry.task {
                task.abort();
            }
        });
    }
}

/// Reads one lock's watch stream (deletes under the lock's key prefix), waking the waiters of the
/// process on a deletion that concerns it (see [`Waiting::deleted`]). Waking everyone when the
/// stream breaks would only send them to ask while the connection is down: the watch resumes
/// where it was (see [`resumable_watch`]), and only when etcd cannot replay the gap is what the
/// process knows of its line reset, and its waiters woken once the new watch is confirmed, to
/// read the line again.
async fn watch_loop(
    waiting: Weak<Waiting>,
    members: Arc<Members>,
    lock_key: String,
    notify: Arc<Notify>,
    created: tokio::sync::oneshot::Sender<()>,
) {
    let options = WatchOptions::new()
        .with_prefix()
        .with_filters([WatchFilterType::NoPut]);
    let mut waiters = Waiters {
        waiting,
        lock_key: lock_key.clone(),
        notify,
        created: Some(created),
    };
    resumable_watch::follow(&members, &lock_key, options, "watch", &mut waiters).await;
}

/// The waiters of this process on one lock, as its watch loop sees them.
struct Waiters {
    waiting: Weak<Waiting>,
    lock_key: String,
    notify: Arc<Notify>,
    /// Told once, when etcd first confirms the watch.
    created: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Follower for Waiters {
    fn confirmed(&mut self, missed: bool) -> ControlFlow<()> {
        let Some(waiting) = self.waiting.upgrade() else {
            return ControlFlow::Break(());
        };
        if let Some(created) = self.created.take() {
            let _ = created.send(());
        }
        if missed {
            waiting.line_unknown(&self.lock_key);
            self.notify.notify_waiters();
        }
        ControlFlow::Continue(())
    }

    fn events(&mut self, response: &WatchResponse, at: i64) -> ControlFlow<()> {
        let Some(waiting) = self.waiting.upgrade() else {
            return ControlFlow::Break(());
        };
        // Every event updates what the process knows of its line, so no `any`.
        let mut wake = false;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            if event.event_type() == EventType::Delete {
                wake |= waiting.deleted(&self.lock_key, kv.key(), revision_of(kv, at));
            }
        }
        if wake {
            // Every waiter of this process: local competition decides which one asks (the head
            // of its line); one picked here might not be listening.
            self.notify.notify_waiters();
        }
        ControlFlow::Continue(())
    }

    fn goes_on(&self) -> bool {
        self.waiting.strong_count() > 0
    }
}
