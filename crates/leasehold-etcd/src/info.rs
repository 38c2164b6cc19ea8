//! What `inspect` and `list` read back: the exclusive record with its fencing token, or every
//! reader or permit holder with its own lease's time left, and whether a writer waits.

use std::collections::BTreeMap;
use std::time::Duration;

use etcd_client::{GetOptions, KeyValue, TxnOp};
use leasehold_core::{HolderInfo, LockInfo, LockKey, LockMode, OwnerToken, Result};

use crate::error::{map, Op};
use crate::layout::{holder_prefix, writer_prefix, Entry};
use crate::members::Retry;
use crate::store::EtcdStore;

/// The keys of one lock, as read.
#[derive(Default)]
struct Found<'a> {
    record: Option<&'a KeyValue>,
    holders: Vec<(LockMode, &'a KeyValue)>,
    writer_waiting: bool,
}

impl EtcdStore {
    /// One read-only transaction (the record, the holders, whether a writer waits), then the
    /// remaining TTL of every lease, concurrently.
    pub(crate) async fn inspect_lock(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let lock_key = self.lock_key(key);
        let [record, holders, writers] = self
            .read_ranges(
                key,
                Op::Inspect,
                [
                    TxnOp::get(lock_key.as_str(), None),
                    TxnOp::get(
                        holder_prefix(&lock_key),
                        Some(GetOptions::new().with_prefix()),
                    ),
                    TxnOp::get(
                        writer_prefix(&lock_key),
                        Some(GetOptions::new().with_prefix().with_count_only()),
                    ),
                ],
            )
            .await?;
        let mut found = Found {
            record: record.kvs().first(),
            writer_waiting: writers.count() > 0,
            ..Found::default()
        };
        for kv in holders.kvs() {
            if let Some(Entry::Holder(_, mode)) = self.entry(kv) {
                found.holders.push((mode, kv));
            }
        }
        self.info(key.clone(), found).await
    }

    /// One range read over `<prefix><filter>` (records, holders, markers; waiter keys are
    /// skipped), then the remaining TTL of every lease, concurrently.
    pub(crate) async fn list_locks(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let range = format!("{}{prefix}", self.config().prefix);
        let response = self
            .members()
            .run(Retry::Safe, |client| {
                let range = range.clone();
                let mut kv = client.kv_client();
                async move { kv.get(range, Some(GetOptions::new().with_prefix())).await }
            })
            .await
            .map_err(|e| map(Op::List, prefix, &e.at, e.error))?;
        let mut locks: BTreeMap<LockKey, Found<'_>> = BTreeMap::new();
        for kv in response.kvs() {
            let Some(entry) = self.entry(kv) else {
                continue;
            };
            // A filter longer than a lock key may match its holders but not the lock.
            if matches!(entry, Entry::Waiter(_)) || !entry.key().as_str().starts_with(prefix) {
                continue;
            }
            let found = locks.entry(entry.key().clone()).or_default();
            match entry {
                Entry::Record(_) => found.record = Some(kv),
                Entry::Holder(_, mode) => found.holders.push((mode, kv)),
                Entry::Writer(_) => found.writer_waiting = true,
                Entry::Waiter(_) => {}
            }
        }
        let infos = futures::future::try_join_all(
            locks.into_iter().map(|(key, found)| self.info(key, found)),
        )
        .await?;
        Ok(infos.into_iter().flatten().collect())
    }

    fn entry(&self, kv: &KeyValue) -> Option<Entry> {
        let name = std::str::from_utf8(kv.key()).ok()?;
        Entry::parse(name.strip_prefix(self.config().prefix.as_str())?)
    }

    /// The info of one lock; `None` when no hold is left (leases that expired between the read
    /// and the lookup, or only a writer's marker).
    async fn info(&self, key: LockKey, found: Found<'_>) -> Result<Option<LockInfo>> {
        if let Some(kv) = found.record {
            let ttl = self.lease_ttl(&key, kv.lease()).await?;
            if kv.lease() != 0 && ttl.is_none() {
                return Ok(None); // expired between the read and the lease lookup
            }
            return Ok(Some(
                LockInfo::new(key, Some(token(kv)))
                    .with_ttl_remaining(ttl)
                    .with_fencing_token(u64::try_from(kv.create_revision()).ok()),
            ));
        }
        let Some(&(mode, _)) = found.holders.first() else {
            return Ok(None);
        };
        let ttls = futures::future::try_join_all(
            found
                .holders
                .iter()
                .map(|(_, kv)| self.lease_ttl(&key, kv.lease())),
        )
        .await?;
        let holders: Vec<HolderInfo> = found
            .holders
            .iter()
            .zip(ttls)
            .filter(|((_, kv), ttl)| kv.lease() == 0 || ttl.is_some())
            .map(|((_, kv), ttl)| HolderInfo::new(token(kv), ttl))
            .collect();
        if holders.is_empty() {
            return Ok(None);
        }
        Ok(Some(
            LockInfo::shared(key, mode, holders).with_writer_waiting(found.writer_waiting),
        ))
    }

    /// Remaining TTL of a lease, `None` if it has none (0) or is gone.
    async fn lease_ttl(&self, key: &LockKey, id: i64) -> Result<Option<Duration>> {
        if id == 0 {
            return Ok(None);
        }
        let ttl = self
            .members()
            .run(Retry::Safe, |client| {
                let mut lease = client.lease_client();
                async move { lease.time_to_live(id, None).await }
            })
            .await
            .map_err(|e| self.err(Op::Inspect, key, e))?
            .ttl();
        Ok(u64::try_from(ttl).ok().map(Duration::from_secs))
    }
}

/// The owner token a record or holder key holds as its value.
fn token(kv: &KeyValue) -> OwnerToken {
    OwnerToken::from_string(String::from_utf8_lossy(kv.value()).into_owned())
}
