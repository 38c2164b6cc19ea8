//! One acquisition: a single attempt or the wait loop, in a tracing span, reported to observers
//! (each attempt, and its undo, in `attempt`).

use std::future::Future;
use std::sync::atomic::{fence, Ordering};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;
use tracing::Instrument;

use crate::core::{
    Acquire, Attempt, Error, ErrorKind, Lease, LockEvent, LockStore, OwnerToken, Result, Wait,
};
use crate::failover::{is_store_down, may_have_applied};
use crate::guard::LockGuard;

use crate::handle::Handle;
use crate::scenario::StoreDownPolicy;
use crate::waiters::{FirstWait, Place};

use super::options::Plan;
use super::state::LockManager;

/// Added to a holder's remaining TTL before trying again: the store's clock and ours may differ
/// by a little, and an attempt a hair early only fails again.
const EXPIRY_SLACK: Duration = Duration::from_millis(2);

/// How many in-doubt attempts of one wait are remembered, to recognise one that landed late.
const MAX_IN_DOUBT: usize = 8;

/// What a blocking call knows when it starts waiting: from its first try, or that it made none.
struct BeforeWait {
    /// The store was down at the first try: its error, and one failure so far.
    down: Option<(Error, u32)>,
    /// The first try's token, if it ended in doubt.
    in_doubt: Vec<OwnerToken>,
    /// No try was made: this process has a place in the store's line for the key
    /// ([`LockStore::is_in_line_here`]).
    in_store_line: bool,
    /// How long the first try took to be answered (`None` without a try, or when it failed):
    /// what the store's answers take, for telling a slow answer at the deadline from a store
    /// that stopped answering.
    answered_in: Option<Duration>,
}

impl LockManager {
    /// One acquisition: a single attempt (`wait: None`) or a wait loop, in a tracing span, with
    /// the outcome reported to observers.
    pub(super) async fn execute(&self, plan: Plan, wait: Option<Duration>) -> Result<LockGuard> {
        // An acquisition is one unit of tokio's cooperative budget, as a read from a channel is.
        // The embedded store answers every call at once, so a task that keeps acquiring free keys
        // would otherwise never give its thread back, and a waiter that a release woke on that
        // thread would wait until the task stopped (on a multi-threaded runtime too: a woken task
        // waits in its thread's next-task slot, which other threads do not steal from).
        tokio::task::consume_budget().await;
        crate::observe::in_scenario(plan.scenario.clone(), self.acquire_in_scenario(plan, wait))
            .await
    }

    async fn acquire_in_scenario(&self, plan: Plan, wait: Option<Duration>) -> Result<LockGuard> {
        let handle = &plan.handle;
        let span = tracing::info_span!(
            "leasehold.acquire",
            key = %plan.key,
            store = handle.store.name(),
            scenario = &*plan.scenario,
            mode = if wait.is_some() { "wait" } else { "try" },
            lock_mode = plan.mode.as_str(),
            outcome = tracing::field::Empty,
            attempts = tracing::field::Empty,
        );
        // The clock is read only when the time is needed: a wait's deadline, or the `waited` of
        // an event someone listens to.
        let started = (wait.is_some() || !handle.observers.is_empty()).then(Instant::now);
        let mut attempts = 0u32;
        // Tracked before the lifecycle is read (fenced against the shutdown's close-then-wait):
        // either the shutdown waits for this acquisition or this acquisition sees the shutdown.
        let in_flight = handle.lifecycle.track();
        fence(Ordering::SeqCst);
        let result = if handle.lifecycle.is_closing() {
            Err(Error::shut_down().with_key(plan.key.as_str()))
        } else {
            self.attempts(&plan, wait, started, &mut attempts)
                .instrument(span.clone())
                .await
        };
        drop(in_flight);
        let waited = || started.map_or(Duration::ZERO, |at| at.elapsed());
        span.record("attempts", attempts);
        match result {
            Ok(lease) => {
                span.record("outcome", "acquired");
                handle.observers.emit(|| LockEvent::Acquired {
                    key: lease.key().clone(),
                    token: lease.token().clone(),
                    fencing_token: lease.fencing_token(),
                    waited: waited(),
                    attempts,
                });
                Ok(
                    LockGuard::new(handle.clone(), lease, plan.renew, plan.scenario.clone())
                        .with_hold_at_least(plan.hold_at_least),
                )
            }
            Err(error)
                if plan.on_store_down == StoreDownPolicy::Proceed
                    && is_store_down(error.kind()) =>
            {
                // Fail open, as the scenario says: an alert every time, and a guard holding
                // nothing. A blocking call gets here only once its whole wait was spent retrying
                // the store (a failover is ridden out first); a try-lock at once.
                span.record("outcome", "proceeded_without_lock");
                tracing::warn!(key = %plan.key, scenario = &*plan.scenario, error = %error.chain(),
                    "store down: proceeding WITHOUT the lock (on_store_down = proceed)");
                handle.observers.emit(|| LockEvent::ProceededWithoutLock {
                    key: plan.key.clone(),
                    scenario: plan.scenario.clone(),
                    error: error.kind(),
                });
                let lease =
                    Lease::new(plan.key.clone(), plan.new_token(), plan.ttl, Instant::now());
                Ok(LockGuard::unprotected(handle.clone(), lease, plan.scenario))
            }
            Err(error) => {
                span.record("outcome", error.kind().as_str());
                handle.observers.emit(|| LockEvent::AcquireFailed {
                    key: plan.key.clone(),
                    error: error.kind(),
                    waited: waited(),
                    attempts,
                });
                Err(error)
            }
        }
    }

