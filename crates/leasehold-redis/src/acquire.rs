//! The exclusive acquisition: one script (first-come here, fair in `queue`), then, with replica
//! acknowledgement on, `WAIT`; and the undo of an acquisition whose caller stopped waiting.

use std::time::Duration;

use leasehold_core::{
    ttl_millis, Acquire, Attempt, Error, HistoryEntry, HistoryEvent, Lease, LockKey, LockStore,
    Operation, Result,
};
use tokio::time::Instant;

use crate::reply::{describe_mode, writer_wait_millis};
use crate::scripts::ScriptCall;
use crate::store::RedisStore;

impl RedisStore {
    /// The error for an acquire refused because this very token holds the lock: the request ran
    /// a second time after its first run took the lock (see "A second run" in the scripts'
    /// docs), so the outcome is in doubt, never a refusal that would leave the hold unknown.
    pub(crate) fn ran_twice(&self, req: &Acquire) -> Error {
        Error::in_doubt(format!(
            "the acquire ran twice on {} (a retry after its first reply was lost) and the lock is \
             held by this very request's token: its first run took it; read the record to learn \
             the outcome (the readback layer does)",
            self.address()
        ))
        .with_key(req.key.as_str())
    }

    /// One acquisition (see `acquire` for cancel safety): the acquire round trip, then, with
    /// replica acknowledgement on, `WAIT`. A grant too few replicas confirmed is undone (an
    /// owner-checked release of its own token) and reported as a temporary error; if the undo
    /// fails too, the outcome is in doubt, so the caller's undo tries again.
    pub(crate) async fn acquire_once(&self, req: &Acquire) -> Result<Attempt> {
        let lease = match self.acquire_unconfirmed(req).await? {
            Attempt::Granted(lease) => lease,
            refused => return Ok(refused),
        };
        if let Err(unconfirmed) = self.confirm(Operation::Acquire, &req.key).await {
            return match self.release_once(&lease).await {
                Ok(_) => Err(unconfirmed),
                Err(undo) => Err(Error::in_doubt(format!(
                    "a grant too few replicas confirmed could not be undone ({undo}); it may \
                     stay held until its TTL unless the release is retried"
                ))
                .with_key(req.key.as_str())
                .with_source(unconfirmed)),
            };
        }
        Ok(Attempt::Granted(lease))
    }

    /// With replica acknowledgement on ([`RedisConfig::min_replicas`]): waits until enough
    /// replicas have every write sent so far on the node holding `key`'s lock.
    pub(crate) async fn confirm(&self, op: Operation, key: &LockKey) -> Result<()> {
        let Some(min) = self.inner.config.min_replicas else {
            return Ok(());
        };
        let mut conn = self.conn();
        let acknowledged = conn
            .wait_replicas(&self.lock_key(key), min.replicas, min.timeout)
            .await
            .map_err(|e| self.err(op, key, e))?;
        if acknowledged >= min.replicas {
            return Ok(());
        }
        Err(Error::connection(format!(
            "only {acknowledged} of the {} replicas asked for acknowledged the {} on Redis at {} \
             within {:?}; {} (a replica down or lagging: retry, or lower min_replicas)",
            min.replicas,
            if op == Operation::Acquire {
                "grant"
            } else {
                "extend"
            },
            self.address(),
            min.timeout,
            if op == Operation::Acquire {
                "the grant is undone"
            } else {
                "the extend does not count"
            }
        ))
        .with_key(key.as_str()))
    }

