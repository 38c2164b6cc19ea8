//! Renewing a hold through etcd's lease keep-alive.
//!
//! Each hold lives on its own etcd lease. A renewal for the TTL the lease was granted with (what
//! the manager's watchdog sends) is a `LeaseKeepAlive` of that lease — served by the leader
//! without a Raft write — and then a read-only transaction that checks the hold still carries our
//! token *on that lease*: a keep-alive renews a lease whatever it holds, and an operator may have
//! deleted the record (or it expired and another owner took the key on a lease of its own). The
//! check comes after the keep-alive, so a hold it sees was renewed before it looked. When either
//! step fails (the lease is gone, or the hold is not on it: moved by a concurrent extend, or by
//! one whose reply was lost), the renewal falls back to the owner-checked move below, so whether
//! the lock is still held is decided by its token alone, as for every other extend.
//!
//! An extend to another TTL cannot be a keep-alive (a lease always renews to its granted TTL):
//! it moves the hold to a new lease in one owner-checked transaction (`EtcdStore::extend`).

use std::time::Duration;

use dashmap::DashMap;
use etcd_client::{Compare, CompareOp, Txn};
use leasehold_core::{Error, ErrorKind, Lease, OwnerToken, Result};
use tokio::time::Instant;

use crate::error::Op;
use crate::store::EtcdStore;

/// The etcd lease each live hold of this store is on, by owner token: what a keep-alive renews.
#[derive(Debug, Default)]
pub(crate) struct HeldLeases(DashMap<String, HeldLease>);

/// One hold's lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct HeldLease {
    /// The etcd lease id.
    pub(crate) id: i64,
    /// The TTL it was granted with, in whole seconds: what a keep-alive renews it to.
    pub(crate) seconds: i64,
}

impl HeldLeases {
    /// The hold of `token` now lives on `lease`.
    pub(crate) fn insert(&self, token: &OwnerToken, lease: HeldLease) {
        self.0.insert(token.as_str().to_owned(), lease);
    }

    /// The lease of `token`'s hold, if this store took or moved it.
    pub(crate) fn get(&self, token: &OwnerToken) -> Option<HeldLease> {
        self.0.get(token.as_str()).map(|held| *held)
    }

    /// The hold of `token` is gone (released, lost or moved away by someone else).
    pub(crate) fn remove(&self, token: &OwnerToken) {
        self.0.remove(token.as_str());
    }
}

impl EtcdStore {
    /// Renews `lease`'s hold for `ttl` by a keep-alive of `held`, the etcd lease it is on (whose
    /// granted TTL is `ttl` in whole seconds), then checks that the hold is still ours on it.
    ///
    /// `None` when the keep-alive cannot tell: the lease is gone, or the hold is not (or no
    /// longer) on it — moved to another lease by a concurrent extend, or by one whose reply was
    /// lost. The caller then extends by the owner-checked move, which alone decides `NotHeld`
    /// (by the token, whatever lease the hold is on).
    pub(crate) async fn renew_by_keep_alive(
        &self,
        lease: &Lease,
        ttl: Duration,
        held: HeldLease,
    ) -> Result<Option<Lease>> {
        let sent_at = Instant::now();
        let mut client = self.lease_client();
        // etcd-client's `keep_alive` sends the first renewal and reads its answer before it
        // returns: a lease that is gone is its `LeaseKeepAliveError` ("lease not found").
        let kept =
            tokio::time::timeout(self.config().response_timeout, client.keep_alive(held.id)).await;
        match kept {
            Ok(Ok(_stream)) => {}
            Ok(Err(etcd_client::Error::LeaseKeepAliveError(_))) => return Ok(None),
            Ok(Err(e)) => return Err(self.err(Op::Extend, lease.key(), e)),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InDoubt,
                    format!(
                        "extend (a lease keep-alive) was sent to etcd at {} but no reply came \
                         back in time: the lease may or may not have been renewed; renew again",
                        self.address()
                    ),
                )
                .with_key(lease.key().as_str()))
            }
        }
        let hold_key = self.hold_key(lease);
        let still_ours = Txn::new().when([
            Compare::value(hold_key.as_str(), CompareOp::Equal, lease.token().as_str()),
            Compare::lease(hold_key.as_str(), CompareOp::Equal, held.id),
        ]);
        let response = self
            .kv()
            .txn(still_ours)
            .await
            .map_err(|e| self.err(Op::Extend, lease.key(), e))?;
        if !response.succeeded() {
            return Ok(None);
        }
        Ok(Some(lease.renewed(ttl, sent_at)))
    }
}
