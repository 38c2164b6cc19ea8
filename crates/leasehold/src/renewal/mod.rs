//! Lease renewal: a background task that keeps a guard's lease alive and notices when it is lost.
//!
//! Short TTLs keep a crashed holder from blocking others for long (Bond recommends 2 s on fast
//! paths), but then a long job outlives its lease. Renewal is the answer Redisson (watchdog) and etcd
//! (session keep-alive) give: while the guard lives, extend the lease every `ttl / 3` (configurable),
//! owner-checked. If an extend says the lock is no longer ours, or the store cannot be reached
//! before the lease would expire, the guard is marked lost: `is_held()` turns false, `lost()`
//! resolves, and a [`LockEvent::Lost`] is emitted. The task ends when the guard is released or
//! dropped, or when the manager shuts down (the guard is then marked lost: nothing renews it any
//! more); it never outlives its guard.
//!
//! A guard's renewal starts as an entry in the manager's [`Schedule`], due one renewal period
//! after the guard was taken; only a guard still held then gets its task. Taking and releasing a
//! lock within a renewal period (a hot key changes hands in microseconds; a period is a third of
//! a TTL) spawns nothing and wakes nothing.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::Duration;

use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::core::{instant_after, Error, ErrorKind, Lease, LockEvent, LockStore};
use crate::handle::Handle;
use crate::schedule::{Due, Place, Schedule};

/// Shortest pause between two renewal attempts after a failure.
const MIN_RETRY: Duration = Duration::from_millis(10);

/// Why a held guard's lease is given up when its manager shuts down.
const SHUT_DOWN: &str = "the lock manager shut down; the lease is no longer renewed";

/// How long after a renewed lease's local expiry [`LeaseState::lost`] waits for its renewal to
/// report before it resolves by itself.
const RENEWAL_SILENT: Duration = Duration::from_secs(1);

/// The current lease of a guard and whether it is still held; shared by the guard and its renewal
/// task. One allocation per guard: the lease and the lost reason behind one mutex, and a `Notify`
/// for `lost()` waiters.
#[derive(Debug)]
pub(crate) struct LeaseState {
    current: Mutex<Current>,
    lost_signal: Notify,
}

#[derive(Debug)]
struct Current {
    lease: Lease,
    /// `None` while held; the reason once lost.
    lost: Option<String>,
    /// Lost because the manager shut down (its renewal ended with it), not to the store.
    lost_to_shutdown: bool,
    /// The library released this lease itself, giving it up (an extend answered too late): the
    /// guard's release sends nothing more. A second release would not be harmless: through
    /// reentrancy it counts down another hold of the same token, and through hand-off it
    /// releases the next holder's lease, which carries the same token.
    given_up: bool,
    /// Where the guard's own release stands.
    guard_release: GuardRelease,
    /// A lease renewed after it was given up, which landed while the guard's release was in
    /// flight: released when that release ends without letting go of the lease.
    parked: Option<Lease>,
}

/// Where a guard's own release stands, for a renewal that lands after it gave the lease up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GuardRelease {
    /// Not sent, or sent and ended without letting go of the lease (skipped by the unlock
    /// window, refused, failed).
    NotDone,
    /// Sent, not answered yet.
    InFlight,
    /// It let go of the lease (the store released it, or keeps it for a hold period): a renewal
    /// landing after it finds nothing of ours to renew.
    LetGo,
}

impl LeaseState {
    pub(crate) fn new(lease: Lease) -> Arc<Self> {
        Arc::new(LeaseState {
            current: Mutex::new(Current {
                lease,
                lost: None,
                lost_to_shutdown: false,
                given_up: false,
                guard_release: GuardRelease::NotDone,
                parked: None,
            }),
            lost_signal: Notify::new(),
        })
    }

