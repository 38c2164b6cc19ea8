//! Acquiring on etcd: the lease, the one transaction that decides (its compares by mode from
//! [`crate::shared`], the fair line's from [`crate::waiting`]), and what a refusal leaves behind
//! (a place in line, a waiting writer's marker).

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, PutResponse, Txn, TxnOp, TxnOpResponse,
};
use leasehold_core::{Acquire, Attempt, Lease, LockKey, LockMode, Result};
use tokio::time::Instant;

use crate::config::lease_seconds;
use crate::error::{unexpected, Op};
use crate::held::HeldLease;
use crate::layout::waiter_prefix;
use crate::members::Retry;
use crate::shared::{self, Refusal, Rule, Seen, MAX_ROUNDS};
use crate::store::EtcdStore;
use crate::waiting::{Place, Spare, Waiting};

impl EtcdStore {
    /// The acquire itself (see `acquire` for cancel safety): a lease, then one transaction;
    /// a blocking attempt that already has a place in line first reads whether it is its turn.
    /// `on_lease` is told the lease the hold goes on as soon as it is chosen (0 before), so that
    /// a caller that stops waiting can revoke it (see `RevokeOnDrop`).
    pub(crate) async fn acquire_once(
        &self,
        req: &Acquire,
        on_lease: &AtomicI64,
    ) -> Result<Attempt> {
        let lock_key = self.lock_key(&req.key);
        let waiting = self.waiting();
        let fair = self.config().fair;
        // A blocking attempt of a process that watches the key waits in line: its first attempt
        // is a plain try (free and nobody waiting), and joins the line if that fails.
        let blocking = fair && req.wait.is_some() && waiting.is_watched(&lock_key);
        let mut place = if blocking {
            waiting.current_place(&lock_key)
        } else {
            None
        };
        if let Some(held) = &place {
            // First in line and the watch saw the hold go: the transaction alone decides, and the
            // read is a round trip less in the hand-over.
            if !waiting.take_turn(&lock_key, held) {
                match self.is_my_turn(&req.key, &lock_key, held).await? {
                    Turn::Mine => {}
                    Turn::NotYet => return Ok(Attempt::refused()),
                    // Forgotten: this attempt joins the line again, as a first attempt does.
                    // If its waiter lease is what went, the join below is refused for it
                    // (`lease_not_found`), and the attempt after it joins on a new one.
                    Turn::Lapsed => place = None,
                }
            }
        }
        let join = match (&place, blocking) {
            (None, true) => match waiting.session().await {
                Ok(session) => Some((Waiting::waiter_key(&lock_key, session), session)),
                Err(error) => {
                    tracing::debug!(key = %req.key, %error,
                        "could not grant the waiter lease; waiting without a place in line");
                    None
                }
            },
            _ => None,
        };
        // The lease the hold goes on, and when its TTL started counting (the hold's lease counts
        // from then: it never claims more time than etcd gives it).
        let mut sent_at = Instant::now();
        let mut lease_id = 0;
        if place.is_some() {
            // Its turn, as far as the read can tell: the lease its refused attempt kept saves a
            // Raft write in the hand-over. It counts from its grant, so it claims no more time
            // than etcd gives it; past a tenth of its TTL a new one is worth the write.
            let seconds = lease_seconds(req.ttl).unwrap_or(0);
            if let Some(spare) = waiting.take_spare(&lock_key, seconds, req.ttl / 10) {
                lease_id = spare.id;
                sent_at = spare.granted_at;
            }
        }
        // Else the lease of an earlier hold of this store, released since (see `crate::spares`):
        // no `LeaseGrant`, so an uncontended cycle is the two transactions alone.
        let mut from_pool = false;
        if lease_id == 0 {
            if let Some(spare) = self.take_spare_lease(req.ttl) {
                (lease_id, sent_at, from_pool) = (spare.id, spare.granted_at, true);
            }
        }
        on_lease.store(lease_id, Ordering::SeqCst);
        // A lease nothing was written on: a refused attempt of a waiter in line keeps it for the
        // next one; any other goes back to the store's spares.
        let set_aside = |lease_id: i64, sent_at: Instant| {
            if lease_id == 0 {
                return;
            }
            // Handed back: a caller that leaves after this must not revoke a lease another hold
            // may take from the spares.
            on_lease.store(0, Ordering::SeqCst);
            let spare = Spare {
                id: lease_id,
                seconds: lease_seconds(req.ttl).unwrap_or(0),
                granted_at: sent_at,
            };
            if blocking {
                waiting.keep_spare(&lock_key, spare);
            } else {
                self.keep_spare_lease(spare);
            }
        };
        for round in 1..=MAX_ROUNDS {
            // A permit counts the taken ones first (etcd compares cannot count): no room, no
            // write — but a blocking request still takes its place in line.
            let counted = match req.mode.permits() {
                Some(permits) => {
                    let (taken, revision) = match shared::permits_taken(self, req, &lock_key).await
                    {
                        Ok(counted) => counted,
                        Err(error) => {
                            set_aside(lease_id, sent_at); // nothing was written on it
                            return Err(error);
                        }
                    };
                    if taken >= i64::from(permits) {
                        set_aside(lease_id, sent_at);
                        if let Some((key, session)) = &join {
                            self.join_line(req, &lock_key, key, *session).await;
                        }
                        return Ok(Attempt::refused());
                    }
                    Some(revision)
                }
                None => None,
            };
            let sent = loop {
                if lease_id == 0 {
                    sent_at = Instant::now();
                    lease_id = self.grant(&req.key, req.ttl).await?;
                    on_lease.store(lease_id, Ordering::SeqCst);
                }
                let txn = || {
                    let rule = Rule::new(req, &lock_key, counted);
                    self.acquire_txn(req, &lock_key, rule, lease_id, place.as_ref(), &join)
                };
                match self.txn(Retry::Unsent, txn).await {
                    Err(e) if from_pool && lease_not_found(&e.error) => {
                        // Refused before it was applied: a spare someone revoked (or the waiter
                        // lease: then the same transaction on a new lease is refused too, and
                        // handled below). A spare that went costs a grant, not a refusal.
                        tracing::debug!(key = %req.key, lease = lease_id, error = %e.error,
                            "a spare lease was gone; granting a new one");
                        self.revoke_later(lease_id);
                        (lease_id, from_pool) = (0, false);
                    }
                    sent => break sent,
                }
            };
            let response = match sent {
                Ok(response) => response,
                Err(e) if lease_not_found(&e.error) => {
                    // Refused before it was applied: a lease it puts on is gone (the waiter
                    // lease lapsed before its keeper noticed, or someone revoked the spare).
                    // Nothing was written; the next attempt, at once, starts afresh.
                    if let Some((_, session)) = &join {
                        waiting.session_lost(*session);
                    }
                    self.revoke_later(lease_id);
                    tracing::debug!(key = %req.key, error = %e.error, "a lease of the attempt was gone");
                    return Ok(Attempt::refused_for(Duration::ZERO));
                }
                Err(e) => {
                    let error = self.err(Op::Acquire, &req.key, e);
                    if !error.is_in_doubt() {
                        self.revoke_later(lease_id);
                    } else if let Some((key, _)) = join {
                        // Its refusal may have put our waiter key in line, on the waiter lease
                        // that outlives this wait: out with the wait, not at the process's end.
                        waiting.maybe_joined(&lock_key, key);
                    }
                    // In doubt: the hold may live on this lease; it expires at its TTL, or the
                    // caller's release (or the readback layer) revokes it.
                    return Err(error);
                }
            };
            let revision = response.header().map_or(0, |h| h.revision());
            let responses = response.op_responses();
            if response.succeeded() {
                return self
                    .granted(
                        req,
                        &lock_key,
                        place.as_ref(),
                        lease_id,
                        sent_at,
                        revision,
                        &responses,
                    )
                    .map(Attempt::Granted);
            }
            if let (Some((key, _)), Some(TxnOpResponse::Put(put))) = (&join, responses.last()) {
                self.took_place(&lock_key, key, put, revision);
            }
            if let Some(place) = place
                .as_ref()
                .filter(|_| place_lapsed(req.mode, &responses))
            {
                // The waiter lease lapsed (etcd unreachable for its TTL, or revoked): the next
                // attempt, at once, joins the line again instead of comparing against a key that
                // is gone — and takes the lock if it is free, as this one could not.
                waiting.forget(&lock_key, place);
                set_aside(lease_id, sent_at);
                return Ok(Attempt::refused_for(Duration::ZERO));
            }
            // With a place, a lost turn (between the read and the transaction) reads again on the
            // next attempt (and rejoins if the waiter lease lapsed).
            let seen = if place.is_none() && join.is_none() {
                self.why_try_refused(req, &lock_key, &responses).await
            } else {
                Seen::read(req, &self.config().prefix, &responses).map(Some)
            };
            let seen = match seen {
                Ok(Some(seen)) => seen,
                // Refused for sure, why unknown: a plain refusal; the next attempt reads again.
                Ok(None) => {
                    set_aside(lease_id, sent_at);
                    return Ok(Attempt::refused());
                }
                Err(error) => {
                    set_aside(lease_id, sent_at); // refused: nothing holds on it
                    return Err(error);
                }
            };
            let line_free = !fair
                || match &place {
                    Some(place) => seen.head.as_deref() == Some(place.key.as_bytes()),
                    None => seen.head.is_none(),
                };
            let refusal = seen.refusal(req);
            let keep = match refusal {
                Refusal::Room if line_free && round < MAX_ROUNDS => continue,
                Refusal::Conflict(error) => {
                    // Refused: nothing was written on it, and this wait is over.
                    on_lease.store(0, Ordering::SeqCst);
                    self.keep_spare_lease(Spare {
                        id: lease_id,
                        seconds: lease_seconds(req.ttl).unwrap_or(0),
                        granted_at: sent_at,
                    });
                    return Err(error);
                }
                // Only the writer whose turn it is marks: one behind others in line must not
                // shut out a reader ahead of it.
                Refusal::ReadersHold if line_free => {
                    shared::mark_writer(self, req, &lock_key, lease_id).await
                }
                _ => false,
            };
            if !keep {
                set_aside(lease_id, sent_at);
            }
            break;
        }
        Ok(Attempt::refused())
    }

