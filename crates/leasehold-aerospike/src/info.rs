//! What a lock record says, for `inspect` and `list`: an exclusive record's holder, token and
//! grant time, or a shared record's live holders.

use std::time::{Duration, UNIX_EPOCH};

use aerospike::policy::BatchPolicy;
use aerospike::{BatchOperation, BatchReadPolicy, Bins, Record, Value};
use leasehold_core::{LockInfo, LockKey, OwnerToken};

use crate::layout::{COUNTER_BIN, FENCE_BIN, OWNER_BIN, TOKEN_BIN};
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

impl AerospikeStore {
    /// Fills in the fencing tokens of exclusive holds whose lock records carry none, from their
    /// fence records (one batch read). Best effort: `list` answers without them if it fails.
    pub(crate) async fn fence_records(&self, locks: &mut [LockInfo]) {
        let wanted: Vec<usize> = (0..locks.len())
            .filter(|&i| !locks[i].mode.is_shared_record() && locks[i].fencing_token.is_none())
            .collect();
        if wanted.is_empty() {
            return;
        }
        let read = BatchReadPolicy::default();
        let mut rows = Vec::with_capacity(wanted.len());
        for &i in &wanted {
            let Ok(fence_key) = self.fence_key(&locks[i].key) else {
                return;
            };
            rows.push(BatchOperation::read(
                &read,
                fence_key,
                Bins::from([COUNTER_BIN, OWNER_BIN]),
            ));
        }
        let mut base_policy = self.base(self.inner.config.retries.saturating_sub(1) as usize);
        base_policy.replica = self.inner.config.read_replica;
        let policy = BatchPolicy {
            base_policy,
            concurrency: self.batch_concurrency(),
            ..BatchPolicy::default()
        };
        if let Err(error) = self.inner.client.batch(&policy, &mut rows).await {
            tracing::debug!(%error, "list: fence records not read; tokens left out");
        }
        for (&i, row) in wanted.iter().zip(&rows) {
            let blank = LockInfo::new(locks[i].key.clone(), None);
            let info = std::mem::replace(&mut locks[i], blank);
            locks[i] = self.with_fence_record(info, row.record());
        }
    }
}

impl AerospikeStore {
    /// An exclusive holder's fencing token from its key's fence record, when its lock record has
    /// none: the counter, if the record names this holder as the owner that took it.
    pub(crate) fn with_fence_record(&self, info: LockInfo, fence: Option<&Record>) -> LockInfo {
        if info.fencing_token.is_some() || info.mode.is_shared_record() {
            return info;
        }
        let Some(fence) = fence else {
            return info;
        };
        let owner = match fence.bins.get(OWNER_BIN) {
            Some(Value::String(owner)) => owner.as_str(),
            _ => return info,
        };
        let counter = match fence.bins.get(COUNTER_BIN) {
            Some(Value::Int(n)) if *n > 0 => *n as u64,
            _ => return info,
        };
        let ours = info.token.as_ref().is_some_and(|t| t.as_str() == owner);
        if ours {
            info.with_fencing_token(Some(counter))
        } else {
            info
        }
    }
}
