//! The store trait: what a backend must do to hold leases.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::acquire::{Acquire, HolderId};
use crate::attempt::Attempt;
use crate::change_watch::ChangeWatch;
use crate::error::{Error, Result};
use crate::history::{HistoryEntry, TraceConfig};
use crate::key::LockKey;
use crate::lease::{Lease, LockInfo};
use crate::watch::ReleaseWatch;

/// What a store can do beyond the required operations, so layers and tests can ask instead of
/// guessing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// Every acquisition returns a fencing token strictly greater than every earlier one for the
    /// same key (see [`Lease::fencing_token`]).
    pub fencing: bool,
    /// [`LockStore::list`] is implemented.
    pub listing: bool,
    /// [`LockStore::watch`] delivers release notifications (waiters need not poll).
    pub notifications: bool,
    /// [`LockMode::Shared`](crate::LockMode::Shared) and
    /// [`LockMode::Semaphore`](crate::LockMode::Semaphore) holds are supported; without it a
    /// store answers them with [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    pub shared_modes: bool,
    /// The lock history is kept: traced operations ([`Acquire::trace`]) append to it and
    /// [`LockStore::history`] reads it.
    pub history: bool,
    /// The store keeps one place in its waiter line per waiting acquisition
    /// ([`Acquire::waiter`]), not per process: it grants in the fleet-wide order of arrival
    /// (strict FIFO). Local competition then lets every blocking waiter take its own place in the
    /// store instead of queueing it behind the process's head.
    pub waiter_line: bool,
}

impl Capabilities {
    /// No optional capability.
    pub const NONE: Capabilities = Capabilities {
        fencing: false,
        listing: false,
        notifications: false,
        shared_modes: false,
        history: false,
        waiter_line: false,
    };

    /// Fencing, listing, notifications, shared modes and history (not `waiter_line`, a choice
    /// of order rather than a feature).
    pub const ALL: Capabilities = Capabilities {
        fencing: true,
        listing: true,
        notifications: true,
        shared_modes: true,
        history: true,
        waiter_line: false,
    };

    /// Sets `fencing`.
    pub const fn with_fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// Sets `listing`.
    pub const fn with_listing(mut self, listing: bool) -> Self {
        self.listing = listing;
        self
    }

    /// Sets `shared_modes`.
    pub const fn with_shared_modes(mut self, shared_modes: bool) -> Self {
        self.shared_modes = shared_modes;
        self
    }

    /// Sets `history`.
    pub const fn with_history(mut self, history: bool) -> Self {
        self.history = history;
        self
    }

    /// Sets `waiter_line`.
    pub const fn with_waiter_line(mut self, waiter_line: bool) -> Self {
        self.waiter_line = waiter_line;
        self
    }

    /// Sets `notifications`.
    pub const fn with_notifications(mut self, notifications: bool) -> Self {
        self.notifications = notifications;
        self
    }
}

