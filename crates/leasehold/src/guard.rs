//! RAII guards: a held lock that is released when dropped.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use tracing::Instrument;

use crate::core::{validate_ttl, Error, Lease, LockKey, LockStore, OwnerToken, Result};
use crate::handle::Handle;
use crate::renewal::{LeaseState, Renewer};

/// A held lock. Release it with [`LockGuard::release`] to learn whether it was still ours; dropping
/// it releases it in the background.
///
/// With renewal on ([`LockOptions::renew`](crate::LockOptions::renew)) a background task keeps the
/// lease alive while the guard lives; [`LockGuard::is_held`] and [`LockGuard::lost`] tell when it
/// could not.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
/// let locks = leasehold::LockManager::builder().client_id("jobs").farm_id("f1").build()?;
/// let guard = locks.try_lock("nightly-report").await?;
/// println!("holding {} as {}", guard.key(), guard.token());
/// assert_eq!(guard.fencing_token(), Some(1)); // the embedded store fences
/// assert!(guard.is_held());
/// assert!(guard.release().await?);
/// # Ok(()) }
/// ```
#[must_use = "if unused the lock is released immediately"]
#[derive(Debug)]
pub struct LockGuard {
    handle: Arc<Handle>,
    /// The lease as acquired: key, token and fencing token never change while held.
    acquired: Lease,
    state: Arc<LeaseState>,
    renewer: Option<Renewer>,
    /// The renewal interval asked for (`None`: a third of the TTL), to start renewal again after
    /// an [`extend`](Self::extend) paused it.
    renew_every: Option<Duration>,
    released: bool,
    scenario: Arc<str>,
    /// Issued without the lock (the store was down and the scenario proceeds).
    unprotected: bool,
    /// [`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least): the release keeps the
    /// lock until this long after the grant.
    hold_at_least: Option<Duration>,
}

tokio::task_local! {
    /// Set while a release within a hold period extends the lease instead of deleting it: from
    /// then on the lock is the store's to expire, so a graceful shutdown must not give it back
    /// early (the graceful-shutdown layer stops tracking it).
    pub(crate) static KEEPING_FOR_HOLD_PERIOD: ();
}

/// What [`LockGuard::release_outcome`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReleaseOutcome {
    /// The lock was still ours and is now free.
    Released,
    /// The lock was still ours, but its [`hold_at_least`](crate::LockOptions::hold_at_least)
    /// period had not passed: its lease was shortened to the rest of the period (`left`), after
    /// which the store lets it expire. Until then nobody else can take it.
    Kept {
        /// How long the store keeps the lock from now (the rest of the period, on the store's
        /// clock).
        left: Duration,
    },
    /// The lock was no longer ours (expired, broken, or taken after expiry): nothing changed.
    NotHeld,
}

impl ReleaseOutcome {
    /// `true` unless the lock was no longer ours: what [`LockGuard::release`] returns.
    pub fn was_held(self) -> bool {
        !matches!(self, ReleaseOutcome::NotHeld)
    }
}

impl LockGuard {
    pub(crate) fn new(
        handle: Arc<Handle>,
        lease: Lease,
        renew_every: Option<Option<Duration>>,
        scenario: Arc<str>,
    ) -> Self {
        let state = LeaseState::new(lease.clone());
        let renewer = renew_every
            .and_then(|every| Renewer::start(&handle, state.clone(), every, scenario.clone()));
        LockGuard {
            handle,
            acquired: lease,
            state,
            renewer,
            renew_every: renew_every.flatten(),
            released: false,
            scenario,
            unprotected: false,
            hold_at_least: None,
        }
    }

    /// Sets the hold period of [`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least).
    pub(crate) fn with_hold_at_least(mut self, hold: Option<Duration>) -> Self {
        self.hold_at_least = hold;
        self
    }

    /// The period this lock stays taken after its grant even if released sooner
    /// ([`LockOptions::hold_at_least`](crate::LockOptions::hold_at_least)), if one was asked for.
    pub fn hold_at_least(&self) -> Option<Duration> {
        self.hold_at_least
    }

