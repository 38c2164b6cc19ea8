//! The queue record of fair waiting: joining the line, looking at it, publishing a grant and its
//! expected hold, leaving; and the fair acquire built on them (see [`crate::waiting`] for the
//! per-process schedule that decides when to look).

use std::time::Duration;

use crate::refused::{Step, Stop};
use aerospike::expressions::{eq, int_bin, int_val};
use aerospike::operations::maps::{self, MapOrder, MapPolicy, MapReturnType, MapWriteFlags};
use aerospike::operations::{self, Operation};
use aerospike::policy::{Expiration, RecordExistsAction};
use aerospike::{as_bin, Bins, Key, ResultCode, Value};
use leasehold_core::{Acquire, Lease, LockKey, ReleaseWatch, Result};
use tokio::time::Instant;

use crate::error::{classify, Class};
use crate::layout::{Record, GRANTED_BIN, HOLD_BIN, LINE_BIN};
use crate::line::Line;
use crate::store::{ttl_seconds, AerospikeStore};
use crate::waiting::{now_us, sampled, us, Left};

/// How often a leave looks again for an entry that may land after it.
const LATE_ENTRY_POLL: Duration = Duration::from_millis(200);

impl AerospikeStore {
    pub(crate) fn queue_key(&self, key: &LockKey) -> Result<Key> {
        self.key_of(key, Record::Queue)
    }

    fn waiter_timeout(&self) -> Duration {
        self.inner.config.waiter_timeout
    }

    /// A place in line: `[ticket, deadline]`, the ticket being now.
    fn place(&self, now: i64) -> Value {
        Value::List(vec![
            Value::Int(now),
            Value::Int(now.saturating_add(us(self.waiter_timeout()))),
        ])
    }

    /// One `operate` on the queue record, which lives 2 × the waiter timeout past its last write.
    /// Every queue write is harmless to repeat, so it is retried whatever happened to it.
    async fn queue_operate(
        &self,
        what: &str,
        key: &LockKey,
        queue_key: &Key,
        ops: &[Operation],
    ) -> Result<aerospike::Record> {
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.expiration = Expiration::Seconds(ttl_seconds(self.waiter_timeout() * 2));
        policy.send_key = self.inner.config.send_key;
        self.retrying(what, key, true, || {
            self.inner.client.operate(&policy, queue_key, ops)
        })
        .await
        .map_err(|e| self.exhausted_or(what, key, e))
    }

    /// Takes a place in line if the process has none (create-only, so a kept place stays where it
    /// is) and reads the line. A kept place that is more than half way to lapsing is refreshed
    /// (one more write, about once per half waiter timeout of waiting).
    async fn enter(&self, req: &Acquire, queue_key: &Key) -> Result<Line> {
        let me = self.inner.waiting.id();
        let join = MapPolicy::new(
            MapOrder::Unordered,
            MapWriteFlags::CREATE_ONLY | MapWriteFlags::NO_FAIL,
        );
        let ops = [
            maps::put(&join, LINE_BIN, Value::from(me), self.place(now_us())),
            operations::get_bin(LINE_BIN),
            operations::get_bin(GRANTED_BIN),
            operations::get_bin(HOLD_BIN),
        ];
        let record = self
            .queue_operate("queue", &req.key, queue_key, &ops)
            .await?;
        let results = record.results.unwrap_or_default();
        let line = Line::parse(results.get(1), results.get(2), results.get(3));
        let now = now_us();
        if let Some(mine) = line.entry(me) {
            if mine.deadline.saturating_sub(now) < us(self.waiter_timeout()) / 2 {
                let refreshed = Value::List(vec![
                    Value::Int(mine.ticket),
                    Value::Int(now.saturating_add(us(self.waiter_timeout()))),
                ]);
                let ops = [maps::put(
                    &MapPolicy::default(),
                    LINE_BIN,
                    Value::from(me),
                    refreshed,
                )];
                self.queue_operate("queue", &req.key, queue_key, &ops)
                    .await?;
            }
        }
        Ok(line)
    }