    async fn attempts(
        &self,
        plan: &Plan,
        wait: Option<Duration>,
        started: Option<Instant>,
        attempts: &mut u32,
    ) -> Result<Lease> {
        let handle = &plan.handle;
        let try_once = || {
            Acquire::new(plan.key.clone(), plan.new_token(), plan.ttl)
                .with_holder(plan.holder)
                .with_mode(plan.mode)
                .with_trace(plan.trace)
                .with_announce(plan.announce)
        };
        *attempts = 1;
        let Some(wait) = wait else {
            return self.try_once(plan, try_once()).await;
        };
        let started = started.unwrap_or_else(Instant::now);
        let deadline = started + wait;
        // A store that is down (a failover: see `crate::failover`) is retried like a refusal,
        // within the same wait: the consecutive failures shape the backoff, and the last error is
        // what the caller gets if the wait runs out while the store is still down.
        let mut down: Option<(Error, u32)> = None;
        // The tokens of this wait's attempts that ended in doubt (each undone in the background):
        // such a write can still land after its undo (held in a paused server or the network), and
        // the lock would then be held for nobody until its TTL. A refusal is checked against them.
        let mut in_doubt: Vec<OwnerToken> = Vec::new();
        // Most locks meet nobody: a first plain try costs what `try_lock` costs, and only a
        // refusal pays for a place in the line and the watch (a subscription, on stores that
        // notify). A try never takes a place in the store's line, so it cannot pass anyone
        // waiting there. When other tasks of this process already wait for the key, the key is
        // theirs first: the call queues behind them at once, unless its holder holds the key
        // already (a reentrant take: queueing behind its own waiters would never end). Should
        // that take turn out fresh after all (the hold ran out meanwhile), it is given back: the
        // next in line may not have asked the store yet.
        //
        // A process that still has a place in the store's line for the key (it kept it after a
        // contended grant: its tasks keep asking) waits for its turn there at once: others are
        // ahead, and a try would only be refused.
        let behind_others = handle.waiters.anyone_waits(&plan.key) && !self.own_places(handle);
        let in_store_line = !behind_others && handle.store.is_in_line_here(&plan.key);
        let skip_try = (behind_others || in_store_line) && !self.is_reentrant(plan);
        let in_store_line = in_store_line && skip_try;
        let mut answered_in = None;
        if skip_try {
            *attempts = 0;
        } else {
            let first = try_once();
            let sent = Instant::now();
            let answer = self.attempt_outside_line(handle, &first).await;
            if answer.is_ok() {
                answered_in = Some(sent.elapsed());
            }
            match answer {
                Ok(Attempt::Refused { .. }) => {}
                Err(e) if is_store_down(e.kind()) => {
                    if may_have_applied(&e) {
                        in_doubt.push(first.token.clone());
                    }
                    down = Some((e, 1));
                }
                Ok(Attempt::Granted(lease)) if behind_others && *lease.token() == first.token => {
                    self.give_back(handle, lease).await;
                }
                Ok(Attempt::Granted(lease)) => return Ok(lease),
                Err(e) => return Err(e),
            }
        }
        // Boxed: only a call that waits pays for the wait's state.
        let before = BeforeWait {
            down,
            in_doubt,
            in_store_line,
            answered_in,
        };
        Box::pin(self.wait(plan, started, deadline, before, attempts)).await
    }

