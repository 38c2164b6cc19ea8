//! Releasing and extending a hold: an owner-filtered delete or touch, within the retry budget;
//! a lost reply is resolved by reading the record back, never by sending the write again blindly.

use std::time::Duration;

use aerospike::policy::Expiration;
use aerospike::{Bins, Key, ResultCode, Value};
use leasehold_core::{Error, Lease, Result};
use tokio::time::Instant;

use crate::error::{classify, map, place, Cause, Class};
use crate::layout::TOKEN_BIN;
use crate::retry::Backoff;
use crate::store::{ttl_seconds, AerospikeStore};

impl AerospikeStore {
    pub(crate) async fn release_once(&self, lease: &Lease) -> Result<bool> {
        if lease.mode().is_shared_record() {
            return self.release_shared(lease).await;
        }
        let record_key = self.record_key(lease.key())?;
        if self.inner.config.fair {
            // How long holds of this key last: what this process tells waiters when it takes it.
            self.inner.waiting.released(lease.key().as_str());
        }
        let result = self.delete_owned(lease, &record_key).await;
        if self.inner.config.fair && result.is_ok() {
            // Released before the line says: a head looking meanwhile would wait out the rest of
            // this process's estimate (one more request, only then).
            let early = self
                .inner
                .waiting
                .released_early(lease.key().as_str(), crate::waiting::now_us());
            if let Some(granted) = early {
                self.clear_grant(lease.key().clone(), granted);
            }
        }
        result
    }

    /// The owner-filtered delete, within the retry budget: transient failures are sent again
    /// after a pause; a lost reply is resolved by reading the record back (absent: released;
    /// still ours: the delete is sent again; someone else's: ours had already gone). Never sent
    /// again blindly.
    pub(crate) async fn delete_owned(&self, lease: &Lease, record_key: &Key) -> Result<bool> {
        let policy = self.owned_by(lease.token(), self.inner.config.commit_levels.release);
        let mut backoff = self.budget(None);
        // Whether a delete's reply was lost: then a readback comes first.
        let mut lost = false;
        loop {
            if lost {
                match self.read_owner(record_key).await {
                    // Gone: our delete landed (or the record expired meanwhile).
                    Ok(None) => return Ok(true),
                    Ok(Some(owner)) if owner == lease.token().as_str() => {}
                    Ok(Some(_)) => return Ok(false),
                    Err(e) if classify(&e) == Class::NotSent || classify(&e) == Class::InDoubt => {
                        tracing::debug!(key = %lease.key(), error = %e, "release readback failed");
                        if !backoff.wait().await {
                            return Err(self.release_unresolved(lease, &backoff, lost, e));
                        }
                        continue;
                    }
                    Err(e) => {
                        return Err(map(
                            "release readback",
                            lease.key().as_str(),
                            self.address(),
                            e,
                        ))
                    }
                }
            }
            let e = match self.inner.client.delete(&policy, record_key).await {
                // After a lost reply, a record found gone counts as released by us.
                Ok(existed) => return Ok(existed || lost),
                Err(e) => e,
            };
            match classify(&e) {
                Class::Server(ResultCode::KeyNotFoundError) => return Ok(lost),
                Class::Server(ResultCode::FilteredOut) => return Ok(false),
                Class::InDoubt | Class::NotSent => {
                    lost |= classify(&e) == Class::InDoubt;
                    if !backoff.wait().await {
                        return Err(self.release_unresolved(lease, &backoff, lost, e));
                    }
                    tracing::debug!(key = %lease.key(), error = %e, "release again");
                }
                _ => return Err(map("release", lease.key().as_str(), self.address(), e)),
            }
        }
    }

    /// The owner token in the lock record, read from the master; `None` when it is absent.
    pub(crate) async fn read_owner(
        &self,
        record_key: &Key,
    ) -> Result<Option<String>, aerospike::Error> {
        let policy = self.master_read_policy();
        let bins = Bins::Some(vec![TOKEN_BIN.to_owned()]);
        match self.inner.client.get(&policy, record_key, bins).await {
            Ok(record) => Ok(match record.bins.get(TOKEN_BIN) {
                Some(Value::String(t)) => Some(t.clone()),
                _ => Some(String::new()),
            }),
            Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// A release that ran out of budget: `InDoubt` when a delete may have landed, else
    /// `RetriesExhausted`; either way the lock stays until its TTL if it was not deleted.
    fn release_unresolved(
        &self,
        lease: &Lease,
        backoff: &Backoff,
        lost: bool,
        last: aerospike::Error,
    ) -> Error {
        let ttl = ttl_seconds(lease.ttl());
        let spent = backoff.spent();
        match lost {
            true => Error::in_doubt(format!(
                "release was sent to {} but its reply was lost, and reading the lock back failed \
                 too ({spent}): it may still be held until its TTL ({ttl} s) runs out",
                place(self.address(), &last)
            ))
            .with_key(lease.key().as_str())
            .with_source(Cause(last)),
            false => self.exhausted(
                "release",
                lease.key(),
                last,
                &format!("({spent}); the lock stays until its TTL ({ttl} s) runs out"),
            ),
        }
    }

    /// The renewal itself (see `LockStore::extend`): the owner-filtered touch, sent again on
    /// transient failures and lost replies (touching twice is harmless) within the retry budget,
    /// never past the lease's end.
    pub(crate) async fn extend_once(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if lease.mode().is_shared_record() {
            return self.extend_shared(lease, ttl).await;
        }
        let record_key = self.record_key(lease.key())?;
        let mut policy = self.owned_by(lease.token(), self.inner.config.commit_levels.extend);
        policy.expiration = Expiration::Seconds(ttl_seconds(ttl));
        let mut backoff = self.budget(Some(lease.expires_at()));
        let mut sent_at = Instant::now();
        let (result, doubted) = self
            .retry_with(&mut backoff, "extend", lease.key(), true, || {
                sent_at = Instant::now();
                self.inner.client.touch(&policy, &record_key)
            })
            .await;
        match result {
            Ok(()) => Ok(lease.renewed(ttl, sent_at)),
            Err(e) => match classify(&e) {
                Class::Server(ResultCode::FilteredOut | ResultCode::KeyNotFoundError) => {
                    Err(Error::not_held(
                        "the lease expired or was taken by another owner before it could be extended",
                    )
                    .with_key(lease.key().as_str()))
                }
                Class::NotSent | Class::InDoubt if backoff.made() > 1 => {
                    Err(self.retries_ended("extend", lease.key(), e, &backoff, doubted))
                }
                _ => Err(map("extend", lease.key().as_str(), self.address(), e)),
            },
        }
    }
}