/// A shared store of lease records: the contract every leasehold backend (and every layer, which
/// wraps a store and is one) keeps.
///
/// # Behavior
/// - Operations validate nothing about keys or TTLs beyond what the store itself requires: the
///   manager validates input before any store I/O. A store may reject what it cannot represent
///   (for example a TTL under the store's granularity) with [`ErrorKind::InvalidArgument`]. Every
///   store rejects a zero TTL or one above [`MAX_TTL`](crate::MAX_TTL) with
///   [`ErrorKind::InvalidArgument`] before any I/O ([`validate_ttl`](crate::validate_ttl)): some
///   stores read 0 as "never expire", which must never happen by accident.
/// - A store never reports a lock as held when it is not: when the outcome of a write is unknown,
///   it returns [`ErrorKind::InDoubt`], never a grant and never a refusal.
/// - Expired records are absent for every operation.
///
/// # Cancel safety
/// Every method must be cancel safe in this sense: dropping the future before it completes must
/// not leave a lock held under a token nobody knows. A network store does its I/O in a spawned
/// task (or otherwise completes and undoes it) so that a cancelled `acquire` whose write lands
/// later is released again.
///
/// [`ErrorKind::InvalidArgument`]: crate::ErrorKind::InvalidArgument
/// [`ErrorKind::InDoubt`]: crate::ErrorKind::InDoubt
pub trait LockStore: Send + Sync + 'static {
    /// A short name for logs, metrics and error messages: `memory`, `redis`, `aerospike`.
    fn name(&self) -> &'static str;

    /// What this store can do beyond the required operations.
    fn capabilities(&self) -> Capabilities;

    /// Creates the lock record only if no live record exists for `req.key`, owned by `req.token`
    /// and expiring after `req.ttl`: one attempt.
    ///
    /// # Behavior
    /// - Absent or expired: creates it and returns [`Attempt::Granted`] with the lease (with a
    ///   fencing token if [`Capabilities::fencing`]). The lease's `acquired_at` is taken before
    ///   the request is sent.
    /// - Held by anyone (or, in a store that keeps a waiter line, others are ahead of this
    ///   attempt): [`Attempt::Refused`], with how long until the lock can be free without a
    ///   release where the store can tell. The refusal and the [`watch`](Self::watch)'s
    ///   notifications are all a store tells a waiter: the manager's wait needs nothing else.
    ///   Never a grant for the same token either: tokens are new for every attempt, so a record
    ///   held by the asking token means this request ran before (a retry whose first reply was
    ///   lost). A store that recognises that case answers [`ErrorKind::InDoubt`] instead, since
    ///   its first run took the lock.
    /// - Reply lost after the request was sent: [`ErrorKind::InDoubt`].
    ///
    /// [`ErrorKind::InDoubt`]: crate::ErrorKind::InDoubt
    fn acquire(&self, req: &Acquire) -> impl Future<Output = Result<Attempt>> + Send;

    /// [`acquire`](Self::acquire) for a caller that makes one attempt (an ops tool, a test): the
    /// lease, or a refusal as [`ErrorKind::LockUnavailable`]. Stores and layers implement
    /// `acquire`; this only reads its answer ([`Attempt::into_lease`]).
    ///
    /// [`ErrorKind::LockUnavailable`]: crate::ErrorKind::LockUnavailable
    fn try_acquire(&self, req: &Acquire) -> impl Future<Output = Result<Lease>> + Send {
        async move { self.acquire(req).await?.into_lease(&req.key) }
    }

    /// Deletes the record only if it is still owned by `lease.token()`.
    ///
    /// # Behavior
    /// - Owned by the token: deletes it and returns `Ok(true)`.
    /// - Absent, expired or owned by another token: deletes nothing and returns `Ok(false)`. A stale
    ///   token never deletes a newer holder's record.
    /// - Reply lost: [`ErrorKind::InDoubt`]. Never retried blindly.
    ///
    /// [`ErrorKind::InDoubt`]: crate::ErrorKind::InDoubt
    fn release(&self, lease: &Lease) -> impl Future<Output = Result<bool>> + Send;

    /// Resets the record's TTL to `ttl` only if it is still owned by `lease.token()`, and returns the
    /// renewed lease (`acquired_at` moved to just before the request was sent).
    ///
    /// # Behavior
    /// - Owned by the token: TTL reset, renewed lease returned (same token and fencing token).
    /// - Absent, expired or owned by another: [`ErrorKind::NotHeld`]; nothing changes.
    ///
    /// [`ErrorKind::NotHeld`]: crate::ErrorKind::NotHeld
    fn extend(&self, lease: &Lease, ttl: Duration) -> impl Future<Output = Result<Lease>> + Send;

    /// Reads the current holder of `key` and its remaining TTL, or `None` if the lock is free.
    fn inspect(&self, key: &LockKey) -> impl Future<Output = Result<Option<LockInfo>>> + Send;

    /// Lists held locks whose storage key starts with `prefix` (empty: all), for ops tooling.
    ///
    /// Only for stores with [`Capabilities::listing`]; the default returns
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    fn list(&self, prefix: &str) -> impl Future<Output = Result<Vec<LockInfo>>> + Send {
        let _ = prefix;
        let name = self.name();
        async move { Err(Error::unsupported(name, "listing")) }
    }

    /// Registers this process as waiting for `key`, until the returned watch is dropped (see
    /// [`ReleaseWatch`]). The manager calls it only once a blocking acquisition's first attempt
    /// (a plain try, without a deadline) was refused, before the attempts that wait: an
    /// acquisition nobody contends never pays for a watch.
    ///
    /// Stores with [`Capabilities::notifications`] fire the watch when the lock may be free for
    /// this process (a release, or this process's turn in the store's waiter queue). Never fails:
    /// a store that cannot subscribe returns [`ReleaseWatch::none`] and the waiter polls. The
    /// default returns [`ReleaseWatch::none`].
    ///
    /// Cancel safe: the manager drops the call when the wait's deadline comes first (and a
    /// caller may drop its acquisition at any point), so whatever it registers before its first
    /// `.await` is undone by dropping the future as by dropping the watch.
    fn watch(&self, key: &LockKey) -> impl Future<Output = ReleaseWatch> + Send {
        let _ = key;
        async { ReleaseWatch::none() }
    }

    /// Whether `holder` already holds `key` through this store, so that an acquisition by it
    /// would be a reentrant take. Answered from memory, without I/O: the manager asks before it
    /// queues a holder's call behind this process's waiters for the key, since only a reentrant
    /// take may pass them. The default is `false`; the reentrancy layer answers from what it
    /// holds.
    fn is_held_by(&self, key: &LockKey, holder: HolderId) -> bool {
        let _ = (key, holder);
        false
    }

    /// Whether a task of this process holds `key` through this store with a lease granted
    /// uncontended ([`Lease::is_contended`] false: its release goes to this process's waiters
    /// first), as far as this store knows from memory, without I/O. The manager asks after a
    /// waiter's attempt was refused: while it is so, the waiter waits for that task's release
    /// (which wakes it once the store has it) instead of also listening to the store, whose word
    /// could come first and only lead to a refused attempt and a second wake-up. The default is
    /// `false` (unknown); the reentrancy layer answers from the leases it holds.
    fn is_held_here(&self, key: &LockKey) -> bool {
        let _ = key;
        false
    }

    /// Whether this process still has a place in the store's waiter line for `key` from an
    /// earlier wait, as far as this store knows from memory, without I/O: a store that keeps a
    /// line may keep a process's place for a moment after its grant when others wait too (a
    /// contended key its tasks are likely to ask for again), and give it up if nobody here
    /// asks. The manager asks before a blocking acquisition's first attempt: while it is so, the
    /// acquisition registers its [`watch`](Self::watch) and waits for its turn, instead of first
    /// trying as a plain try, which others ahead would only refuse. The default is `false`.
    fn is_in_line_here(&self, key: &LockKey) -> bool {
        let _ = key;
        false
    }

    /// Subscribes this process to changes of who holds `key` (grants and releases), until the
    /// returned watch is dropped (see [`ChangeWatch`]): for readers of who holds a lock, such as
    /// an election's observers. Unlike [`watch`](Self::watch) it never waits for the lock: it
    /// takes no place in any waiter line, and it is fired on grants too. A store may announce
    /// only the locks taken with [`Acquire::announce`] (Redis does: an announcement is a command
    /// per grant and release there); stores that notify anyway announce every lock.
    ///
    /// Never fails: a store without change notifications (or that cannot subscribe now) returns
    /// [`ChangeWatch::none`] and the reader polls. The default returns [`ChangeWatch::none`].
    fn watch_changes(&self, key: &LockKey) -> impl Future<Output = ChangeWatch> + Send {
        let _ = key;
        async { ChangeWatch::none() }
    }

    /// The lock history of `key`, newest first (see [`TraceConfig`]): empty when the key was never
    /// traced or its history expired.
    ///
    /// # Behavior
    /// Only for stores with [`Capabilities::history`]. Such a store writes an entry for every
    /// traced operation ([`Acquire::trace`], carried by the lease to its release and renewals):
    /// `acquired`, `refused` or `waited` from `acquire`, `released` or `not_held` from
    /// `release`, `lost` from a failed `extend`, in the same round trip as the operation where
    /// the store allows it; it keeps at most [`TraceConfig::max_entries`] and lets the history
    /// expire [`TraceConfig::ttl`] after its last write. The default returns
    /// [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    fn history(&self, key: &LockKey) -> impl Future<Output = Result<Vec<HistoryEntry>>> + Send {
        let _ = key;
        let name = self.name();
        async move { Err(Error::unsupported(name, "lock history")) }
    }

    /// Appends `entry` to the history of `key` on its own, for what happens without a store
    /// operation (a release the unlock window skipped). Same bounds as traced operations. The
    /// default returns [`ErrorKind::Unsupported`](crate::ErrorKind::Unsupported).
    fn append_history(
        &self,
        key: &LockKey,
        trace: &TraceConfig,
        entry: &HistoryEntry,
    ) -> impl Future<Output = Result<()>> + Send {
        let _ = (key, trace, entry);
        let name = self.name();
        async move { Err(Error::unsupported(name, "lock history")) }
    }

    /// Stops the store (or layer) gracefully: layers that track live locks release them here.
    /// Returns how many locks were released. The default does nothing and returns 0.
    fn shutdown(&self) -> impl Future<Output = Result<usize>> + Send {
        async { Ok(0) }
    }
}