    /// Reads the line without joining it; an absent record is an empty line.
    pub(crate) async fn peek(&self, req: &Acquire) -> Result<Line> {
        let queue_key = self.queue_key(&req.key)?;
        let queue_key = &queue_key;
        let policy = self.master_read_policy();
        let bins = Bins::Some(vec![
            LINE_BIN.to_owned(),
            GRANTED_BIN.to_owned(),
            HOLD_BIN.to_owned(),
        ]);
        let read = self
            .retrying("queue read", &req.key, true, || {
                self.inner.client.get(&policy, queue_key, bins.clone())
            })
            .await;
        match read {
            Ok(record) => Ok(Line::parse(
                record.bins.get(LINE_BIN),
                record.bins.get(GRANTED_BIN),
                record.bins.get(HOLD_BIN),
            )),
            Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => {
                Ok(Line::default())
            }
            Err(e) => Err(self.exhausted_or("queue read", &req.key, e)),
        }
    }

    /// After a grant to a process in line: it leaves the line, or goes to its end when other tasks
    /// of it still wait; the places `line` showed lapsed are swept (each only if unchanged since,
    /// so a waiter that asked again meanwhile keeps its place); and when and for how long it took
    /// the key is published. Answers the line as it is now (`None` if the write failed: best
    /// effort, a place left behind lapses by the waiter timeout). With `requeue`, the caller
    /// counts the new place as an entry ([`crate::waiting::Waiting::entering`]) before this is
    /// sent; its answer is counted here.
    async fn taken(
        &self,
        req: &Acquire,
        queue_key: &Key,
        line: &Line,
        requeue: bool,
    ) -> Option<Line> {
        let waiting = &self.inner.waiting;
        let me = waiting.id();
        let now = now_us();
        let mut ops: Vec<Operation> = line
            .lapsed(now)
            .filter(|e| e.id != me)
            .map(|e| {
                let exact =
                    |deadline: i64| Value::List(vec![Value::Int(e.ticket), Value::Int(deadline)]);
                maps::remove_by_value_range(
                    LINE_BIN,
                    exact(e.deadline),
                    exact(e.deadline.saturating_add(1)),
                    MapReturnType::NONE,
                )
            })
            .collect();
        ops.push(if requeue {
            maps::put(
                &MapPolicy::default(),
                LINE_BIN,
                Value::from(me),
                self.place(now),
            )
        } else {
            maps::remove_by_key(LINE_BIN, Value::from(me), MapReturnType::NONE)
        });

        ops.push(operations::put(&as_bin!(GRANTED_BIN, now)));
        // Always written, so the line never shows this grant with another process's estimate
        // (a nil removes the bin: no estimate yet).
        let hold = waiting.hold_estimate(req.key.as_str());
        waiting.publish(req.key.as_str(), now, hold);
        ops.push(operations::put(&as_bin!(
            HOLD_BIN,
            hold.map_or(Value::Nil, Value::from)
        )));
        ops.push(operations::get_bin(LINE_BIN));
        let read_at = ops.len() - 1;
        match self.queue_operate("queue", &req.key, queue_key, &ops).await {
            Ok(record) => {
                if requeue {
                    waiting.entered(req.key.as_str());
                }
                let results = record.results.unwrap_or_default();
                Some(Line {
                    granted: Some(now),
                    ..Line::parse(results.get(read_at), None, None)
                })
            }
            Err(error) => {
                tracing::debug!(key = %req.key, error = %error.chain(),
                    "could not update the waiter line after a grant; the place lapses by the waiter timeout");
                None
            }
        }
    }

    /// After a release earlier than the line says (see [`crate::waiting::Waiting::released_early`]): removes the
    /// grant time `granted` from the line, in the background and only while it is still this
    /// process's (a filter on its value: a later holder's grant is never touched), so the head
    /// tries the free lock record at its next look instead of at the estimated release. Lost, it
    /// costs only that wait.
    pub(crate) fn clear_grant(&self, key: LockKey, granted: i64) {
        let store = self.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        runtime.spawn(async move {
            let Ok(queue_key) = store.queue_key(&key) else {
                return;
            };
            let mut policy = store.write_policy(store.inner.config.commit_levels.release);
            policy.record_exists_action = RecordExistsAction::UpdateOnly;
            policy.expiration = Expiration::DontUpdate;
            policy.base_policy.filter_expression =
                Some(eq(int_bin(GRANTED_BIN.to_owned()), int_val(granted)));
            let ops = [operations::put(&as_bin!(GRANTED_BIN, Value::Nil))];
            if let Err(error) = store.inner.client.operate(&policy, &queue_key, &ops).await {
                if !matches!(
                    classify(&error),
                    Class::Server(ResultCode::KeyNotFoundError | ResultCode::FilteredOut)
                ) {
                    tracing::debug!(%key, %error,
                        "could not clear the grant time from the waiter line after an early release");
                }
            }
        });
    }

