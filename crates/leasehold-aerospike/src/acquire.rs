//! The exclusive acquisition: the lock record's create-only write — what decides exclusion, fair
//! or not — sent in one request with the reads its next step needs, so that neither fair waiting
//! nor fencing costs a round trip of its own while nobody waits:
//! - a fair try reads the key's waiter line (its queue record) in the same request, and gives
//!   the record back at once if the line shows another process ahead (a try never passes a
//!   queued process);
//! - a fenced acquisition reads the fence record's generation in the same request, then takes
//!   its token with one generation-checked write of that record (module `fencing`).
//!
//! One request is a batch (`Client::batch`): one message to a node that masters every record of
//! it, parallel messages (one round trip of latency) otherwise. Its rows run in no set order, so
//! what the reads show is what the records held at about the create, which is all either use
//! needs: the line only decides who tries (a place landing alongside is a concurrent arrival), and
//! the fence step's generation check refuses a generation that changed at any point since.

use std::sync::atomic::Ordering;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aerospike::policy::{BatchPolicy, Concurrency, Expiration, RecordExistsAction};
use aerospike::{
    as_bin, operations, BatchOperation, BatchReadPolicy, BatchWritePolicy, Bins, Key, Replica,
    ResultCode,
};
use leasehold_core::{Acquire, Error, Lease, Result};
use tokio::time::Instant;

use crate::error::{classify, left_behind, Class};
use crate::layout::{GRANTED_BIN, HOLD_BIN, LINE_BIN, TOKEN_BIN};
use crate::line::Line;
use crate::refused::{Step, Stop};
use crate::store::{ttl_seconds, AerospikeStore, MAX_TAKEOVERS};

/// What a fair try does with the line read alongside its create: `Some(retry_after)` gives the
/// record back and refuses, saying when the line suggests looking again.
pub(crate) type LineRule<'a> = &'a (dyn Fn(&Line) -> Option<Duration> + Send + Sync);

/// What the acquisition's request read besides creating the lock record.
#[derive(Debug, Default)]
pub(crate) struct Seen {
    /// The key's waiter line (an absent queue record is an empty line), when asked for.
    pub(crate) line: Option<Result<Line, aerospike::Error>>,
    /// The fence record's generation (0: absent), when asked for.
    pub(crate) fence: Option<Result<u32, aerospike::Error>>,
}

/// A created lock record: when the acquisition was sent (the lease's clock), and what was read
/// with the create.
#[derive(Debug)]
pub(crate) struct Created {
    pub(crate) sent_at: Instant,
    pub(crate) seen: Seen,
}

impl AerospikeStore {
    /// The acquisition time the next create writes (`<farmId>##uat`, epoch ms): the clock, but
    /// strictly later than this store's previous one, so that a record can be told apart from
    /// another acquisition's under the same owner token by it (see `sweep_late_create`).
    pub(crate) fn next_uat(&self) -> i64 {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
        let last = &self.inner.last_uat;
        let mut seen = last.load(Ordering::Relaxed);
        loop {
            let next = now.max(seen.saturating_add(1));
            match last.compare_exchange_weak(seen, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return next,
                Err(current) => seen = current,
            }
        }
    }

    /// How the client runs a batch's per-node messages: in parallel (each node's on a task of
    /// its own, rows alone on their node as concurrent single commands), except on a one-node
    /// cluster, where every row shares the one message and a task of its own would only add a
    /// hand-over between threads.
    pub(crate) fn batch_concurrency(&self) -> Concurrency {
        if self.inner.client.nodes().len() == 1 {
            Concurrency::Sequential
        } else {
            Concurrency::Parallel
        }
    }

    fn create_policy(&self, req: &Acquire) -> BatchWritePolicy {
        BatchWritePolicy {
            record_exists_action: RecordExistsAction::CreateOnly,
            expiration: Expiration::Seconds(ttl_seconds(req.ttl)),
            send_key: self.inner.config.send_key,
            commit_level: self.inner.config.commit_levels.acquire,
            ..BatchWritePolicy::default()
        }
    }