    /// The acquire transaction: `rule`'s compares and the line's (fair: nobody waiting, or our
    /// place first in line); then the hold, `rule`'s writes, leaving the line and a count of who
    /// still waits; else the reads that say why it was refused, and joining the line.
    fn acquire_txn(
        &self,
        req: &Acquire,
        lock_key: &str,
        rule: Rule,
        lease_id: i64,
        place: Option<&Place>,
        join: &Option<(String, i64)>,
    ) -> Txn {
        let waiters = waiter_prefix(lock_key);
        let mut when = rule.when;
        let mut then = vec![TxnOp::put(
            rule.key.as_str(),
            req.token.as_str(),
            Some(PutOptions::new().with_lease(lease_id)),
        )];
        then.extend(rule.also);
        match place {
            Some(place) => {
                // Ours is still in line, and every waiter key was created at or after ours.
                when.push(Compare::create_revision(
                    place.key.as_str(),
                    CompareOp::Equal,
                    place.revision,
                ));
                when.push(
                    Compare::create_revision(
                        waiters.as_str(),
                        CompareOp::Greater,
                        place.revision - 1,
                    )
                    .with_prefix(),
                );
                then.push(TxnOp::delete(place.key.as_str(), None));
            }
            None if self.config().fair => {
                // No waiter key at all (an empty range compares as create revision 0).
                when.push(
                    Compare::create_revision(waiters.as_str(), CompareOp::Equal, 0).with_prefix(),
                );
            }
            None => {}
        }
        // Who still waits (the hold is contended). Not asked when the compare above already
        // says nobody does: a range read less in every uncontended fair acquisition.
        if place.is_some() || !self.config().fair {
            then.push(TxnOp::get(
                waiters.as_str(),
                Some(GetOptions::new().with_prefix().with_count_only()),
            ));
        }
        // A plain try asks only whether the record exists (see `shared::whether_record`).
        let mut otherwise = match (place, join) {
            (None, None) => vec![shared::whether_record(lock_key)],
            _ => shared::why_refused(lock_key, req.mode),
        };
        if let Some((key, session)) = join {
            otherwise.push(join_op(self.waiting(), key, *session));
        }
        if let Some(place) = place {
            // Whether our place is still in line: a turn taken on the watch's word alone skips
            // the read that would have seen it lapse (see `place_lapsed`).
            otherwise.push(TxnOp::get(
                place.key.as_str(),
                Some(GetOptions::new().with_count_only()),
            ));
        }
        Txn::new().when(when).and_then(then).or_else(otherwise)
    }

