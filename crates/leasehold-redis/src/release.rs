//! The release: one owner-checked script that, with fair waiting on, tells the next entry in line.

use leasehold_core::{HistoryEntry, HistoryEvent, Lease, Operation, Result};

use crate::scripts::ScriptCall;
use crate::store::RedisStore;

impl RedisStore {
    pub(crate) async fn release_once(&self, lease: &Lease) -> Result<bool> {
        let mut conn = self.conn();
        let lock_key = self.lock_key(lease.key());
        let traced = lease.trace().is_some();
        let shared = lease.mode().is_shared_record();
        let fair = self.inner.config.fair;
        let script = match (shared, fair, traced) {
            (true, _, false) => &self.scripts().release_shared,
            (true, _, true) => &self.scripts().release_shared_traced,
            (false, true, false) => &self.scripts().release_fair,
            (false, true, true) => &self.scripts().release_fair_traced,
            (false, false, false) => &self.scripts().release,
            (false, false, true) => &self.scripts().release_traced,
        };
        let change_channel = self.change_channel_if(&lock_key, lease.announces(), traced);
        let change_channel = change_channel.as_deref();
        let trace_key = self.trace_key_for(lease.key(), lease.trace());
        let mut call = if shared || fair {
            let queue_key = self.queue_key(lease.key());
            let channel = self.inner.waiting.channel(&lock_key);
            ScriptCall::announcing(
                script,
                &[&lock_key, &queue_key, &channel],
                change_channel,
                trace_key.as_deref(),
            )
        } else {
            ScriptCall::announcing(script, &[&lock_key], change_channel, trace_key.as_deref())
        };
        call.arg(lease.token().as_str())
            .optional_args(&[u64::from(lease.announces())], traced);
        if let Some(trace) = lease.trace() {
            let entry = |event| HistoryEntry::new(event, lease.token(), "");
            let (released, not_held) =
                (entry(HistoryEvent::Released), entry(HistoryEvent::NotHeld));
            self.trace_args(&mut call, trace, Some(released), Some(not_held));
        }
        let deleted: i64 = call
            .invoke(&mut conn)
            .await
            .map_err(|e| self.err(Operation::Release, lease.key(), e))?;
        Ok(deleted == 1)
    }
}