    /// A try: one attempt, unless tasks of this process wait for the key. The key is theirs
    /// first, so a try never passes them: refused at once, with no store I/O, unless its holder
    /// holds the key already (a reentrant take; one that turns out fresh is given back).
    async fn try_once(&self, plan: &Plan, req: Acquire) -> Result<Lease> {
        let handle = &plan.handle;
        if !handle.waiters.anyone_waits(&plan.key) || self.own_places(handle) {
            return self
                .attempt_outside_line(handle, &req)
                .await?
                .into_lease(&plan.key);
        }
        if self.is_reentrant(plan) {
            match self.attempt_outside_line(handle, &req).await? {
                Attempt::Granted(lease) if *lease.token() == req.token => {
                    self.give_back(handle, lease).await
                }
                done => return done.into_lease(&plan.key),
            }
        }
        handle.observers.emit(|| LockEvent::FastFailed {
            key: plan.key.clone(),
        });
        Err(Error::unavailable(&plan.key))
    }

    /// Whether the call's holder holds the key already (a reentrant take, answered by the
    /// stack from memory): such a call may pass this process's waiters, since they wait for it.
    fn is_reentrant(&self, plan: &Plan) -> bool {
        plan.holder
            .is_some_and(|holder| plan.handle.store.is_held_by(&plan.key, holder))
    }

    /// A store that keeps a place per waiter (strict FIFO across the fleet) is asked by every
    /// waiter: a line here would hold them back from taking their places there.
    fn own_places(&self, handle: &Handle) -> bool {
        handle.store.capabilities().waiter_line
    }

