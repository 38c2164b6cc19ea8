//! Fencing tokens for exclusive holds: the fence counter record, and the steps that take a token
//! inside the hold — the create (which reads the fence record's generation in the same request)
//! and a generation-checked increment; or, when that check cannot decide, an increment and an
//! owner-filtered write of the token into the lock record.
//!
//! The counter lives only as long as the hold it was last taken for: every increment sets the
//! fence record's TTL to the hold's, and an absent counter starts from the server's clock in
//! microseconds (see [`next_counter`]), so a key nobody holds leaves nothing in the namespace and
//! its next token is still above every earlier one.

use std::sync::LazyLock;
use std::time::Duration;

use aerospike::expressions::{
    and, bin_exists, cond, eq, from_base64, int_bin, int_val, last_update, le, not, num_add,
    num_div, num_mul, since_update, string_bin, string_val, Expression,
};
use aerospike::operations::exp::{write_exp, ExpWriteFlags};
use aerospike::operations::{self, Operation};
use aerospike::policy::{Expiration, GenerationPolicy, RecordExistsAction};
use aerospike::{as_bin, Bins, Key, ResultCode, Value};
use leasehold_core::{Acquire, Error, ErrorKind, Lease, LockKey, Result};
use tokio::time::Instant;

use crate::acquire::{LineRule, Seen};
use crate::error::{classify, left_behind, Cause, Class};
use crate::layout::{Record, COUNTER_BIN, FENCE_BIN, OWNER_BIN, TOKEN_BIN};
use crate::line::Line;
use crate::refused::{Step, Stop};
use crate::retry::Backoff;
use crate::store::{ttl_seconds, AerospikeStore, MAX_TAKEOVERS};

/// How often a failed acquisition looks for its own late-landing create.
const LATE_CREATE_POLL: std::time::Duration = std::time::Duration::from_millis(200);

/// What the creates of one fenced acquisition whose reply was lost left behind.
#[derive(Debug, Default)]
struct Doubt {
    /// The acquisition time (`uat`) of the latest create whose reply was lost, if any.
    uat: Option<i64>,
    /// The acquisition was granted by a create sent after one in doubt, so the record it holds
    /// is not one of theirs.
    granted_by_later_create: bool,
}

impl AerospikeStore {
    pub(crate) fn fence_key(&self, key: &LockKey) -> Result<Key> {
        self.key_of(key, Record::Fence)
    }

    /// The fence step when nothing else wrote the fence record since `generation` was read with
    /// the create: one generation-checked `operate` (the increment, our owner token, read the counter).
    /// `Ok(None)`: the generation changed (another acquisition's fence step came between, or
    /// ours landed in doubt), and the verified steps decide ([`Self::fence_verified`]).
    async fn fence_checked(
        &self,
        req: &Acquire,
        fence_key: &Key,
        generation: u32,
    ) -> Result<Option<u64>> {
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.generation_policy = GenerationPolicy::ExpectGenEqual;
        policy.generation = generation;
        policy.expiration = fence_expiration(req);
        let ops = fence_ops(req);
        // Never sent again after a lost reply: landed, it changed the generation, and a second
        // one would be refused for that; the verified steps take over instead.
        let result = self
            .with_retries("fence", &req.key, || {
                self.inner.client.operate(&policy, fence_key, &ops)
            })
            .await;
        match result {
            Ok(record) => counter(req, &record).map(Some),
            Err(e) => match classify(&e) {
                Class::Server(ResultCode::GenerationError | ResultCode::KeyExistsError)
                | Class::InDoubt => Ok(None),
                _ => Err(self.exhausted_or("fence increment", &req.key, e)),
            },
        }
    }

    /// The fence counter's unconditional increment (from the server's clock when the counter is
    /// absent), retried whatever happened to it: applied twice, it only leaves a gap. It clears
    /// the counter's owner: the token is ours only once the lock record carries it (step 3 of the
    /// verified steps), and the counter is no longer the token of the owner it had — a holder
    /// whose token came from the checked step, which `inspect` would otherwise credit with this
    /// increment (a stale acquirer's, that then fails).
    pub(crate) async fn next_fence(&self, req: &Acquire) -> Result<u64> {
        let fence_key = self.fence_key(&req.key)?;
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.expiration = fence_expiration(req);
        let ops = [
            increment(),
            operations::put(&as_bin!(OWNER_BIN, Value::Nil)),
            operations::get_bin(COUNTER_BIN),
        ];
        let record = self
            .retrying("fence", &req.key, true, || {
                self.inner.client.operate(&policy, &fence_key, &ops)
            })
            .await
            .map_err(|e| self.exhausted_or("fence increment", &req.key, e))?;
        counter(req, &record)
    }

