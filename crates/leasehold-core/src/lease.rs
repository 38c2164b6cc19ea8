//! Leases (what an acquisition returns) and lock info (what an inspection reads back).

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::history::TraceConfig;
use crate::key::LockKey;
use crate::mode::LockMode;
use crate::token::OwnerToken;

/// A held lock: key, owner token, when it was taken, for how long, and its fencing token.
///
/// `acquired_at` is the monotonic instant taken *before* the acquire request was sent (Bond's
/// unlock-window rule: the store's clock started no earlier than that, so
/// `acquired_at + ttl` is a safe lower bound of the record's expiry). A successful extend moves it.
///
/// ```
/// use std::time::Duration;
/// use leasehold_core::{Lease, LockKey, OwnerToken};
///
/// let lease = Lease::new(
///     LockKey::xdc("orders", "o-1")?,
///     OwnerToken::generate(),
///     Duration::from_secs(2),
///     tokio::time::Instant::now(),
/// )
/// .with_fencing_token(Some(7));
/// assert_eq!(lease.fencing_token(), Some(7));
/// assert!(lease.remaining() <= Duration::from_secs(2));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    key: LockKey,
    token: OwnerToken,
    ttl: Duration,
    acquired_at: Instant,
    fencing_token: Option<u64>,
    /// Other processes were in the store's waiter line when this lease was granted.
    contended: bool,
    mode: LockMode,
    /// The lock-history setting of the acquisition, carried to its release and renewals.
    trace: Option<TraceConfig>,
    /// Whether the acquisition was announced to observers, so its release is too.
    announce: bool,
}

impl Lease {
    /// A lease on `key` owned by `token`, valid for `ttl` from `acquired_at`.
    pub fn new(key: LockKey, token: OwnerToken, ttl: Duration, acquired_at: Instant) -> Self {
        Lease {
            key,
            token,
            ttl,
            acquired_at,
            fencing_token: None,
            contended: false,
            mode: LockMode::Exclusive,
            trace: None,
            announce: false,
        }
    }

    /// The lease a store grants for `req`, sent at `sent_at`: the request's key, token, TTL,
    /// mode, trace and announcement carried over (add the fencing token the store issued). One
    /// place that knows what a lease keeps of its request, for stores and layers alike.
    pub fn granted(req: &crate::acquire::Acquire, sent_at: Instant) -> Self {
        Lease::new(req.key.clone(), req.token.clone(), req.ttl, sent_at)
            .with_mode(req.mode)
            .with_trace(req.trace)
            .with_announce(req.announce)
    }

    /// Sets whether this lease's release is announced to observers (stores copy it from
    /// [`Acquire::announce`](crate::Acquire::announce)).
    pub fn with_announce(mut self, announce: bool) -> Self {
        self.announce = announce;
        self
    }

    /// Whether this lease's release is announced to observers.
    pub fn announces(&self) -> bool {
        self.announce
    }

    /// Sets the lock-history setting stores apply to this lease's release and renewals (stores
    /// copy it from [`Acquire::trace`](crate::Acquire::trace)).
    pub fn with_trace(mut self, trace: Option<TraceConfig>) -> Self {
        self.trace = trace;
        self
    }

    /// The lock-history setting, if this lease is traced.
    pub fn trace(&self) -> Option<&TraceConfig> {
        self.trace.as_ref()
    }

    /// Sets the mode this lease was taken in (stores copy it from the request).
    pub fn with_mode(mut self, mode: LockMode) -> Self {
        self.mode = mode;
        self
    }

    /// How this lease holds its key: exclusive (or write), shared (read), or a semaphore permit.
    /// Release and extend act on the record of this mode.
    pub fn mode(&self) -> LockMode {
        self.mode
    }

    /// Records that other processes were waiting in the store's line when this lease was granted
    /// (stores with a fair waiter queue report it).
    pub fn with_contended(mut self, contended: bool) -> Self {
        self.contended = contended;
        self
    }

    /// Whether other processes were waiting in the store's line when this lease was granted: its
    /// release is their turn, so local competition does not hand it to a local waiter, and the
    /// manager's next waiter in this process waits for the store's word instead of asking.
    pub fn is_contended(&self) -> bool {
        self.contended
    }

    /// Sets the fencing token the store returned.
    pub fn with_fencing_token(mut self, fencing_token: Option<u64>) -> Self {
        self.fencing_token = fencing_token;
        self
    }

    /// The same lease, renewed for `ttl` from `at` (what a successful extend returns).
    pub fn renewed(&self, ttl: Duration, at: Instant) -> Self {
        Lease {
            ttl,
            acquired_at: at,
            ..self.clone()
        }
    }

    /// The same lease owned by another token (used by a local hand-off, where the store record
    /// keeps the first holder's token).
    pub fn with_token(mut self, token: OwnerToken) -> Self {
        self.token = token;
        self
    }

    /// The lock key.
    pub fn key(&self) -> &LockKey {
        &self.key
    }

    /// The owner token written to the store.
    pub fn token(&self) -> &OwnerToken {
        &self.token
    }

    /// The TTL requested at acquisition (or at the last extend).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// Monotonic time just before the acquire (or last extend) request was sent.
    pub fn acquired_at(&self) -> Instant {
        self.acquired_at
    }

