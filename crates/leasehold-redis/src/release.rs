//! The release: one owner-checked script that, with fair waiting on, tells the next entry in line.

use leasehold_core::{HistoryEntry, HistoryEvent, Lease, Operation, Result};

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
        let mut invocation = script.prepare_invoke();
        invocation.key(&lock_key);
        if shared || fair {
            invocation
                .key(self.queue_key(lease.key()))
                .key(self.inner.waiting.channel(&lock_key));
        }
        invocation
            .key(self.change_channel(lease.key()))
            .arg(lease.token().as_str())
            .arg(if lease.announces() { "1" } else { "0" });
        if let Some(trace) = lease.trace() {
            let entry = |event| HistoryEntry::new(event, lease.token(), "");
            let (released, not_held) =
                (entry(HistoryEvent::Released), entry(HistoryEvent::NotHeld));
            self.trace_args(
                &mut invocation,
                lease.key(),
                trace,
                Some(released),
                Some(not_held),
            );
        }
        let deleted: i64 = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.err(Operation::Release, lease.key(), e))?;
        Ok(deleted == 1)
    }
}