    /// How this guard holds its key: exclusive (or write), shared (read), or a semaphore permit.
    pub fn mode(&self) -> crate::core::LockMode {
        self.acquired.mode()
    }

    /// A guard that holds nothing: the store was down and the scenario's
    /// [`StoreDownPolicy::Proceed`](crate::scenario::StoreDownPolicy::Proceed) lets the work run
    /// anyway. Releasing it does no I/O.
    pub(crate) fn unprotected(handle: Arc<Handle>, lease: Lease, scenario: Arc<str>) -> Self {
        let state = LeaseState::new(lease.clone());
        state.mark_lost("proceeded without the lock: the store was down".to_owned());
        LockGuard {
            handle,
            acquired: lease,
            state,
            renewer: None,
            renew_every: None,
            released: true,
            scenario,
            unprotected: true,
            hold_at_least: None,
        }
    }

    /// The scenario this lock was taken under (see [`crate::scenario`]).
    pub fn scenario(&self) -> &str {
        &self.scenario
    }

    /// `true` when the store was down and the scenario's `on_store_down = proceed` issued this
    /// guard without taking the lock: the work runs without mutual exclusion. Such a guard is
    /// never [held](Self::is_held); releasing it does nothing.
    pub fn is_unprotected(&self) -> bool {
        self.unprotected
    }

    /// The lock key.
    pub fn key(&self) -> &LockKey {
        self.acquired.key()
    }

    /// The owner token written to the store.
    pub fn token(&self) -> &OwnerToken {
        self.acquired.token()
    }

    /// The fencing token of this acquisition, where the store gives one: pass it with every write
    /// the lock protects, so the downstream system can reject a stale holder (see
    /// `docs/FENCING.md`).
    pub fn fencing_token(&self) -> Option<u64> {
        self.acquired.fencing_token()
    }

    /// The lease as last acquired, extended or renewed.
    pub fn lease(&self) -> Lease {
        self.state.lease()
    }

    /// Whether the lock is still ours as far as this process knows: `false` once renewal found it
    /// taken or could not reach the store before it expired, and once the lease's local expiry
    /// has passed with no renewal that moved it (renewal off, or the process paused past it).
    /// The local expiry counts from when the acquire request was sent, so it is never later than
    /// the store's. Once `false`, it stays `false`: a renewal read after the expiry gives the
    /// lock up, and [`extend`](Self::extend) refuses.
    ///
    /// It is `false` too once the manager has shut down
    /// ([`LockManager::shutdown`](crate::LockManager::shutdown)): its locks were released by
    /// graceful shutdown, or are left to expire, and either way no longer protect work.
    ///
    /// A reentrant guard (a holder taking a key it holds already) reports its own copy of the
    /// held lease: with the outer guard renewed and the inner one not, the inner turns `false`
    /// at its copy's expiry while the key is still held. Check the outer guard, or take the
    /// inner one with renewal too.
    pub fn is_held(&self) -> bool {
        self.state.is_held() && !self.handle.lifecycle.is_closing()
    }

    /// Whether [`is_held`](Self::is_held) reads `false` because the manager shut down (the lease
    /// otherwise still held, or lost only as its renewal ended with the shutdown), not because
    /// the store lost the lock or its lease ran out.
    pub(crate) fn let_go_by_shutdown(&self) -> bool {
        self.handle.lifecycle.is_closing()
            && (self.state.is_held() || self.state.lost_to_shutdown())
    }

