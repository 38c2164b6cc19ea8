//! The Redis store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    validate_ttl, Acquire, Attempt, Capabilities, ChangeWatch, Error, HistoryEntry, HistoryEvent,
    Lease, LockInfo, LockKey, LockStore, ReleaseWatch, Result, TraceConfig, UndoIfCancelled,
};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use crate::config::RedisConfig;
use crate::connection::Connection;
use crate::error::map;
use crate::scripts::{scripts, ScriptCall, Scripts};
use crate::waiting::subscriber::Subscriber;
use crate::waiting::Waiting;
use leasehold_core::{ttl_millis, Operation};

/// A lock store on one Redis server (or a Redis-compatible proxy), a Redis Cluster, or the master
/// Redis Sentinel names (see [`RedisConfig::new`] for the URLs). Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) conn: Connection,
    pub(crate) config: RedisConfig,
    /// Every key of one lock shares a hash tag (`{<lock key>}`): a cluster spreads keys over
    /// slots, and a script may only touch keys of one slot.
    pub(crate) cluster: bool,
    /// `host:port` or socket path, for messages (never credentials).
    pub(crate) address: String,
    /// This store's place in waiter queues and its release notifications.
    pub(crate) waiting: Arc<Waiting>,
}

impl RedisStore {
    /// Validates `config` (before any I/O), connects, and checks the server answers.
    ///
    /// Bad URL or prefix: [`ErrorKind::InvalidArgument`](leasehold_core::ErrorKind::InvalidArgument).
    /// Server unreachable: [`ErrorKind::Connection`](leasehold_core::ErrorKind::Connection), naming
    /// the address.
    pub async fn connect(config: RedisConfig) -> Result<Self> {
        config.validate()?;
        let topology = config.topology()?;
        let cluster = topology.is_cluster();
        let connected = crate::connect::connect(&config, &topology).await?;
        let waiting = Arc::new(Waiting::new(
            &config.prefix,
            connected.subscriber,
            config.connect_timeout,
        ));
        if let Some(pushes) = connected.pushes {
            crate::waiting::subscriber::deliver_pushes(&waiting, pushes);
        }
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn: connected.connection,
                config,
                cluster,
                address: connected.address,
                waiting,
            }),
        })
    }

    /// Wraps a connection manager you already have (its own timeouts apply). `config` gives the
    /// prefix, fencing and fairness; its URL is only used in messages. Without a client of its
    /// own the store cannot subscribe: waiters keep their place in line but poll.
    pub fn from_connection_manager(conn: ConnectionManager, config: RedisConfig) -> Result<Self> {
        config.validate()?;
        let address = config.redacted_url();
        let cluster = config.topology()?.is_cluster();
        if cluster {
            return Err(Error::invalid_argument(
                "a connection manager talks to one server: connect to a Redis Cluster with \
                 RedisStore::connect(RedisConfig::cluster(..))",
            ));
        }
        let waiting = Waiting::new(&config.prefix, Subscriber::None, config.connect_timeout);
        Ok(RedisStore {
            inner: Arc::new(Inner {
                conn: Connection::Node(conn),
                config,
                cluster,
                address,
                waiting: Arc::new(waiting),
            }),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &RedisConfig {
        &self.inner.config
    }

    /// The lock trace's key for a call of a script on `key`, if the call is traced (`trace`).
    pub(crate) fn trace_key_for<T>(&self, key: &LockKey, trace: Option<T>) -> Option<String> {
        trace.map(|_| self.trace_key(key))
    }

    /// Appends the lock-trace arguments a traced script expects (see `scripts::traced`; its key
    /// goes last among the call's keys: [`trace_key_for`](Self::trace_key_for)).
    pub(crate) fn trace_args(
        &self,
        call: &mut ScriptCall<'_>,
        trace: &TraceConfig,
        ok: Option<HistoryEntry>,
        otherwise: Option<HistoryEntry>,
    ) {
        call.arg(ok.map(|e| e.encode()).unwrap_or_default())
            .arg(otherwise.map(|e| e.encode()).unwrap_or_default())
            .arg(trace.max_entries())
            .arg(trace.ttl().as_millis() as u64);
    }

    /// This store's id in waiter queues (one per store instance).
    pub fn waiter_id(&self) -> &str {
        self.inner.waiting.id()
    }

    /// Where the store sends its commands, for messages: with Sentinel, the master in use too.
    pub(crate) fn address(&self) -> std::borrow::Cow<'_, str> {
        match &self.inner.conn {
            Connection::Sentinel(link) => {
                format!("{} (node {})", self.inner.address, link.address()).into()
            }
            _ => self.inner.address.as_str().into(),
        }
    }

    pub(crate) fn conn(&self) -> Connection {
        self.inner.conn.clone()
    }

    /// The scripts for this deployment (sharded pub/sub on a cluster).
    pub(crate) fn scripts(&self) -> &'static Scripts {
        scripts(self.inner.cluster)
    }

    /// A failed command on `key`'s node, named with the node and the operation.
    pub(crate) fn err(&self, op: Operation, key: &LockKey, e: redis::RedisError) -> Error {
        let address = self.address();
        let site = self.inner.conn.failure_site(&self.lock_key(key), &address);
        map(op, key.as_str(), &site, e)
    }
}