    fn current(&self) -> std::sync::MutexGuard<'_, Current> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn lease(&self) -> Lease {
        self.current().lease.clone()
    }

    pub(crate) fn set_lease(&self, lease: Lease) {
        self.current().lease = lease;
    }

    /// Moves the lease on to `renewed` (an extend's answer), unless it is lost or its local
    /// expiry passed before the answer was read: checked under the lock `is_held` reads, so that
    /// `is_held` never turns `true` again. Gives `renewed` back when it did not take it.
    pub(crate) fn renew_to(&self, renewed: Lease) -> Option<Lease> {
        let mut current = self.current();
        if current.lost.is_some() || Instant::now() >= current.lease.expires_at() {
            return Some(renewed);
        }
        current.lease = renewed;
        None
    }

    /// The library gives up `renewed` (this lease, renewed by an extend answered too late):
    /// `Some` to release now; `None` when the guard's own release let go of the lease already,
    /// or is in flight (the lease is then kept for it: [`Self::end_release`]).
    pub(crate) fn give_up(&self, renewed: Lease) -> Option<Lease> {
        let mut current = self.current();
        match current.guard_release {
            GuardRelease::LetGo => None,
            GuardRelease::InFlight => {
                current.parked = Some(renewed);
                None
            }
            GuardRelease::NotDone => {
                current.given_up = true;
                Some(renewed)
            }
        }
    }

    /// The guard's release is about to be sent: `true` when it should, `false` when the library
    /// already gave the lease up (and released it).
    pub(crate) fn begin_release(&self) -> bool {
        let mut current = self.current();
        if current.given_up {
            return false;
        }
        current.guard_release = GuardRelease::InFlight;
        true
    }

    /// The guard's release ended: `let_go` when it let go of the lease. Otherwise a renewal that
    /// landed meanwhile is given up now: `Some`, to release.
    pub(crate) fn end_release(&self, let_go: bool) -> Option<Lease> {
        let mut current = self.current();
        if let_go {
            current.guard_release = GuardRelease::LetGo;
            current.parked = None;
            return None;
        }
        current.guard_release = GuardRelease::NotDone;
        let parked = current.parked.take();
        current.given_up |= parked.is_some();
        parked
    }

    /// After an extend to `ttl`, first sent at `sent_at`, that failed without saying the lock
    /// is gone: it may have been applied, so the store's expiry may be as early as
    /// `sent_at + ttl`. The local expiry moves there when that is earlier (never later: the
    /// local expiry must not pass the store's).
    pub(crate) fn expire_no_later_than(&self, ttl: Duration, sent_at: Instant) {
        let mut current = self.current();
        let shortened = current.lease.renewed(ttl, sent_at);
        if shortened.expires_at() < current.lease.expires_at() {
            current.lease = shortened;
        }
    }

    /// Not marked lost, and the lease's local expiry has not passed. The expiry counts from when
    /// the lease's request was sent, so it is never later than the store's; past it, with no
    /// renewal that moved it (renewal off, or a process paused past it), the key may be another
    /// holder's already.
    pub(crate) fn is_held(&self) -> bool {
        let current = self.current();
        current.lost.is_none() && Instant::now() < current.lease.expires_at()
    }

    /// Marks the lease lost (first reason wins).
    pub(crate) fn mark_lost(&self, reason: String) {
        self.mark_lost_as(reason, false);
    }

    /// Marks the lease lost because the manager shut down and nothing renews it any more.
    fn mark_shut_down(&self) {
        self.mark_lost_as(SHUT_DOWN.to_owned(), true);
    }

    fn mark_lost_as(&self, reason: String, shut_down: bool) {
        let first = {
            let mut current = self.current();
            let first = current.lost.is_none();
            if first {
                current.lost = Some(reason);
                current.lost_to_shutdown = shut_down;
            }
            first
        };
        if first {
            self.lost_signal.notify_waiters();
        }
    }

    /// Whether the lease was marked lost by its manager's shutdown (see [`Self::mark_lost`]).
    pub(crate) fn lost_to_shutdown(&self) -> bool {
        self.current().lost_to_shutdown
    }

    /// Resolves when the lease is marked lost, with an `ErrorKind::NotHeld` error saying why,
    /// or when its local expiry passes: at once without renewal (`renewed == false`: nothing
    /// moves it), and [`RENEWAL_SILENT`] later with it, which leaves the renewal the time to say
    /// why itself (it gives the lease up at the expiry), and still resolves when the renewal can
    /// no longer run (its runtime gone).
    pub(crate) async fn lost(&self, renewed: bool) -> Error {
        let grace = if renewed {
            RENEWAL_SILENT
        } else {
            Duration::ZERO
        };
        loop {
            // Registered before the check, so a `mark_lost` in between is not missed.
            let signal = self.lost_signal.notified();
            tokio::pin!(signal);
            signal.as_mut().enable();
            let deadline = {
                let current = self.current();
                let key = current.lease.key().as_str();
                if let Some(reason) = &current.lost {
                    return Error::not_held(format!("the lock was lost: {reason}")).with_key(key);
                }
                let deadline = instant_after(current.lease.expires_at(), grace);
                if Instant::now() >= deadline {
                    let why = if renewed {
                        format!(
                            "the lock's lease ran out: its TTL of {:?} passed and its renewal did \
                             not report (its runtime may have shut down); the key may be another \
                             holder's now",
                            current.lease.ttl()
                        )
                    } else {
                        format!(
                            "the lock's lease ran out: its TTL of {:?} passed and nothing renews \
                             it; the key may be another holder's now",
                            current.lease.ttl()
                        )
                    };
                    return Error::not_held(why).with_key(key);
                }
                deadline
            };
            // An `extend` moves the expiry on: the loop then looks again.
            tokio::select! {
                () = &mut signal => {}
                () = tokio::time::sleep_until(deadline) => {}
            }
        }
    }
}

