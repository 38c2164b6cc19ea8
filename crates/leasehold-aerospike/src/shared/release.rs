//! Releasing and extending a read hold or permit: both change only our own holder entry, so
//! sending them again after a lost reply is harmless; the last holder out deletes the record.

use std::time::Duration;

use aerospike::expressions::maps as map_exp;
use aerospike::expressions::{and, bin_exists, eq, gt, int_val, map_bin, string_val, ExpType};
use aerospike::operations;
use aerospike::operations::maps::{self, MapOrder, MapPolicy, MapReturnType, MapWriteFlags};
use aerospike::policy::{Expiration, RecordExistsAction};
use aerospike::{ResultCode, Value};
use leasehold_core::{Error, Lease, Result};
use tokio::time::Instant;

use super::expiry::Expiry;
use super::expressions::{live_count, marker_dead, sweep};
use super::record::{ms, now_ms};
use crate::error::{classify, Class};
use crate::layout::{HOLDERS_BIN, MODE_BIN, WRITER_BIN};
use crate::store::AerospikeStore;

impl AerospikeStore {
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
                        Err(self.retries_ended("release", lease.key(), e, &backoff, doubted))
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
            let (result, doubted) = self
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
                        return Err(self.retries_ended(
                            "extend",
                            lease.key(),
                            e,
                            &backoff,
                            doubted,
                        ));
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