    /// Why a plain try was refused: its record read says so if another writer holds the key;
    /// else one read-only transaction of [`shared::why_refused`]'s reads (no Raft write) tells.
    /// That read comes after the refusal, so it may find the key freed since: a refusal then,
    /// and the caller's next attempt decides. `None` if that read failed: the refusal is certain,
    /// only why is unknown.
    async fn why_try_refused(
        &self,
        req: &Acquire,
        lock_key: &str,
        responses: &[TxnOpResponse],
    ) -> Result<Option<Seen>> {
        if let Some(TxnOpResponse::Get(record)) = responses.first() {
            if record.count() > 0 {
                return Ok(Some(Seen::held_by_record()));
            }
        }
        let reads = shared::why_refused(lock_key, req.mode);
        match self
            .txn(Retry::Safe, || Txn::new().and_then(reads.clone()))
            .await
        {
            Ok(response) => {
                Seen::read(req, &self.config().prefix, &response.op_responses()).map(Some)
            }
            Err(failed) => {
                let error = self.err(Op::AcquireRead, &req.key, failed);
                tracing::debug!(key = %req.key, %error, "could not read why a try was refused");
                Ok(None)
            }
        }
    }

    /// The lease of a granted acquisition; a writer's marker (deleted with it) loses its lease.
    #[allow(clippy::too_many_arguments)]
    fn granted(
        &self,
        req: &Acquire,
        lock_key: &str,
        place: Option<&Place>,
        lease_id: i64,
        sent_at: Instant,
        revision: i64,
        responses: &[TxnOpResponse],
    ) -> Result<Lease> {
        if let Some(place) = place {
            self.waiting().forget(lock_key, place);
        }
        if revision <= 0 {
            // The hold was written, but without its revision there is no fencing token to give:
            // it goes again with its lease, never left held under a token nobody has.
            self.revoke_later(lease_id);
            return Err(unexpected(
                Op::Acquire,
                req.key.as_str(),
                "no revision in its header; the hold it took is being revoked",
            ));
        }
        for response in responses {
            if let TxnOpResponse::Delete(deleted) = response {
                for old in deleted.prev_kvs() {
                    if old.lease() != lease_id {
                        self.revoke_later(old.lease());
                    }
                }
            }
        }
        self.held_leases().insert(
            &req.token,
            HeldLease::new(lease_id, lease_seconds(req.ttl).unwrap_or(0), sent_at),
        );
        // The count of the line, when the transaction asked for it (else nobody waits).
        let others = match responses.last() {
            Some(TxnOpResponse::Get(g)) => g.count(),
            _ => 0,
        };
        // Only writers are fenced: readers and permit holders are many at once by design.
        let fence = match req.mode {
            LockMode::Exclusive => u64::try_from(revision).ok(),
            _ => None,
        };
        Ok(
            Lease::new(req.key.clone(), req.token.clone(), req.ttl, sent_at)
                .with_mode(req.mode)
                .with_fencing_token(fence)
                .with_contended(others > 0),
        )
    }

