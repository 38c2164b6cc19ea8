//! Read-write locks and semaphores on Aerospike: one record per lock (the same key as the
//! exclusive lock record) holding its holders in a map bin, changed by filtered `operate`s.
//!
//! A shared record has `lh_mode` (`shared` or `semaphore:N`), `lh_holders` (owner token → expiry,
//! ms since the Unix epoch) and, for a read-write lock with a waiting writer, `lh_writer` (the
//! marker's expiry). It has none of the Java manager's bins, and the Java manager's create-only
//! write fails on it as on any existing record. The record's own TTL never ends before its
//! longest holder's entry: every write either sets it to the writer's TTL + 1 s when the record
//! has no more left than that, or leaves it alone (see [`Expiry`]). docs/AEROSPIKE.md lists every
//! round trip and why it is safe.

use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aerospike::expressions::maps as map_exp;
use aerospike::expressions::{
    and, bin_exists, eq, gt, int_bin, int_val, le, lt, map_bin, or, string_bin, string_val, ttl,
    ExpType, Expression,
};
use aerospike::operations::maps::{self, MapOrder, MapPolicy, MapReturnType, MapWriteFlags};
use aerospike::operations::{self, Operation};
use aerospike::policy::{Expiration, RecordExistsAction};
use aerospike::{as_bin, Bins, Key, ReadPolicy, Record, Replica, ResultCode, Value, WritePolicy};
use leasehold_core::{
    Acquire, Error, HolderInfo, Lease, LockInfo, LockKey, LockMode, OwnerToken, Result,
};
use tokio::time::Instant;

use crate::error::{classify, Class};
use crate::layout::{HOLDERS_BIN, MODE_BIN, WRITER_BIN};
use crate::store::{ttl_seconds, AerospikeStore};

/// Rounds of "try, read the record, try again" before a contended shared request gives up.
const MAX_ROUNDS: usize = 3;

/// Milliseconds since the Unix epoch on this client's clock: holders' expiries are wall-clock
/// times (Aerospike expressions have no "now"), so clients must keep their clocks in sync.
fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn left(until: i64, now: i64) -> Duration {
    Duration::from_millis(u64::try_from(until.saturating_sub(now)).unwrap_or(0))
}

/// The `lh_mode` value of a shared mode: `shared`, or `semaphore:N`.
fn mode_field(mode: LockMode) -> String {
    match mode {
        LockMode::Semaphore { permits } => format!("semaphore:{permits}"),
        other => other.as_str().to_owned(),
    }
}

fn parse_mode(field: &str) -> Option<LockMode> {
    match field.strip_prefix("semaphore:") {
        Some(n) => n.parse().ok().and_then(|p| LockMode::semaphore(p).ok()),
        None if field == "shared" => Some(LockMode::Shared),
        None => None,
    }
}

fn describe(field: &str) -> String {
    parse_mode(field).map_or_else(
        || format!("a record of unknown mode {field:?}"),
        |m| m.to_string(),
    )
}

/// How a write treats the record's TTL, so that it never ends before the longest holder's entry.
/// `R` is the request's TTL in whole seconds, rounded up; the `ttl` expression is the record's
/// remaining TTL in whole seconds (rounded either way, the conditions hold).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expiry {
    /// Filter `ttl <= R`, expiration `R + 1`: lengthens (or keeps) the record's life. Also
    /// creates an absent record.
    Set,
    /// Filter `ttl > R`, expiration unchanged, update-only: the record already outlives the entry.
    Keep,
}

impl Expiry {
    fn apply(self, policy: &mut WritePolicy, ttl: Duration) -> Expression {
        let secs = ttl_seconds(ttl);
        match self {
            Expiry::Set => {
                policy.expiration = Expiration::Seconds(secs.saturating_add(1));
                le(self::ttl(), int_val(i64::from(secs)))
            }
            Expiry::Keep => {
                policy.expiration = Expiration::DontUpdate;
                policy.record_exists_action = RecordExistsAction::UpdateOnly;
                gt(self::ttl(), int_val(i64::from(secs)))
            }
        }
    }

