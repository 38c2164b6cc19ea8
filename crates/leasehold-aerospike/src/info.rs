//! What a lock record says, for `inspect` and `list`: an exclusive record's holder, token and
//! grant time, or a shared record's live holders.

use std::time::{Duration, UNIX_EPOCH};

use aerospike::{Record, Value};
use leasehold_core::{LockInfo, LockKey, OwnerToken};

use crate::layout::{FENCE_BIN, TOKEN_BIN};
use crate::shared::{is_shared, shared_info};
use crate::store::AerospikeStore;

impl AerospikeStore {
    /// What a lock record says: `None` for a shared record whose holders have all expired.
    pub(crate) fn info(&self, key: LockKey, record: &Record) -> Option<LockInfo> {
        if is_shared(record) {
            return shared_info(key, record);
        }
        let token = match record.bins.get(TOKEN_BIN) {
            Some(Value::String(t)) => Some(OwnerToken::from_string(t.as_str())),
            _ => None,
        };
        let uat = match record.bins.get(self.inner.layout.uat_bin()) {
            Some(Value::Int(ms)) if *ms > 0 => Some(UNIX_EPOCH + Duration::from_millis(*ms as u64)),
            _ => None,
        };
        let fence = match record.bins.get(FENCE_BIN) {
            Some(Value::Int(f)) if *f > 0 => Some(*f as u64),
            _ => None,
        };
        Some(
            LockInfo::new(key, token)
                .with_ttl_remaining(record.time_to_live())
                .with_acquired_at(uat)
                .with_fencing_token(fence),
        )
    }
}