    /// Resolves when the lock is lost (like etcd's session `Done()`), with an
    /// [`ErrorKind::NotHeld`](crate::core::ErrorKind::NotHeld) error saying why: renewal found it
    /// taken or gone, the store stayed unreachable until the lease expired, or the lease's local
    /// expiry passed with no renewal that moved it (without renewal, that is its TTL), or the
    /// manager shut down. Never resolves while [`is_held`](Self::is_held) is `true`.
    ///
    /// ```no_run
    /// # async fn demo(locks: leasehold::LockManager) -> leasehold::Result<()> {
    /// use std::time::Duration;
    /// let guard = locks.lock_with("job", leasehold::LockOptions::new().ttl(Duration::from_secs(2)).renew(true)).await?;
    /// tokio::select! {
    ///     _ = async { /* long work */ } => {}
    ///     lost = guard.lost() => eprintln!("stopping: {lost}"),
    /// }
    /// # Ok(()) }
    /// ```
    pub async fn lost(&self) -> Error {
        tokio::select! {
            // The local expiry counts with renewal too: a renewal that can no longer run (its
            // runtime gone) must not leave this waiting past the lease.
            lost = self.state.lost(self.renewer.is_some()) => lost,
            () = self.handle.lifecycle.closing() => Error::not_held(
                "the lock manager shut down: its locks were released (graceful shutdown) or are \
                 left to expire",
            )
            .with_key(self.acquired.key().as_str()),
        }
    }

    /// Resets the lease's TTL to `ttl`, only if the lock is still ours
    /// ([`ErrorKind::NotHeld`](crate::core::ErrorKind::NotHeld) otherwise, and at once, with no
    /// store I/O, when [`is_held`](Self::is_held) is already `false`). A `ttl` not longer than
    /// the unlock window's margin is refused before any I/O
    /// ([`ErrorKind::InvalidArgument`](crate::core::ErrorKind::InvalidArgument)): every release
    /// of such a lease would be skipped.
    ///
    /// A store that is down (connection refused or reset, a failover, an outcome in doubt) is
    /// retried with backoff until the lease expires, at most the manager's
    /// [`release_retry`](crate::LockManagerBuilder::release_retry); then the last store error is
    /// returned. Such a failure, or this future dropped before the answer, may still have
    /// applied the new TTL: the local expiry then moves to the earliest the store may now expire
    /// the key (never later than it), so with a shorter `ttl` [`is_held`](Self::is_held) turns
    /// `false` by then, and a release after it may be skipped by the unlock window (the lock
    /// then expires at its TTL). Renewal pauses while an extend runs and then renews the lease
    /// it leaves, at its TTL.
    pub async fn extend(&mut self, ttl: Duration) -> Result<()> {
        validate_ttl(ttl)?;
        self.handle
            .check_ttl(ttl)
            .map_err(|e| e.with_key(self.key().as_str()))?;
        if self.unprotected {
            return Err(Error::new(
                crate::core::ErrorKind::NotHeld,
                "this guard was issued without the lock (the store was down and the scenario \
                 proceeds); there is nothing to extend",
            )
            .with_key(self.key().as_str()));
        }
        // `is_held` only ever turns false: a lease given up as lost (or past its local expiry,
        // where the key may be another's already) is not extended back to life.
        if !self.state.is_held() {
            return Err(Error::not_held(
                "the lock is no longer held as far as this process knows (renewal found it lost, \
                 or its lease's local expiry passed); take it again",
            )
            .with_key(self.key().as_str()));
        }
        // Renewal pauses while the extend runs: its own extends would race this one, and the
        // store keeps whichever it applied last while this process keeps whichever answer it
        // read last. It starts again from the lease this leaves (its TTL, its start), also when
        // this future is dropped midway.
        let LockGuard {
            handle,
            state,
            renewer,
            renew_every,
            scenario,
            ..
        } = self;
        let paused = renewer.take();
        let mut resume = Resume {
            armed: paused.is_some(),
            slot: renewer,
            handle: handle.clone(),
            state: state.clone(),
            every: *renew_every,
            scenario: scenario.clone(),
            unanswered: None,
        };
        if let Some(paused) = paused {
            paused.stop().await;
        }
        let lease = state.lease();
        let key = lease.key().clone();
        if !state.is_held() {
            drop(resume);
            return Err(Error::not_held(
                "the lock was found lost by its renewal while the extend waited for it; take it \
                 again",
            )
            .with_key(key.as_str()));
        }
        let span = tracing::info_span!(
            "leasehold.extend",
            key = %key,
            store = handle.store.name(),
            scenario = &**scenario,
            outcome = tracing::field::Empty,
        );
        let sent_at = Instant::now();
        resume.unanswered = Some((ttl, sent_at));
        let result = crate::observe::in_scenario(
            scenario.clone(),
            crate::failover::extend(&handle.store, &handle.retry, &lease, ttl)
                .instrument(span.clone()),
        )
        .await;
        resume.unanswered = None;
        span.record(
            "outcome",
            match &result {
                Ok(_) => "extended",
                Err(e) => e.kind().as_str(),
            },
        );
        let outcome = match result {
            Ok(renewed) => match state.renew_to(renewed) {
                None => Ok(()),
                // Read only after the lease's local expiry (or a renewal found it lost
                // meanwhile): `is_held` may have said `false` already, so the lock is given up.
                Some(late) => {
                    if let Some(late) = state.give_up(late) {
                        crate::observe::with_scenario(self.scenario.clone(), || {
                            handle.release_given_up_in_background(
                                late,
                                "an extend read after its lease expired",
                            )
                        });
                    }
                    Err(Error::not_held(
                        "the extend was answered only after the lease's local expiry (or the \
                         lock was found lost meanwhile); the lock is given up (released), take \
                         it again",
                    )
                    .with_key(key.as_str()))
                }
            },
            Err(error) => {
                use crate::core::ErrorKind;
                match error.kind() {
                    ErrorKind::NotHeld => state.mark_lost(error.chain().to_string()),
                    // The store was reached, or may have been, and failed to answer: an attempt
                    // may have been applied, and with a shorter TTL the store's expiry may now
                    // come before the local one, which must never be later.
                    ErrorKind::InDoubt
                    | ErrorKind::Connection
                    | ErrorKind::Timeout
                    | ErrorKind::RetriesExhausted
                    | ErrorKind::Internal => state.expire_no_later_than(ttl, sent_at),
                    _ => {}
                }
                Err(error)
            }
        };
        drop(resume);
        outcome
    }