/// A guard's renewal: scheduled, then (if the guard is still held when it is due) a running task.
#[derive(Debug)]
pub(crate) struct Renewer {
    schedule: Arc<Schedule>,
    entry: Arc<Entry>,
}

impl Renewer {
    /// Renews `state`'s lease every `every` (default: a third of its TTL), counted from when each
    /// lease started, while the guard lives: the first renewal is scheduled; its task starts
    /// when it is due. `None` outside a tokio runtime (logged: the lease expires at its TTL).
    pub(crate) fn start(
        handle: &Arc<Handle>,
        state: Arc<LeaseState>,
        every: Option<Duration>,
        scenario: Arc<str>,
    ) -> Option<Self> {
        let lease = state.lease();
        let interval = interval(every, lease.ttl());
        // Counted from when the lease's TTL started (its request was sent), not from now: a
        // slow reply must not push the first renewal past the lease's expiry.
        let due = instant_after(lease.acquired_at(), interval);
        let key = lease.key().clone();
        let entry = Arc::new(Entry {
            phase: Mutex::new(Phase::Done),
            handle: Arc::downgrade(handle),
            state,
            every,
            scenario,
        });
        if !handle.renewals.add(&handle.lifecycle, entry.clone(), due) {
            tracing::warn!(%key, "no tokio runtime to renew on; the lease expires at its TTL");
            return None;
        }
        Some(Renewer {
            schedule: handle.renewals.clone(),
            entry,
        })
    }

    /// Stops the renewal, so the lease state is final: a renewal not yet due is taken off the
    /// schedule (nothing to wait for); a running task is stopped and waited for (an extend in
    /// flight completes and is recorded).
    pub(crate) async fn stop(self) {
        if let Some(task) = self.entry.stop(&self.schedule) {
            task.stop().await;
        }
    }
}

impl Drop for Renewer {
    fn drop(&mut self) {
        // `stop()` not called (guard dropped without a runtime): make sure nothing renews.
        drop(self.entry.stop(&self.schedule));
    }
}

/// One guard's renewal, as the schedule sees it.
#[derive(Debug)]
struct Entry {
    phase: Mutex<Phase>,
    /// Weak: the manager's schedule holds the entry, and the manager holds the schedule.
    handle: Weak<Handle>,
    state: Arc<LeaseState>,
    every: Option<Duration>,
    scenario: Arc<str>,
}

#[derive(Debug)]
enum Phase {
    /// In the schedule, not due yet.
    Scheduled(Place),
    /// Due, and renewing in its own task.
    Running(Task),
    /// Stopped, or never started.
    Done,
}

impl Entry {
    fn phase(&self) -> MutexGuard<'_, Phase> {
        // Each update is one assignment: a panic elsewhere leaves it consistent.
        self.phase.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Ends the renewal: takes it off `schedule` if it was not due yet, and returns its task if
    /// it was running (the caller stops it and waits, or drops it, which aborts it).
    fn stop(&self, schedule: &Schedule) -> Option<Task> {
        let phase = std::mem::replace(&mut *self.phase(), Phase::Done);
        match phase {
            Phase::Scheduled(place) => {
                schedule.remove(place);
                None
            }
            Phase::Running(task) => Some(task),
            Phase::Done => None,
        }
    }
}

impl Due for Entry {
    fn scheduled(&self, place: Place) {
        *self.phase() = Phase::Scheduled(place);
    }

