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

use std::future::Future;
use std::time::Duration;

use aerospike::{Bins, ReadPolicy, Replica, ResultCode, Value};
use leasehold_core::{Acquire, Attempt, Lease, Result};
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

/// Undoes an abandoned acquisition when dropped armed.
struct UndoOnDrop<'a> {
    store: Option<&'a AerospikeStore>,
    req: &'a Acquire,
}

impl Drop for UndoOnDrop<'_> {
    fn drop(&mut self) {
        if let Some(store) = self.store.take() {
            store.undo_abandoned(self.req.clone());
        }
    }
}

impl AerospikeStore {
    /// Runs `acquire` on the caller's task; if the caller stops waiting before its answer, the
    /// attempt is undone ([`Self::undo_abandoned`]). An answer, whatever it is, is the caller's
    /// (an in-doubt one included: the manager undoes those).
    pub(crate) async fn undone_if_dropped(
        &self,
        req: &Acquire,
        acquire: impl Future<Output = Result<Attempt>>,
    ) -> Result<Attempt> {
        let mut guard = UndoOnDrop {
            store: Some(self),
            req,
        };
        let answer = acquire.await;
        guard.store = None;
        answer
    }

    /// Releases whatever an abandoned acquisition may hold under its token, at once and again
    /// while the record shows it (see the module docs), in the background.
    pub(crate) fn undo_abandoned(&self, req: Acquire) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(key = %req.key,
                "an acquisition was abandoned outside a runtime and cannot be undone; it expires at its TTL");
            return;
        };
        let store = self.clone();
        runtime.spawn(async move {
            let until = Instant::now() + store.inner.config.retry_budget.min(req.ttl);
            let lease = Lease::new(req.key.clone(), req.token.clone(), req.ttl, Instant::now())
                .with_mode(req.mode);
            let mut looks = LOOKS.iter().chain(std::iter::repeat(&LOOKS[2]));
            // The first pass releases without looking; later ones release when the record shows
            // the token, or when they cannot tell (the release is owner-filtered: harmless).
            let mut check = false;
            // The last release that failed on a temporary error: asked again at the next look,
            // reported only if the looks run out with it unanswered.
            let mut unanswered = None;
            loop {
                if !check || store.holds(&req).await != Some(false) {
                    match store.release_once(&lease).await {
                        Ok(_) => unanswered = None,
                        Err(error) if error.is_temporary() => unanswered = Some(error),
                        Err(error) => {
                            tracing::warn!(key = %req.key, error = %error.chain(),
                                "could not undo an acquisition nobody waited for; it expires at its TTL");
                            return;
                        }
                    }
                }
                check = true;
                let next = Instant::now() + *looks.next().unwrap_or(&LOOKS[2]);
                if next >= until {
                    if let Some(error) = unanswered {
                        tracing::warn!(key = %req.key, error = %error.chain(),
                            "could not undo an acquisition nobody waited for within the retry \
                             budget; it expires at its TTL");
                    }
                    return;
                }
                tokio::time::sleep_until(next).await;
            }
        });
    }

    /// Whether the key's lock record holds `req`'s token (an exclusive record's owner, or an
    /// entry of a shared record's holders); `None` when the read failed and cannot tell.
    async fn holds(&self, req: &Acquire) -> Option<bool> {
        let Ok(record_key) = self.record_key(&req.key) else {
            return Some(false);
        };
        let mut base_policy = self.base(0);
        base_policy.replica = Replica::Master;
        let policy = ReadPolicy { base_policy };
        let bins = Bins::Some(vec![TOKEN_BIN.to_owned(), HOLDERS_BIN.to_owned()]);
        match self.inner.client.get(&policy, &record_key, bins).await {
            Ok(record) => {
                let token = req.token.as_str();
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
                tracing::debug!(key = %req.key, error = %e, "abandoned acquisition: look failed");
                None
            }
        }
    }
}
