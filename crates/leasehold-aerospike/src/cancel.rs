//! Cancel safety at no cost unless the caller is cancelled: an acquisition runs on the caller's
//! task, and only if the caller drops it before its answer is the attempt undone, in the
//! background.
//!
//! Running every acquisition on a task of its own (`acquire_detached`) would let it finish and
//! release what it took, but costs a spawn and two hand-overs between threads on every call
//! (measured on the uncontended benchmark with the wire fixture: about a third of the Java
//! manager's cycle). Undoing from a drop guard instead has one difficulty on Aerospike: the
//! client's connections are pooled, so the undo travels on another connection than the request
//! it undoes, and may overtake it — the dropped request can still land after the undo, as a
//! paused node's buffered requests do. So the undo releases at once, then looks again for a while
//! (10 ms, 50 ms, then every 200 ms, within the retry budget and never past the TTL) and
//! releases again whenever the record still holds the abandoned token. Owner tokens are unique
//! per acquisition, and an abandoned one was never handed to anybody, so anything held under it
//! is ours to remove.

use std::time::Duration;

use aerospike::{Bins, ResultCode, Value};
use leasehold_core::{
    Acquire, Attempt, Lease, LockKey, OwnerToken, Result, UndoGuard, UndoIfCancelled,
};
use tokio::time::Instant;

use crate::error::{classify, Class};
use crate::layout::{HOLDERS_BIN, TOKEN_BIN};
use crate::store::AerospikeStore;

/// When an abandoned acquisition is looked for again after its first undo: soon (a request
/// overtaken on a healthy cluster lands within a round trip or two), then as the late create of
/// a failed fenced acquisition is (`LATE_CREATE_POLL`).
const LOOKS: [Duration; 3] = [
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(200),
];

/// How many of the [`LOOKS`] after an undo's first release a shutdown waits for.
const COUNTED_LOOKS: usize = 2;

impl AerospikeStore {
    /// The acquire itself, on the caller's task; if the caller stops waiting before its answer,
    /// the attempt is undone ([`Self::undo_abandoned`], on a task of its own). An answer, whatever
    /// it is, is the caller's (an in-doubt one included: the manager undoes those).
    pub(crate) async fn acquire_undone_if_cancelled(&self, req: &Acquire) -> Result<Attempt> {
        let undo = UndoIfCancelled::arm(req, |lease, counted| {
            let store = self.clone();
            async move { store.undo_abandoned(lease, counted).await }
        });
        let result = self.acquire_once(req).await;
        let answer = self.trace_acquire(req, result).await;
        undo.disarm();
        answer
    }

    /// Releases whatever an abandoned acquisition may hold under its token, at once and again
    /// while the record shows it (see the module docs). `Ok(true)` if a release removed it; an
    /// error when the looks ran out with the last release unanswered, or one failed for good.
    /// A shutdown waits for the first release and the looks of its first [`COUNTED_LOOKS`]
    /// (about 60 ms: where an overtaken request lands), not for the rest (`counted` goes then).
    async fn undo_abandoned(&self, lease: Lease, counted: UndoGuard) -> Result<bool> {
        let mut counted = Some(counted);
        let mut passes = 0;
        let until = Instant::now() + self.inner.config.retry_budget.min(lease.ttl());
        let mut looks = LOOKS.iter().chain(std::iter::repeat(&LOOKS[2]));
        // The first pass releases without looking; later ones release when the record shows
        // the token, or when they cannot tell (the release is owner-filtered: harmless).
        let mut check = false;
        let mut released = false;
        // The last release that failed on a temporary error: asked again at the next look,
        // reported only if the looks run out with it unanswered.
        let mut unanswered = None;
        loop {
            if !check || self.holds(lease.key(), lease.token()).await != Some(false) {
                match self.release_once(&lease).await {
                    Ok(removed) => {
                        released |= removed;
                        unanswered = None;
                    }
                    Err(error) if error.is_temporary() => unanswered = Some(error),
                    Err(error) => return Err(error),
                }
            }
            check = true;
            passes += 1;
            if passes > COUNTED_LOOKS {
                drop(counted.take());
            }
            let next = Instant::now() + *looks.next().unwrap_or(&LOOKS[2]);
            if next >= until {
                return unanswered.map_or(Ok(released), Err);
            }
            tokio::time::sleep_until(next).await;
        }
    }

    /// Whether `key`'s lock record holds `token` (an exclusive record's owner, or an
    /// entry of a shared record's holders); `None` when the read failed and cannot tell.
    async fn holds(&self, key: &LockKey, token: &OwnerToken) -> Option<bool> {
        let Ok(record_key) = self.record_key(key) else {
            return Some(false);
        };
        let policy = self.master_read_policy();
        let bins = Bins::Some(vec![TOKEN_BIN.to_owned(), HOLDERS_BIN.to_owned()]);
        match self.inner.client.get(&policy, &record_key, bins).await {
            Ok(record) => {
                let token = token.as_str();
                let exclusive =
                    matches!(record.bins.get(TOKEN_BIN), Some(Value::String(t)) if t == token);
                let shared = match record.bins.get(HOLDERS_BIN) {
                    Some(Value::HashMap(m)) => m.contains_key(&Value::from(token)),
                    Some(Value::OrderedMap(m)) => m.contains_key(&Value::from(token)),
                    Some(Value::SortedMap(m)) => m.contains_key(&Value::from(token)),
                    _ => false,
                };
                Some(exclusive || shared)
            }
            Err(e) if classify(&e) == Class::Server(ResultCode::KeyNotFoundError) => Some(false),
            Err(e) => {
                tracing::debug!(key = %key, error = %e, "abandoned acquisition: look failed");
                None
            }
        }
    }
}