impl LockStore for RedisStore {
    fn name(&self) -> &'static str {
        "redis"
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::NONE
            .with_fencing(self.inner.config.fencing)
            .with_listing(true)
            .with_notifications(self.inner.config.fair)
            .with_waiter_line(self.inner.config.strict_fifo)
            .with_shared_modes(true)
            .with_history(true)
    }

    /// One round trip: `LRANGE` of the key's history list, newest first.
    async fn history(&self, key: &LockKey) -> Result<Vec<HistoryEntry>> {
        let mut conn = self.conn();
        let stored: Vec<String> = redis::cmd("LRANGE")
            .arg(self.trace_key(key))
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .map_err(|e| self.err(Operation::Inspect, key, e))?;
        stored.iter().map(|s| HistoryEntry::decode(s)).collect()
    }

    /// One round trip: the traced script around a body that does nothing.
    async fn append_history(
        &self,
        key: &LockKey,
        trace: &TraceConfig,
        entry: &HistoryEntry,
    ) -> Result<()> {
        let mut conn = self.conn();
        let trace_key = self.trace_key(key);
        let mut call = ScriptCall::new(&self.scripts().append_trace, &[], Some(&trace_key));
        self.trace_args(&mut call, trace, Some(entry.clone()), None);
        let _: i64 = call
            .invoke(&mut conn)
            .await
            .map_err(|e| self.err(Operation::Inspect, key, e))?;
        Ok(())
    }

    /// With fair waiting (the default): subscribes this process to the key's release
    /// announcements (one subscriber connection per store, shared by every key), confirmed
    /// before it returns. When the last waiter of this process goes away without the lock, the
    /// process leaves the key's queue; in strict FIFO mode a waiter that goes away leaves its own
    /// place at once.
    async fn watch(&self, key: &LockKey) -> ReleaseWatch {
        if !self.inner.config.fair {
            return ReleaseWatch::none();
        }
        let store = self.clone();
        let owned_key = key.clone();
        let leave: crate::waiting::places::Leave =
            Arc::new(move |entry| store.leave_queue(owned_key.clone(), entry));
        self.inner.waiting.watch(self.lock_key(key), leave).await
    }

    /// Gives up the places this process kept in waiter lines after its grants (see
    /// [`is_in_line_here`](LockStore::is_in_line_here)) and waits until the store has it, so the
    /// next in line is told now, not at those places' deadlines. Holds no lock itself: 0.
    async fn shutdown(&self) -> Result<usize> {
        for leaving in self.inner.waiting.give_up_all_parked() {
            leaving.await;
        }
        Ok(0)
    }

    /// A place this process kept in the key's line after a grant while others waited (fair
    /// mode, one place per process): it stays while a task of the process waits on the key,
    /// and goes when its turn comes with nobody here waiting, a second after that grant, or at
    /// shutdown.
    fn is_in_line_here(&self, key: &LockKey) -> bool {
        self.inner.config.fair && self.inner.waiting.in_line(&self.lock_key(key))
    }

    /// Subscribes this process to the key's change channel ([`RedisStore::change_channel`]),
    /// on which every grant and release script announces itself: one subscription per key and
    /// store, on the subscriber connection release announcements use, shared by every watch on
    /// the key and ended with the last. Takes no place in the waiter line. A lapse at the TTL is
    /// not announced (Redis expires keys silently). A store made from a connection manager, or a
    /// subscription that fails, gives [`ChangeWatch::none`].
    async fn watch_changes(&self, key: &LockKey) -> ChangeWatch {
        self.inner.waiting.watch_changes(self.lock_key(key)).await
    }

    /// One round trip. Cancel safe: if the caller stops waiting before the answer, an
    /// owner-checked release follows the request on the same connection (one per node, which
    /// applies requests in order), so no lock is left under a token nobody knows.
    async fn acquire(&self, req: &Acquire) -> Result<Attempt> {
        req.validate()?;
        let undo = UndoIfCancelled::arm(req, |lease, counted| {
            let store = self.clone();
            // Its looks take a few hundred milliseconds: a shutdown waits for all of them.
            async move {
                let undone = store.undo_abandoned(&lease).await;
                drop(counted);
                undone
            }
        });
        let answer = self.acquire_once(req).await;
        undo.disarm();
        answer
    }

    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.release_once(lease).await
    }

    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        validate_ttl(ttl)?;
        let sent_at = Instant::now();
        let mut conn = self.conn();
        let script = match (lease.mode().is_shared_record(), lease.trace().is_some()) {
            (true, false) => &self.scripts().extend_shared,
            (true, true) => &self.scripts().extend_shared_traced,
            (false, false) => &self.scripts().extend,
            (false, true) => &self.scripts().extend_traced,
        };
        let lock_key = self.lock_key(lease.key());
        let trace_key = self.trace_key_for(lease.key(), lease.trace());
        let mut call = ScriptCall::new(script, &[&lock_key], trace_key.as_deref());
        call.arg(lease.token().as_str()).arg(ttl_millis(ttl));
        if let Some(trace) = lease.trace() {
            // A renewal is not news; finding the lock gone is.
            let lost = HistoryEntry::new(
                HistoryEvent::Lost,
                lease.token(),
                "expired or taken by another owner before it could be extended",
            );
            self.trace_args(&mut call, trace, None, Some(lost));
        }
        let extended: i64 = call
            .invoke(&mut conn)
            .await
            .map_err(|e| self.err(Operation::Extend, lease.key(), e))?;
        if extended == 1 {
            self.confirm(Operation::Extend, lease.key()).await?;
            Ok(lease.renewed(ttl, sent_at))
        } else {
            Err(Error::not_held(
                "the lease expired or was taken by another owner before it could be extended",
            )
            .with_key(lease.key().as_str()))
        }
    }

    async fn inspect(&self, key: &LockKey) -> Result<Option<LockInfo>> {
        self.inspect_lock(key).await
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        self.list_locks(prefix).await
    }
}

impl fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisStore")
            .field("address", &self.inner.address)
            .field("config", &self.inner.config)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_is_never_rounded_to_zero() {
        assert_eq!(ttl_millis(Duration::from_micros(10)), 1);
        assert_eq!(ttl_millis(Duration::from_millis(1500)), 1500);
        assert_eq!(
            ttl_millis(Duration::from_micros(1999)),
            2,
            "rounded up, not down"
        );
        assert_eq!(ttl_millis(Duration::from_nanos(1_500_000_001)), 1501);
    }
}