    /// Due: the renewal task starts, its first extend at once, unless the guard stopped it.
    fn start(&self) {
        let mut phase = self.phase();
        if !matches!(*phase, Phase::Scheduled(_)) {
            return;
        }
        let task = self.handle.upgrade().and_then(|handle| {
            Task::start(
                handle,
                self.state.clone(),
                self.every,
                self.scenario.clone(),
                Duration::ZERO,
            )
        });
        if let Some(task) = task {
            *phase = Phase::Running(task);
            return;
        }
        // The runtime is shutting down (a live guard keeps its manager's handle): say so rather
        // than let the guard believe it is renewed.
        *phase = Phase::Done;
        drop(phase);
        let reason = "its renewal could not start (no tokio runtime); the lease expires at its TTL"
            .to_owned();
        match self.handle.upgrade() {
            // Warned, and reported to observers, as every other loss.
            Some(handle) => lose(&handle, &self.state, &self.state.lease(), reason),
            None => {
                tracing::warn!(key = %self.state.lease().key(), %reason, "lock lost");
                self.state.mark_lost(reason);
            }
        }
    }

    fn shut_down(&self) {
        let mut phase = self.phase();
        if matches!(*phase, Phase::Scheduled(_)) {
            *phase = Phase::Done;
            drop(phase);
            self.state.mark_shut_down();
        }
    }
}

/// A guard's running renewal task and the means to stop it.
#[derive(Debug)]
struct Task {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<()>,
}

impl Task {
    /// Starts renewing `state`'s lease: the first extend after `first`, then every `every`
    /// (default: a third of its TTL). `None` outside a runtime.
    fn start(
        handle: Arc<Handle>,
        state: Arc<LeaseState>,
        every: Option<Duration>,
        scenario: Arc<str>,
        first: Duration,
    ) -> Option<Self> {
        let (stop, stopped) = oneshot::channel();
        // Tracked by the lifecycle, and ended by it: a shutdown waits for the task to finish.
        let task = handle.lifecycle.clone().spawn(crate::observe::in_scenario(
            scenario,
            renew(handle, state, every, stopped, first),
        ))?;
        Some(Task {
            stop: Some(stop),
            task,
        })
    }

    /// Stops the task and waits for it.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Task {
    fn drop(&mut self) {
        // `stop()` not called: make sure the task ends.
        if self.stop.is_some() {
            self.task.abort();
        }
    }
}

async fn renew(
    handle: Arc<Handle>,
    state: Arc<LeaseState>,
    every: Option<Duration>,
    mut stopped: oneshot::Receiver<()>,
    first: Duration,
) {
    let mut first = Some(first);
    loop {
        let lease = state.lease();
        let interval = interval(every, lease.ttl());
        // Each renewal is due `interval` after the current lease started (when the last extend
        // was sent), however long its reply took: counted from the reply instead, a slow one
        // would delay every renewal after it, up to past the lease's expiry.
        let due = match first.take() {
            Some(pause) => Instant::now() + pause,
            None => instant_after(lease.acquired_at(), interval),
        };
        tokio::select! {
            _ = &mut stopped => return,
            _ = handle.lifecycle.closing() => {
                // The manager shut down (and, with graceful shutdown, released the lock): the
                // lease is no longer kept alive, so the holder must stop relying on it. Expected,
                // so no `Lost` event and no warning: a deploy is not an incident.
                tracing::debug!(key = %lease.key(), "renewal stopped: the lock manager shut down");
                state.mark_shut_down();
                return;
            }
            _ = tokio::time::sleep_until(due) => {}
        }
        // Extend, retrying transient failures until the lease would have expired.
        loop {
            // The extend must answer before the lease runs out; after that the lock may already
            // be someone else's, so waiting longer would keep `is_held()` true on a lost lock.
            let mut extend = Box::pin({
                let (store, lease) = (handle.store.clone(), lease.clone());
                async move { store.extend(&lease, lease.ttl()).await }
            });
            let attempt = match tokio::time::timeout_at(lease.expires_at(), extend.as_mut()).await {
                Ok(answer) => answer,
                Err(_) => {
                    // Still in flight. If it lands, the lock would live on for a whole TTL under
                    // a guard already reported lost: it is released as soon as it answers,
                    // unless the guard's own release let go of the lease first (the extend then
                    // found nothing of ours, or the release deleted what it renewed). A guard
                    // release skipped by the unlock window, or failed, leaves it to this.
                    let (cleanup, state) = (handle.clone(), state.clone());
                    // Tracked: a shutdown waits for this cleanup. In the renewal's scenario.
                    handle
                        .lifecycle
                        .spawn(crate::observe::keeping_scenario(async move {
                            if let Ok(renewed) = extend.await {
                                if let Some(renewed) = state.give_up(renewed) {
                                    cleanup
                                        .release_given_up(
                                            &renewed,
                                            "a renewal answered after its lease was given up",
                                        )
                                        .await;
                                }
                            }
                        }));
                    Err(
                        Error::in_doubt("no answer to the renewal before the lease expired")
                            .with_key(lease.key().as_str()),
                    )
                }
            };
            match attempt {
                Ok(renewed) => {
                    // Answered, but read only after the lease's local expiry (the process was
                    // paused, or its runtime starved): the guard may have been seen not held
                    // already, and stays lost; the lease renewed for nobody is released.
                    if let Some(late) = state.renew_to(renewed) {
                        if let Some(late) = state.give_up(late) {
                            handle.release_given_up_in_background(
                                late,
                                "a renewal read after its lease expired",
                            );
                        }
                        lose(
                            &handle,
                            &state,
                            &lease,
                            "the renewal's answer was read only after the lease's local expiry \
                             (was the process paused?)"
                                .to_owned(),
                        );
                        return;
                    }
                    handle.observers.emit(|| LockEvent::Renewed {
                        key: lease.key().clone(),
                    });
                    break;
                }
                Err(error) if error.kind() == ErrorKind::NotHeld => {
                    lose(
                        &handle,
                        &state,
                        &lease,
                        format!("renewal found it no longer ours ({})", error.chain()),
                    );
                    return;
                }
                Err(error) => {
                    if Instant::now() >= lease.expires_at() {
                        lose(
                            &handle,
                            &state,
                            &lease,
                            format!(
                                "could not renew before the lease expired ({})",
                                error.chain()
                            ),
                        );
                        return;
                    }
                    tracing::debug!(key = %lease.key(), error = %error.chain(), "renewal failed; retrying");
                    let pause = (interval / 4)
                        .max(MIN_RETRY)
                        .min(lease.remaining().max(MIN_RETRY));
                    tokio::select! {
                        _ = &mut stopped => return,
                        _ = handle.lifecycle.closing() => {
                            // As while it sleeps: a shutdown does not wait for the retries.
                            state.mark_shut_down();
                            return;
                        }
                        _ = tokio::time::sleep(pause) => {}
                    }
                }
            }
        }
    }
}

