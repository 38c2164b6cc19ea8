//! An acquisition request, as it travels down the layer stack to a store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::time::Instant;

use crate::history::TraceConfig;
use crate::key::LockKey;
use crate::token::OwnerToken;

/// Who is asking for a lock, for reentrancy: the same holder taking a key it already holds counts
/// up instead of deadlocking.
///
/// In async Rust a thread is the wrong identity for a task (a task moves between threads), so a
/// holder is either an explicit handle the caller creates and passes down (`leasehold::Holder`),
/// the current tokio task, or — for code that runs in no task, such as the body of
/// `#[tokio::main]` or a `block_on` — the current thread, which that code never leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum HolderId {
    /// An explicit holder handle (see [`HolderId::new_explicit`]).
    Explicit(u64),
    /// A tokio task, as given by `tokio::task::try_id()`.
    Task(tokio::task::Id),
    /// The future a thread is blocked on (`Runtime::block_on`), outside any task.
    Thread(std::thread::ThreadId),
}

impl HolderId {
    /// A fresh explicit holder id, unique within this process.
    pub fn new_explicit() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        HolderId::Explicit(NEXT.fetch_add(1, Ordering::Relaxed))
    }

    /// The current tokio task, if called inside one.
    pub fn current_task() -> Option<Self> {
        tokio::task::try_id().map(HolderId::Task)
    }

    /// The current tokio task, or outside any task (the future a thread blocks on, such as the
    /// body of `#[tokio::main]`) the current thread: that future runs on this thread only.
    ///
    /// ```
    /// use leasehold_core::HolderId;
    /// # #[tokio::main(flavor = "current_thread")] async fn main() {
    /// assert!(matches!(HolderId::current(), HolderId::Thread(_))); // main's body is no task
    /// let in_task = tokio::spawn(async { HolderId::current() }).await.unwrap();
    /// assert!(matches!(in_task, HolderId::Task(_)));
    /// # }
    /// ```
    pub fn current() -> Self {
        HolderId::current_task().unwrap_or_else(|| HolderId::Thread(std::thread::current().id()))
    }
}

/// One blocking acquisition across all its attempts: the manager's wait loop asks the store many
/// times for one `lock()` call, and every attempt carries the same waiter id, so a store that
/// keeps one place per waiting call (strict FIFO) recognises it between attempts, and a layer
/// can tell a waiter's attempt from a try (local competition hands a released lease only to a
/// waiter).
///
/// A [`ReleaseWatch`](crate::ReleaseWatch) mints one ([`ReleaseWatch::waiter`](crate::ReleaseWatch::waiter)): the watch
/// is the waiter's registration for its whole wait, and dropping it is how the waiter leaves.
///
/// ```
/// use leasehold_core::WaiterId;
/// assert_ne!(WaiterId::new(), WaiterId::new()); // unique within the process
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct WaiterId(u64);

impl WaiterId {
    /// A fresh waiter id, unique within this process.
    #[allow(clippy::new_without_default)] // a default would hide that each call is a new id
    pub fn new() -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        WaiterId(NEXT.fetch_add(1, Ordering::Relaxed))
    }
}

/// What a store's waiter line needs from an attempt of a blocking acquisition: until when it
/// waits, and which wait it is. The one field of a request ([`Acquire::wait`]) that tells a
/// blocking attempt from a try.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{Wait, WaiterId};
/// let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
/// let wait = Wait::new(deadline, WaiterId::new());
/// assert_eq!(wait.deadline, deadline);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Wait {
    /// When the acquisition gives up: a store that keeps a line of waiters may keep this one's
    /// place until then.
    pub deadline: Instant,
    /// The blocking acquisition this attempt belongs to: the same id on every attempt of one
    /// wait (see [`WaiterId`]), the id of the [`ReleaseWatch`](crate::ReleaseWatch) the waiter
    /// registered.
    pub waiter: WaiterId,
}

impl Wait {
    /// An attempt of the wait `waiter` that gives up at `deadline`.
    pub fn new(deadline: Instant, waiter: WaiterId) -> Self {
        Wait { deadline, waiter }
    }
}