    fn for_record(record_ttl: Option<Duration>, ttl: Duration) -> Expiry {
        match record_ttl {
            Some(t) if t.as_secs() > u64::from(ttl_seconds(ttl)) => Expiry::Keep,
            _ => Expiry::Set,
        }
    }
}

/// Entries of the holder map whose expiry is at or after `cut` (live ones, with `cut = now + 1`).
fn live_count(cut: i64) -> Expression {
    map_exp::get_by_value_range(
        MapReturnType::COUNT,
        Some(int_val(cut)),
        None,
        map_bin(HOLDERS_BIN),
        &[],
    )
}

/// No waiting writer's marker in force.
fn marker_dead(cut: i64) -> Expression {
    or(vec![
        eq(aerospike::expressions::bin_type(WRITER_BIN), int_val(0)),
        lt(int_bin(WRITER_BIN), int_val(cut)),
    ])
}

/// A shared record as read back.
#[derive(Debug)]
struct State {
    /// `lh_mode`; `None` for an exclusive (or Java) record.
    mode: Option<String>,
    holders: Vec<(String, i64)>,
    writer: i64,
    ttl: Option<Duration>,
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

    fn live(&self, now: i64) -> impl Iterator<Item = &(String, i64)> {
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

/// What the client-side reading of a record says about a reader or permit request.
fn judge(req: &Acquire, state: &State, now: i64) -> Result<()> {
    let Some(held) = state.mode.as_deref() else {
        // An exclusive hold (ours or the Java manager's).
        return Err(match req.mode {
            LockMode::Semaphore { .. } => req.mode.conflict("an exclusive lock", &req.key),
            _ => Error::unavailable(&req.key).with_retry_after(state.ttl.unwrap_or_default()),
        });
    };
    let live: Vec<i64> = state.live(now).map(|(_, exp)| *exp).collect();
    let marker = state.writer > now;
    if live.is_empty() && !marker {
        return Ok(());
    }
    let compatible = match (parse_mode(held), req.mode) {
        (Some(LockMode::Shared), LockMode::Shared) => true,
        (Some(h), asked) => h == asked,
        (None, _) => false,
    };
    if !compatible {
        return Err(req.mode.conflict(&describe(held), &req.key));
    }
    match req.mode {
        LockMode::Shared if marker => {
            Err(Error::unavailable(&req.key).with_retry_after(left(state.writer, now)))
        }
        LockMode::Semaphore { permits } if live.len() >= permits as usize => {
            let soonest = live.iter().copied().min().unwrap_or(now);
            Err(Error::unavailable(&req.key).with_retry_after(left(soonest, now)))
        }
        _ => Ok(()),
    }
}

impl AerospikeStore {
    /// Reads a lock record's mode, holders and marker from the master; `None` when absent.
    async fn read_state(&self, key: &LockKey, record_key: &Key) -> Result<Option<State>> {
        let mut base_policy = self.base(0);
        base_policy.replica = Replica::Master;
        let policy = ReadPolicy { base_policy };
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

    /// Takes a read lock or a permit: one filtered `operate` that sweeps expired holders and adds
    /// ours, admitted by the filter only under the mode's rule. Refused (filtered out), the record
    /// is read once to tell why; a request the reading admits goes again, with the TTL handling
    /// the record needs. An absent record the filtered write did not create is created
    /// create-only.
    pub(crate) async fn acquire_shared(&self, req: &Acquire) -> Result<Lease> {
        let record_key = self.record_key(&req.key)?;
        let sent_at = Instant::now();
        let granted =
            || Lease::new(req.key.clone(), req.token.clone(), req.ttl, sent_at).with_mode(req.mode);
        let mut expiry = Expiry::Set;
        for _ in 0..MAX_ROUNDS {
            match self.join(req, &record_key, expiry).await {
                Ok(()) => return Ok(granted()),
                Err(e) => match classify(&e) {
                    Class::Server(ResultCode::FilteredOut | ResultCode::KeyNotFoundError) => {}
                    _ => return Err(self.exhausted_or("acquire", &req.key, e)),
                },
            }
            match self.read_state(&req.key, &record_key).await? {
                None => match self.create_shared(req, &record_key).await {
                    Ok(()) => return Ok(granted()),
                    Err(e) if classify(&e) == Class::Server(ResultCode::KeyExistsError) => {
                        expiry = Expiry::Set;
                    }
                    Err(e) => return Err(self.exhausted_or("acquire", &req.key, e)),
                },
                Some(state) => {
                    judge(req, &state, now_ms())?;
                    expiry = Expiry::for_record(state.ttl, req.ttl);
                }
            }
        }
        Err(Error::unavailable(&req.key))
    }

    /// The joining `operate`: filter `ttl rule && (mode rule || nobody left)`, then set the mode,
    /// remove expired entries, put ours.
    async fn join(
        &self,
        req: &Acquire,
        record_key: &Key,
        expiry: Expiry,
    ) -> Result<(), aerospike::Error> {
        let now = now_ms();
        let cut = now + 1;
        let mode = mode_field(req.mode);
        let mode_rule = match req.mode {
            LockMode::Semaphore { permits } => and(vec![
                eq(string_bin(MODE_BIN), string_val(mode.clone())),
                lt(live_count(cut), int_val(i64::from(permits))),
            ]),
            _ => and(vec![
                eq(string_bin(MODE_BIN), string_val(mode.clone())),
                marker_dead(cut),
            ]),
        };
        let free = and(vec![eq(live_count(cut), int_val(0)), marker_dead(cut)]);
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.send_key = self.inner.config.send_key;
        let ttl_rule = expiry.apply(&mut policy, req.ttl);
        policy.base_policy.filter_expression = Some(and(vec![ttl_rule, or(vec![mode_rule, free])]));
        let ops = [
            operations::put(&as_bin!(MODE_BIN, mode)),
            sweep(cut),
            maps::put(
                &MapPolicy::default(),
                HOLDERS_BIN,
                Value::from(req.token.as_str()),
                Value::from(now.saturating_add(ms(req.ttl))),
            ),
        ];
        self.with_retries("acquire", &req.key, || {
            self.inner.client.operate(&policy, record_key, &ops)
        })
        .await
        .map(|_| ())
    }

    /// A fresh shared record, create-only (the fallback when the filtered write did not create
    /// an absent record).
    async fn create_shared(&self, req: &Acquire, record_key: &Key) -> Result<(), aerospike::Error> {
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.record_exists_action = RecordExistsAction::CreateOnly;
        policy.expiration = Expiration::Seconds(ttl_seconds(req.ttl).saturating_add(1));
        policy.send_key = self.inner.config.send_key;
        let holders = HashMap::from([(
            Value::from(req.token.as_str()),
            Value::from(now_ms().saturating_add(ms(req.ttl))),
        )]);
        let bins = [
            as_bin!(MODE_BIN, mode_field(req.mode)),
            as_bin!(HOLDERS_BIN, Value::HashMap(holders)),
        ];
        self.with_retries("acquire", &req.key, || {
            self.inner.client.put(&policy, record_key, &bins)
        })
        .await
    }

    /// An exclusive create found the record. Exclusive record: `LockUnavailable`. Shared record
    /// with live holders: `ModeConflict` for a semaphore, else `LockUnavailable`, leaving a
    /// blocking writer's marker. Shared record with no live holder: removed (filtered delete),
    /// `Ok` — the caller creates again. Absent by now: `Ok`.
    pub(crate) async fn writer_meets_record(&self, req: &Acquire, record_key: &Key) -> Result<()> {
        let Some(state) = self.read_state(&req.key, record_key).await? else {
            return Ok(());
        };
        let Some(held) = state.mode.as_deref() else {
            return Err(Error::unavailable(&req.key));
        };
        let now = now_ms();
        let longest = state.live(now).map(|(_, exp)| *exp).max();
        let Some(longest) = longest else {
            return self.remove_if_unheld(req, record_key, now + 1).await;
        };
        if parse_mode(held) != Some(LockMode::Shared) {
            return Err(req.mode.conflict(&describe(held), &req.key));
        }
        if let Some(deadline) = req.deadline {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(req.ttl);
            self.mark_writer(req, record_key, now.saturating_add(ms(wait)))
                .await;
        }
        Err(Error::unavailable(&req.key).with_retry_after(left(longest, now)))
    }

    /// Deletes a shared record whose holders have all expired, filtered on exactly that.
    async fn remove_if_unheld(&self, req: &Acquire, record_key: &Key, cut: i64) -> Result<()> {
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.base_policy.filter_expression = Some(and(vec![
            bin_exists(MODE_BIN),
            eq(live_count(cut), int_val(0)),
        ]));
        let deleted = self
            .with_retries("acquire", &req.key, || {
                self.inner.client.delete(&policy, record_key)
            })
            .await;
        match deleted {
            Ok(_) => Ok(()),
            Err(e) => match classify(&e) {
                Class::Server(ResultCode::KeyNotFoundError) => Ok(()),
                // Someone joined in between.
                Class::Server(ResultCode::FilteredOut) => Err(Error::unavailable(&req.key)),
                _ => Err(self.exhausted_or("acquire", &req.key, e)),
            },
        }
    }

    /// Leaves (or moves later) the waiting writer's marker on a read-locked record. Best effort:
    /// a marker that is not written only costs the writer its priority.
    async fn mark_writer(&self, req: &Acquire, record_key: &Key, until: i64) {
        let mut policy = self.write_policy(self.inner.config.commit_levels.acquire);
        policy.record_exists_action = RecordExistsAction::UpdateOnly;
        policy.expiration = Expiration::DontUpdate;
        policy.base_policy.filter_expression = Some(and(vec![
            eq(
                string_bin(MODE_BIN),
                string_val(mode_field(LockMode::Shared)),
            ),
            marker_dead(until),
        ]));
        let ops = [operations::put(&as_bin!(WRITER_BIN, until))];
        let result = self
            .with_retries("writer marker", &req.key, || {
                self.inner.client.operate(&policy, record_key, &ops)
            })
            .await;
        if let Err(e) = result {
            if !matches!(classify(&e), Class::Server(ResultCode::FilteredOut)) {
                tracing::debug!(key = %req.key, error = %e, "writer marker not written");
            }
        }
    }

    /// Removes our entry (and expired ones); when no live holder is left, deletes the record with
    /// a filter saying exactly that. `true` when our entry was there and live.
    pub(crate) async fn release_shared(&self, lease: &Lease) -> Result<bool> {
        let record_key = self.record_key(lease.key())?;
        let now = now_ms();
        let cut = now + 1;
        let mut policy = self.write_policy(self.inner.config.commit_levels.release);
        policy.record_exists_action = RecordExistsAction::UpdateOnly;
        policy.expiration = Expiration::DontUpdate;
        policy.base_policy.filter_expression = Some(bin_exists(MODE_BIN));
        let ops = [
            maps::remove_by_key(
                HOLDERS_BIN,
                Value::from(lease.token().as_str()),
                MapReturnType::VALUE,
            ),
            sweep(cut),
            maps::get_by_value_range(
                HOLDERS_BIN,
                Value::from(cut),
                Value::Nil,
                MapReturnType::COUNT,
            ),
            operations::get_bin(WRITER_BIN),
        ];
        // Removing our entry twice is harmless: sent again on transient failures and lost
        // replies, within the retry budget.
        let mut backoff = self.budget(None);
        let (result, doubted) = self
            .retry_with(&mut backoff, "release", lease.key(), true, || {
                self.inner.client.operate(&policy, &record_key, &ops)
            })
            .await;
        let record = match result {
            Ok(record) => record,
            Err(e) => {
                return match classify(&e) {
                    Class::Server(ResultCode::FilteredOut | ResultCode::KeyNotFoundError) => {
                        Ok(doubted)
                    }
                    Class::NotSent | Class::InDoubt if backoff.made() > 1 => {
                        let after = format!(
                            "({} attempt(s) in {} ms)",
                            backoff.made(),
                            backoff.elapsed().as_millis()
                        );
                        Err(if classify(&e) == Class::InDoubt {
                            crate::error::map("release", lease.key().as_str(), self.address(), e)
                        } else {
                            self.exhausted("release", lease.key(), e, &after)
                        })
                    }
                    _ => Err(crate::error::map(
                        "release",
                        lease.key().as_str(),
                        self.address(),
                        e,
                    )),
                };
            }
        };
        let results = record.results.unwrap_or_default();
        // After a lost reply, an entry found gone counts as removed by us.
        let released = doubted || matches!(results.first(), Some(Value::Int(exp)) if *exp > now);
        let left = matches!(results.get(2), Some(Value::Int(n)) if *n > 0);
        let marker = matches!(results.get(3), Some(Value::Int(w)) if *w > now);
        if !left && !marker {
            let mut policy = self.write_policy(self.inner.config.commit_levels.release);
            policy.base_policy.filter_expression = Some(and(vec![
                bin_exists(MODE_BIN),
                eq(live_count(cut), int_val(0)),
                marker_dead(cut),
            ]));
            // Best effort: a record left behind holds nobody and expires with its TTL.
            if let Err(e) = self.inner.client.delete(&policy, &record_key).await {
                tracing::debug!(key = %lease.key(), error = %e, "empty shared record left");
            }
        }
        Ok(released)
    }

    /// Moves our entry's expiry, filtered on the entry being live; the record's TTL follows
    /// ([`Expiry`]: `Set` first, then `Keep`).
    pub(crate) async fn extend_shared(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        let record_key = self.record_key(lease.key())?;
        let sent_at = Instant::now();
        let token = lease.token().as_str();
        for expiry in [Expiry::Set, Expiry::Keep, Expiry::Set, Expiry::Keep] {
            let now = now_ms();
            let mut policy = self.write_policy(self.inner.config.commit_levels.extend);
            let ttl_rule = expiry.apply(&mut policy, ttl);
            policy.record_exists_action = RecordExistsAction::UpdateOnly;
            let entry = map_exp::get_by_key(
                MapReturnType::VALUE,
                ExpType::Int,
                string_val(token),
                map_bin(HOLDERS_BIN),
                &[],
            );
            policy.base_policy.filter_expression = Some(and(vec![
                bin_exists(MODE_BIN),
                gt(entry, int_val(now)),
                ttl_rule,
            ]));
            let update_only = MapPolicy::new(MapOrder::Unordered, MapWriteFlags::UPDATE_ONLY);
            let ops = [maps::put(
                &update_only,
                HOLDERS_BIN,
                Value::from(token),
                Value::from(now.saturating_add(ms(ttl))),
            )];
            // Moving the entry's expiry twice is harmless: sent again on transient failures and
            // lost replies, within the retry budget and the lease.
            let mut backoff = self.budget(Some(lease.expires_at()));
            let (result, _) = self
                .retry_with(&mut backoff, "extend", lease.key(), true, || {
                    self.inner.client.operate(&policy, &record_key, &ops)
                })
                .await;
            match result {
                Ok(_) => return Ok(lease.renewed(ttl, sent_at)),
                Err(e) => match classify(&e) {
                    Class::Server(ResultCode::FilteredOut) => {}
                    Class::Server(ResultCode::KeyNotFoundError | ResultCode::ElementNotFound) => {
                        break
                    }
                    Class::NotSent if backoff.made() > 1 => {
                        let after = format!(
                            "({} attempt(s) in {} ms)",
                            backoff.made(),
                            backoff.elapsed().as_millis()
                        );
                        return Err(self.exhausted("extend", lease.key(), e, &after));
                    }
                    _ => {
                        return Err(crate::error::map(
                            "extend",
                            lease.key().as_str(),
                            self.address(),
                            e,
                        ))
                    }
                },
            }
        }
        Err(Error::not_held(
            "the permit or read hold expired (or was never ours) before it could be extended",
        )
        .with_key(lease.key().as_str()))
    }
}

/// Removes the holder entries that expired before `cut`.
fn sweep(cut: i64) -> Operation {
    maps::remove_by_value_range(
        HOLDERS_BIN,
        Value::Nil,
        Value::from(cut),
        MapReturnType::NONE,
    )
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

    #[test]
    fn the_record_ttl_is_kept_only_when_longer() {
        let ttl = Duration::from_millis(1500);
        assert_eq!(Expiry::for_record(None, ttl), Expiry::Set);
        assert_eq!(
            Expiry::for_record(Some(Duration::from_secs(2)), ttl),
            Expiry::Set
        );
        assert_eq!(
            Expiry::for_record(Some(Duration::from_secs(3)), ttl),
            Expiry::Keep
        );
    }
}
