//! Read-write locks and semaphores on etcd: what each mode's acquire transaction compares, why a
//! refused one was refused, and the marker a waiting writer leaves.
//!
//! Every reader and permit holder is its own key, `<lock>#holder#<mode>#<token>`, on its own
//! lease (see [`crate::layout`]); so release and extend are the exclusive record's operations on
//! another key, owner-checked by the token in it. One transaction decides every acquisition:
//!
//! | request | compares (all in one `Txn`) |
//! |---|---|
//! | writer (exclusive) | no record; no holder key at all |
//! | reader | no record; no holder of another mode (two key ranges); no writer marker |
//! | permit of N | as a reader, and no permit of its mode created after the count read just before (it found fewer than N) |
//!
//! etcd compares cannot count keys, so a permit request first reads how many permits of its mode
//! are taken (`count_only`, at revision R). Fewer than N: the transaction succeeds only if every
//! key of the mode still has `create_revision <= R` — nobody took a permit since, releases only
//! lowered the count — so at most N are ever held. A request that lost that race reads again
//! (at most [`MAX_ROUNDS`] times).

use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, PutOptions, SortOrder, SortTarget, Txn, TxnOp,
    TxnOpResponse,
};
use leasehold_core::{Acquire, Error, LockMode, Result};
use tokio::time::Instant;

use crate::config::lease_seconds;
use crate::error::{unexpected, Op};
use crate::layout::{
    holder_key, holder_prefix, mode_prefix, other_modes, waiter_prefix, writer_key, writer_prefix,
    Entry,
};
use crate::members::Retry;
use crate::store::EtcdStore;

/// Rounds of "count, then take a permit" before a contended permit request gives up.
pub(crate) const MAX_ROUNDS: usize = 3;

/// The compares and writes of one acquisition, by mode.
pub(crate) struct Rule {
    /// Where the hold is written: the lock record (exclusive) or the holder's own key.
    pub(crate) key: String,
    pub(crate) when: Vec<Compare>,
    /// Writes besides the hold, when it is granted: a writer deletes the writers' markers.
    pub(crate) also: Vec<TxnOp>,
}

impl Rule {
    /// The rule for `req`; `counted` is the revision at which a permit request counted free
    /// permits.
    pub(crate) fn new(req: &Acquire, lock_key: &str, counted: Option<i64>) -> Rule {
        let none = |key: String| Compare::create_revision(key, CompareOp::Equal, 0);
        match req.mode {
            LockMode::Exclusive => Rule {
                key: lock_key.to_owned(),
                when: vec![
                    none(lock_key.to_owned()),
                    none(holder_prefix(lock_key)).with_prefix(),
                ],
                // A writer that gets in clears every marker, as the other stores' writers replace
                // the record that held it: the writers still waiting mark again if readers
                // refuse them later.
                also: vec![TxnOp::delete(
                    writer_prefix(lock_key),
                    Some(DeleteOptions::new().with_prefix().with_prev_key()),
                )],
            },
            mode => {
                let mut when = vec![none(lock_key.to_owned())];
                for (start, end) in other_modes(lock_key, mode) {
                    when.push(Compare::create_revision(start, CompareOp::Equal, 0).with_range(end));
                }
                // A reader stays out while a writer waits; for a semaphore a marker means the
                // key is a read-write lock (a conflict, told apart by `Seen`).
                when.push(none(writer_prefix(lock_key)).with_prefix());
                if let Some(revision) = counted {
                    when.push(
                        Compare::create_revision(
                            mode_prefix(lock_key, mode),
                            CompareOp::Less,
                            revision.saturating_add(1),
                        )
                        .with_prefix(),
                    );
                }
                Rule {
                    key: holder_key(lock_key, mode, req.token.as_str()),
                    when,
                    also: Vec::new(),
                }
            }
        }
    }
}