    /// Fencing in hold order, in two round trips: (1) create-only the lock record with the owner
    /// token, reading the fence record's generation in the same request (module `acquire`);
    /// (2) increment the fence counter with a write that expects that generation. Tokens follow
    /// the holds: the increment is applied only if no other acquisition's increment came after
    /// our read, which was after our create; an acquisition whose record was taken over
    /// meanwhile (it expired, or was broken) by one that already incremented is refused by the
    /// generation, and one whose hold outlived its TTL before the answer gives up (its record may
    /// have expired). A changed generation (another acquisition's increment landed between the
    /// read and ours: a hand-over, or a stale acquirer) falls back to the verified steps
    /// ([`Self::fence_verified`]), which prove the hold after the increment with a third.
    ///
    /// With `rule` (a fair try), the line read with the create is judged before the token is
    /// taken: a refusal gives the record back.
    ///
    /// Never reports `InDoubt`: a lost create reply is resolved here by reading the record back,
    /// because a lease recovered elsewhere from the record alone could lack its fencing token.
    /// A create whose reply was lost can still land after the acquisition gave up (a stopped node
    /// applies what it had buffered when it resumes), or after the caller released a lock a
    /// later create granted: such an acquisition watches for it and deletes it (see
    /// [`Self::sweep_late_create`]).
    pub(crate) async fn acquire_fenced(
        &self,
        req: &Acquire,
        rule: Option<LineRule<'_>>,
    ) -> Step<(Lease, Option<Line>)> {
        let mut doubt = Doubt::default();
        let result = self.acquire_fenced_steps(req, rule, &mut doubt).await;
        if let Some(uat) = doubt.uat {
            // A failed acquisition holds nothing, so any record a create in doubt leaves is
            // stray. A granted one holds a record only a later create (a later `uat`) wrote: a
            // create in doubt can still land once that record is gone, after the release. A
            // grant that found a create in doubt's own record is left alone: its record could
            // be the one the sweep looks for.
            if result.is_err() || doubt.granted_by_later_create {
                self.sweep_late_create(req, uat);
            }
        }
        result
    }

    /// [`Self::acquire_fenced`]'s steps; `doubt` says what creates whose reply was lost left.
    async fn acquire_fenced_steps(
        &self,
        req: &Acquire,
        rule: Option<LineRule<'_>>,
        doubt: &mut Doubt,
    ) -> Step<(Lease, Option<Line>)> {
        let record_key = self.record_key(&req.key)?;
        let fence_key = self.fence_key(&req.key)?;
        let queue_key = rule.map(|_| self.queue_key(&req.key)).transpose()?;
        let sent_at = Instant::now();
        // Step 1: the create. A lost reply is read back; if the record is absent the create did
        // not apply (or applied and already expired), so sending it again is a fresh attempt.
        let (mut attempt, mut takeovers) = (1, 0);
        let seen = loop {
            let uat = self.next_uat();
            let (created, seen) = self
                .create_and_read(req, &record_key, uat, queue_key.as_ref(), Some(&fence_key))
                .await;
            let Err(e) = created else {
                doubt.granted_by_later_create = doubt.uat.is_some();
                break seen;
            };
            match classify(&e) {
                Class::Server(ResultCode::KeyExistsError | ResultCode::GenerationError) => {
                    // An earlier create of ours whose reply was lost may have landed meanwhile:
                    // then the record is ours, and the steps go on (verified: nothing was read
                    // with that create).
                    if doubt.uat.is_some()
                        && matches!(self.read_owner(&record_key).await, Ok(Some(owner)) if owner == req.token.as_str())
                    {
                        break Seen::default();
                    }
                    // Held, or a shared record: `writer_meets_record` refuses, or removes a
                    // shared record nobody holds any more so that the create can go again.
                    takeovers += 1;
                    if takeovers > MAX_TAKEOVERS {
                        return Err(Stop::refused());
                    }
                    self.writer_meets_record(req, &record_key).await?;
                }
                Class::InDoubt => {
                    doubt.uat = Some(uat);
                    match self.resolve_create(req, &record_key, e).await {
                        Ok(()) => break Seen::default(),
                        Err(Stop::Failed(e))
                            if e.kind() == ErrorKind::Connection
                                && attempt < self.inner.config.retries =>
                        {
                            tracing::debug!(key = %req.key, attempt, error = %e.chain(), "create again");
                            attempt += 1;
                            tokio::time::sleep(self.inner.config.retry_delay).await;
                        }
                        Err(e) => return Err(e),
                    }
                }
                _ => return Err(self.exhausted_or("acquire", &req.key, e).into()),
            }
        };
        let lease = Lease::new(req.key.clone(), req.token.clone(), req.ttl, sent_at);
        let line = self
            .judge_line(req, &record_key, &lease, rule, seen.line)
            .await?;
        // Step 2: the token, while the record is ours.
        let checked = match seen.fence {
            Some(Ok(generation)) => match self.fence_checked(req, &fence_key, generation).await {
                Ok(fence) => fence,
                Err(e) => return Err(self.abandon(req, "fence increment", e).await.into()),
            },
            _ => None,
        };
        let fence = match checked {
            Some(fence) => {
                if let Some(held) = Self::outlived(req, sent_at) {
                    let error = Error::new(
                        ErrorKind::Timeout,
                        format!(
                            "the lock record's TTL ({} ms) ran out before its fencing token was                              taken ({} ms): it may have expired and been taken since; nothing of                              ours is held; try again, with a TTL longer than two round trips",
                            req.ttl.as_millis(),
                            held.as_millis()
                        ),
                    )
                    .with_key(req.key.as_str());
                    // Not ours for sure any more: given back, and the attempt is refused (the
                    // warning says why).
                    self.abandon(req, "fence increment", error).await;
                    return Err(Stop::refused_for(Duration::ZERO));
                }
                fence
            }
            None => self.fence_verified(req, &record_key, sent_at).await?,
        };
        Ok((lease.with_fencing_token(Some(fence)), line))
    }

