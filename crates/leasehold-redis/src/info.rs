//! Reading locks back: one lock's record (`INSPECT`, exclusive and shared alike) and every lock
//! under a prefix (`SCAN` of each master).

use std::time::Duration;

use leasehold_core::{HolderInfo, LockInfo, LockKey, LockMode, Operation, OwnerToken, Result};

use crate::connection::Connection;
use crate::error::map;
use crate::reply::parse_mode;
use crate::scripts::ScriptCall;
use crate::store::RedisStore;

/// Keys returned by one `SCAN` step.
const SCAN_COUNT: usize = 500;

impl RedisStore {
    /// One round trip: the `INSPECT` script, exclusive and shared records alike.
    pub(crate) async fn inspect_lock(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        let mut conn = self.conn();
        let lock_key = self.lock_key(key);
        let found: Vec<redis::Value> = ScriptCall::new(&self.scripts().inspect, &[&lock_key], None)
            .invoke(&mut conn)
            .await
            .map_err(|e| self.err(Operation::Inspect, key, e))?;
        parse_inspect(key, found).map_err(|e| self.err(Operation::Inspect, key, e))
    }

    /// `SCAN` of every master (one server: itself), then an inspect per key found, pipelined.
    pub(crate) async fn list_locks(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let config_prefix = &self.inner.config.prefix;
        let pattern = if self.inner.cluster {
            format!("{}{{{}*", glob_escape(config_prefix), glob_escape(prefix))
        } else {
            format!("{}{}*", glob_escape(config_prefix), glob_escape(prefix))
        };
        let list_err = |e| map(Operation::List, prefix, &self.address(), e);
        let mut conn = self.conn();
        // On a cluster every master scans its own keys; one server scans all.
        let nodes = match &mut conn {
            Connection::Cluster(cluster) => crate::connection::masters(cluster)
                .await
                .map_err(list_err)?,
            _ => vec![None],
        };
        let mut locks = Vec::new();
        for node in nodes {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, keys): (u64, Vec<String>) = match (&mut conn, &node) {
                    // A master's scan that fails names that master.
                    (Connection::Cluster(cluster), Some(node)) => {
                        crate::connection::query_node(cluster, scan, node)
                            .await
                            .map_err(|e| {
                                map(
                                    Operation::List,
                                    prefix,
                                    &crate::slots::nodes::shown(node),
                                    e,
                                )
                            })
                    }
                    (conn, _) => scan.query_async(conn).await.map_err(list_err),
                }?;
                let keys: Vec<LockKey> = keys
                    .iter()
                    .filter_map(|k| self.lock_key_of(k))
                    .filter_map(|k| k.parse::<LockKey>().ok())
                    .collect();
                // Concurrent inspects on the multiplexed connection: pipelined, one script each,
                // so exclusive and shared records are read alike and atomically.
                let found =
                    futures::future::try_join_all(keys.iter().map(|key| self.inspect_lock(key)));
                locks.extend(found.await?.into_iter().flatten());
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        locks.dedup_by(|a, b| a.key == b.key);
        Ok(locks)
    }
}

/// Reads `INSPECT`'s reply (see the script).
pub(crate) fn parse_inspect(
    key: &LockKey,
    reply: Vec<redis::Value>,
) -> redis::RedisResult<Option<LockInfo>> {
    use redis::FromRedisValue;
    let mut items = reply.into_iter();
    let Some(kind) = items.next() else {
        return Ok(None);
    };
    let kind = String::from_redis_value(kind)?;
    let rest: Vec<redis::Value> = items.collect();
    if kind == "x" {
        let token = rest
            .first()
            .cloned()
            .map(String::from_redis_value)
            .transpose()?;
        let Some(token) = token else { return Ok(None) };
        let pttl = rest
            .get(1)
            .cloned()
            .map(i64::from_redis_value)
            .transpose()?
            .unwrap_or(-2);
        if pttl == -2 {
            return Ok(None);
        }
        let fence = match rest.get(2).cloned() {
            Some(value) => Option::<u64>::from_redis_value(value)?,
            None => None,
        };
        return Ok(Some(info(key, token, pttl, fence)));
    }
    let mut rest = rest.into_iter();
    let field = rest
        .next()
        .map(String::from_redis_value)
        .transpose()?
        .unwrap_or_default();
    let marker = rest
        .next()
        .map(u64::from_redis_value)
        .transpose()?
        .unwrap_or(0);
    let mut holders = Vec::new();
    while let (Some(token), Some(left)) = (rest.next(), rest.next()) {
        let token = String::from_redis_value(token)?;
        let left = Duration::from_millis(u64::from_redis_value(left)?);
        holders.push(HolderInfo::new(OwnerToken::from_string(token), Some(left)));
    }
    if holders.is_empty() {
        return Ok(None);
    }
    let mode = parse_mode(&field).unwrap_or(LockMode::Shared);
    Ok(Some(
        LockInfo::shared(key.clone(), mode, holders).with_writer_waiting(marker > 0),
    ))
}

pub(crate) fn info(key: &LockKey, token: String, pttl: i64, fence: Option<u64>) -> LockInfo {
    // PTTL: -1 no expiry (never written so by leasehold), -2 gone since.
    let ttl = u64::try_from(pttl).ok().map(Duration::from_millis);
    LockInfo::new(key.clone(), Some(OwnerToken::from_string(token)))
        .with_ttl_remaining(ttl)
        .with_fencing_token(fence)
}

/// Escapes Redis glob metacharacters so a prefix matches literally in `SCAN MATCH`.
pub(crate) fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn glob_metacharacters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("leasehold:DC#f#"), "leasehold:DC#f#");
    }
}
