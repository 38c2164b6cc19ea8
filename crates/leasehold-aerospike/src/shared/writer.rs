//! An exclusive request (a write lock) that meets a record already there: it is refused by an
//! exclusive or live shared hold, leaving a waiting writer's marker on a read-locked record so new
//! readers hold back, and it removes a shared record nobody holds any more.

use aerospike::expressions::{and, bin_exists, eq, int_val, string_bin, string_val};
use aerospike::operations;
use aerospike::policy::{Expiration, RecordExistsAction};
use aerospike::{as_bin, Key, ResultCode};
use leasehold_core::{Acquire, LockMode};
use tokio::time::Instant;

use super::expressions::{live_count, marker_dead};
use super::record::{describe, left, mode_field, ms, now_ms, parse_mode};
use crate::error::{classify, Class};
use crate::layout::{MODE_BIN, WRITER_BIN};
use crate::refused::{Step, Stop};
use crate::store::AerospikeStore;

impl AerospikeStore {
    /// An exclusive create found the record. Exclusive record: refused. Shared record
    /// with live holders: `ModeConflict` for a semaphore, else refused, leaving a
    /// blocking writer's marker. Shared record with no live holder: removed (filtered delete),
    /// `Ok` — the caller creates again. Absent by now: `Ok`.
    pub(crate) async fn writer_meets_record(&self, req: &Acquire, record_key: &Key) -> Step<()> {
        let Some(state) = self.read_state(&req.key, record_key).await? else {
            return Ok(());
        };
        let Some(held) = state.mode.as_deref() else {
            return Err(Stop::refused());
        };
        let now = now_ms();
        let longest = state.live(now).map(|(_, exp)| *exp).max();
        let Some(longest) = longest else {
            return self.remove_if_unheld(req, record_key, now + 1).await;
        };
        if parse_mode(held) != Some(LockMode::Shared) {
            return Err(req.mode.conflict(&describe(held), &req.key).into());
        }
        if let Some(deadline) = req.deadline() {
            let wait = deadline
                .saturating_duration_since(Instant::now())
                .min(req.ttl);
            self.mark_writer(req, record_key, now.saturating_add(ms(wait)))
                .await;
        }
        Err(Stop::refused_for(left(longest, now)))
    }

    /// Deletes a shared record whose holders have all expired, filtered on exactly that.
    async fn remove_if_unheld(&self, req: &Acquire, record_key: &Key, cut: i64) -> Step<()> {
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
                Class::Server(ResultCode::FilteredOut) => Err(Stop::refused()),
                _ => Err(self.exhausted_or("acquire", &req.key, e).into()),
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
}