    /// Releases the lock now. `Ok(true)`: it was still ours and is now free (or, taken with
    /// [`hold_at_least`](crate::LockOptions::hold_at_least) and released before that period
    /// ended, kept until it ends: see [`release_outcome`](Self::release_outcome)). `Ok(false)`: it
    /// was no longer ours (expired, broken, or taken after expiry) and nothing was deleted — the
    /// seed manager's `releaseLock` false.
    ///
    /// A store that is down (connection refused or reset, a failover, an outcome in doubt) is
    /// retried with backoff until the lease would expire anyway, at most the manager's
    /// [`release_retry`](crate::LockManagerBuilder::release_retry). If it stays down, the error
    /// (of the last store error's kind) says the lock is left to expire and in how long, and a
    /// [`LockEvent::LeftToExpire`](crate::LockEvent::LeftToExpire) is emitted.
    pub async fn release(self) -> Result<bool> {
        self.release_outcome().await.map(ReleaseOutcome::was_held)
    }

    /// [`release`](Self::release), saying what was done.
    ///
    /// Without [`hold_at_least`](crate::LockOptions::hold_at_least), or once its period has
    /// passed since the grant: an owner-checked delete ([`ReleaseOutcome::Released`] or
    /// [`ReleaseOutcome::NotHeld`]). Before the period has passed: an owner-checked extend of the
    /// lease to the rest of the period instead of a delete ([`ReleaseOutcome::Kept`]), so the
    /// lock stays taken until the period ends and then expires in the store. The rest is measured
    /// on this process's monotonic clock from just before the acquire request was sent, and the
    /// store counts it down on its own clock (Redis `PEXPIRE`, an etcd lease's TTL rounded up to
    /// whole seconds, an Aerospike record TTL, the embedded store's clock): no wall clock is read,
    /// so clients whose clocks differ cannot shorten it. It may end earlier than the period by at
    /// most the acquire's round trip (the store granted the lock a little after the request was
    /// sent).
    ///
    /// ```
    /// # #[tokio::main(flavor = "current_thread")] async fn main() -> leasehold::Result<()> {
    /// use std::time::Duration;
    /// use leasehold::{LockOptions, ReleaseOutcome};
    /// let locks = leasehold::LockManager::builder().client_id("jobs").farm_id("f1").build()?;
    /// let opts = LockOptions::new().hold_at_least(Duration::from_secs(60));
    /// let guard = locks.try_lock_with("nightly-report", opts).await?;
    /// // ... the job finishes in well under a minute ...
    /// let outcome = guard.release_outcome().await?;
    /// assert!(matches!(outcome, ReleaseOutcome::Kept { .. }));
    /// assert!(locks.try_lock("nightly-report").await.unwrap_err().is_unavailable());
    /// # Ok(()) }
    /// ```
    pub async fn release_outcome(mut self) -> Result<ReleaseOutcome> {
        // `released` is set only once the release has completed: if this future is dropped
        // midway, `Drop` still sends the (owner-checked) release in the background.
        if self.unprotected {
            return Ok(ReleaseOutcome::NotHeld);
        }
        if let Some(renewer) = self.renewer.take() {
            renewer.stop().await;
        }
        let result = finish(
            &self.handle,
            &self.state,
            &self.scenario,
            self.acquired.acquired_at(),
            self.hold_at_least,
        )
        .await;
        // No await from here to `released`: a cancelled release is the drop's to end.
        self.released = true;
        guard_ended(&self.handle, self.acquired.key(), &self.scenario);
        result
    }
}