    /// Gives up this process's place in `key`'s line, in the background. When an entry may
    /// still land (`left.entry_in_flight`: sent on another pooled connection, it can reach the
    /// node after the leave), the place is removed again every 200 ms until one of these looks
    /// removes one, or such an entry would have lapsed (the waiter timeout), or a task of this
    /// process waits on the key again (the place is its own then, and its leave looks again).
    /// A removal delayed past a new waiter's entry can take that waiter's place: it enters
    /// again at the end of the line at its next attempt.
    pub(crate) fn leave_line(&self, key: LockKey, left: Left) {
        let store = self.clone();
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the place lapses by the waiter timeout
        };
        // A shutdown waits for the first leave, not for the looks after it.
        let counted = leasehold_core::undo_started();
        runtime.spawn(async move {
            let Ok(queue_key) = store.queue_key(&key) else {
                return;
            };
            let waiting = &store.inner.waiting;
            let mut policy = store.write_policy(store.inner.config.commit_levels.acquire);
            policy.record_exists_action = RecordExistsAction::UpdateOnly;
            policy.expiration = Expiration::DontUpdate;
            let ops = [maps::remove_by_key(
                LINE_BIN,
                Value::from(waiting.id()),
                MapReturnType::COUNT,
            )];
            let leave = || async {
                match store.inner.client.operate(&policy, &queue_key, &ops).await {
                    Ok(record) => {
                        let removed = record.bins.get(LINE_BIN);
                        matches!(removed, Some(Value::Int(n)) if *n > 0)
                    }
                    Err(error) => {
                        if classify(&error) != Class::Server(ResultCode::KeyNotFoundError) {
                            tracing::debug!(%key, %error,
                                "could not leave the waiter line; the place lapses by the waiter timeout");
                        }
                        false
                    }
                }
            };
            leave().await;
            drop(counted);
            if !left.entry_in_flight {
                return;
            }
            // What the first leave removed may be an earlier place: the entry in flight can land
            // after it all the same.
            let lapsed = Instant::now() + store.waiter_timeout();
            while Instant::now() < lapsed {
                tokio::time::sleep(LATE_ENTRY_POLL).await;
                if waiting.waiters(key.as_str()) > 0 {
                    // The new waiter's leave looks again in turn, whether or not it enters.
                    waiting.entering(key.as_str());
                    return;
                }
                if leave().await {
                    tracing::debug!(%key, "a place in the waiter line that landed after the leave was removed");
                    return;
                }
            }
        });
    }

    /// With fair waiting, `watch` registers the waiter; see [`crate::waiting::Waiting::watch`].
    pub(crate) fn watch_line(&self, key: &LockKey) -> ReleaseWatch {
        let store = self.clone();
        let owned = key.clone();
        self.inner
            .waiting
            .watch(key.as_str().to_owned(), move |left| {
                store.leave_line(owned, left)
            })
    }

    /// The fair exclusive acquire. A try (no deadline) reads the line with its create
    /// ([`Self::try_fair`]). A blocking attempt (with a deadline) takes or keeps the process's
    /// place and reads the line (1 round trip); only with nobody live ahead does it try the lock
    /// record (the create-only write, and the fence step); granted, a process in line leaves it
    /// or goes to its end (1 more). Refused, the refusal says when the line suggests looking
    /// again, and the process's waiters are woken then.
    pub(crate) async fn acquire_fair(&self, req: &Acquire) -> Step<Lease> {
        if req.wait.is_none() {
            return self.try_fair(req).await;
        }
        let queue_key = self.queue_key(&req.key)?;
        let key = req.key.as_str();
        let waiting = &self.inner.waiting;
        let me = waiting.id();
        let cap = self.waiter_timeout() / 3;
        // The head refused by the lock record asks the record again directly, for a while: one
        // round trip per hand-over instead of two.
        let known_head = waiting.head(key, cap);
        // Only a fresh reading is remembered: the process enters again (refreshing its place)
        // at least every `cap`.
        let fresh = known_head.is_none();
        let line = match known_head {
            Some(line) => line,
            None => {
                // Marked before the write: an entry whose reply is lost, or whose caller stops
                // waiting before it (the wait's deadline), may have taken the place, and the
                // wait's end must then leave it; leaving a place never taken changes nothing.
                waiting.entering(key);
                let line = self.enter(req, &queue_key).await?;
                waiting.entered(key);
                line
            }
        };
        let now = now_us();
        let ahead = line.ahead_of(me, now);
        if ahead == 0 && fresh && line.holder_busy(now) && line.granted != waiting.published(key) {
            // The head, with the holder (another process: this one asks, so it holds nothing)
            // mid-hold: it looks again at the expected release, going straight to the lock
            // record then.
            let again_in = line.ask_again_in(0, now, 0, cap);
            waiting.late(key, false);
            waiting.set_head(key, Some(line));
            waiting.attempted(key, true, Some(again_in));
            return Err(Stop::refused_for(again_in));
        }
        if ahead > 0 {
            let again_in = line.look_again_in(ahead, now, 0, cap);
            waiting.late(key, false);
            waiting.attempted(key, true, Some(again_in));
            return Err(Stop::refused_for(again_in));
        }
        match self.acquire_record(req, None).await {
            Ok((lease, _)) => {
                let granted_at = Instant::now();
                waiting.set_head(key, None);
                waiting.late(key, false);
                let requeue = waiting.others_wait(key);
                if requeue {
                    // The update puts a new place, as an entry does: counted before it is sent,
                    // since it can land after the last waiter's leave (`taken` counts the answer).
                    waiting.entering(key);
                }
                let others = line.others(me, now);
                let mut after = if others > 0 {
                    // Others wait (the lease says so whatever else the line holds now): the line
                    // is updated in the background, so the holder starts at once, and the next
                    // head, which tries at this holder's expected release, is not delayed by it.
                    let (store, req, queue_key, read) =
                        (self.clone(), req.clone(), queue_key.clone(), line.clone());
                    tokio::spawn(async move {
                        store.taken(&req, &queue_key, &read, requeue).await;
                    });
                    let mut after = line;
                    if requeue {
                        // This process's new place: behind everyone now in line.
                        if let Some(mine) = after.entries.iter_mut().find(|e| e.id == me) {
                            mine.ticket = i64::MAX;
                        }
                        after.entries.sort_by_key(|e| e.ticket);
                    }
                    after
                } else {
                    // The line read showed nobody else (it may be stale, when the head went
                    // straight to the lock record): the update reads it back, fresh.
                    self.taken(req, &queue_key, &line, requeue)
                        .await
                        .unwrap_or(line)
                };
                let now = now_us();
                let others = after.others(me, now);
                let sample = sampled(others > 0, requeue);
                waiting.granted(key, sample.then_some(granted_at));
                // Back at the end: this process's next waiter looks again when the others ahead
                // should have had their turn (this hold first).
                after.granted = Some(now);
                after.hold = waiting.hold_estimate(key).or(after.hold);
                let again_in =
                    requeue.then(|| after.look_again_in(after.ahead_of(me, now), now, 0, cap));
                waiting.attempted(key, requeue, again_in);
                Ok(lease.with_contended(others > 0))
            }
            Err(Stop::Refused { retry_after }) => {
                let now = now_us();
                let late = waiting.late(key, line.holder_overdue(now));
                let again_in = line.ask_again_in(0, now, late, cap);
                if fresh {
                    waiting.set_head(key, Some(line));
                }
                waiting.attempted(key, true, Some(again_in));
                let again_in = retry_after.map_or(again_in, |left| left.min(again_in));
                Err(Stop::refused_for(again_in))
            }
            Err(e) => {
                waiting.set_head(key, None);
                waiting.attempted(key, true, None);
                Err(e)
            }
        }
    }

    /// A fair try (no deadline): the lock record's create, with the key's line read in the same
    /// request (module `acquire`). The record is ours only if the line shows no live place ahead
    /// of this process's (a try never passes a queued process, and never takes a place itself);
    /// otherwise it is given back at once and the try is refused, with when the line suggests
    /// looking again.
    async fn try_fair(&self, req: &Acquire) -> Step<Lease> {
        let waiting = &self.inner.waiting;
        let (key, me) = (req.key.as_str(), waiting.id());
        let cap = self.waiter_timeout() / 3;
        let rule = |line: &Line| {
            let now = now_us();
            let ahead = line.ahead_of(me, now);
            (ahead > 0).then(|| line.look_again_in(ahead, now, 0, cap))
        };
        let (lease, line) = self.acquire_record(req, Some(&rule)).await?;
        let granted_at = Instant::now();
        let contended = line.is_some_and(|line| line.others(me, now_us()) > 0);
        // A try-lock is no watcher: any watcher is another task.
        let sample = sampled(contended, waiting.waiters(key) > 0);
        waiting.granted(key, sample.then_some(granted_at));
        Ok(lease.with_contended(contended))
    }
}
