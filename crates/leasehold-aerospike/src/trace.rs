//! The lock trace on Aerospike: a key's history ([`HistoryEntry`]s, newest first) in a record of
//! its own, `<lock set>#trace` / lock id, list bin `lh_trace`, written with one `operate` per
//! entry: list insert at index 0, list trim to the newest `max_entries`, and the record's
//! expiration set to the trace TTL (so the history expires that long after its last write).
//!
//! Why a record of its own: the exclusive lock record is the Java manager's, created by a
//! create-only write and deleted on release, so a history kept in it would vanish with every
//! release; a shared record is deleted when its last holder leaves. One record per key, whatever
//! the mode, keeps one history per key. Why after the operation, not in the same request: the
//! entry depends on the operation's outcome (acquired or refused, released or not held), and
//! Aerospike cannot make one record's write depend on another's outcome in one request. So a
//! traced operation costs one more round trip, sent once its outcome is known; untraced ones cost
//! nothing more. docs/AEROSPIKE.md has the table.
//!
//! A trace write never changes the operation's result: a failed write is logged (warning) and the
//! operation's own outcome (a lease, a release, `NotHeld`) is returned as it was.

use aerospike::operations::lists::{self, ListPolicy};
use aerospike::policy::{CommitLevel, Expiration};
use aerospike::{Bins, Key, ReadPolicy, ResultCode, Value};
use leasehold_core::{
    Acquire, Attempt, Error, ErrorKind, HistoryEntry, HistoryEvent, Lease, LockKey, Result,
    TraceConfig,
};

use crate::error::{classify, map, Class};
use crate::layout::{Record, TRACE_BIN};
use crate::store::{ttl_seconds, AerospikeStore};

impl AerospikeStore {
    /// The Aerospike key of a lock's history record: namespace, `<lock set>#trace`, lock id.
    pub fn trace_key(&self, key: &LockKey) -> Result<Key> {
        self.key_of(key, Record::Trace)
    }

    /// Writes one entry: one `operate` (insert at the front, trim to the newest
    /// `max_entries`, expiration = the trace TTL). Sent again only while surely not sent: a
    /// resent insert could record the entry twice.
    pub(crate) async fn write_trace(
        &self,
        key: &LockKey,
        trace: &TraceConfig,
        entry: &HistoryEntry,
    ) -> Result<()> {
        let trace_key = self.trace_key(key)?;
        // A history entry is not worth waiting for the replicas.
        let mut policy = self.write_policy(CommitLevel::CommitMaster);
        policy.expiration = Expiration::Seconds(ttl_seconds(trace.ttl()));
        policy.send_key = self.inner.config.send_key;
        let ops = [
            lists::insert(
                &ListPolicy::default(),
                TRACE_BIN,
                0,
                Value::from(entry.encode()),
            ),
            lists::trim(TRACE_BIN, 0, i64::from(trace.max_entries())),
        ];
        self.with_retries("trace", key, || {
            self.inner.client.operate(&policy, &trace_key, &ops)
        })
        .await
        .map(|_| ())
        .map_err(|e| self.exhausted_or("trace", key, e))
    }

    /// [`Self::write_trace`] for a traced operation: a failure is logged, never returned.
    async fn record(&self, key: &LockKey, trace: &TraceConfig, entry: HistoryEntry) {
        if let Err(error) = self.write_trace(key, trace, &entry).await {
            tracing::warn!(%key, event = %entry.event, error = %error.chain(),
                "could not write the lock history entry; the lock operation itself is unaffected");
        }
    }

    /// Traces an acquisition's outcome (when `req` is traced): `acquired`, or `refused` /
    /// `waited` when the lock was held. Errors (mode conflicts, store failures) write nothing,
    /// as on Redis. The lease carries the trace setting to its release and renewals.
    pub(crate) async fn trace_acquire(
        &self,
        req: &Acquire,
        result: Result<Attempt>,
    ) -> Result<Attempt> {
        let Some(trace) = &req.trace else {
            return result;
        };
        match &result {
            Ok(Attempt::Granted(_)) => {
                let detail = format!("{} ttl {}ms", req.mode, req.ttl.as_millis());
                let entry = HistoryEntry::new(HistoryEvent::Acquired, &req.token, detail);
                self.record(&req.key, trace, entry).await;
            }
            Ok(Attempt::Refused { .. }) => {
                let event = if req.wait.is_some() {
                    HistoryEvent::Waited
                } else {
                    HistoryEvent::Refused
                };
                let entry = HistoryEntry::new(event, &req.token, "held by another owner");
                self.record(&req.key, trace, entry).await;
            }
            Err(_) => {}
        }
        result.map(|attempt| match attempt {
            Attempt::Granted(lease) => Attempt::Granted(lease.with_trace(req.trace)),
            refused => refused,
        })
    }

    /// Traces a release's outcome (when the lease is traced): `released` or `not_held`; a failed
    /// release writes nothing.
    pub(crate) async fn trace_release(&self, lease: &Lease, result: Result<bool>) -> Result<bool> {
        if let (Some(trace), Ok(released)) = (lease.trace(), &result) {
            let event = if *released {
                HistoryEvent::Released
            } else {
                HistoryEvent::NotHeld
            };
            let entry = HistoryEntry::new(event, lease.token(), "");
            self.record(lease.key(), trace, entry).await;
        }
        result
    }

    /// Traces a renewal that found the lock gone (`lost`); a renewal that worked is not news.
    pub(crate) async fn trace_extend(&self, lease: &Lease, result: Result<Lease>) -> Result<Lease> {
        if let (Some(trace), Err(e)) = (lease.trace(), &result) {
            if e.kind() == ErrorKind::NotHeld {
                let entry = HistoryEntry::new(
                    HistoryEvent::Lost,
                    lease.token(),
                    "expired or taken by another owner before it could be extended",
                );
                self.record(lease.key(), trace, entry).await;
            }
        }
        result
    }

    /// The history of `key`, newest first: one read of the history record (empty when absent
    /// or expired), from the node the read replica policy picks.
    pub(crate) async fn read_history(&self, key: &LockKey) -> Result<Vec<HistoryEntry>> {
        let trace_key = self.trace_key(key)?;
        let mut base_policy = self.base(self.inner.config.retries.saturating_sub(1) as usize);
        base_policy.replica = self.inner.config.read_replica;
        let policy = ReadPolicy { base_policy };
        let bins = Bins::Some(vec![TRACE_BIN.to_owned()]);
        let record = match self.inner.client.get(&policy, &trace_key, bins).await {
            Ok(record) => record,
            Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => {
                return Ok(Vec::new())
            }
            Err(e) => return Err(map("history", key.as_str(), self.address(), e)),
        };
        let items = match record.bins.get(TRACE_BIN) {
            None => return Ok(Vec::new()),
            Some(Value::List(items)) => items,
            Some(other) => return Err(not_a_history(key, other)),
        };
        items
            .iter()
            .map(|item| match item {
                Value::String(stored) => HistoryEntry::decode(stored),
                other => Err(not_a_history(key, other)),
            })
            .collect()
    }
}

fn not_a_history(key: &LockKey, found: &Value) -> Error {
    Error::internal(format!(
        "the history record of {key} holds {found:?} in bin `{TRACE_BIN}`, not a list of \
         history entries; was it written by another program?"
    ))
    .with_key(key.as_str())
}