/// How many reads [`why_refused`] adds to a transaction's else branch for a request of `mode`.
pub(crate) fn refusal_reads(mode: LockMode) -> usize {
    match mode {
        LockMode::Semaphore { .. } => 5,
        _ => 4,
    }
}

/// The one read a plain try (no place in line, not joining it) sends in its `else` branch: whether
/// the record exists. That is the common refusal (another writer holds the key), and it says why
/// alone ([`Seen::held_by_record`]); any other refusal reads [`why_refused`] after it. Every
/// request carries its `else` branch into the Raft log whether it runs or not, and an uncontended
/// acquire never runs it: with leasehold's key names the full reads would be a third of the
/// request's bytes.
pub(crate) fn whether_record(lock_key: &str) -> TxnOp {
    TxnOp::get(lock_key, Some(GetOptions::new().with_count_only()))
}

/// The reads a refused acquisition sends in its `else` branch, to say why: the record, the first
/// holder (its key names the mode), whether a writer waits, the head of the line and, for a
/// permit, how many of its mode are taken. [`Seen::read`] decodes them in this order. Every
/// acquire request carries them, so a request that would never read an answer does not ask: only
/// a permit counts its mode's holders (that count would be an eighth of an exclusive acquire
/// request's bytes).
pub(crate) fn why_refused(lock_key: &str, mode: LockMode) -> Vec<TxnOp> {
    let count = || GetOptions::new().with_prefix().with_count_only();
    let first = || {
        GetOptions::new()
            .with_prefix()
            .with_keys_only()
            .with_limit(1)
    };
    let mut reads = vec![
        TxnOp::get(lock_key, Some(GetOptions::new().with_count_only())),
        TxnOp::get(holder_prefix(lock_key), Some(first())),
        TxnOp::get(writer_prefix(lock_key), Some(count())),
        TxnOp::get(
            waiter_prefix(lock_key),
            Some(first().with_sort(SortTarget::Create, SortOrder::Ascend)),
        ),
    ];
    if refusal_reads(mode) > reads.len() {
        reads.push(TxnOp::get(mode_prefix(lock_key, mode), Some(count())));
    }
    reads
}

/// What a refused acquisition found.
#[derive(Debug)]
pub(crate) struct Seen {
    record: bool,
    /// The mode of the holders, if any.
    holders: Option<LockMode>,
    writer_waiting: bool,
    /// The first waiter key in line, if any.
    pub(crate) head: Option<Vec<u8>>,
    /// Holders of the request's own mode.
    taken: i64,
}

/// Why a refused acquisition was refused.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// Held in a way that excludes the request, or the line is ahead: a refusal.
    Held,
    /// A writer refused by readers (a blocking one leaves its marker).
    ReadersHold,
    /// A permit request found room: another took a permit since its count; count again.
    Room,
    /// The key is held as another kind of lock.
    Conflict(Error),
}

impl Seen {
    /// A refusal by the record alone (see [`whether_record`]): an exclusive holder, so nobody else
    /// holds the key, and nobody holds it as another kind of lock.
    pub(crate) fn held_by_record() -> Seen {
        Seen {
            record: true,
            holders: None,
            writer_waiting: false,
            head: None,
            taken: 0,
        }
    }

    /// Decodes the responses of [`why_refused`], which start at `responses[0]`.
    pub(crate) fn read(
        req: &Acquire,
        store_prefix: &str,
        responses: &[TxnOpResponse],
    ) -> Result<Seen> {
        let expected = refusal_reads(req.mode);
        let gets: Vec<&etcd_client::GetResponse> = responses
            .iter()
            .take(expected)
            .filter_map(|r| match r {
                TxnOpResponse::Get(g) => Some(g),
                _ => None,
            })
            .collect();
        let (record, holder, writers, head, taken) = match gets[..] {
            [record, holder, writers, head] if expected == 4 => (record, holder, writers, head, 0),
            [record, holder, writers, head, taken] => {
                (record, holder, writers, head, taken.count())
            }
            _ => {
                return Err(unexpected(
                    Op::Acquire,
                    req.key.as_str(),
                    "a refusal without its reads",
                ))
            }
        };
        let holders = holder.kvs().first().and_then(|kv| {
            let name = std::str::from_utf8(kv.key()).ok()?;
            match Entry::parse(name.strip_prefix(store_prefix)?)? {
                Entry::Holder(_, mode) => Some(mode),
                _ => None,
            }
        });
        Ok(Seen {
            record: record.count() > 0,
            holders,
            writer_waiting: writers.count() > 0,
            head: head.kvs().first().map(|kv| kv.key().to_vec()),
            taken,
        })
    }