    /// The verified fence steps, for when the generation-checked one could not decide: (2)
    /// increment the counter unconditionally, (3) write its value into the lock record,
    /// filtered on the owner token and update-only. Step 3 succeeding proves the record was
    /// still ours after step 2 (only our own create can make a record with our token), so the
    /// increment lies inside our hold. If the record expired or was broken between the steps,
    /// step 3 answers `KEY_NOT_FOUND` / `FILTERED_OUT`: refused, nothing of ours held.
    async fn fence_verified(&self, req: &Acquire, record_key: &Key, sent_at: Instant) -> Step<u64> {
        let fence = match self.next_fence(req).await {
            Ok(fence) => fence,
            Err(e) => return Err(self.abandon(req, "fence increment", e).await.into()),
        };
        let mut policy = self.owned_by(&req.token, self.inner.config.commit_levels.acquire);
        policy.record_exists_action = RecordExistsAction::UpdateOnly;
        policy.expiration = Expiration::DontUpdate;
        let bins = [as_bin!(FENCE_BIN, fence as i64)];
        // Writing the same value twice under the same filter is harmless: retried in doubt too.
        let written = self
            .retrying("fence write", &req.key, true, || {
                self.inner.client.put(&policy, record_key, &bins)
            })
            .await;
        match written {
            Ok(()) => Ok(fence),
            Err(e) => match classify(&e) {
                Class::Server(ResultCode::FilteredOut | ResultCode::KeyNotFoundError) => {
                    tracing::warn!(key = %req.key, elapsed_ms = sent_at.elapsed().as_millis() as u64,
                        error = %Cause(e),
                        "the lock record expired (or was broken) before its fencing token could \
                         be written: nothing of ours is held, the attempt is refused; use a TTL \
                         longer than three round trips");
                    Err(Stop::refused_for(Duration::ZERO))
                }
                _ => {
                    let error = self.exhausted_or("fence write", &req.key, e);
                    Err(self.abandon(req, "fence write", error).await.into())
                }
            },
        }
    }