/// How often a lease of `ttl` is renewed: every `every` as asked, or a third of the TTL. An
/// interval not shorter than the TTL (an extend shortened the lease below the one asked for)
/// could never keep it: a third of the TTL then.
fn interval(every: Option<Duration>, ttl: Duration) -> Duration {
    every.filter(|every| *every < ttl).unwrap_or(ttl / 3)
}

fn lose(handle: &Handle, state: &LeaseState, lease: &Lease, reason: String) {
    tracing::warn!(key = %lease.key(), %reason, "lock lost");
    handle.observers.emit(|| LockEvent::Lost {
        key: lease.key().clone(),
        reason: reason.clone(),
    });
    state.mark_lost(reason);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::{Acquire, BoxStore, Lifecycle, LockKey, LockStore, Observers, OwnerToken};
    use crate::waiters::Waiters;
    use crate::MemoryStore;

    const TTL: Duration = Duration::from_secs(3);
    const EVERY: Duration = Duration::from_secs(1);

    fn handle(store: &MemoryStore) -> Arc<Handle> {
        Arc::new(Handle {
            store: BoxStore::new(store.clone()),
            observers: Observers::default(),
            waiters: Waiters::default(),
            lifecycle: Lifecycle::new(),
            renewals: Arc::default(),
            retry: crate::failover::Retry::new(
                crate::backoff::Backoff::new(Duration::from_millis(10), Duration::from_secs(1)),
                Duration::from_secs(10),
            ),
            layers: crate::scenario::LayerStack::none(),
        })
    }

    /// A lease on `name`, held in `store`.
    async fn held(store: &MemoryStore, name: &str) -> Arc<LeaseState> {
        let key = LockKey::dc("f1", "test", name).unwrap();
        let lease = store
            .try_acquire(&Acquire::new(key, OwnerToken::generate(), TTL))
            .await
            .unwrap();
        LeaseState::new(lease)
    }

    fn renew(handle: &Arc<Handle>, state: &Arc<LeaseState>, every: Duration) -> Renewer {
        Renewer::start(handle, state.clone(), Some(every), Arc::from("default")).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn guards_released_before_their_renewal_is_due_start_no_task() {
        let store = MemoryStore::new();
        let handle = handle(&store);
        let mut states = Vec::new();
        let mut renewers = Vec::new();
        for i in 0..50 {
            let state = held(&store, &format!("k{i}")).await;
            renewers.push(renew(&handle, &state, EVERY));
            let taken = state.lease().expires_at();
            states.push((state, taken));
        }
        assert_eq!(
            handle.lifecycle.in_flight(),
            1,
            "one driver, no task per guard"
        );
        for renewer in renewers {
            renewer.stop().await;
        }
        tokio::time::sleep(EVERY * 2).await;
        assert_eq!(
            handle.lifecycle.in_flight(),
            0,
            "the driver ends with its schedule"
        );
        for (state, taken) in &states {
            assert_eq!(state.lease().expires_at(), *taken, "never extended");
            assert!(state.is_held());
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_due_renewal_runs_and_an_earlier_one_is_not_kept_waiting_behind_a_later() {
        let store = MemoryStore::new();
        let handle = handle(&store);
        let (late, early) = (held(&store, "late").await, held(&store, "early").await);
        let _late = renew(&handle, &late, Duration::from_millis(2500));
        let late_taken_at = late.lease().expires_at();
        // The driver now sleeps until the late entry is due.
        tokio::time::sleep(Duration::from_millis(10)).await;
        let _early = renew(&handle, &early, EVERY);
        let taken_at = early.lease().expires_at();
        tokio::time::sleep(EVERY + Duration::from_millis(100)).await;
        assert!(
            early.lease().expires_at() > taken_at,
            "renewed when due, not at the later entry's time"
        );
        assert_eq!(late.lease().expires_at(), late_taken_at, "not due yet");
        tokio::time::sleep(TTL * 2).await;
        assert!(early.is_held(), "kept alive by its task");
        assert!(late.is_held(), "and the later one by its own");
    }

    /// A renewed lease whose renewal never reports (its runtime gone) is still given up as
    /// lost, a moment after its local expiry.
    #[tokio::test(start_paused = true)]
    async fn lost_resolves_when_a_renewal_stops_reporting() {
        let store = MemoryStore::new();
        let state = held(&store, "silent").await;
        let started = Instant::now();
        let lost = state.lost(true).await.to_string();
        assert_eq!(started.elapsed(), TTL + RENEWAL_SILENT);
        assert!(lost.contains("did not report"), "{lost}");
    }

    #[test]
    fn an_interval_that_could_not_keep_the_lease_falls_back_to_a_third_of_it() {
        let ttl = Duration::from_secs(6);
        assert_eq!(interval(None, ttl), Duration::from_secs(2));
        assert_eq!(
            interval(Some(Duration::from_secs(5)), ttl),
            Duration::from_secs(5)
        );
        // An extend shortened the lease below the interval asked for.
        assert_eq!(
            interval(Some(Duration::from_secs(10)), ttl),
            Duration::from_secs(2)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn renewals_count_from_when_the_lease_started_not_from_a_slow_reply() {
        let store = MemoryStore::new();
        let handle = handle(&store);
        let state = held(&store, "slow").await;
        let expires = state.lease().expires_at();
        // The acquire's reply came late: most of the TTL was gone when the guard was made.
        // Counted from now, the first renewal (every 1 s) would come after the lease expired.
        tokio::time::sleep(TTL - Duration::from_millis(500)).await;
        let _renewer = renew(&handle, &state, EVERY);
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(
            state.lease().expires_at() > expires,
            "renewed at once: the renewal was due a second after the lease started"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(state.is_held());
        let rival = Acquire::new(state.lease().key().clone(), OwnerToken::generate(), TTL);
        assert!(
            store.try_acquire(&rival).await.is_err(),
            "still held in the store past the first lease's expiry"
        );
        // Later renewals follow each renewed lease's start: one per second of paused time.
        let renewed = state.lease().acquired_at();
        tokio::time::sleep(EVERY).await;
        assert!(state.lease().acquired_at() > renewed);
        assert!(state.lease().acquired_at() <= renewed + EVERY);
    }

    #[tokio::test(start_paused = true)]
    async fn a_shutdown_ends_scheduled_renewals_and_says_so() {
        let store = MemoryStore::new();
        let handle = handle(&store);
        let state = held(&store, "a").await;
        let _renewer = renew(&handle, &state, EVERY);
        handle.lifecycle.close();
        handle.lifecycle.wait().await;
        assert!(!state.is_held());
        let lost = state.lost(true).await.to_string();
        assert!(lost.contains("shut down"), "{lost}");
    }
}