    /// The lock record's bins: the Java manager's marker and acquisition time, our owner token.
    fn create_ops(&self, req: &Acquire, uat: i64) -> Vec<operations::Operation> {
        let layout = &self.inner.layout;
        vec![
            operations::put(&as_bin!(layout.data_bin(), 1)),
            operations::put(&as_bin!(layout.uat_bin(), uat)),
            operations::put(&as_bin!(TOKEN_BIN, req.token.as_str())),
        ]
    }

    /// The lock record's create-only write (owner token, the Java manager's bins, expiration =
    /// TTL) with, in the same request, the reads asked for: the key's waiter line from
    /// `queue_key`, the fence record's generation from `fence_key`. Sent again, whole, only while
    /// the create was surely not applied; a read that failed after the create was answered is
    /// returned as failed.
    pub(crate) async fn create_and_read(
        &self,
        req: &Acquire,
        record_key: &Key,
        uat: i64,
        queue_key: Option<&Key>,
        fence_key: Option<&Key>,
    ) -> (Result<(), aerospike::Error>, Seen) {
        if queue_key.is_none() && fence_key.is_none() {
            // Nothing to read: the plain write, the Java manager's request.
            let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
            policy.record_exists_action = RecordExistsAction::CreateOnly;
            policy.expiration = Expiration::Seconds(ttl_seconds(req.ttl));
            policy.send_key = self.inner.config.send_key;
            let layout = &self.inner.layout;
            let bins = [
                as_bin!(layout.data_bin(), 1),
                as_bin!(layout.uat_bin(), uat),
                as_bin!(TOKEN_BIN, req.token.as_str()),
            ];
            let created = self
                .with_retries("acquire", &req.key, || {
                    self.inner.client.put(&policy, record_key, &bins)
                })
                .await;
            return (created, Seen::default());
        }
        let mut base_policy = self.base(0);
        base_policy.replica = Replica::Master;
        let policy = BatchPolicy {
            base_policy,
            concurrency: self.batch_concurrency(),
            ..BatchPolicy::default()
        };
        let create = self.create_policy(req);
        let ops = self.create_ops(req, uat);
        let read = BatchReadPolicy::default();
        let mut backoff = crate::retry::Backoff::attempts(&self.inner.config);
        loop {
            let mut rows = vec![BatchOperation::write(
                &create,
                record_key.clone(),
                ops.clone(),
            )];
            if let Some(queue_key) = queue_key {
                rows.push(BatchOperation::read(
                    &read,
                    queue_key.clone(),
                    Bins::from([LINE_BIN, GRANTED_BIN, HOLD_BIN]),
                ));
            }
            if let Some(fence_key) = fence_key {
                // The header only: the generation is what the fence step checks.
                rows.push(BatchOperation::read(&read, fence_key.clone(), Bins::None));
            }
            let whole = self.inner.client.batch(&policy, &mut rows).await.err();
            let outcome = |row: &BatchOperation| -> Result<(), aerospike::Error> {
                match (row.error(), row.record(), &whole) {
                    (Some(e), _, _) => Err(e.clone()),
                    (None, Some(_), _) => Ok(()),
                    (None, None, Some(e)) => Err(e.clone()),
                    (None, None, None) => Err(aerospike::Error::client_error(
                        "the batch answered nothing for this row",
                    )),
                }
            };
            let created = outcome(&rows[0]);
            if let Err(e) = &created {
                if classify(e) == Class::NotSent && backoff.wait().await {
                    tracing::debug!(key = %req.key, error = %e, "acquire again");
                    continue;
                }
            }
            let mut seen = Seen::default();
            let mut next = 1;
            if queue_key.is_some() {
                let row = &rows[next];
                next += 1;
                seen.line = Some(match outcome(row) {
                    Ok(()) => Ok(row.record().map_or_else(Line::default, |record| {
                        Line::parse(
                            record.bins.get(LINE_BIN),
                            record.bins.get(GRANTED_BIN),
                            record.bins.get(HOLD_BIN),
                        )
                    })),
                    Err(e) if not_found(&e) => Ok(Line::default()),
                    Err(e) => Err(e),
                });
            }
            if fence_key.is_some() {
                let row = &rows[next];
                seen.fence = Some(match outcome(row) {
                    Ok(()) => Ok(row.record().map_or(0, |record| record.generation)),
                    Err(e) if not_found(&e) => Ok(0),
                    Err(e) => Err(e),
                });
            }
            return (created, seen);
        }
    }