    /// The rules of docs/LOCK_KINDS.md, as the embedded store's record states them.
    pub(crate) fn refusal(&self, req: &Acquire) -> Refusal {
        let conflict = |held: &str| Refusal::Conflict(req.mode.conflict(held, &req.key));
        if self.record {
            return match req.mode {
                LockMode::Semaphore { .. } => conflict("an exclusive lock"),
                _ => Refusal::Held,
            };
        }
        match (req.mode, self.holders) {
            (LockMode::Exclusive, Some(LockMode::Shared)) => return Refusal::ReadersHold,
            (asked, Some(held)) if asked != held => return conflict(&held.to_string()),
            _ => {}
        }
        match req.mode {
            // A waiting writer's marker alone still makes the key a read-write lock.
            LockMode::Semaphore { .. } if self.holders.is_none() && self.writer_waiting => {
                conflict(&LockMode::Shared.to_string())
            }
            LockMode::Semaphore { permits } if self.taken < i64::from(permits) => Refusal::Room,
            _ => Refusal::Held,
        }
    }
}

/// How many permits of `req`'s semaphore are taken, and the revision of that count.
pub(crate) async fn permits_taken(
    store: &EtcdStore,
    req: &Acquire,
    lock_key: &str,
) -> Result<(i64, i64)> {
    let prefix = mode_prefix(lock_key, req.mode);
    let response = store
        .members()
        .run(Retry::Safe, |client| {
            let (prefix, mut kv) = (prefix.clone(), client.kv_client());
            async move {
                kv.get(
                    prefix,
                    Some(GetOptions::new().with_prefix().with_count_only()),
                )
                .await
            }
        })
        .await
        .map_err(|e| store.err(Op::AcquireRead, &req.key, e))?;
    let revision = response.header().map_or(0, |h| h.revision());
    Ok((response.count(), revision))
}