    /// The wait after a refused first try (or none, behind others): a place in the line, then the
    /// attempts of its head.
    async fn wait(
        &self,
        plan: &Plan,
        started: Instant,
        deadline: Instant,
        before: BeforeWait,
        attempts: &mut u32,
    ) -> Result<Lease> {
        let BeforeWait {
            mut down,
            mut in_doubt,
            in_store_line,
            answered_in,
        } = before;
        // The slowest answer of this wait so far (see `silent`).
        let mut slowest = answered_in;
        let handle = &plan.handle;
        if down.is_some() {
            // The store is down: its first backoff step before the next attempt, as in the loop
            // (and the try's undo goes out first).
            let pause = self.inner.config.backoff.delay(1);
            tokio::select! {
                _ = handle.lifecycle.closing() => {
                    return Err(Error::shut_down().with_key(plan.key.as_str()))
                }
                _ = tokio::time::sleep_until(deadline.min(Instant::now() + pause)) => {}
            }
        }
        // The first try (or that pause) took the whole wait: nothing is left to wait with.
        if Instant::now() >= deadline {
            return Err(gave_up(plan, down, started, *attempts));
        }
        // The process's line for the key: only its head asks the store, the others wait here for
        // their turn. The place is left when this call ends (served, timed out, failed or
        // cancelled), which makes the next in line the head.
        let mut place = (!self.own_places(handle)).then(|| handle.waiters.join(&plan.key));
        // The store's notification that the lock may be free for this process (a release
        // elsewhere, or this process's turn in the store's waiter queue), registered before the
        // first attempt that waits, by every waiter of the line: the store counts them (a fair
        // store keeps the process in its line while any of them waits).
        // Every store call of the wait ends at its deadline (see `by_deadline`).
        let grace = self.inner.config.backoff.shortest();
        let registering = Instant::now();
        let Some(store) = by_deadline(deadline, grace, handle.store.watch(&plan.key)).await else {
            let cut = Error::connection(
                "the store had not answered the registration for its release notifications when \
                 the wait's deadline came",
            );
            let silent = silent(registering, slowest, grace);
            return Err(gave_up(
                plan,
                after_cut(down, silent, cut, 0),
                started,
                *attempts,
            ));
        };
        slowest = slowest.max(Some(registering.elapsed()));
        // A call in the store's line waits for its word first (below): listened for from the
        // registration on, so a turn given before the wait begins is not missed.
        let early = store.notify().notified();
        tokio::pin!(early);
        if in_store_line {
            early.as_mut().enable();
        }
        // Head at a look of its own: the holder it was to wait for never released (see
        // `await_turn`), so it asks at once.
        let mut unwoken_head = false;
        if let Some(place) = &place {
            unwoken_head = self
                .await_turn(plan, place, deadline)
                .await
                .map_err(|timed_out| {
                    timed_out.unwrap_or_else(|| gave_up(plan, down.take(), started, *attempts))
                })?;
        } else if !store.is_live() {
            // Not in this process's line, but woken by its releases all the same.
            place = Some(handle.waiters.join(&plan.key));
        }
        // A release by a task of this process (see `Handle::release` for which ones) wakes the
        // head: the key may be free, or its lease handed off to it.
        let local = place.as_ref().map(Place::released);
        // The last head was served: asking at once would only be refused (see `FirstWait`).
        let mut first_wait = place
            .as_ref()
            .and_then(Place::first_wait)
            .filter(|_| !unwoken_head);
        // In the store's line already: its word comes when it is this process's turn. Looked at
        // again now that the watch is registered: a turn the store gave before it (the place
        // given up, as nobody here listened) is then seen, and the head asks at once.
        let mut early_armed = first_wait.is_none()
            && !unwoken_head
            && in_store_line
            && handle.store.is_in_line_here(&plan.key);
        if early_armed {
            first_wait = Some(FirstWait::Store);
        }
        // While a task of this process holds the key with a lease granted uncontended (the
        // release count when that was learnt: the head before was served here, or the stack says
        // so after a refusal, `LockStore::is_held_here`), this head waits for that task's
        // release and does not listen to the store: the release wakes it once the store has it
        // (`Handle::release`), and a notification before that (the embedded store's comes from
        // inside the release) would only send an attempt local competition refuses, and cost a
        // second wake-up per hand-over.
        let mut local_holder: Option<u64> = None;
        loop {
            // Enabled before the attempt, so a release between a failed attempt and the sleep is
            // not missed.
            let mut woken = std::pin::pin!(local.map(Notify::notified));
            if let Some(woken) = woken.as_mut().as_pin_mut() {
                woken.enable();
            }
            let notified = store.notify().notified();
            tokio::pin!(notified);
            notified.as_mut().enable();

            if let (Some(seen), Some(place)) = (local_holder, &place) {
                if place.released_since(seen) {
                    local_holder = None;
                }
            }
            let wait_first = match (first_wait.take(), &place) {
                (Some(FirstWait::Store), _) => true,
                // Looked at after `woken` was enabled: a release from now on wakes this head.
                (Some(FirstWait::Release(seen)), Some(place)) if !place.released_since(seen) => {
                    local_holder = Some(seen);
                    true
                }
                _ => local_holder.is_some(),
            };
            let retry_after = if wait_first {
                None
            } else {
                // Read before the attempt: a release after it is then seen (see `local_holder`).
                let releases = place.as_ref().map(Place::releases);
                // Every attempt of this wait is the same waiter (the watch's).
                let req = Acquire::new(plan.key.clone(), plan.new_token(), plan.ttl)
                    .with_holder(plan.holder)
                    .with_wait(Some(Wait::new(deadline, store.waiter())))
                    .with_mode(plan.mode)
                    .with_trace(plan.trace)
                    .with_announce(plan.announce);
                *attempts += 1;
                let sent = Instant::now();
                let Some(answer) = by_deadline(deadline, grace, self.attempt(handle, &req)).await
                else {
                    // Undone like any attempt cut off (see `attempt`).
                    let cut = Error::in_doubt(
                        "the store had not answered the last attempt when the wait's deadline \
                         came; it is undone in the background (an owner-checked release of its \
                         token)",
                    );
                    let silent = silent(sent, slowest, grace);
                    return Err(gave_up(
                        plan,
                        after_cut(down, silent, cut, 1),
                        started,
                        *attempts,
                    ));
                };
                if answer.is_ok() {
                    slowest = slowest.max(Some(sent.elapsed()));
                }
                match answer {
                    Ok(Attempt::Refused { retry_after }) => {
                        down = None;
                        if !in_doubt.is_empty()
                            && by_deadline(deadline, grace, self.undo_late(plan, &mut in_doubt))
                                .await
                                .unwrap_or(false)
                        {
                            // The holder was one of our own attempts that landed late, now
                            // released: ask again at once.
                            continue;
                        }
                        if releases.is_some() && handle.store.is_held_here(&plan.key) {
                            local_holder = releases;
                        }
                        retry_after
                    }
                    Err(e) if is_store_down(e.kind()) => {
                        if may_have_applied(&e) {
                            if in_doubt.len() == MAX_IN_DOUBT {
                                in_doubt.remove(0);
                            }
                            in_doubt.push(req.token.clone());
                        }
                        let failures = down.as_ref().map_or(1, |(_, n)| n + 1);
                        tracing::debug!(key = %plan.key, error = %e.chain(), attempt = *attempts,
                            "the store is down; retrying within the wait");
                        down = Some((e, failures));
                        None
                    }
                    Ok(Attempt::Granted(lease)) => {
                        // The next head need not wait for a shared hold's release: it may share.
                        if let (Some(place), false) = (&place, lease.mode().is_shared_record()) {
                            place.served(lease.is_contended());
                        }
                        return Ok(lease);
                    }
                    Err(e) => return Err(e),
                }
            };
            let now = Instant::now();
            if now >= deadline {
                return Err(gave_up(plan, down, started, *attempts));
            }
            // A store that notifies wakes this waiter when it is its turn, so polling is only the
            // net under a lost notification: the longest backoff step. Without notifications the
            // backoff grows from its shortest step. The holder's remaining TTL (where the store
            // reports it) bounds the wait for a lock nobody releases.
            let backoff = &self.inner.config.backoff;
            let pause = match &down {
                // The store's notifications may be down with it: back off from the shortest step.
                Some((_, failures)) => backoff.delay(*failures),
                None if store.is_live() => backoff.longest(),
                None => backoff.delay(*attempts),
            };
            let mut pause = pause.min(deadline - now);
            if let Some(left) = retry_after {
                pause = pause.min(left + EXPIRY_SLACK);
            }
            // While the store is down its notifications are not trusted to pace the retries (a
            // dropped connection wakes every waiter): the backoff does.
            let store_up = down.is_none();
            tokio::select! {
                // A shutdown first, then a wake-up before the timer: one that comes as the last
                // pause ends is acted on.
                biased;
                _ = handle.lifecycle.closing() => {
                    return Err(Error::shut_down().with_key(plan.key.as_str()))
                }
                _ = async { if let Some(woken) = woken.as_mut().as_pin_mut() { woken.await } }, if local.is_some() => {}
                _ = &mut notified, if store_up && local_holder.is_none() => {}
                _ = &mut early, if early_armed && store_up => {}
                // The net under a lost wake-up: ask, whoever was thought to hold the key.
                _ = tokio::time::sleep(pause) => local_holder = None,
            }
            early_armed = false;
        }
    }

