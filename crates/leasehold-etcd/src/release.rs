//! The release: one owner-checked delete transaction; the etcd lease the hold was on is kept as
//! a spare for the next acquisition of the same TTL, or revoked.

use etcd_client::{Compare, CompareOp, DeleteOptions, Txn, TxnOp, TxnOpResponse};
use leasehold_core::{Lease, Result};

use crate::error::Op;
use crate::members::Retry;
use crate::store::EtcdStore;
use crate::waiting::Spare;

impl EtcdStore {
    /// Deletes the lease's hold (the record, or its holder key) if it holds our token; the lease
    /// it was on is kept as a spare when it is the one this store put it on (so nothing else
    /// lives on it), else revoked.
    pub(crate) async fn release_once(&self, lease: &Lease) -> Result<bool> {
        let held = self.held_leases().remove(lease.token());
        let hold_key = self.hold_key(lease);
        let txn = || {
            let delete = TxnOp::delete(
                hold_key.as_str(),
                Some(DeleteOptions::new().with_prev_key()),
            );
            Self::if_ours(&hold_key, lease, delete)
        };
        let response = self
            .txn(Retry::Unsent, txn)
            .await
            .map_err(|e| self.err(Op::Release, lease.key(), e))?;
        if !response.succeeded() {
            return Ok(false);
        }
        if let Some(TxnOpResponse::Delete(deleted)) = response.op_responses().first() {
            if let Some(kv) = deleted.prev_kvs().first() {
                // The hold was on the lease this store put it on, and a hold's lease carries
                // nothing else: empty now, it can carry the next hold. A hold on a lease the store
                // does not know (recovered by the readback layer, moved behind its back) may
                // share it with something: revoked.
                match held.filter(|held| held.id == kv.lease()) {
                    Some(held) => self.keep_spare_lease(Spare {
                        id: held.id,
                        seconds: held.seconds,
                        granted_at: held.since,
                    }),
                    None => self.revoke_later(kv.lease()),
                }
            }
        }
        Ok(true)
    }

    /// `then` if the hold at `hold_key` is still `lease`'s (its value is the lease's owner
    /// token): the owner check of every write to a hold.
    pub(crate) fn if_ours(hold_key: &str, lease: &Lease, then: TxnOp) -> Txn {
        Txn::new()
            .when([Compare::value(
                hold_key,
                CompareOp::Equal,
                lease.token().as_str(),
            )])
            .and_then([then])
    }
}
