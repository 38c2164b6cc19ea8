//! The shared record as this client sees it: the `lh_mode` value of each shared mode, the holder
//! entries (wall-clock milliseconds) and the writer's marker, read back from the master, and
//! `inspect`'s answer built from them. Kept apart from the writes so that every operation reads
//! the record one way.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aerospike::{Bins, Key, Record, ResultCode, Value};
use leasehold_core::{HolderInfo, LockInfo, LockKey, LockMode, OwnerToken, Result};

use crate::error::{classify, Class};
use crate::layout::{HOLDERS_BIN, MODE_BIN, WRITER_BIN};
use crate::store::AerospikeStore;

/// Milliseconds since the Unix epoch on this client's clock: holders' expiries are wall-clock
/// times (Aerospike expressions have no "now"), so clients must keep their clocks in sync.
pub(super) fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(super) fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

pub(super) fn left(until: i64, now: i64) -> Duration {
    Duration::from_millis(u64::try_from(until.saturating_sub(now)).unwrap_or(0))
}

/// The `lh_mode` value of a shared mode: `shared`, or `semaphore:N`.
pub(super) fn mode_field(mode: LockMode) -> String {
    match mode {
        LockMode::Semaphore { permits } => format!("semaphore:{permits}"),
        other => other.as_str().to_owned(),
    }
}

pub(super) fn parse_mode(field: &str) -> Option<LockMode> {
    match field.strip_prefix("semaphore:") {
        Some(n) => n.parse().ok().and_then(|p| LockMode::semaphore(p).ok()),
        None if field == "shared" => Some(LockMode::Shared),
        None => None,
    }
}

pub(super) fn describe(field: &str) -> String {
    parse_mode(field).map_or_else(
        || format!("a record of unknown mode {field:?}"),
        |m| m.to_string(),
    )
}

/// A shared record as read back.
#[derive(Debug)]
pub(super) struct State {
    /// `lh_mode`; `None` for an exclusive (or Java) record.
    pub(super) mode: Option<String>,
    pub(super) holders: Vec<(String, i64)>,
    pub(super) writer: i64,
    pub(super) ttl: Option<Duration>,
}

impl State {
    fn of(record: &Record) -> State {
        let mode = match record.bins.get(MODE_BIN) {
            Some(Value::String(m)) => Some(m.clone()),
            _ => None,
        };
        let writer = match record.bins.get(WRITER_BIN) {
            Some(Value::Int(w)) => *w,
            _ => 0,
        };
        State {
            mode,
            holders: holders_of(record),
            writer,
            ttl: record.time_to_live(),
        }
    }

    pub(super) fn live(&self, now: i64) -> impl Iterator<Item = &(String, i64)> {
        self.holders.iter().filter(move |(_, exp)| *exp > now)
    }
}

fn holders_of(record: &Record) -> Vec<(String, i64)> {
    let entries: Vec<(&Value, &Value)> = match record.bins.get(HOLDERS_BIN) {
        Some(Value::HashMap(m)) => m.iter().collect(),
        Some(Value::OrderedMap(m)) => m.iter().collect(),
        Some(Value::SortedMap(m)) => m.iter().collect(),
        _ => Vec::new(),
    };
    entries
        .into_iter()
        .filter_map(|(k, v)| match (k, v) {
            (Value::String(token), Value::Int(exp)) => Some((token.clone(), *exp)),
            _ => None,
        })
        .collect()
}

/// Whether `record` is a shared record (readers or permits).
pub(crate) fn is_shared(record: &Record) -> bool {
    matches!(record.bins.get(MODE_BIN), Some(Value::String(_)))
}

/// `inspect`'s answer for a shared record: every live holder; `None` when none is left (a
/// waiting writer's marker alone is no hold).
pub(crate) fn shared_info(key: LockKey, record: &Record) -> Option<LockInfo> {
    let state = State::of(record);
    let now = now_ms();
    let mode = state
        .mode
        .as_deref()
        .and_then(parse_mode)
        .unwrap_or(LockMode::Shared);
    let mut holders: Vec<HolderInfo> = state
        .live(now)
        .map(|(token, exp)| {
            HolderInfo::new(
                OwnerToken::from_string(token.as_str()),
                Some(left(*exp, now)),
            )
        })
        .collect();
    if holders.is_empty() {
        return None;
    }
    holders.sort_by(|a, b| a.token.as_str().cmp(b.token.as_str()));
    Some(LockInfo::shared(key, mode, holders).with_writer_waiting(state.writer > now))
}

impl AerospikeStore {
    /// Reads a lock record's mode, holders and marker from the master; `None` when absent.
    pub(super) async fn read_state(
        &self,
        key: &LockKey,
        record_key: &Key,
    ) -> Result<Option<State>> {
        let policy = self.master_read_policy();
        let bins = Bins::Some(vec![
            MODE_BIN.to_owned(),
            HOLDERS_BIN.to_owned(),
            WRITER_BIN.to_owned(),
        ]);
        // A read is harmless to repeat: retried whatever happened to it.
        let read = self
            .retrying("read back", key, true, || {
                self.inner.client.get(&policy, record_key, bins.clone())
            })
            .await;
        match read {
            Ok(record) => Ok(Some(State::of(&record))),
            Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => Ok(None),
            Err(e) => Err(self.exhausted_or("read back", key, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mode_fields_round_trip() {
        for mode in [LockMode::Shared, LockMode::semaphore(3).unwrap()] {
            assert_eq!(parse_mode(&mode_field(mode)), Some(mode));
        }
        assert_eq!(parse_mode("semaphore:0"), None);
        assert_eq!(describe("weird"), "a record of unknown mode \"weird\"");
    }
}