    /// The create's reply was lost: read the record back to learn whether it landed. Ours: go on
    /// (`Ok`). Anyone else's: refused. Absent: nothing is held, `Connection`.
    async fn resolve_create(
        &self,
        req: &Acquire,
        record_key: &Key,
        lost: aerospike::Error,
    ) -> Step<()> {
        // From the master, whatever the read replica policy: a replica may not have the create yet.
        let policy = self.master_read_policy();
        let bins = Bins::Some(vec![TOKEN_BIN.to_owned()]);
        // A read is harmless to repeat: retried whatever happened to it.
        let read = self
            .retrying("acquire readback", &req.key, true, || {
                self.inner.client.get(&policy, record_key, bins.clone())
            })
            .await;
        match read {
            Ok(record) => match record.bins.get(TOKEN_BIN) {
                Some(Value::String(t)) if t == req.token.as_str() => Ok(()),
                _ => Err(Stop::refused()),
            },
            Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => {
                Err(Error::connection(format!(
                    "the acquire reply from {} was lost and the record is absent: the create did \
                     not apply (or applied and already expired); nothing is held",
                    crate::error::place(self.address(), &lost)
                ))
                .with_key(req.key.as_str())
                .with_source(Cause(lost))
                .into())
            }
            Err(e) => {
                let error = Error::new(
                    ErrorKind::RetriesExhausted,
                    format!(
                        "the acquire reply from {} was lost and reading the record back failed \
                         too: {}",
                        crate::error::place(self.address(), &lost),
                        crate::error::transient_reason(&e)
                    ),
                )
                .with_key(req.key.as_str())
                .with_source(Cause(e));
                Err(self.abandon(req, "acquire", error).await.into())
            }
        }
    }

    /// After a fenced acquisition with a create in doubt (failed, or granted by a later create):
    /// that create may still land. For the retry budget (never past the TTL), the record is read
    /// every 200 ms, and deleted if it appears with our token, without a fencing token and with
    /// an acquisition time (`uat`) no later than the last create in doubt's (a create of ours
    /// that never went on to its fence steps: no acquisition of ours holds it). Our own later
    /// record, while held, is passed over. In the background; one read per 200 ms per such
    /// acquisition, only after an outage.
    pub(crate) fn sweep_late_create(&self, req: &Acquire, uat: i64) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return; // the record, if it lands, expires with its TTL
        };
        let (store, req) = (self.clone(), req.clone());
        runtime.spawn(async move {
            let Ok(record_key) = store.record_key(&req.key) else {
                return;
            };
            let until = Instant::now() + store.inner.config.retry_budget.min(req.ttl);
            let mut policy = store.write_policy(store.inner.config.commit_levels.release);
            // Ours, never fenced, and from one of the creates in doubt (a later acquisition
            // under the same token wrote a later acquisition time).
            policy.base_policy.filter_expression = Some(and(vec![
                eq(
                    string_bin(TOKEN_BIN.to_owned()),
                    string_val(req.token.as_str().to_owned()),
                ),
                not(bin_exists(FENCE_BIN.to_owned())),
                le(
                    int_bin(store.inner.layout.uat_bin().to_owned()),
                    int_val(uat),
                ),
            ]));
            let uat_bin = store.inner.layout.uat_bin();
            let bins = Bins::Some(vec![TOKEN_BIN.to_owned(), uat_bin.to_owned()]);
            let read = store.master_read_policy();
            while Instant::now() < until {
                tokio::time::sleep(LATE_CREATE_POLL).await;
                let late = match store
                    .inner
                    .client
                    .get(&read, &record_key, bins.clone())
                    .await
                {
                    Ok(record) => {
                        matches!(record.bins.get(TOKEN_BIN), Some(Value::String(t)) if t == req.token.as_str())
                            && matches!(record.bins.get(uat_bin), Some(Value::Int(at)) if *at <= uat)
                    }
                    Err(_) => false,
                };
                if !late {
                    continue;
                }
                let mut backoff = Backoff::until(&store.inner.config, until);
                let (deleted, _) = store
                    .retry_with(&mut backoff, "late create", &req.key, true, || {
                        store.inner.client.delete(&policy, &record_key)
                    })
                    .await;
                match deleted {
                    Ok(_) => {
                        tracing::info!(key = %req.key, "a create that landed after its acquisition gave up was deleted")
                    }
                    Err(e) => {
                        tracing::warn!(key = %req.key, error = %e, "a create that landed after its acquisition gave up stays until its TTL")
                    }
                }
                return;
            }
        });
    }

    /// Gives up an acquisition whose create may have landed: deletes our record (owner-filtered,
    /// best effort) and returns an error that is never `InDoubt`, so that no layer recovers a
    /// lease without its fencing token from the record.
    pub(crate) async fn abandon(&self, req: &Acquire, step: &str, error: Error) -> Error {
        let lease = Lease::new(req.key.clone(), req.token.clone(), req.ttl, Instant::now());
        let cleanup = match self.release_once(&lease).await {
            Ok(_) => "the lock record was deleted again: nothing is held".to_owned(),
            Err(e) => format!(
                "deleting the lock record failed too ({}): it blocks the key until its TTL \
                 ({} s) runs out, and is never used",
                e.chain(),
                ttl_seconds(req.ttl)
            ),
        };
        tracing::warn!(key = %req.key, step, error = %error.chain(), "fenced acquisition abandoned");
        Error::new(
            left_behind(error.kind()),
            format!("fenced acquisition abandoned at its {step}; {cleanup}"),
        )
        .with_key(req.key.as_str())
        .with_source(error)
    }
}