/// The release of a guard: a delete, or within its hold period an extend to the rest of it.
/// Sent once for the lease: not when the library gave it up already; and a renewal that landed
/// while it was in flight is released after it when it did not let go of the lease. All of it
/// in the guard's scenario, which its events carry.
async fn finish(
    handle: &Handle,
    state: &LeaseState,
    scenario: &Arc<str>,
    granted_at: tokio::time::Instant,
    hold_at_least: Option<Duration>,
) -> Result<ReleaseOutcome> {
    if !state.begin_release() {
        return Ok(ReleaseOutcome::NotHeld);
    }
    crate::observe::in_scenario(scenario.clone(), async {
        let result = send_release(handle, state, scenario, granted_at, hold_at_least).await;
        let let_go = matches!(
            result,
            Ok(ReleaseOutcome::Released | ReleaseOutcome::Kept { .. })
        );
        if let Some(parked) = state.end_release(let_go) {
            handle
                .release_given_up(
                    &parked,
                    "a renewal that landed during a release that let go of nothing",
                )
                .await;
        }
        result
    })
    .await
}

/// Says a guard of `key` ended (see [`LockEvent::GuardEnded`](crate::LockEvent::GuardEnded)), in
/// its scenario as its `Acquired` was.
fn guard_ended(handle: &Handle, key: &LockKey, scenario: &Arc<str>) {
    if handle.observers.is_empty() {
        return;
    }
    crate::observe::with_scenario(scenario.clone(), || {
        handle
            .observers
            .emit(|| crate::core::LockEvent::GuardEnded { key: key.clone() });
    });
}

/// Says its guard ended when it is dropped: carried by a dropped guard's release task, it does
/// so once the release has run, or when the task is dropped without running (its runtime shut
/// down, or none to spawn it on).
struct EndsGuard {
    handle: Arc<Handle>,
    key: LockKey,
    scenario: Arc<str>,
}

impl Drop for EndsGuard {
    fn drop(&mut self) {
        guard_ended(&self.handle, &self.key, &self.scenario);
    }
}