    /// The acquire round trip itself.
    pub(crate) async fn acquire_unconfirmed(&self, req: &Acquire) -> Result<Attempt> {
        if req.mode.is_shared_record() {
            return self.acquire_shared(req).await;
        }
        if self.inner.config.fair {
            return self.acquire_fair(req).await;
        }
        let sent_at = Instant::now();
        let mut conn = self.conn();
        let traced = req.trace.is_some();
        let script = if traced {
            &self.scripts().acquire_traced
        } else {
            &self.scripts().acquire
        };
        let (lock_key, fence_key) = (self.lock_key(&req.key), self.fence_key(&req.key));
        let change_channel = self.change_channel_if(&lock_key, req.announce, traced);
        let trace_key = self.trace_key_for(&req.key, req.trace.as_ref());
        let mut call = ScriptCall::announcing(
            script,
            &[&lock_key, &fence_key],
            change_channel.as_deref(),
            trace_key.as_deref(),
        );
        call.arg(req.token.as_str())
            .arg(ttl_millis(req.ttl))
            .arg(if self.inner.config.fencing { "1" } else { "0" })
            .optional_args(
                &[writer_wait_millis(req, sent_at), u64::from(req.announce)],
                traced,
            );
        self.trace_acquire(&mut call, req);
        let (acquired, value, mine): (i64, Option<u64>, u64) = call
            .invoke(&mut conn)
            .await
            .map_err(|e| self.acquire_err(req, e))?;
        if acquired == 1 {
            return Ok(Lease::granted(req, sent_at)
                .with_fencing_token(value)
                .into());
        }
        if mine == 1 {
            return Err(self.ran_twice(req));
        }
        Ok(Attempt::refused_for(Duration::from_millis(
            value.unwrap_or(1),
        )))
    }

    /// Maps an acquire script's error: `MODECONFLICT <mode>` is the key held as another kind.
    pub(crate) fn acquire_err(&self, req: &Acquire, e: redis::RedisError) -> Error {
        if e.code() == Some("MODECONFLICT") {
            let held = e
                .detail()
                .map_or("another kind of lock".to_owned(), describe_mode);
            return req.mode.conflict(&held, &req.key);
        }
        self.err(Operation::Acquire, &req.key, e)
    }

    /// Adds the lock trace's arguments to an acquire script's call, if `req` is traced.
    pub(crate) fn trace_acquire(&self, call: &mut ScriptCall<'_>, req: &Acquire) {
        if let Some(trace) = &req.trace {
            let (ok, refused) = acquire_entries(req);
            self.trace_args(call, trace, Some(ok), Some(refused));
        }
    }
}

/// When an abandoned acquisition is looked for again after its undo (see
/// [`RedisStore::undo_abandoned`]).
const UNDO_LOOKS: [Duration; 3] = [
    Duration::from_millis(10),
    Duration::from_millis(50),
    Duration::from_millis(200),
];

impl RedisStore {
    /// Undoes an acquisition whose caller stopped waiting for its answer: an owner-checked
    /// release, then a few looks (10, 50 and 200 ms later) that release again if the abandoned
    /// token shows up. The undo usually follows the request on the same ordered connection, but
    /// not always: a cluster's request may have gone through the cluster client and its undo
    /// direct (or the other way round), and a reconnect or a Sentinel master switch puts the undo
    /// on a new connection; there it can overtake the request it undoes.
    pub(crate) async fn undo_abandoned(&self, lease: &Lease) -> Result<bool> {
        let released = self.release_once(lease).await;
        for pause in UNDO_LOOKS {
            tokio::time::sleep(pause).await;
            let holds = match LockStore::inspect(self, lease.key()).await {
                Ok(Some(info)) => {
                    info.token.as_ref() == Some(lease.token())
                        || info.holders.iter().any(|h| &h.token == lease.token())
                }
                Ok(None) => false,
                // Cannot tell: the owner-checked release is harmless either way.
                Err(_) => true,
            };
            if holds {
                if let Ok(true) = self.release_once(lease).await {
                    return Ok(true);
                }
            }
        }
        released
    }
}

/// The history entries an acquire writes: acquired, or refused / waited.
fn acquire_entries(req: &Acquire) -> (HistoryEntry, HistoryEntry) {
    let ok = HistoryEntry::new(
        HistoryEvent::Acquired,
        &req.token,
        format!("{} ttl {}ms", req.mode, ttl_millis(req.ttl)),
    );
    let failed = if req.wait.is_some() {
        HistoryEvent::Waited
    } else {
        HistoryEvent::Refused
    };
    (
        ok,
        HistoryEntry::new(failed, &req.token, "held by another owner"),
    )
}
