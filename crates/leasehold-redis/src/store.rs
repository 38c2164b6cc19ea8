//! The Redis store.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    acquire_undone_on_drop, validate_ttl, Acquire, Capabilities, ChangeWatch, Error, HistoryEntry,
    HistoryEvent, Lease, LockInfo, LockKey, LockStore, ReleaseWatch, Result, TraceConfig,
};
use redis::aio::ConnectionManager;
use tokio::time::Instant;

use crate::config::RedisConfig;
use crate::connection::Connection;
use crate::error::map;
use crate::reply::{describe_mode, glob_escape, parse_inspect, writer_wait_millis};
use crate::scripts::{scripts, Scripts};
use crate::waiting::subscriber::Subscriber;
use crate::waiting::Waiting;
use leasehold_core::{ttl_millis, Operation};

mod keys;
mod queue;

/// Keys returned by one `SCAN` step.
const SCAN_COUNT: usize = 500;

/// A lock store on one Redis server (or a Redis-compatible proxy), a Redis Cluster, or the master
/// Redis Sentinel names (see [`RedisConfig::new`] for the URLs). Cheap to clone.
#[derive(Clone)]
pub struct RedisStore {
    inner: Arc<Inner>,
}

struct Inner {
    conn: Connection,
    config: RedisConfig,
    /// Every key of one lock shares a hash tag (`{<lock key>}`): a cluster spreads keys over
    /// slots, and a script may only touch keys of one slot.
    cluster: bool,
    /// `host:port` or socket path, for messages (never credentials).
    address: String,
    /// This store's place in waiter queues and its release notifications.
    waiting: Arc<Waiting>,
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

    /// Appends the lock-trace key and arguments a traced script expects (see `scripts::traced`).
    fn trace_args(
        &self,
        invocation: &mut redis::ScriptInvocation<'_>,
        key: &LockKey,
        trace: &TraceConfig,
        ok: Option<HistoryEntry>,
        otherwise: Option<HistoryEntry>,
    ) {
        invocation
            .key(self.trace_key(key))
            .arg(ok.map(|e| e.encode()).unwrap_or_default())
            .arg(otherwise.map(|e| e.encode()).unwrap_or_default())
            .arg(trace.max_entries())
            .arg(trace.ttl().as_millis() as u64);
    }

    /// This store's id in waiter queues (one per store instance).
    pub fn waiter_id(&self) -> &str {
        self.inner.waiting.id()
    }