/// Leaves (or renews) the marker of a blocking writer that readers refused:
/// `<lock>#writer#<store id>` (one per waiting process: the manager sends every attempt with a
/// new token) on a lease of its wait left, at most its TTL (whole seconds, rounded up), put only
/// if readers still hold and no record exists. The marker goes when a writer gets in (its acquire
/// deletes every marker), or with its lease: a writer that gave up or crashed keeps readers out
/// no longer.
///
/// `attempt` is the lease the refused attempt granted; when the marker's lease would have the
/// same TTL it is reused (no second grant). Returns whether the marker is, or may be, on it: the
/// caller must then never put a hold on it (a spare lease carries nothing), and leaves it to the
/// marker. Best effort: a marker that could not be put only costs the writer its preference
/// this time.
pub(crate) async fn mark_writer(
    store: &EtcdStore,
    req: &Acquire,
    lock_key: &str,
    attempt: i64,
) -> bool {
    let Some(deadline) = req.deadline() else {
        return false;
    };
    let left = deadline
        .saturating_duration_since(Instant::now())
        .min(req.ttl);
    if left.is_zero() {
        return false;
    }
    let reuse = lease_seconds(left) == lease_seconds(req.ttl);
    let lease = if reuse {
        attempt
    } else {
        match store.grant(&req.key, left).await {
            Ok(id) => id,
            Err(error) => {
                tracing::debug!(key = %req.key, error = %error.chain(), "could not grant a writer marker's lease");
                return false;
            }
        }
    };
    let readers = mode_prefix(lock_key, LockMode::Shared);
    let writer = writer_key(lock_key, store.waiting().id());
    let put = || {
        Txn::new()
            .when([
                Compare::create_revision(lock_key, CompareOp::Equal, 0),
                Compare::create_revision(readers.as_str(), CompareOp::Greater, 0).with_prefix(),
            ])
            .and_then([TxnOp::put(
                writer.as_str(),
                req.token.as_str(),
                Some(PutOptions::new().with_lease(lease).with_prev_key()),
            )])
    };
    match store.txn(Retry::Unsent, put).await {
        Ok(response) if response.succeeded() => {
            if let Some(TxnOpResponse::Put(put)) = response.op_responses().first() {
                if let Some(old) = put.prev_key() {
                    if old.lease() != lease {
                        store.revoke_later(old.lease());
                    }
                }
            }
            reuse
        }
        Ok(_) => {
            // Readers left, or a writer got in: nothing was written.
            if !reuse {
                store.revoke_later(lease);
            }
            false
        }
        Err(failed) => {
            tracing::debug!(key = %req.key, at = %failed.at, error = %failed.error,
                "could not leave a writer marker");
            if !reuse {
                store.revoke_later(lease);
            }
            // A put whose reply was lost may have landed: the attempt's lease may carry the
            // marker, so it is nobody's spare (it lapses at its TTL, or a writer's acquire that
            // deletes the marker revokes it).
            reuse
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use leasehold_core::{ErrorKind, LockKey, OwnerToken};
    use std::time::Duration;

    fn seen(record: bool, holders: Option<LockMode>, writer_waiting: bool, taken: i64) -> Seen {
        Seen {
            record,
            holders,
            writer_waiting,
            head: None,
            taken,
        }
    }

    fn req(mode: LockMode) -> Acquire {
        let key = LockKey::xdc("c", "e").unwrap();
        Acquire::new(key, OwnerToken::generate(), Duration::from_secs(5)).with_mode(mode)
    }

    #[test]
    fn refusals_follow_the_lock_kinds_rules() {
        let sem2 = LockMode::semaphore(2).unwrap();
        let sem3 = LockMode::semaphore(3).unwrap();
        let kind = |r: Refusal| match r {
            Refusal::Conflict(e) => format!("conflict:{:?}", e.kind() == ErrorKind::ModeConflict),
            other => format!("{other:?}"),
        };
        let cases = [
            (LockMode::Exclusive, seen(true, None, false, 0), "Held"),
            (
                LockMode::Exclusive,
                seen(false, Some(LockMode::Shared), false, 0),
                "ReadersHold",
            ),
            (
                LockMode::Exclusive,
                seen(false, Some(sem2), false, 0),
                "conflict:true",
            ),
            (LockMode::Exclusive, seen(false, None, false, 0), "Held"),
            (LockMode::Shared, seen(true, None, false, 0), "Held"),
            (LockMode::Shared, seen(false, None, true, 0), "Held"),
            (
                LockMode::Shared,
                seen(false, Some(sem2), false, 0),
                "conflict:true",
            ),
            (sem2, seen(true, None, false, 0), "conflict:true"),
            (
                sem2,
                seen(false, Some(LockMode::Shared), false, 0),
                "conflict:true",
            ),
            (sem2, seen(false, Some(sem3), false, 0), "conflict:true"),
            (sem2, seen(false, None, true, 0), "conflict:true"),
            (sem2, seen(false, Some(sem2), false, 1), "Room"),
            (sem2, seen(false, Some(sem2), false, 2), "Held"),
        ];
        for (mode, seen, expected) in cases {
            assert_eq!(
                kind(seen.refusal(&req(mode))),
                expected,
                "{mode} on {seen:?}"
            );
        }
    }
}
