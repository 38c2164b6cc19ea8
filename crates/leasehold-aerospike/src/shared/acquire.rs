//! Taking a read lock or a semaphore permit: a filtered `operate` that joins the holders when the
//! mode's rule admits us, and, when it is refused, one read of the record to tell a conflict from
//! a request worth sending again.

use std::collections::HashMap;

use aerospike::expressions::{and, eq, int_val, lt, or, string_bin, string_val};
use aerospike::operations;
use aerospike::operations::maps::{self, MapPolicy};
use aerospike::policy::{Expiration, RecordExistsAction};
use aerospike::{as_bin, Key, ResultCode, Value};
use leasehold_core::{Acquire, Lease, LockMode};
use tokio::time::Instant;

use super::expiry::Expiry;
use super::expressions::{live_count, marker_dead, sweep};
use super::record::{describe, left, mode_field, ms, now_ms, parse_mode, State};
use crate::error::{classify, Class};
use crate::layout::{HOLDERS_BIN, MODE_BIN};
use crate::refused::{Step, Stop};
use crate::store::{ttl_seconds, AerospikeStore};

/// Rounds of "try, read the record, try again" before a contended shared request gives up.
const MAX_ROUNDS: usize = 3;

/// What the client-side reading of a record says about a reader or permit request.
fn judge(req: &Acquire, state: &State, now: i64) -> Step<()> {
    let Some(held) = state.mode.as_deref() else {
        // An exclusive hold (ours or the Java manager's).
        return Err(match req.mode {
            LockMode::Semaphore { .. } => req.mode.conflict("an exclusive lock", &req.key).into(),
            _ => Stop::refused_for(state.ttl.unwrap_or_default()),
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
        return Err(req.mode.conflict(&describe(held), &req.key).into());
    }
    match req.mode {
        LockMode::Shared if marker => Err(Stop::refused_for(left(state.writer, now))),
        LockMode::Semaphore { permits } if live.len() >= permits as usize => {
            let soonest = live.iter().copied().min().unwrap_or(now);
            Err(Stop::refused_for(left(soonest, now)))
        }
        _ => Ok(()),
    }
}

impl AerospikeStore {
    /// Takes a read lock or a permit: one filtered `operate` that sweeps expired holders and adds
    /// ours, admitted by the filter only under the mode's rule. Refused (filtered out), the record
    /// is read once to tell why; a request the reading admits goes again, with the TTL handling
    /// the record needs. An absent record the filtered write did not create is created
    /// create-only.
    pub(crate) async fn acquire_shared(&self, req: &Acquire) -> Step<Lease> {
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
                    _ => return Err(self.exhausted_or("acquire", &req.key, e).into()),
                },
            }
            match self.read_state(&req.key, &record_key).await? {
                None => match self.create_shared(req, &record_key).await {
                    Ok(()) => return Ok(granted()),
                    Err(e) if classify(&e) == Class::Server(ResultCode::KeyExistsError) => {
                        expiry = Expiry::Set;
                    }
                    Err(e) => return Err(self.exhausted_or("acquire", &req.key, e).into()),
                },
                Some(state) => {
                    judge(req, &state, now_ms())?;
                    expiry = Expiry::for_record(state.ttl, req.ttl);
                }
            }
        }
        Err(Stop::refused())
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
}