    /// Takes a place in line without trying (a permit request that found no room).
    async fn join_line(&self, req: &Acquire, lock_key: &str, key: &str, session: i64) {
        let join = || Txn::new().and_then([join_op(self.waiting(), key, session)]);
        match self.txn(Retry::Unsent, join).await {
            Ok(response) => {
                let revision = response.header().map_or(0, |h| h.revision());
                if let Some(TxnOpResponse::Put(put)) = response.op_responses().first() {
                    self.took_place(lock_key, key, put, revision);
                }
            }
            Err(failed) => {
                if lease_not_found(&failed.error) {
                    // The waiter lease went before its keeper noticed: the next join takes a new one.
                    self.waiting().session_lost(session);
                } else {
                    // It may have been put (a lost reply): out with the wait.
                    self.waiting().maybe_joined(lock_key, key.to_owned());
                }
                tracing::debug!(key = %req.key, at = %failed.at, error = %failed.error,
                    "could not join the waiter line; waiting without a place in line");
            }
        }
    }

    /// Records the place a put of our waiter key took (a key that existed keeps its create
    /// revision).
    fn took_place(&self, lock_key: &str, key: &str, put: &PutResponse, revision: i64) {
        let created = put.prev_key().map_or(revision, |p| p.create_revision());
        self.waiting().set_place(
            lock_key,
            Place {
                key: key.to_owned(),
                revision: created,
            },
        );
    }

