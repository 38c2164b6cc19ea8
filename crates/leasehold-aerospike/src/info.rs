//! Reading locks back, for `inspect` and `list`: the record (and fence record) read, and what it
//! says: an exclusive record's holder, token and grant time, or a shared record's live holders.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use aerospike::policy::{BatchPolicy, QueryPolicy};
use aerospike::{
    BatchOperation, BatchReadPolicy, Bins, PartitionFilter, ReadPolicy, Record, ResultCode,
    Statement, Value,
};
use futures::StreamExt;
use leasehold_core::{LockInfo, LockKey, LockLevel, OwnerToken, Result};

use crate::error::{classify, map, Class};

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

impl AerospikeStore {
    /// `LockStore::inspect` (see its docs on [`AerospikeStore`]), its errors not yet named.
    pub(crate) async fn inspect_record(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let record_key = self.record_key(key)?;
        let mut base_policy = self.base(self.inner.config.retries.saturating_sub(1) as usize);
        base_policy.replica = self.inner.config.read_replica;
        if !self.inner.config.fencing {
            let policy = ReadPolicy { base_policy };
            return match self.inner.client.get(&policy, &record_key, Bins::All).await {
                Ok(record) => Ok(self.info(key.clone(), &record)),
                Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => Ok(None),
                Err(e) => Err(map("inspect", key.as_str(), self.address(), e)),
            };
        }
        let policy = BatchPolicy {
            base_policy,
            concurrency: self.batch_concurrency(),
            ..BatchPolicy::default()
        };
        let read = BatchReadPolicy::default();
        let mut rows = vec![
            BatchOperation::read(&read, record_key, Bins::All),
            BatchOperation::read(
                &read,
                self.fence_key(key)?,
                Bins::from([COUNTER_BIN, OWNER_BIN]),
            ),
        ];
        let whole = self.inner.client.batch(&policy, &mut rows).await.err();
        let info = match (rows[0].record(), rows[0].error().or(whole.as_ref())) {
            (Some(record), _) => self.info(key.clone(), record),
            (None, Some(e)) if classify(e) == Class::Server(ResultCode::KeyNotFoundError) => None,
            (None, Some(e)) => return Err(map("inspect", key.as_str(), self.address(), e.clone())),
            (None, None) => None,
        };
        Ok(info.map(|info| self.with_fence_record(info, rows[1].record())))
    }

    /// `LockStore::list` (see its docs on [`AerospikeStore`]), its errors not yet named.
    pub(crate) async fn list_records(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let mut locks = Vec::new();
        for (level, set) in self.inner.layout.listed_sets() {
            let policy = QueryPolicy::default();
            let statement = Statement::new(self.inner.config.namespace.clone(), set, Bins::All);
            let records = self
                .inner
                .client
                .query(&policy, PartitionFilter::all(), statement)
                .await
                .map_err(|e| map("list", prefix, self.address(), e))?;
            let mut stream = Arc::clone(&records).into_stream();
            while let Some(record) = stream.next().await {
                let record = record.map_err(|e| map("list", prefix, self.address(), e))?;
                let Some(lock_id) = record
                    .key
                    .as_ref()
                    .and_then(|k| k.user_key())
                    .and_then(|v| match v {
                        Value::String(s) => Some(s.clone()),
                        _ => None,
                    })
                else {
                    continue;
                };
                let storage = match level {
                    LockLevel::Dc => format!("DC#{}#{lock_id}", self.inner.layout.farm_id()),
                    LockLevel::Xdc => format!("XDC#{lock_id}"),
                };
                if !storage.starts_with(prefix) {
                    continue;
                }
                if let Some(info) = storage
                    .parse::<LockKey>()
                    .ok()
                    .and_then(|key| self.info(key, &record))
                {
                    locks.push(info);
                }
            }
        }
        if self.inner.config.fencing {
            self.fence_records(&mut locks).await;
        }
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(locks)
    }
}