/// The fence record's expiration at an increment: the hold's TTL (whole seconds, rounded up),
/// counted from this grant. No holder's token outlives its hold by the counter's absence: a
/// counter taken again after it expired starts from the clock, above every earlier token.
fn fence_expiration(req: &Acquire) -> Expiration {
    Expiration::Seconds(ttl_seconds(req.ttl))
}

/// The counter's next value, computed by the server: the counter plus one, or, when the record
/// (or its counter) is absent, the server's clock in microseconds since 1970 (see
/// [`server_clock_micros`]). Tokens of earlier versions (a counter from 1) stay below it.
fn next_counter() -> Expression {
    cond(vec![
        bin_exists(COUNTER_BIN),
        num_add(vec![int_bin(COUNTER_BIN.to_owned()), int_val(1)]),
        server_clock_micros(),
    ])
}

/// The server's clock in microseconds since 1970, at millisecond resolution, from the record's
/// metadata: its last-update time (`last_update`, nanoseconds since 1970 from the server's
/// millisecond value) plus the milliseconds since then (`since_update`, the server's clock minus
/// that time). The sum is the clock whatever the last-update time is — the previous write's, or
/// 0 for a record this write creates — so it holds for a record that does not exist yet; when
/// the clock is behind the last update, `since_update` is 0 and the sum is the last update.
fn server_clock_micros() -> Expression {
    num_add(vec![
        num_div(vec![last_update(), int_val(1_000)]),
        num_mul(vec![since_update(), int_val(1_000)]),
    ])
}

/// [`next_counter`] in its wire form, packed once: the expression never changes, and the client
/// packs an expression tree anew each time it sends it, twice per command (once to size the
/// buffer, once to write it): about 10 k instructions per fenced acquisition. Packed bytes are
/// written as they are (`from_base64`, as the client documents for pre-serialized
/// expressions). If packing failed, the tree is sent as before.
static NEXT_COUNTER: LazyLock<Expression> = LazyLock::new(|| {
    next_counter()
        .base64()
        .and_then(|packed| from_base64(&packed))
        .unwrap_or_else(|_| next_counter())
});

/// The increment as one expression write of the counter bin.
fn increment() -> Operation {
    write_exp(COUNTER_BIN, NEXT_COUNTER.clone(), ExpWriteFlags::DEFAULT)
}

/// The generation-checked fence step's operations: the increment, record our owner token (what
/// `inspect` matches the counter against), read the counter back.
fn fence_ops(req: &Acquire) -> [Operation; 3] {
    [
        increment(),
        operations::put(&as_bin!(OWNER_BIN, req.token.as_str())),
        operations::get_bin(COUNTER_BIN),
    ]
}

/// The counter value a fence `operate` read back.
fn counter(req: &Acquire, record: &aerospike::Record) -> Result<u64> {
    // Two operations on one bin answer with both results (the write: nil, get: the new value).
    let value = match record.bins.get(COUNTER_BIN) {
        Some(Value::MultiResult(results)) => results.last(),
        other => other,
    };
    match value {
        Some(Value::Int(n)) if *n > 0 => Ok(*n as u64),
        other => Err(
            Error::internal(format!("fence counter read back as {other:?}"))
                .with_key(req.key.as_str()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_increment_is_sent_packed_and_as_the_tree_would_be() {
        let tree = next_counter();
        // Packed, not the fallback: the tree itself compares unequal to its packed bytes.
        assert_ne!(*NEXT_COUNTER, tree);
        assert_eq!(
            NEXT_COUNTER.base64().expect("packed form encodes"),
            tree.base64().expect("tree encodes"),
        );
    }
}