    /// One read-only transaction (served by etcd without a Raft write): is the record absent and
    /// nobody ahead of our place in line? The waiter keys ahead are remembered, so that the watch
    /// wakes this process only when the last of them leaves (see [`crate::ahead`]). A place whose
    /// key is gone (the waiter lease lapsed) is forgotten, and the attempt joins the line again.
    async fn is_my_turn(&self, key: &LockKey, lock_key: &str, place: &Place) -> Result<Turn> {
        let ([record, ahead, mine], read_at) = self
            .read_ranges_at(
                key,
                Op::AcquireRead,
                [
                    TxnOp::get(lock_key, Some(GetOptions::new().with_count_only())),
                    TxnOp::get(
                        waiter_prefix(lock_key),
                        Some(
                            GetOptions::new()
                                .with_prefix()
                                .with_max_create_revision(place.revision - 1)
                                .with_keys_only(),
                        ),
                    ),
                    TxnOp::get(
                        place.key.as_str(),
                        Some(GetOptions::new().with_count_only()),
                    ),
                ],
            )
            .await?;
        if mine.count() == 0 {
            self.waiting().forget(lock_key, place);
            return Ok(Turn::Lapsed);
        }
        // The range is already cut at our place; the filter also keeps a server that ignores
        // `max_create_revision` (or a place at revision 1, where 0 means "no limit") correct.
        let keys = ahead
            .kvs()
            .iter()
            .filter(|kv| kv.create_revision() < place.revision)
            .map(|kv| kv.key().to_vec());
        let Some(learned) = self.waiting().learn_ahead(lock_key, place, keys, read_at) else {
            return Ok(Turn::NotYet);
        };
        // A release the watch saw after the read makes it worth trying: the transaction decides.
        if learned.first && (record.count() == 0 || learned.hold_gone_since) {
            Ok(Turn::Mine)
        } else {
            Ok(Turn::NotYet)
        }
    }
}

/// etcd refused a request because a lease it names does not exist (nothing was applied).
fn lease_not_found(error: &etcd_client::Error) -> bool {
    matches!(error, etcd_client::Error::GRpcStatus(status)
        if status.code() == tonic::Code::NotFound && status.message().contains("lease not found"))
}

/// What a read of the line says of a place in it.
enum Turn {
    /// First in line, and the lock may be free: worth a transaction.
    Mine,
    /// Someone is ahead, or the lock is held.
    NotYet,
    /// The place is gone (its waiter lease lapsed, or was revoked) and is forgotten.
    Lapsed,
}

/// Whether a refused attempt of `mode` with a place in line found its waiter key gone (the read
/// after [`shared::why_refused`]'s).
fn place_lapsed(mode: LockMode, responses: &[TxnOpResponse]) -> bool {
    matches!(responses.get(shared::refusal_reads(mode)), Some(TxnOpResponse::Get(mine)) if mine.count() == 0)
}

/// Puts our waiter key in a lock's line, on the waiter lease.
fn join_op(waiting: &Waiting, key: &str, session: i64) -> TxnOp {
    TxnOp::put(
        key,
        waiting.id(),
        Some(PutOptions::new().with_lease(session).with_prev_key()),
    )
}
