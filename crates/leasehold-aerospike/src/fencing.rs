//! Fencing tokens for exclusive holds: the fence counter record and the three steps that take a
//! token inside the hold (create-only, increment, owner-filtered write of the token).

use aerospike::expressions::{and, bin_exists, eq, not, string_bin, string_val};
use aerospike::policy::{Expiration, RecordExistsAction};
use aerospike::{as_bin, operations, Bins, Key, ReadPolicy, Replica, ResultCode, Value};
use leasehold_core::{Acquire, Error, ErrorKind, Lease, LockKey, Result};
use tokio::time::Instant;

use crate::error::{classify, Cause, Class};
use crate::layout::{fence_set, COUNTER_BIN, FENCE_BIN, TOKEN_BIN};
use crate::retry::Backoff;
use crate::store::{ttl_seconds, AerospikeStore, MAX_TAKEOVERS};

/// How often a failed acquisition looks for its own late-landing create.
const LATE_CREATE_POLL: std::time::Duration = std::time::Duration::from_millis(200);

impl AerospikeStore {
    fn fence_key(&self, key: &LockKey) -> Result<Key> {
        let set = fence_set(&self.inner.layout.lock_set(key)?);
        Key::new(
            self.inner.config.namespace.clone(),
            set,
            Value::from(key.lock_id()),
        )
        .map_err(|e| Error::invalid_argument("cannot build the fence key").with_source(e))
    }

    pub(crate) async fn next_fence(&self, key: &LockKey) -> Result<u64> {
        let fence_key = self.fence_key(key)?;
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.expiration = Expiration::Never;
        let ops = [
            operations::add(&as_bin!(COUNTER_BIN, 1)),
            operations::get_bin(COUNTER_BIN),
        ];
        let record = self
            .retrying("fence", key, true, || {
                self.inner.client.operate(&policy, &fence_key, &ops)
            })
            .await
            .map_err(|e| self.exhausted_or("fence increment", key, e))?;
        // Two operations on one bin answer with both results (add: nil, get: the new value).
        let value = match record.bins.get(COUNTER_BIN) {
            Some(Value::MultiResult(results)) => results.last(),
            other => other,
        };
        match value {
            Some(Value::Int(n)) if *n > 0 => Ok(*n as u64),
            other => Err(
                Error::internal(format!("fence counter read back as {other:?}"))
                    .with_key(key.as_str()),
            ),
        }
    }

    /// Fencing in hold order: (1) create-only the lock record with the owner token, (2) increment
    /// the key's fence counter, (3) write the counter's value into the lock record, filtered on the
    /// owner token and update-only. The increment happens while the record is ours, and the
    /// filtered write proves it still was afterwards, so a holder's token is taken inside its own
    /// hold: tokens grow in the order of the holds. An acquisition that loses the record between
    /// the steps fails and leaves nothing of ours held.
    ///
    /// Never reports `InDoubt`: a lost create reply is resolved here by reading the record back,
    /// because a lease recovered elsewhere from the record alone could lack its fencing token.
    /// A create whose reply was lost can still land after the acquisition gave up (a stopped node
    /// applies what it had buffered when it resumes): a failed acquisition that sent one watches
    /// for it and deletes it (see [`Self::sweep_late_create`]).
    pub(crate) async fn acquire_fenced(&self, req: &Acquire) -> Result<Lease> {
        let mut doubted = false;
        let result = self.acquire_fenced_steps(req, &mut doubted).await;
        if doubted && result.is_err() {
            self.sweep_late_create(req);
        }
        result
    }

