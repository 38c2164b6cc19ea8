//! Lock events: the one hook through which layers and the manager report what they did, so
//! metrics, tracing and the lock trace attach without touching the layers.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::key::LockKey;

/// Why a release was not sent to the store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SkipReason {
    /// The unlock window had closed: the lease may already have expired and been taken by another
    /// holder (`late_by` says by how much the window was missed).
    WindowClosed {
        /// How long after the window closed the release came.
        late_by: Duration,
    },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::WindowClosed { late_by } => {
                write!(f, "unlock window closed {late_by:?} ago")
            }
        }
    }
}

/// Something a layer or the manager did with a lock.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum LockEvent {
    /// A guard was issued: the lock is ours (from the store, a reentrant acquisition or a local
    /// hand-off; those also emit their own event).
    Acquired {
        /// The lock.
        key: LockKey,
        /// Who holds it now.
        token: crate::token::OwnerToken,
        /// The fencing token, where the store gives one.
        fencing_token: Option<u64>,
        /// How long the acquisition took, from the call to the guard (including any wait).
        waited: Duration,
        /// Attempts made (1 for a try-lock that succeeded at once).
        attempts: u32,
    },
    /// An acquisition ended without the lock.
    AcquireFailed {
        /// The lock.
        key: LockKey,
        /// Why: `LockUnavailable` (try-lock), `Timeout` (blocking wait), or any other error.
        error: crate::error::ErrorKind,
        /// How long the call took.
        waited: Duration,
        /// Attempts made.
        attempts: u32,
    },
    /// An acquisition attempt found the lock held by another owner (in the store, or locally: see
    /// [`LockEvent::FastFailed`]).
    Contended {
        /// The lock.
        key: LockKey,
    },
    /// Local competition refused an acquisition without store I/O, because another task of this
    /// process holds (or is acquiring) the key.
    FastFailed {
        /// The lock.
        key: LockKey,
    },
    /// An operation whose reply was lost was resolved by reading the record back.
    RecoveredByReadback {
        /// The lock.
        key: LockKey,
        /// `"acquire"` or `"release"`.
        operation: &'static str,
        /// What the readback found: `true` if our token held the record.
        held: bool,
    },
    /// A release was not sent to the store.
    ReleaseSkipped {
        /// The lock.
        key: LockKey,
        /// Why.
        reason: SkipReason,
    },
    /// A holder took a key it already held; `depth` is the new hold count.
    Reentered {
        /// The lock.
        key: LockKey,
        /// Hold count after this acquisition.
        depth: u32,
    },
    /// A local holder's lease was handed to a local waiter without a store release.
    HandedOff {
        /// The lock.
        key: LockKey,
        /// Consecutive local hand-offs of this store lease so far.
        consecutive: u32,
    },
    /// A lock was released in the store.
    Released {
        /// The lock.
        key: LockKey,
        /// How long it was held.
        held_for: Duration,
        /// Whether it was still ours (`false`: it had expired or been taken).
        was_held: bool,
    },
    /// A guard ended: its release finished, whatever the outcome (a [`LockEvent::Released`], a
    /// hold period kept, an error with [`LockEvent::LeftToExpire`]), or it was dropped where no
    /// release could be sent. Exactly one follows each [`LockEvent::Acquired`]: what
    /// `leasehold.locks.held` counts down.
    GuardEnded {
        /// The lock.
        key: LockKey,
    },
    /// A live lock was released by a graceful shutdown.
    ReleasedAtShutdown {
        /// The lock.
        key: LockKey,
    },
    /// A lease was extended (renewal).
    Renewed {
        /// The lock.
        key: LockKey,
    },
    /// The store could not be reached and the scenario's policy is to proceed without the lock
    /// (fail open): the caller runs unprotected. An alert: emitted every time.
    ProceededWithoutLock {
        /// The lock.
        key: LockKey,
        /// The scenario whose `on_store_down = proceed` allowed it.
        scenario: std::sync::Arc<str>,
        /// Why the store was considered down.
        error: crate::error::ErrorKind,
    },
    /// A release gave up: the lock may still be held in the store under our token and is left to
    /// expire at its TTL (other holders can take it then, not before). Either it met temporary
    /// store errors (connection refused or reset, a failover, an outcome in doubt) until its retry
    /// budget ran out, or an error that retrying cannot cure (a permission the store refused, an
    /// unexpected reply). Emitted for every release, including a dropped guard's and an
    /// abandoned attempt's undo, which have no caller to return the error to.
    LeftToExpire {
        /// The lock.
        key: LockKey,
        /// The last store error's kind: `Connection`, `RetriesExhausted` or `InDoubt` when the
        /// budget ran out, else the error that ended the release.
        error: crate::error::ErrorKind,
        /// How long the lease had left when the release gave up (at most this long until the
        /// store lets it go).
        expires_in: Duration,
        /// Release attempts made.
        attempts: u32,
    },
    /// A held lock was lost: renewal found it no longer ours, or could not reach the store in time.
    Lost {
        /// The lock.
        key: LockKey,
        /// What happened.
        reason: String,
    },
}