async fn send_release(
    handle: &Handle,
    state: &LeaseState,
    scenario: &Arc<str>,
    granted_at: tokio::time::Instant,
    hold_at_least: Option<Duration>,
) -> Result<ReleaseOutcome> {
    let lease = state.lease();
    // A lease no longer held has nothing to keep for a hold period: an extend of it could
    // outlive a renewal landing late. It is released as any other.
    let left = hold_at_least
        .filter(|_| state.is_held())
        .and_then(|d| d.checked_sub(granted_at.elapsed()));
    // Under a millisecond no store can represent the rest: release at once.
    let Some(left) = left.filter(|left| *left >= Duration::from_millis(1)) else {
        return Ok(if handle.release(&lease, scenario).await? {
            ReleaseOutcome::Released
        } else {
            ReleaseOutcome::NotHeld
        });
    };
    let span = tracing::info_span!(
        "leasehold.release",
        key = %lease.key(),
        store = handle.store.name(),
        scenario = &**scenario,
        outcome = tracing::field::Empty,
    );
    // In the guard's scenario already (`finish`).
    let result = KEEPING_FOR_HOLD_PERIOD
        .scope(
            (),
            crate::failover::extend(&handle.store, &handle.retry, &lease, left)
                .instrument(span.clone()),
        )
        .await;
    match result {
        Ok(renewed) => {
            span.record("outcome", "kept_for_hold_period");
            state.set_lease(renewed);
            Ok(ReleaseOutcome::Kept { left })
        }
        Err(error) if error.kind() == crate::core::ErrorKind::NotHeld => {
            span.record("outcome", "not_held");
            state.mark_lost(error.chain().to_string());
            Ok(ReleaseOutcome::NotHeld)
        }
        Err(error) => {
            span.record("outcome", error.kind().as_str());
            Err(error)
        }
    }
}

impl Drop for LockGuard {
    /// Releases in the background on the current tokio runtime; never blocks or panics. Outside a
    /// runtime nothing can be sent: the lock is logged and expires at its TTL.
    fn drop(&mut self) {
        if self.released {
            return;
        }
        let renewer = self.renewer.take();
        let handle = self.handle.clone();
        let state = self.state.clone();
        let scenario = self.scenario.clone();
        let granted_at = self.acquired.acquired_at();
        let hold_at_least = self.hold_at_least;
        let ends = EndsGuard {
            handle: self.handle.clone(),
            key: self.acquired.key().clone(),
            scenario: self.scenario.clone(),
        };
        // Tracked by the lifecycle: a shutdown waits for this release.
        let spawned = self.handle.lifecycle.spawn(async move {
            let _ends = ends;
            if let Some(renewer) = renewer {
                renewer.stop().await;
            }
            let lease = state.lease();
            if let Err(error) = finish(&handle, &state, &scenario, granted_at, hold_at_least).await
            {
                tracing::warn!(key = %lease.key(), error = %error.chain(),
                    "releasing a dropped guard failed; the lock expires at its TTL");
            }
        });
        if spawned.is_none() {
            tracing::warn!(key = %self.acquired.key(),
                "guard dropped outside a tokio runtime; the lock expires at its TTL");
        }
    }
}

/// Ends an [`LockGuard::extend`], also one dropped midway: an extend sent and never answered
/// may have been applied, so the local expiry moves to the earliest the store's may now be;
/// then the guard's renewal, which the extend paused, starts again if it had one and the guard
/// is still held.
struct Resume<'a> {
    armed: bool,
    slot: &'a mut Option<Renewer>,
    handle: Arc<Handle>,
    state: Arc<LeaseState>,
    every: Option<Duration>,
    scenario: Arc<str>,
    /// The TTL asked for and when the extend was sent, until it answered.
    unanswered: Option<(Duration, Instant)>,
}

impl Drop for Resume<'_> {
    fn drop(&mut self) {
        if let Some((ttl, sent_at)) = self.unanswered.take() {
            self.state.expire_no_later_than(ttl, sent_at);
        }
        if self.armed && self.state.is_held() {
            *self.slot = Renewer::start(
                &self.handle,
                self.state.clone(),
                self.every,
                self.scenario.clone(),
            );
        }
    }
}