impl<S: LockStore + ?Sized> LockStore for Arc<S> {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn capabilities(&self) -> Capabilities {
        (**self).capabilities()
    }
    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        (**self).acquire(req).await
    }
    async fn release(&self, lease: &Lease) -> Result<bool> {
        (**self).release(lease).await
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        (**self).extend(lease, ttl).await
    }
    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        (**self).inspect(key).await
    }
    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        (**self).list(prefix).await
    }
    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        (**self).watch(key).await
    }
    async fn watch_changes(&self, key: &LockKey) -> ChangeWatch {
        (**self).watch_changes(key).await
    }
    fn is_held_by(&self, key: &LockKey, holder: HolderId) -> bool {
        (**self).is_held_by(key, holder)
    }
    fn is_held_here(&self, key: &LockKey) -> bool {
        (**self).is_held_here(key)
    }
    fn is_in_line_here(&self, key: &LockKey) -> bool {
        (**self).is_in_line_here(key)
    }
    async fn history(&self, key: &LockKey) -> Result<Vec<HistoryEntry>> {
        (**self).history(key).await
    }
    async fn append_history(
        &self,
        key: &LockKey,
        trace: &TraceConfig,
        entry: &HistoryEntry,
    ) -> Result<()> {
        (**self).append_history(key, trace, entry).await
    }
    async fn shutdown(&self) -> Result<usize> {
        (**self).shutdown().await
    }
}
