//! Fair waiting on the store side: the acquires that keep a key's waiter queue (exclusive, and
//! readers / permits), and leaving the queue.
//!
//! By default a blocking attempt queues its process (the store's id; local competition orders the
//! tasks inside the process, and a process that takes the lock while more of its tasks wait goes
//! back to the end of the line). In strict FIFO mode it queues its own waiting call
//! (`<store id>#<n>`, see [`Place`]) and is never re-queued: grants follow the fleet-wide order in
//! which calls started waiting.

use std::time::Duration;

use leasehold_core::{Acquire, Attempt, ErrorKind, Lease, LockKey, Result};
use tokio::time::Instant;

use crate::reply::{mode_field, writer_wait_millis};
use crate::scripts::ScriptCall;
use crate::store::RedisStore;
use leasehold_core::ttl_millis;

use crate::waiting::places::Place;

impl RedisStore {
    /// The queue entry `req` asks under, and whether taking the lock puts it back at the end of
    /// the line (default mode only: other tasks of this process still wait on the key). Under
    /// the process's place, once the process's last leave of the key's line is done: sent
    /// after this attempt's join, it would take the new place out.
    async fn queue_place(&self, lock_key: &str, req: &Acquire) -> (Place, bool) {
        let waiting = &self.inner.waiting;
        let strict = self.inner.config.strict_fifo;
        let place = waiting.place(lock_key, req, strict);
        if place == Place::Process {
            if let Some(leaving) = waiting.leaving(lock_key) {
                leaving.await;
            }
        }
        let requeue = !strict && place == Place::Process && waiting.others_wait(lock_key);
        (place, requeue)
    }

    /// Records where an attempt left its entry, and when it renewed the entry's deadline (the
    /// attempt's send time, if it did); an entry queued for a wait that already ended (its watch
    /// dropped while the script ran) is taken out at once.
    fn queued(
        &self,
        key: &LockKey,
        lock_key: &str,
        place: &Place,
        queued: bool,
        renewed: Option<Instant>,
    ) {
        if let Some(orphan) = self
            .inner
            .waiting
            .set_queued(lock_key, place, queued, renewed)
        {
            let _ = self.leave_queue(key.clone(), orphan);
        }
    }

    /// A reader or a semaphore permit: one script, in the fair queue when fair waiting is on.
    pub(crate) async fn acquire_shared(&self, req: &Acquire) -> Result<Attempt> {
        let lock_key = self.lock_key(&req.key);
        let fair = self.inner.config.fair;
        let (place, requeue) = if fair {
            self.queue_place(&lock_key, req).await
        } else {
            (Place::None, false)
        };
        let sent_at = Instant::now();
        let mut conn = self.conn();
        let traced = req.trace.is_some();
        let script = if traced {
            &self.scripts().acquire_shared_traced
        } else {
            &self.scripts().acquire_shared
        };
        let (queue_key, deadlines_key) =
            (self.queue_key(&req.key), self.queue_deadline_key(&req.key));
        let channel = self.inner.waiting.channel(&lock_key);
        let change_channel = self.change_channel_if(&lock_key, req.announce, traced);
        let trace_key = self.trace_key_for(&req.key, req.trace.as_ref());
        let mut call = ScriptCall::announcing(
            script,
            &[&lock_key, &queue_key, &deadlines_key, &channel],
            change_channel.as_deref(),
            trace_key.as_deref(),
        );
        call.arg(req.token.as_str())
            .arg(ttl_millis(req.ttl))
            .arg(mode_field(req.mode))
            .arg(req.mode.permits().unwrap_or(0))
            .arg(self.inner.waiting.entry(&place))
            .arg(self.inner.config.waiter_timeout.as_millis() as u64)
            .optional_args(
                &[u64::from(requeue), u64::from(fair), u64::from(req.announce)],
                traced,
            );
        self.trace_acquire(&mut call, req);
        let dropped = QueuedIfDropped::arm(self, req, &lock_key, &place);
        let answer = call.invoke(&mut conn).await;
        let answer = answer.map_err(|e| self.acquire_err(req, e));
        dropped.answered(&answer);
        let (acquired, left, mine): (i64, u64, u64) = answer?;
        if mine == 1 {
            return Err(self.ran_twice(req));
        }
        let queued = acquired != 1 || requeue;
        // The shared script renews the deadline of every place it leaves queued.
        self.queued(&req.key, &lock_key, &place, queued, Some(sent_at));
        if acquired == 1 {
            return Ok(Lease::granted(req, sent_at).into());
        }
        Ok(Attempt::refused_for(Duration::from_millis(left.max(1))))
    }