    /// Where the store sends its commands, for messages: with Sentinel, the master in use too.
    fn address(&self) -> std::borrow::Cow<'_, str> {
        match &self.inner.conn {
            Connection::Sentinel(link) => {
                format!("{} (node {})", self.inner.address, link.address()).into()
            }
            _ => self.inner.address.as_str().into(),
        }
    }

    fn conn(&self) -> Connection {
        self.inner.conn.clone()
    }

    /// The scripts for this deployment (sharded pub/sub on a cluster).
    pub(crate) fn scripts(&self) -> &'static Scripts {
        scripts(self.inner.cluster)
    }

    fn err(&self, op: Operation, key: &LockKey, e: redis::RedisError) -> Error {
        let address = self.address();
        let site = self.inner.conn.failure_site(&self.lock_key(key), &address);
        map(op, key.as_str(), &site, e)
    }

    /// The error for an acquire refused because this very token holds the lock: the request ran
    /// a second time after its first run took the lock (see "A second run" in the scripts'
    /// docs), so the outcome is in doubt, never a refusal that would leave the hold unknown.
    fn ran_twice(&self, req: &Acquire) -> Error {
        Error::in_doubt(format!(
            "the acquire ran twice on {} (a retry after its first reply was lost) and the lock is \
             held by this very request's token: its first run took it; read the record to learn \
             the outcome (the readback layer does)",
            self.address()
        ))
        .with_key(req.key.as_str())
    }

    /// One acquisition (see `try_acquire` for cancel safety): the acquire round trip, then, with
    /// replica acknowledgement on, `WAIT`. A grant too few replicas confirmed is undone (an
    /// owner-checked release of its own token) and reported as a temporary error; if the undo
    /// fails too, the outcome is in doubt, so the caller's undo tries again.
    async fn acquire_once(&self, req: &Acquire) -> Result<Lease> {
        let lease = self.acquire_unconfirmed(req).await?;
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
        Ok(lease)
    }

    /// With replica acknowledgement on ([`RedisConfig::min_replicas`]): waits until enough
    /// replicas have every write sent so far on the node holding `key`'s lock.
    async fn confirm(&self, op: Operation, key: &LockKey) -> Result<()> {
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
    async fn acquire_unconfirmed(&self, req: &Acquire) -> Result<Lease> {
        if req.mode.is_shared_record() {
            return self.acquire_shared(req).await;
        }
        if self.inner.config.fair {
            return self.acquire_fair(req).await;
        }
        let sent_at = Instant::now();
        let mut conn = self.conn();
        let script = if req.trace.is_some() {
            &self.scripts().acquire_traced
        } else {
            &self.scripts().acquire
        };
        let mut invocation = script.prepare_invoke();
        invocation
            .key(self.lock_key(&req.key))
            .key(self.fence_key(&req.key))
            .key(self.change_channel(&req.key))
            .arg(req.token.as_str())
            .arg(ttl_millis(req.ttl))
            .arg(if self.inner.config.fencing { "1" } else { "0" })
            .arg(writer_wait_millis(req, sent_at))
            .arg(if req.announce { "1" } else { "0" });
        self.trace_acquire(&mut invocation, req);
        let (acquired, value, mine): (i64, Option<u64>, u64) = invocation
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.acquire_err(req, e))?;
        if acquired == 1 {
            return Ok(Lease::granted(req, sent_at).with_fencing_token(value));
        }
        if mine == 1 {
            return Err(self.ran_twice(req));
        }
        let left = Duration::from_millis(value.unwrap_or(1));
        Err(Error::unavailable(&req.key).with_retry_after(left))
    }

    /// Maps an acquire script's error: `MODECONFLICT <mode>` is the key held as another kind.
    fn acquire_err(&self, req: &Acquire, e: redis::RedisError) -> Error {
        if e.code() == Some("MODECONFLICT") {
            let held = e
                .detail()
                .map_or("another kind of lock".to_owned(), describe_mode);
            return req.mode.conflict(&held, &req.key);
        }
        self.err(Operation::Acquire, &req.key, e)
    }

    async fn release_once(&self, lease: &Lease) -> Result<bool> {
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

    /// Adds the lock trace's arguments to an acquire script's invocation, if `req` is traced.
    fn trace_acquire(&self, invocation: &mut redis::ScriptInvocation<'_>, req: &Acquire) {
        if let Some(trace) = &req.trace {
            let (ok, refused) = acquire_entries(req);
            self.trace_args(invocation, &req.key, trace, Some(ok), Some(refused));
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
    async fn undo_abandoned(&self, lease: &Lease) -> Result<bool> {
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
        let mut invocation = self.scripts().append_trace.prepare_invoke();
        self.trace_args(&mut invocation, key, trace, Some(entry.clone()), None);
        let _: i64 = invocation
            .invoke_async(&mut conn)
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
    async fn try_acquire(&self, req: &Acquire) -> Result<Lease> {
        req.validate()?;
        let releaser = self.clone();
        acquire_undone_on_drop(req, self.acquire_once(req), move |lease| async move {
            releaser.undo_abandoned(&lease).await
        })
        .await
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
        let mut invocation = script.prepare_invoke();
        invocation
            .key(self.lock_key(lease.key()))
            .arg(lease.token().as_str())
            .arg(ttl_millis(ttl));
        if let Some(trace) = lease.trace() {
            // A renewal is not news; finding the lock gone is.
            let lost = HistoryEntry::new(
                HistoryEvent::Lost,
                lease.token(),
                "expired or taken by another owner before it could be extended",
            );
            self.trace_args(&mut invocation, lease.key(), trace, None, Some(lost));
        }
        let extended: i64 = invocation
            .invoke_async(&mut conn)
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
        let mut conn = self.conn();
        let found: Vec<redis::Value> = self
            .scripts()
            .inspect
            .key(self.lock_key(key))
            .key(self.fence_key(key))
            .invoke_async(&mut conn)
            .await
            .map_err(|e| self.err(Operation::Inspect, key, e))?;
        parse_inspect(key, found).map_err(|e| self.err(Operation::Inspect, key, e))
    }

    async fn list(&self, prefix: &str) -> Result<Vec<LockInfo>> {
        let config_prefix = &self.inner.config.prefix;
        let pattern = if self.inner.cluster {
            format!("{}{{{}*", glob_escape(config_prefix), glob_escape(prefix))
        } else {
            format!("{}{}*", glob_escape(config_prefix), glob_escape(prefix))
        };
        let list_err = |e| map(Operation::List, prefix, &self.address(), e);
        let mut conn = self.conn();
        // On a cluster every master scans its own keys; one server scans all.
        let nodes = match &mut conn {
            Connection::Cluster(cluster) => crate::connection::masters(cluster)
                .await
                .map_err(list_err)?,
            _ => vec![None],
        };
        let mut locks = Vec::new();
        for node in nodes {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, keys): (u64, Vec<String>) = match (&mut conn, &node) {
                    (Connection::Cluster(cluster), Some(node)) => {
                        crate::connection::query_node(cluster, scan, node).await
                    }
                    (conn, _) => scan.query_async(conn).await,
                }
                .map_err(list_err)?;
                let keys: Vec<LockKey> = keys
                    .iter()
                    .filter_map(|k| self.lock_key_of(k))
                    .filter_map(|k| k.parse::<LockKey>().ok())
                    .collect();
                // Concurrent inspects on the multiplexed connection: pipelined, one script each,
                // so exclusive and shared records are read alike and atomically.
                let found = futures::future::try_join_all(keys.iter().map(|key| self.inspect(key)));
                locks.extend(found.await?.into_iter().flatten());
                cursor = next;
                if cursor == 0 {
                    break;
                }
            }
        }
        locks.sort_by(|a, b| a.key.cmp(&b.key));
        locks.dedup_by(|a, b| a.key == b.key);
        Ok(locks)
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
    fn glob_metacharacters_are_escaped() {
        assert_eq!(glob_escape("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
        assert_eq!(glob_escape("leasehold:DC#f#"), "leasehold:DC#f#");
    }

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