    /// [`Self::acquire_fenced`]'s steps; `doubted` is set once a create's reply was lost.
    async fn acquire_fenced_steps(&self, req: &Acquire, doubted: &mut bool) -> Result<Lease> {
        let record_key = self.record_key(&req.key)?;
        let sent_at = Instant::now();
        // Step 1: the create. A lost reply is read back; if the record is absent the create did
        // not apply (or applied and already expired), so sending it again is a fresh attempt.
        let (mut attempt, mut takeovers) = (1, 0);
        loop {
            let Err(e) = self.create(req, &record_key).await else {
                break;
            };
            match classify(&e) {
                Class::Server(ResultCode::KeyExistsError | ResultCode::GenerationError) => {
                    // An earlier create of ours whose reply was lost may have landed meanwhile:
                    // then the record is ours, and the steps go on.
                    if *doubted
                        && matches!(self.read_owner(&record_key).await, Ok(Some(owner)) if owner == req.token.as_str())
                    {
                        break;
                    }
                    // Held, or a shared record: `writer_meets_record` refuses, or removes a
                    // shared record nobody holds any more so that the create can go again.
                    takeovers += 1;
                    if takeovers > MAX_TAKEOVERS {
                        return Err(Error::unavailable(&req.key));
                    }
                    self.writer_meets_record(req, &record_key).await?;
                }
                Class::InDoubt => {
                    *doubted = true;
                    match self.resolve_create(req, &record_key, e).await {
                        Ok(()) => break,
                        Err(e)
                            if e.kind() == ErrorKind::Connection
                                && attempt < self.inner.config.retries =>
                        {
                            tracing::debug!(key = %req.key, attempt, error = %e, "create again");
                            attempt += 1;
                            tokio::time::sleep(self.inner.config.retry_delay).await;
                        }
                        Err(e) => return Err(e),
                    }
                }
                _ => return Err(self.exhausted_or("acquire", &req.key, e)),
            }
        }
        // Step 2: the increment, while the record is ours.
        let fence = match self.next_fence(&req.key).await {
            Ok(fence) => fence,
            Err(e) => return Err(self.abandon(req, "fence increment", e).await),
        };
        // Step 3: the token into our record — only if it is still ours.
        let mut policy = self.owned_by(&req.token, self.inner.config.commit_levels.acquire);
        policy.record_exists_action = RecordExistsAction::UpdateOnly;
        policy.expiration = Expiration::DontUpdate;
        let bins = [as_bin!(FENCE_BIN, fence as i64)];
        // Writing the same value twice under the same filter is harmless: retried in doubt too.
        let written = self
            .retrying("fence write", &req.key, true, || {
                self.inner.client.put(&policy, &record_key, &bins)
            })
            .await;
        match written {
            Ok(()) => Ok(
                Lease::new(req.key.clone(), req.token.clone(), req.ttl, sent_at)
                    .with_fencing_token(Some(fence)),
            ),
            Err(e) => match classify(&e) {
                Class::Server(ResultCode::FilteredOut | ResultCode::KeyNotFoundError) => {
                    Err(Error::new(
                        ErrorKind::LockUnavailable,
                        format!(
                            "the lock record expired (or was broken) before its fencing token \
                             could be written, after {} ms: nothing of ours is held; try again, \
                             with a TTL longer than three round trips",
                            sent_at.elapsed().as_millis()
                        ),
                    )
                    .with_key(req.key.as_str())
                    .with_source(Cause(e)))
                }
                _ => {
                    let error = self.exhausted_or("fence write", &req.key, e);
                    Err(self.abandon(req, "fence write", error).await)
                }
            },
        }
    }

    /// The create's reply was lost: read the record back to learn whether it landed. Ours: go on
    /// (`Ok`). Anyone else's: `LockUnavailable`. Absent: nothing is held, `Connection`.
    async fn resolve_create(
        &self,
        req: &Acquire,
        record_key: &Key,
        lost: aerospike::Error,
    ) -> Result<()> {
        // From the master, whatever the read replica policy: a replica may not have the create yet.
        let mut base_policy = self.base(0);
        base_policy.replica = Replica::Master;
        let policy = ReadPolicy { base_policy };
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
                _ => Err(Error::unavailable(&req.key)),
            },
            Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => {
                Err(Error::connection(format!(
                    "the acquire reply from {} was lost and the record is absent: the create did \
                     not apply (or applied and already expired); nothing is held",
                    crate::error::place(self.address(), &lost)
                ))
                .with_key(req.key.as_str())
                .with_source(Cause(lost)))
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
                Err(self.abandon(req, "acquire", error).await)
            }
        }
    }

    /// After a fenced acquisition failed with a create in doubt: that create may still land. For
    /// the retry budget (never past the TTL), the record is read every 200 ms, and deleted if it
    /// appears with our token and without a fencing token (a create of ours that never went on to
    /// its fence steps: no acquisition of ours holds it). In the background; one read per 200 ms
    /// per such acquisition, only after an outage.
    pub(crate) fn sweep_late_create(&self, req: &Acquire) {
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
            policy.base_policy.filter_expression = Some(and(vec![
                eq(
                    string_bin(TOKEN_BIN.to_owned()),
                    string_val(req.token.as_str().to_owned()),
                ),
                not(bin_exists(FENCE_BIN.to_owned())),
            ]));
            while Instant::now() < until {
                tokio::time::sleep(LATE_CREATE_POLL).await;
                match store.read_owner(&record_key).await {
                    Ok(Some(owner)) if owner == req.token.as_str() => {}
                    _ => continue,
                }
                let mut backoff = Backoff::until(&store.inner.config, until);
                let (deleted, _) = store
                    .retry_with(&mut backoff, "late create", &req.key, true, || {
                        store.inner.client.delete(&policy, &record_key)
                    })
                    .await;
                match deleted {
                    Ok(_) => tracing::info!(key = %req.key, "a create that landed after its acquisition gave up was deleted"),
                    Err(e) => tracing::warn!(key = %req.key, error = %e, "a create that landed after its acquisition gave up stays until its TTL"),
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
                "deleting the lock record failed too ({e}): it blocks the key until its TTL \
                 ({} s) runs out, and is never used",
                ttl_seconds(req.ttl)
            ),
        };
        tracing::warn!(key = %req.key, step, error = %error, "fenced acquisition abandoned");
        let kind = match error.kind() {
            ErrorKind::InDoubt => ErrorKind::RetriesExhausted,
            kind => kind,
        };
        Error::new(
            kind,
            format!("fenced acquisition abandoned at its {step}; {cleanup}"),
        )
        .with_key(req.key.as_str())
        .with_source(error)
    }
}