    /// The fair acquire script: a blocking attempt (with a deadline) queues its process, or in
    /// strict FIFO mode its own waiting call; a try-lock never passes a queued waiter.
    pub(crate) async fn acquire_fair(&self, req: &Acquire) -> Result<Attempt> {
        let lock_key = self.lock_key(&req.key);
        let (place, requeue) = self.queue_place(&lock_key, req).await;
        // The process's last waiter, in a process that keeps asking for the key: granted while
        // others are in line, the process keeps its place (its next wait then waits for its
        // turn without a try and a join: see `is_in_line_here`), and gives it up if none asks.
        let stay = !requeue
            && place == Place::Process
            && !self.inner.config.strict_fifo
            && self.inner.waiting.asks_again_soon(&lock_key);
        let waiter_timeout = self.inner.config.waiter_timeout;
        // A place kept by a process served again and again is renewed once half the waiter
        // timeout has passed, not at every turn: it then has at least half of it left, more
        // than the manager's retry interval (which must stay below half the waiter timeout),
        // and a wait longer than that renews it by asking again (every refused attempt, the
        // safety-net poll included, renews it).
        let renew =
            (requeue || stay) && self.inner.waiting.place_due(&lock_key, waiter_timeout / 2);
        let sent_at = Instant::now();
        let mut conn = self.conn();
        let traced = req.trace.is_some();
        let script = if traced {
            &self.scripts().acquire_fair_traced
        } else {
            &self.scripts().acquire_fair
        };
        let (fence_key, queue_key) = (self.fence_key(&req.key), self.queue_key(&req.key));
        let deadlines_key = self.queue_deadline_key(&req.key);
        let change_channel = self.change_channel_if(&lock_key, req.announce, traced);
        let trace_key = self.trace_key_for(&req.key, req.trace.as_ref());
        let mut call = ScriptCall::announcing(
            script,
            &[&lock_key, &fence_key, &queue_key, &deadlines_key],
            change_channel.as_deref(),
            trace_key.as_deref(),
        );
        call.arg(req.token.as_str())
            .arg(ttl_millis(req.ttl))
            .arg(self.inner.waiting.entry(&place))
            .arg(waiter_timeout.as_millis() as u64)
            .arg(if self.inner.config.fencing { "1" } else { "0" })
            .optional_args(
                &[
                    match (requeue, stay) {
                        (true, _) => 1,
                        (false, true) => 2,
                        (false, false) => 0,
                    },
                    writer_wait_millis(req, sent_at),
                    u64::from(renew),
                    u64::from(req.announce),
                ],
                traced,
            );
        self.trace_acquire(&mut call, req);
        let dropped = QueuedIfDropped::arm(self, req, &lock_key, &place);
        let answer = call.invoke(&mut conn).await;
        let answer = answer.map_err(|e| self.acquire_err(req, e));
        dropped.answered(&answer);
        let (acquired, value, others): (i64, Option<u64>, Option<u64>) = answer?;
        // Refused, `others` says whether this very token holds: a second run, which left the
        // line untouched.
        if acquired != 1 && others == Some(1) {
            return Err(self.ran_twice(req));
        }
        // A refused blocking attempt always renews its place; a granted one when asked to.
        let renewed = (acquired != 1 || renew).then_some(sent_at);
        let others = others.unwrap_or(0) > 0;
        let kept = acquired == 1 && stay && others;
        self.queued(
            &req.key,
            &lock_key,
            &place,
            acquired != 1 || requeue || kept,
            renewed,
        );
        if acquired == 1 && place == Place::Process {
            self.inner.waiting.granted(&lock_key, sent_at, kept);
        }
        if acquired == 1 {
            return Ok(Lease::granted(req, sent_at)
                .with_fencing_token(value)
                .with_contended(others)
                .into());
        }
        Ok(Attempt::refused_for(Duration::from_millis(
            value.unwrap_or(1),
        )))
    }

    /// Gives up `entry`'s place in `key`'s queue (this process's, or one waiting call's), in the
    /// background: the task doing it (`None` outside a runtime: the place lapses after the
    /// waiter timeout).
    pub(crate) fn leave_queue(
        &self,
        key: LockKey,
        entry: String,
    ) -> Option<tokio::task::JoinHandle<()>> {
        let store = self.clone();
        let runtime = tokio::runtime::Handle::try_current().ok()?;
        Some(leasehold_core::spawn_undo(&runtime, async move {
            let lock_key = store.lock_key(&key);
            let mut conn = store.conn();
            let (queue_key, deadlines_key) =
                (store.queue_key(&key), store.queue_deadline_key(&key));
            let channel = store.inner.waiting.channel(&lock_key);
            let left: redis::RedisResult<i64> = ScriptCall::new(
                &store.scripts().leave_queue,
                &[&queue_key, &lock_key, &channel, &deadlines_key],
                None,
            )
            .arg(&entry)
            .invoke(&mut conn)
            .await;
            if let Err(error) = left {
                // Others are refused behind the place until it lapses: worth an operator's eye.
                tracing::warn!(%key, %error,
                    "could not leave the waiter queue; the place lapses after the waiter timeout");
            }
        }))
    }
}

/// A blocking attempt's place, marked as possibly queued if the attempt is dropped before its
/// answer (its wait's deadline came, or its caller was cancelled), or its answer was lost (in
/// doubt): the script may have queued it, and no answer says so. Marked, the place is left when
/// the wait's watch goes (or at once, for a waiting call's own place whose watch is gone),
/// instead of staying in the line until the waiter timeout, where every other process would be
/// refused behind it, a try on a free key included. Leaving a place that was never taken is a
/// no-op.
struct QueuedIfDropped<'a> {
    armed: Option<(&'a RedisStore, &'a LockKey, &'a str, &'a Place)>,
}

impl<'a> QueuedIfDropped<'a> {
    /// Armed for a blocking attempt that has a place (a try never queues).
    fn arm(store: &'a RedisStore, req: &'a Acquire, lock_key: &'a str, place: &'a Place) -> Self {
        let queues = req.wait.is_some() && *place != Place::None;
        QueuedIfDropped {
            armed: queues.then_some((store, &req.key, lock_key, place)),
        }
    }

    /// The script's answer is in: read, its reader records the place; lost (in doubt), the
    /// place stays marked as possibly queued (see the type's docs), when this guard drops.
    fn answered<T>(mut self, answer: &Result<T>) {
        if !answer
            .as_ref()
            .is_err_and(|e| e.kind() == ErrorKind::InDoubt)
        {
            self.armed = None;
        }
    }
}

impl Drop for QueuedIfDropped<'_> {
    fn drop(&mut self) {
        if let Some((store, key, lock_key, place)) = self.armed.take() {
            store.queued(key, lock_key, place, true, None);
        }
    }
}