    /// Releases a lease a first try took from under this process's waiters (owner-checked: it is
    /// this call's own token) and wakes the head; in the background if the release fails, or if
    /// the caller stops waiting midway (the stack forgets the lease as its release begins, so
    /// nothing else would release it before its TTL).
    async fn give_back(&self, handle: &Handle, lease: Lease) {
        let mut unfinished = GiveBack {
            handle,
            lease: Some(lease.clone()),
        };
        let released = handle.store.release(&lease).await;
        unfinished.lease = None;
        if !matches!(released, Ok(true)) {
            handle.release_in_background(lease.clone(), "a take given back to the waiters");
        }
        handle.waiters.wake(lease.key());
    }

    /// Waits in this process's line until `place` is its head. `Ok(true)`: it found itself head
    /// at a look of its own, not woken (the release it was to be woken by never came: see
    /// `crate::waiters`). `Err(None)`: the deadline passed first; `Err(Some(_))`: the manager
    /// shut down.
    async fn await_turn(
        &self,
        plan: &Plan,
        place: &Place<'_>,
        deadline: Instant,
    ) -> std::result::Result<bool, Option<Error>> {
        let mut looked = false;
        loop {
            // Enabled before looking, so a change of head in between is not missed.
            let turn = place.turn().notified();
            tokio::pin!(turn);
            turn.as_mut().enable();
            if place.is_head() {
                return Ok(looked);
            }
            // The net under a head made without a wake-up (see `crate::waiters`): a look at the
            // longest backoff step.
            let look = deadline.min(Instant::now() + self.inner.config.backoff.longest());
            tokio::select! {
                _ = turn => looked = false,
                _ = plan.handle.lifecycle.closing() => {
                    return Err(Some(Error::shut_down().with_key(plan.key.as_str())))
                }
                _ = tokio::time::sleep_until(look) => {
                    if look == deadline {
                        return Err(None);
                    }
                    looked = true;
                }
            }
        }
    }
}