    /// Wall-clock time matching [`Lease::acquired_at`], for logs and people.
    ///
    /// Computed when asked (now on the wall clock, minus the monotonic time elapsed since
    /// `acquired_at`), so taking a lease costs no wall-clock read and the answer is not skewed by
    /// a wall-clock step made since.
    pub fn acquired_at_wall(&self) -> SystemTime {
        wall_time_of(self.acquired_at)
    }

    /// The fencing token: strictly greater than every earlier acquisition's token for this key, if
    /// the store provides them.
    pub fn fencing_token(&self) -> Option<u64> {
        self.fencing_token
    }

    /// The monotonic instant at which the lease surely expired in the store, if not extended.
    pub fn expires_at(&self) -> Instant {
        // Saturating: `Lease::new` is public and takes any TTL; stores reject absurd ones.
        crate::ttl::instant_after(self.acquired_at, self.ttl)
    }

    /// Time left until [`Lease::expires_at`], zero if past.
    pub fn remaining(&self) -> Duration {
        self.expires_at().saturating_duration_since(Instant::now())
    }
}

/// The wall-clock time of a monotonic instant in the past (or now, if it lies in the future).
pub fn wall_time_of(instant: Instant) -> SystemTime {
    let now = SystemTime::now();
    now.checked_sub(instant.elapsed()).unwrap_or(now)
}

/// What a store says about a key: who holds it and for how long. Returned by `inspect` and `list`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LockInfo {
    /// The lock key.
    pub key: LockKey,
    /// The owner token in the record. `None` when the record was written by a client that stores no
    /// token (for example the Java lock manager on Aerospike).
    pub token: Option<OwnerToken>,
    /// Time left before the record expires; `None` if it never expires.
    pub ttl_remaining: Option<Duration>,
    /// When the lock was acquired, as recorded in the store (or in the token).
    pub acquired_at: Option<SystemTime>,
    /// The fencing token of the current holder, if the store keeps one.
    pub fencing_token: Option<u64>,
    /// How the key is held. For [`LockMode::Shared`] and [`LockMode::Semaphore`] the holders are
    /// in `holders` and `token` is `None`.
    pub mode: LockMode,
    /// Every holder of a shared lock or semaphore (empty for an exclusive hold).
    pub holders: Vec<HolderInfo>,
    /// A blocking writer is waiting and new readers are kept out (read-write locks only).
    pub writer_waiting: bool,
}

/// One holder of a shared lock or semaphore: its token and how long its own lease has left.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct HolderInfo {
    /// The holder's owner token.
    pub token: OwnerToken,
    /// Time left on this holder's lease.
    pub ttl_remaining: Option<Duration>,
}

impl HolderInfo {
    /// A holder with `ttl_remaining` left.
    pub fn new(token: OwnerToken, ttl_remaining: Option<Duration>) -> Self {
        HolderInfo {
            token,
            ttl_remaining,
        }
    }
}

impl LockInfo {
    /// Info with only key and token; set the other fields with the `with_*` methods.
    pub fn new(key: LockKey, token: Option<OwnerToken>) -> Self {
        let acquired_at = token.as_ref().and_then(OwnerToken::acquired_at);
        LockInfo {
            key,
            token,
            ttl_remaining: None,
            acquired_at,
            fencing_token: None,
            mode: LockMode::Exclusive,
            holders: Vec::new(),
            writer_waiting: false,
        }
    }

    /// Info on a shared lock or semaphore held by `holders`; the record's TTL is the longest
    /// holder's.
    pub fn shared(key: LockKey, mode: LockMode, holders: Vec<HolderInfo>) -> Self {
        let ttl_remaining = holders.iter().filter_map(|h| h.ttl_remaining).max();
        let mut info = LockInfo::new(key, None).with_ttl_remaining(ttl_remaining);
        info.mode = mode;
        info.holders = holders;
        info
    }

    /// Sets whether a writer is waiting.
    pub fn with_writer_waiting(mut self, writer_waiting: bool) -> Self {
        self.writer_waiting = writer_waiting;
        self
    }

    /// Sets the remaining TTL.
    pub fn with_ttl_remaining(mut self, ttl_remaining: Option<Duration>) -> Self {
        self.ttl_remaining = ttl_remaining;
        self
    }

    /// Sets the acquisition time.
    pub fn with_acquired_at(mut self, acquired_at: Option<SystemTime>) -> Self {
        if acquired_at.is_some() {
            self.acquired_at = acquired_at;
        }
        self
    }

    /// Sets the fencing token.
    pub fn with_fencing_token(mut self, fencing_token: Option<u64>) -> Self {
        self.fencing_token = fencing_token;
        self
    }

    /// Whether `token` holds the key: the exclusive owner or one of the shared holders.
    pub fn is_owned_by(&self, token: &OwnerToken) -> bool {
        self.token.as_ref() == Some(token) || self.holders.iter().any(|h| &h.token == token)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_absurd_ttl_saturates_instead_of_panicking() {
        let lease = Lease::new(
            crate::key::LockKey::xdc("c", "e").unwrap(),
            crate::token::OwnerToken::generate(),
            Duration::MAX,
            Instant::now(),
        );
        assert!(lease.remaining() > Duration::from_secs(86_400 * 365));
    }
}