impl LockEvent {
    /// The key the event concerns.
    pub fn key(&self) -> &LockKey {
        match self {
            LockEvent::Acquired { key, .. }
            | LockEvent::AcquireFailed { key, .. }
            | LockEvent::Contended { key }
            | LockEvent::FastFailed { key }
            | LockEvent::RecoveredByReadback { key, .. }
            | LockEvent::ReleaseSkipped { key, .. }
            | LockEvent::Reentered { key, .. }
            | LockEvent::HandedOff { key, .. }
            | LockEvent::Released { key, .. }
            | LockEvent::GuardEnded { key }
            | LockEvent::ReleasedAtShutdown { key }
            | LockEvent::Renewed { key }
            | LockEvent::ProceededWithoutLock { key, .. }
            | LockEvent::LeftToExpire { key, .. }
            | LockEvent::Lost { key, .. } => key,
        }
    }

    /// A short stable name: `acquired`, `contended`, `fast_failed`, ...
    pub fn name(&self) -> &'static str {
        match self {
            LockEvent::Acquired { .. } => "acquired",
            LockEvent::AcquireFailed { .. } => "acquire_failed",
            LockEvent::Contended { .. } => "contended",
            LockEvent::FastFailed { .. } => "fast_failed",
            LockEvent::RecoveredByReadback { .. } => "recovered_by_readback",
            LockEvent::ReleaseSkipped { .. } => "release_skipped",
            LockEvent::Reentered { .. } => "reentered",
            LockEvent::HandedOff { .. } => "handed_off",
            LockEvent::Released { .. } => "released",
            LockEvent::GuardEnded { .. } => "guard_ended",
            LockEvent::ReleasedAtShutdown { .. } => "released_at_shutdown",
            LockEvent::Renewed { .. } => "renewed",
            LockEvent::ProceededWithoutLock { .. } => "proceeded_without_lock",
            LockEvent::LeftToExpire { .. } => "left_to_expire",
            LockEvent::Lost { .. } => "lost",
        }
    }
}

/// Receives [`LockEvent`]s. Called inline on the lock path: keep it cheap and never block.
pub trait Observer: Send + Sync + 'static {
    /// Called once per event.
    fn on_event(&self, event: &LockEvent);
}

impl<F: Fn(&LockEvent) + Send + Sync + 'static> Observer for F {
    fn on_event(&self, event: &LockEvent) {
        self(event)
    }
}

/// A cheap-to-clone set of observers that layers hold and emit to. Empty by default, in which case
/// emitting costs one branch.
///
/// ```
/// use std::sync::{Arc, Mutex};
/// use leasehold_core::{LockEvent, LockKey, Observers};
///
/// let seen = Arc::new(Mutex::new(Vec::new()));
/// let sink = seen.clone();
/// let observers = Observers::default().with(move |e: &LockEvent| sink.lock().unwrap().push(e.name()));
/// observers.emit(|| LockEvent::Contended { key: LockKey::xdc("c", "e").unwrap() });
/// assert_eq!(*seen.lock().unwrap(), vec!["contended"]);
/// ```
#[derive(Clone, Default)]
pub struct Observers {
    list: Arc<Vec<Arc<dyn Observer>>>,
}

impl Observers {
    /// Adds an observer.
    pub fn with(mut self, observer: impl Observer) -> Self {
        self.push(Arc::new(observer));
        self
    }

    /// Adds a shared observer.
    pub fn push(&mut self, observer: Arc<dyn Observer>) {
        Arc::make_mut(&mut self.list).push(observer);
    }

    /// Whether any observer is attached.
    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Builds the event only if someone listens, and hands it to every observer.
    pub fn emit(&self, event: impl FnOnce() -> LockEvent) {
        if self.list.is_empty() {
            return;
        }
        let event = event();
        for observer in self.list.iter() {
            observer.on_event(&event);
        }
    }
}

impl fmt::Debug for Observers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observers")
            .field("count", &self.list.len())
            .finish()
    }
}