/// A take being given back: dropped with the lease still in it (the caller stopped waiting
/// during the release), it releases the lease in the background and wakes the head.
struct GiveBack<'a> {
    handle: &'a Handle,
    lease: Option<Lease>,
}

impl Drop for GiveBack<'_> {
    fn drop(&mut self) {
        if let Some(lease) = self.lease.take() {
            let key = lease.key().clone();
            self.handle
                .release_in_background(lease, "a take given back to the waiters, cancelled");
            self.handle.waiters.wake(&key);
        }
    }
}

/// `call`'s answer, or `None` if it had none in time: a store that stops answering (a hung or
/// paused member, a partition) must not keep the caller past the wait it asked for, as the
/// store's own request timeouts would. A call ends at the wait's deadline, or `grace` after it
/// began if that is later: a look at the deadline, or on a wake-up that came as it passed,
/// still gets a short store round trip. An attempt cut off is undone in the background (an
/// owner-checked release of its token: see `attempt`); a registration cut off is dropped like
/// any other (`LockStore::watch` is cancel safe).
async fn by_deadline<T>(
    deadline: Instant,
    grace: Duration,
    call: impl Future<Output = T>,
) -> Option<T> {
    let end = deadline.max(Instant::now() + grace);
    tokio::time::timeout_at(end, call).await.ok()
}

/// Whether a store call cut off at the wait's deadline, sent at `sent`, says the store stopped
/// answering: it went unanswered for longer than twice the slowest answer of the wait (`None`:
/// none answered yet, so nothing says how long an answer takes) and a backoff step, `grace`. A
/// call begun near the deadline that a slow store (a remote one, a pause) would have answered in
/// its usual time says nothing of the store; nor does one when no answer was timed: failing
/// closed, the wait ends as a timeout, never as "the store is down", which a scenario may
/// proceed without the lock on.
fn silent(sent: Instant, slowest: Option<Duration>, grace: Duration) -> bool {
    slowest.is_some_and(|slowest| sent.elapsed() > slowest.saturating_mul(2).saturating_add(grace))
}

/// What a store call cut off at the deadline (`cut`, the error saying so; `failed`: whether it
/// counts as one more failed attempt) leaves the wait's end with, for [`gave_up`]: the store down
/// if it was already, or if the call was `silent`; else, the key held at the last answer, no
/// store error at all (a timeout: never "the store is down", which a scenario may proceed
/// without the lock on).
fn after_cut(
    down: Option<(Error, u32)>,
    silent: bool,
    cut: Error,
    failed: u32,
) -> Option<(Error, u32)> {
    if down.is_none() && !silent {
        return None;
    }
    let failures = down.as_ref().map_or(0, |(_, n)| *n) + failed;
    Some((cut, failures))
}

/// The error of a wait that ran out: the store's last error if it was down at the end (its kind,
/// and it as the source: a request the deadline cut off is one), else a timeout.
fn gave_up(plan: &Plan, down: Option<(Error, u32)>, started: Instant, attempts: u32) -> Error {
    let waited = started.elapsed();
    if let Some((last, failures)) = down {
        tracing::warn!(key = %plan.key, error = %last.chain(), attempts,
            "the store stayed down for the whole wait");
        let failed = match failures {
            0 => String::new(),
            n => format!(", the last {n} failed on the store"),
        };
        return Error::new(
            last.kind(),
            format!(
                "the store was still down after waiting {waited:?} ({attempts} attempts{failed}); \
                 the last error is the cause"
            ),
        )
        .with_key(plan.key.as_str())
        .with_source(last);
    }
    Error::new(
        ErrorKind::Timeout,
        format!(
            "still held by another owner after waiting {waited:?} ({attempts} attempts); wait \
             longer or inspect the holder"
        ),
    )
    .with_key(plan.key.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn only_a_call_unanswered_far_past_the_usual_answer_says_the_store_is_silent() {
        let grace = Duration::from_millis(10);
        let sent = Instant::now();
        tokio::time::advance(Duration::from_millis(100)).await;
        // Answers took 50 ms: 100 ms unanswered is within twice that and a step.
        assert!(!silent(sent, Some(Duration::from_millis(50)), grace));
        // Answers took 1 ms: 100 ms unanswered is far past them.
        assert!(silent(sent, Some(Duration::from_millis(1)), grace));
        // Nothing answered yet (a waiter behind others, whose first attempt meets the
        // deadline): no evidence either way, so never "silent".
        assert!(!silent(sent, None, grace));
    }
}