/// A request to acquire one lock.
///
/// Stores use `key`, `token`, `ttl`, `mode` and, for their waiter lines, `wait`; `holder` is for
/// reentrancy.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{Acquire, LockKey, OwnerToken};
///
/// let key = LockKey::xdc("orders", "order-42")?;
/// let req = Acquire::new(key, OwnerToken::generate(), Duration::from_secs(2));
/// assert!(req.wait.is_none()); // one attempt, fail fast
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct Acquire {
    /// The lock to take.
    pub key: LockKey,
    /// The token to write as owner. Generated before the request is sent, so that a caller whose
    /// reply was lost can read the record back and recognise its own write.
    pub token: OwnerToken,
    /// How long the lease lives in the store unless extended.
    pub ttl: Duration,
    /// Who asks, for reentrancy. `None`: every acquisition is a new holder.
    pub holder: Option<HolderId>,
    /// `None`: a try, which never takes a place in a store's waiter line. `Some`: an attempt of a
    /// blocking acquisition (see [`Wait`]). Every call is one attempt: the manager's wait loop
    /// does the waiting.
    pub wait: Option<Wait>,
    /// The kind of hold: exclusive (the default, also a read-write lock's write side), shared
    /// (a reader) or a semaphore permit. A blocking exclusive request (`wait` set) on a key
    /// held by readers also marks a writer as waiting, which keeps new readers out until it is
    /// served or its marker expires.
    pub mode: crate::mode::LockMode,
    /// `Some`: record this acquisition (and, through the lease, its release and renewals) in the
    /// key's lock history in the store (see [`TraceConfig`]). Stores without
    /// [`Capabilities::history`](crate::Capabilities::history) ignore it.
    pub trace: Option<TraceConfig>,
    /// Announce this lock's grant and (through the lease) its release to the readers watching
    /// the key ([`LockStore::watch_changes`](crate::LockStore::watch_changes)): an election's
    /// lock sets it. Stores whose announcements cost a command per operation (Redis) announce
    /// only such locks, so a hot lock nobody observes never pays for them; stores that notify
    /// anyway (etcd's watch, the embedded store) ignore it.
    pub announce: bool,
}

impl Acquire {
    /// A single-attempt request with no holder identity.
    pub fn new(key: LockKey, token: OwnerToken, ttl: Duration) -> Self {
        Acquire {
            key,
            token,
            ttl,
            holder: None,
            wait: None,
            mode: crate::mode::LockMode::Exclusive,
            trace: None,
            announce: false,
        }
    }

    /// Checks what a store must check before any I/O: the TTL (above zero, at most
    /// [`MAX_TTL`](crate::MAX_TTL)) and the lock mode (a semaphore's permits). Every store's
    /// `acquire` starts with it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_core::{Acquire, LockKey, OwnerToken};
    /// let req = Acquire::new(LockKey::xdc("c", "e")?, OwnerToken::generate(), Duration::ZERO);
    /// assert!(req.validate().is_err());
    /// # Ok::<(), leasehold_core::Error>(())
    /// ```
    pub fn validate(&self) -> crate::error::Result<()> {
        crate::ttl::validate_ttl(self.ttl)?;
        self.mode.validate()
    }

    /// Sets the lock mode.
    pub fn with_mode(mut self, mode: crate::mode::LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// Sets the holder identity.
    pub fn with_holder(mut self, holder: Option<HolderId>) -> Self {
        self.holder = holder;
        self
    }

    /// Sets the lock-history setting (`None`: not traced).
    pub fn with_trace(mut self, trace: Option<TraceConfig>) -> Self {
        self.trace = trace;
        self
    }

    /// Makes this an attempt of a blocking acquisition (`Some`), or a try (`None`).
    pub fn with_wait(mut self, wait: Option<Wait>) -> Self {
        self.wait = wait;
        self
    }

    /// When the blocking acquisition this attempt belongs to gives up; `None` for a try.
    pub fn deadline(&self) -> Option<Instant> {
        self.wait.map(|wait| wait.deadline)
    }

    /// The blocking acquisition this attempt belongs to; `None` for a try.
    pub fn waiter(&self) -> Option<WaiterId> {
        self.wait.map(|wait| wait.waiter)
    }

    /// Sets whether the grant and release are announced to observers (see
    /// [`announce`](Self::announce)).
    pub fn with_announce(mut self, announce: bool) -> Self {
        self.announce = announce;
        self
    }
}