    /// Takes the exclusive lock record: the create-only write (again after removing a shared
    /// record nobody holds any more, see `writer_meets_record`), with the fence record's
    /// generation read alongside when fenced, and, with `rule` (a fair try), the key's line,
    /// judged once the record is ours: a refusal gives the record back. Fenced, the token is
    /// taken next (module `fencing`). Returns the lease and the line read, if any.
    pub(crate) async fn acquire_record(
        &self,
        req: &Acquire,
        rule: Option<LineRule<'_>>,
    ) -> Step<(Lease, Option<Line>)> {
        if self.inner.config.fencing {
            return self.acquire_fenced(req, rule).await;
        }
        let record_key = self.record_key(&req.key)?;
        let queue_key = rule.map(|_| self.queue_key(&req.key)).transpose()?;
        let mut takeovers = 0;
        let created = loop {
            let sent_at = Instant::now();
            let (result, seen) = self
                .create_and_read(req, &record_key, self.next_uat(), queue_key.as_ref(), None)
                .await;
            let e = match result {
                Ok(()) => break Created { sent_at, seen },
                Err(e) => e,
            };
            match classify(&e) {
                Class::Server(ResultCode::KeyExistsError | ResultCode::GenerationError)
                    if takeovers < MAX_TAKEOVERS =>
                {
                    takeovers += 1;
                    self.writer_meets_record(req, &record_key).await?;
                }
                Class::Server(ResultCode::KeyExistsError | ResultCode::GenerationError) => {
                    return Err(Stop::refused())
                }
                _ => return Err(self.exhausted_or("acquire", &req.key, e).into()),
            }
        };
        let lease = Lease::new(req.key.clone(), req.token.clone(), req.ttl, created.sent_at);
        let line = self
            .judge_line(req, &record_key, &lease, rule, created.seen.line)
            .await?;
        Ok((lease, line))
    }

    /// A fair try's line, read with its create (or, if that read failed, again on its own), put
    /// to `rule`: a refusal, or a line that cannot be read, gives the record back (owner-checked)
    /// and is the answer.
    pub(crate) async fn judge_line(
        &self,
        req: &Acquire,
        record_key: &Key,
        lease: &Lease,
        rule: Option<LineRule<'_>>,
        read: Option<Result<Line, aerospike::Error>>,
    ) -> Step<Option<Line>> {
        let Some(rule) = rule else {
            return Ok(None);
        };
        let refusal = match read {
            Some(Ok(line)) => match rule(&line) {
                None => return Ok(Some(line)),
                Some(again_in) => Stop::refused_for(again_in),
            },
            _ => match self.peek(req).await {
                Ok(line) => match rule(&line) {
                    None => return Ok(Some(line)),
                    Some(again_in) => Stop::refused_for(again_in),
                },
                Err(e) => Stop::Failed(e),
            },
        };
        // Given back at once: the line's head may be about to try.
        if let Err(e) = self.delete_owned(lease, record_key).await {
            // The record is still ours, and stays until its TTL: said in the error, as a fenced
            // acquisition abandoned midway says it (see `left_behind`).
            tracing::warn!(key = %req.key, error = %e.chain(),
                "could not give back a lock record taken past the waiter line");
            return Err(Stop::Failed(
                Error::new(
                    left_behind(e.kind()),
                    format!(
                        "the lock record was created past the waiter line and could not be \
                         given back: it blocks the key until its TTL ({} s) runs out, and is \
                         never used",
                        ttl_seconds(req.ttl)
                    ),
                )
                .with_key(req.key.as_str())
                .with_source(e),
            ));
        }
        Err(refusal)
    }

    /// How long an acquisition sent at `sent_at` has held its record, when that is already its
    /// whole TTL: the record may have expired (and been taken by someone else) since.
    pub(crate) fn outlived(req: &Acquire, sent_at: Instant) -> Option<Duration> {
        let held = sent_at.elapsed();
        (held >= req.ttl).then_some(held)
    }
}

fn not_found(e: &aerospike::Error) -> bool {
    classify(e) == Class::Server(ResultCode::KeyNotFoundError)
}
