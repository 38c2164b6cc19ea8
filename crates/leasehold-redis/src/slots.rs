//! Redis Cluster routing on the caller's task.
//!
//! The redis crate's cluster client hands every request to a task of its own through a channel
//! before the node's connection sees it; on a lock's two round trips that hop costs about half
//! again what the one-server client costs. A lock operation touches one slot (every key of a lock
//! shares a hash tag), so the store keeps its own slot map (masters only, from `CLUSTER SLOTS`)
//! and one multiplexed connection per master, and sends each single-slot command from the calling
//! task straight to its master's connection: the same path as on one server.
//!
//! The cluster client stays the owner of correctness. What the direct route cannot vouch for goes
//! through it:
//! - a command without a single slot (`SCAN` over masters, `SCRIPT LOAD`, pipelines, pub/sub);
//! - a slot with no known master, or whose master has no live connection (never made, or broken);
//! - a command the node refused without running it (`MOVED`, `ASK`, `TRYAGAIN`, `CLUSTERDOWN`,
//!   `READONLY`, `MASTERDOWN`, `LOADING`): sent again through the cluster client, which follows
//!   redirections and retries.
//!
//! Each of those asks for the slot map to be read again in the background, at most once per
//! [`REFRESH_MIN`] (backing off to [`REFRESH_MAX`] while nothing changes).
//!
//! A command whose connection failed after it was handed over may have run. On the direct route a
//! read is sent again through the cluster client; a write's error goes back to the caller, which
//! reports the operation in doubt so the readback decides. A write that goes through the cluster
//! client is in the crate's hands: it retries a request whose connection broke, so a lock script
//! can run twice. A second acquire run finds the lock held by its own token and says so, and the
//! store reports it in doubt (see "A second run" in the scripts' docs): the readback finds the
//! record ours and the caller gets the lock, never a refusal that would leave it to its TTL.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{
    Arg, AsyncConnectionConfig, Cmd, ConnectionAddr, ConnectionInfo, Pipeline, PushInfo, PushKind,
    RedisError, RedisResult, Value,
};
use tokio::time::Instant;

/// Slots in a Redis Cluster.
pub(crate) const SLOT_COUNT: usize = 16384;

/// The shortest pause between two readings of the slot map.
pub(crate) const REFRESH_MIN: Duration = Duration::from_millis(100);
/// The longest pause between two readings while they keep finding nothing new (a master that
/// stays unreachable): the commands for its slots go through the cluster client meanwhile.
pub(crate) const REFRESH_MAX: Duration = Duration::from_secs(1);

/// How long a failure on a slot is remembered for the error the caller builds from it.
const FAILURE_MEMORY: Duration = Duration::from_secs(2);

/// The name the direct connections give themselves (`CLIENT SETNAME`), so `CLIENT LIST` on a
/// node tells them from the cluster client's.
pub(crate) const CLIENT_NAME: &str = "leasehold-direct";

/// Error codes with which a node refuses a command without running it because of where the slot
/// lives or the cluster's state: the cluster client knows what to do with each.
const NOT_HERE: [&str; 7] = [
    "MOVED",
    "ASK",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "READONLY",
    "MASTERDOWN",
    "LOADING",
];

/// A cluster node, by address.
pub(crate) type NodeAddress = (String, u16);

/// `host:port` (`[v6]:port`), for messages.
pub(crate) fn shown(address: &NodeAddress) -> String {
    if address.0.contains(':') {
        format!("[{}]:{}", address.0, address.1)
    } else {
        format!("{}:{}", address.0, address.1)
    }
}

// ---------------------------------------------------------------------------------------------
// Slots of keys and commands

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes keys
/// with, one byte at a time through this table.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
};

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The slot of a Redis key: the CRC16 of its hash tag (what lies between the first `{` and the
/// first `}` after it, if not empty), else of the whole key, modulo 16384.
///
/// (`redis::cluster_routing::Slot::for_key` computes the same, but does not give the number,
/// which the slot map is indexed by; the tests check both agree.)
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOT_COUNT as u16
}

/// Where a command's keys are, for the commands the direct route takes.
#[derive(Clone, Copy)]
enum Keys {
    /// `EVAL`-like: the script or function, the key count, then the keys.
    Counted,
    /// One key, right after the command name.
    First,
    /// Every argument is a key.
    All,
}

/// The commands the direct route takes, where their keys are, and whether they only read (a read
/// whose connection failed may be sent again). Everything else goes through the cluster client.
fn routed(name: &[u8]) -> Option<(Keys, bool)> {
    const TABLE: &[(&str, Keys, bool)] = &[
        ("EVALSHA", Keys::Counted, false),
        ("EVAL", Keys::Counted, false),
        ("FCALL", Keys::Counted, false),
        ("EVALSHA_RO", Keys::Counted, true),
        ("EVAL_RO", Keys::Counted, true),
        ("FCALL_RO", Keys::Counted, true),
        ("GET", Keys::First, true),
        ("LRANGE", Keys::First, true),
        ("LINDEX", Keys::First, true),
        ("LLEN", Keys::First, true),
        ("LPOS", Keys::First, true),
        ("PTTL", Keys::First, true),
        ("TTL", Keys::First, true),
        ("HGET", Keys::First, true),
        ("HGETALL", Keys::First, true),
        ("HLEN", Keys::First, true),
        ("TYPE", Keys::First, true),
        ("STRLEN", Keys::First, true),
        ("SET", Keys::First, false),
        ("GETDEL", Keys::First, false),
        ("INCR", Keys::First, false),
        ("INCRBY", Keys::First, false),
        ("PEXPIRE", Keys::First, false),
        ("EXPIRE", Keys::First, false),
        ("PERSIST", Keys::First, false),
        ("LPUSH", Keys::First, false),
        ("RPUSH", Keys::First, false),
        ("LPOP", Keys::First, false),
        ("RPOP", Keys::First, false),
        ("HSET", Keys::First, false),
        ("HDEL", Keys::First, false),
        ("SPUBLISH", Keys::First, false),
        ("EXISTS", Keys::All, true),
        ("DEL", Keys::All, false),
        ("UNLINK", Keys::All, false),
    ];
    TABLE
        .iter()
        .find(|(known, _, _)| name.eq_ignore_ascii_case(known.as_bytes()))
        .map(|(_, keys, read)| (*keys, *read))
}

/// The one slot every key of `cmd` is in, and whether `cmd` only reads; `None` for a command the
/// direct route does not take (unknown, keyless, or keys in several slots).
pub(crate) fn single_slot(cmd: &Cmd) -> Option<(u16, bool)> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        Arg::Simple(bytes) => Some(bytes),
        // A cursor argument (SCAN-like commands) is nothing the direct route takes.
        _ => None,
    });
    let (keys, read) = routed(args.next()??)?;
    let mut slot = None;
    let mut same = |key: &[u8]| {
        let this = key_slot(key);
        match slot {
            None => {
                slot = Some(this);
                true
            }
            Some(seen) => seen == this,
        }
    };
    match keys {
        Keys::Counted => {
            args.next()??;
            let count: usize = std::str::from_utf8(args.next()??).ok()?.parse().ok()?;
            for _ in 0..count {
                if !same(args.next()??) {
                    return None;
                }
            }
        }
        Keys::First => {
            if !same(args.next()??) {
                return None;
            }
        }
        Keys::All => {
            for key in args {
                if !same(key?) {
                    return None;
                }
            }
        }
    }
    slot.map(|slot| (slot, read))
}

/// Whether `cmd` is `SCRIPT LOAD`.
fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().map(|arg| match arg {
        Arg::Simple(bytes) => bytes,
        _ => &[],
    });
    args.next()
        .is_some_and(|name| name.eq_ignore_ascii_case(b"SCRIPT"))
        && args
            .next()
            .is_some_and(|sub| sub.eq_ignore_ascii_case(b"LOAD"))
}

// ---------------------------------------------------------------------------------------------
// The slot map

/// A range of slots and the master serving it, as `CLUSTER SLOTS` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SlotRange {
    pub(crate) start: u16,
    pub(crate) end: u16,
    /// The master's preferred endpoint and port. The endpoint is empty or `?` when the node does
    /// not know it; such a master is never connected to directly.
    pub(crate) master: NodeAddress,
}

/// Parses a `CLUSTER SLOTS` reply, `[[start, end, [host, port, id, …], replica…], …]`, keeping
/// the masters (the first node of each range). A malformed reply is an error, so a refresh keeps
/// the map it had.
pub(crate) fn parse_cluster_slots(reply: Value) -> RedisResult<Vec<SlotRange>> {
    let malformed = |what: &str| {
        RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected CLUSTER SLOTS reply",
            what.to_owned(),
        ))
    };
    let Value::Array(ranges) = reply else {
        return Err(malformed("not an array"));
    };
    let mut parsed = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return Err(malformed("a range is not an array"));
        };
        let mut fields = fields.into_iter();
        let (Some(start), Some(end), Some(master)) = (fields.next(), fields.next(), fields.next())
        else {
            return Err(malformed("a range has no master"));
        };
        let start: u16 = redis::from_redis_value(start)?;
        let end: u16 = redis::from_redis_value(end)?;
        if start > end || usize::from(end) >= SLOT_COUNT {
            return Err(malformed("a range is out of bounds"));
        }
        let Value::Array(node) = master else {
            return Err(malformed("a master is not an array"));
        };
        let mut node = node.into_iter();
        let (Some(host), Some(port)) = (node.next(), node.next()) else {
            return Err(malformed("a master has no host and port"));
        };
        let host: String = match host {
            Value::Nil => String::new(),
            host => redis::from_redis_value(host)?,
        };
        let port: u16 = redis::from_redis_value(port)?;
        parsed.push(SlotRange {
            start,
            end,
            master: (host, port),
        });
    }
    Ok(parsed)
}

/// Every master of `ranges`, once each, in order of first appearance.
pub(crate) fn masters_of(ranges: &[SlotRange]) -> Vec<NodeAddress> {
    let mut masters: Vec<NodeAddress> = Vec::new();
    for range in ranges {
        if !masters.contains(&range.master) {
            masters.push(range.master.clone());
        }
    }
    masters
}

/// Whether a master's endpoint can be connected to (Redis says `?` or nothing when it does not
/// know the endpoint clients should use).
fn reachable(address: &NodeAddress) -> bool {
    !address.0.is_empty() && address.0 != "?"
}

/// A master in the slot map, and the direct connection to it.
pub(crate) struct Node {
    pub(crate) address: NodeAddress,
    /// `host:port`, for messages.
    pub(crate) shown: String,
    /// `None` when the connection could not be made (its slots go through the cluster client).
    conn: Option<MultiplexedConnection>,
    /// Set when the connection dropped (its `Disconnection` push) or a command on it failed:
    /// from then on nothing is sent on it, and the next refresh makes a new one.
    broken: Arc<AtomicBool>,
}

impl Node {
    /// The connection, if it is usable.
    fn connection(&self) -> Option<MultiplexedConnection> {
        if self.broken.load(Ordering::Acquire) {
            None
        } else {
            self.conn.clone()
        }
    }

    fn mark_broken(&self, slot: u16, error: &RedisError) {
        if !self.broken.swap(true, Ordering::AcqRel) {
            tracing::warn!(node = %self.shown, slot, %error,
                "the direct connection to a Redis Cluster node failed; its slots go through the \
                 cluster client until the slot map is read again");
        }
    }
}

/// The slot map: for each slot, its master.
struct Table {
    /// Per slot, an index into `nodes`, or [`Table::NONE`].
    owner: Vec<u16>,
    nodes: Vec<Arc<Node>>,
    ranges: Vec<SlotRange>,
}

impl Table {
    const NONE: u16 = u16::MAX;

    fn empty() -> Table {
        Table {
            owner: vec![Table::NONE; SLOT_COUNT],
            nodes: Vec::new(),
            ranges: Vec::new(),
        }
    }

    fn new(ranges: Vec<SlotRange>, nodes: Vec<Arc<Node>>) -> Table {
        let mut owner = vec![Table::NONE; SLOT_COUNT];
        for range in &ranges {
            let Some(index) = nodes.iter().position(|n| n.address == range.master) else {
                continue;
            };
            let index = u16::try_from(index).unwrap_or(Table::NONE);
            let end = usize::from(range.end).min(SLOT_COUNT - 1);
            if let Some(slots) = owner.get_mut(usize::from(range.start)..=end) {
                slots.fill(index);
            }
        }
        Table {
            owner,
            nodes,
            ranges,
        }
    }

    fn node_of(&self, slot: u16) -> Option<&Arc<Node>> {
        let index = *self.owner.get(usize::from(slot))?;
        self.nodes.get(usize::from(index))
    }

    fn node(&self, address: &NodeAddress) -> Option<&Arc<Node>> {
        self.nodes.iter().find(|n| &n.address == address)
    }
}

// ---------------------------------------------------------------------------------------------
// Connections to nodes

/// Makes the direct connections: a seed's connection settings (credentials, TLS, protocol) with
/// the node's address, and the cluster client's timeouts.
pub(crate) struct NodeConnector {
    template: ConnectionInfo,
    connect_timeout: Duration,
    response_timeout: Duration,
}

impl NodeConnector {
    /// `template` is a seed's connection info: every node gets its settings.
    pub(crate) fn new(
        template: ConnectionInfo,
        connect_timeout: Duration,
        response_timeout: Duration,
    ) -> NodeConnector {
        NodeConnector {
            template,
            connect_timeout,
            response_timeout,
        }
    }

    fn info_for(&self, (host, port): &NodeAddress) -> RedisResult<ConnectionInfo> {
        let addr = match self.template.addr() {
            ConnectionAddr::Tcp(..) => ConnectionAddr::Tcp(host.clone(), *port),
            ConnectionAddr::TcpTls {
                insecure,
                tls_params,
                ..
            } => ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: *insecure,
                tls_params: tls_params.clone(),
            },
            _ => {
                return Err(RedisError::from((
                    redis::ErrorKind::InvalidClientConfig,
                    "a Redis Cluster node is reached over TCP",
                )))
            }
        };
        Ok(self.template.clone().set_addr(addr))
    }

    async fn connect(&self, address: &NodeAddress) -> RedisResult<Node> {
        let info = self.info_for(address)?;
        let broken = Arc::new(AtomicBool::new(false));
        let flag = broken.clone();
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
            // The connection tells when it drops, before any command fails on it: from then on
            // the slots' commands go through the cluster client without being sent here.
            .set_push_sender(move |push: PushInfo| {
                if push.kind == PushKind::Disconnection {
                    flag.store(true, Ordering::Release);
                }
                Ok::<(), std::convert::Infallible>(())
            });
        let client = redis::Client::open(info)?;
        let mut conn = tokio::time::timeout(
            self.connect_timeout.saturating_mul(2),
            client.get_multiplexed_async_connection_with_config(&config),
        )
        .await
        .map_err(|_| RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut)))??;
        // A name only helps operators (and tests) tell these connections apart; an ACL that
        // refuses it costs nothing.
        let named: RedisResult<()> = redis::cmd("CLIENT")
            .arg("SETNAME")
            .arg(CLIENT_NAME)
            .query_async(&mut conn)
            .await;
        if let Err(error) = named {
            tracing::debug!(node = %shown(address), %error, "CLIENT SETNAME refused");
        }
        Ok(Node {
            address: address.clone(),
            shown: shown(address),
            conn: Some(conn),
            broken,
        })
    }
}

// ---------------------------------------------------------------------------------------------
// The router

/// Which connection a slot's last command went on: `WAIT` must go on the same one, since it
/// counts the replicas that have the writes sent on the connection it is sent on.
#[derive(Clone)]
enum Via {
    Node(Arc<Node>),
    Cluster,
}

/// The last failure on a slot: which node the slot map named for it, and when.
struct Failure {
    node: Option<String>,
    at: Instant,
}

/// Whether a refresh of the slot map runs, and whether one was asked for since it started.
#[derive(Default)]
struct Refresh {
    running: AtomicBool,
    wanted: AtomicBool,
}

/// A Redis Cluster connection: the direct route, and the cluster client behind it.
pub(crate) struct Router {
    cluster: ClusterConnection,
    /// Off: everything goes through the cluster client.
    direct: bool,
    table: RwLock<Arc<Table>>,
    connector: NodeConnector,
    refresh: Refresh,
    /// With replica acknowledgement on: per slot, the connection its last command went on.
    trail: Option<Mutex<HashMap<u16, Via>>>,
    /// Per slot, its last failure, for the error the caller builds.
    failures: Mutex<HashMap<u16, Failure>>,
}

fn locked<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Whether a reply is an error (returned, or a server error in the value).
fn failed(result: &RedisResult<Value>) -> bool {
    matches!(result, Err(_) | Ok(Value::ServerError(_)))
}

/// The code of a refusal the cluster client knows how to follow, if `result` is one.
fn not_here(result: &RedisResult<Value>) -> Option<&str> {
    let code = match result {
        Ok(Value::ServerError(error)) => Some(error.code()),
        Err(error) => error.code(),
        Ok(_) => None,
    }?;
    NOT_HERE.contains(&code).then_some(code)
}

impl Router {
    /// A router over `cluster`; with `direct`, reads the slot map and connects to every master
    /// first (a master it cannot reach is served through the cluster client until a refresh
    /// connects to it). `track_writes` keeps the trail `WAIT` needs (replica acknowledgement).
    pub(crate) async fn connect(
        cluster: ClusterConnection,
        connector: NodeConnector,
        direct: bool,
        track_writes: bool,
    ) -> Arc<Router> {
        let router = Arc::new(Router {
            cluster,
            direct,
            table: RwLock::new(Arc::new(Table::empty())),
            connector,
            refresh: Refresh::default(),
            trail: track_writes.then(|| Mutex::new(HashMap::new())),
            failures: Mutex::new(HashMap::new()),
        });
        if direct {
            router.refresh_now().await;
        }
        router
    }

    /// The cluster client (for pub/sub and commands routed by node).
    pub(crate) fn cluster(&self) -> ClusterConnection {
        self.cluster.clone()
    }

    fn table(&self) -> Arc<Table> {
        self.table
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sends `cmd`: directly to its slot's master when it has one slot and that master a live
    /// connection, else (and after a refusal) through the cluster client.
    pub(crate) async fn request(self: &Arc<Self>, cmd: &Cmd) -> RedisResult<Value> {
        if !self.direct {
            return self.cluster.clone().req_packed_command(cmd).await;
        }
        let Some((slot, read)) = single_slot(cmd) else {
            if is_script_load(cmd) {
                return self.load_script(cmd).await;
            }
            return self.cluster.clone().req_packed_command(cmd).await;
        };
        let node = self.table().node_of(slot).cloned();
        let Some((node, mut conn)) = node
            .as_ref()
            .and_then(|n| n.connection().map(|c| (n.clone(), c)))
        else {
            // No master known for the slot, or no live connection to it: nothing was sent.
            self.want_refresh();
            return self.through_cluster(cmd, slot, node.as_deref()).await;
        };
        self.leave_trail(slot, Via::Node(node.clone()));
        let result = conn.req_packed_command(cmd).await;
        if let Some(code) = not_here(&result) {
            tracing::debug!(node = %node.shown, slot, code,
                "a Redis Cluster node refused a command for its slot; sent through the cluster \
                 client, and the slot map is read again");
            self.want_refresh();
            return self.through_cluster(cmd, slot, Some(&node)).await;
        }
        match result {
            Err(error) if error.code().is_none() => {
                // The connection failed. A timeout leaves it usable (the late reply is dropped);
                // anything else means it is gone.
                if !error.is_timeout() {
                    node.mark_broken(slot, &error);
                }
                self.want_refresh();
                if read {
                    return self.through_cluster(cmd, slot, Some(&node)).await;
                }
                self.note_failure(slot, Some(&node));
                Err(error)
            }
            result => {
                if failed(&result) {
                    self.note_failure(slot, Some(&node));
                }
                result
            }
        }
    }

    /// `SCRIPT LOAD` (after a `NOSCRIPT`: a new master's script cache starts empty) on every
    /// master the cluster client knows and on every master of the direct route's map. The two
    /// views differ for a while after a failover (the cluster client learns of it only from its
    /// own redirections), and the script must be on the master the next `EVALSHA` goes to.
    async fn load_script(&self, cmd: &Cmd) -> RedisResult<Value> {
        let table = self.table();
        let direct = table.nodes.iter().filter_map(|node| {
            let mut conn = node.connection()?;
            Some(async move { conn.req_packed_command(cmd).await })
        });
        let mut cluster = self.cluster.clone();
        let (through, direct) = futures::future::join(
            cluster.req_packed_command(cmd),
            futures::future::join_all(direct),
        )
        .await;
        // Every node answers the same hash for the same body: a direct answer serves as well,
        // and is the one that counts when the cluster client's view is the stale one.
        direct
            .into_iter()
            .find(|answer| !failed(answer))
            .unwrap_or(through)
    }

    /// `cmd` through the cluster client; `node` is the master the slot map named for `slot`
    /// (the one a failure is reported on).
    async fn through_cluster(
        &self,
        cmd: &Cmd,
        slot: u16,
        node: Option<&Node>,
    ) -> RedisResult<Value> {
        self.leave_trail(slot, Via::Cluster);
        let result = self.cluster.clone().req_packed_command(cmd).await;
        if failed(&result) {
            self.note_failure(slot, node);
        }
        result
    }

    /// A pipeline: through the cluster client, which splits it by slot.
    pub(crate) async fn request_pipeline(
        &self,
        pipeline: &Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisResult<Vec<Value>> {
        self.cluster
            .clone()
            .req_packed_commands(pipeline, offset, count)
            .await
    }

    /// `wait` (a `WAIT`) on the connection the last command on `key`'s slot went on.
    pub(crate) async fn wait_replicas(&self, key: &str, wait: Cmd) -> RedisResult<Value> {
        let slot = key_slot(key.as_bytes());
        let via = match &self.trail {
            Some(trail) => locked(trail).get(&slot).cloned(),
            // Not kept (replica acknowledgement was off at connect): the slot map's choice is
            // the route the write most likely took.
            None => self.table().node_of(slot).map(|n| Via::Node(n.clone())),
        };
        if let Some(Via::Node(node)) = via {
            if let Some(mut conn) = node.conn.clone() {
                // Even on a connection since broken: WAIT then fails, and the write is reported
                // unconfirmed — never confirmed by replicas of another connection's writes.
                let result = conn.req_packed_command(&wait).await;
                if failed(&result) {
                    self.note_failure(slot, Some(&node));
                }
                return result;
            }
        }
        let route = Route::new(slot, SlotAddr::Master);
        let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(route));
        let result = self.cluster.clone().route_command(wait, routing).await;
        if failed(&result) {
            let node = self.table().node_of(slot).cloned();
            self.note_failure(slot, node.as_deref());
        }
        result
    }

    fn leave_trail(&self, slot: u16, via: Via) {
        if let Some(trail) = &self.trail {
            locked(trail).insert(slot, via);
        }
    }

    fn note_failure(&self, slot: u16, node: Option<&Node>) {
        let now = Instant::now();
        let mut failures = locked(&self.failures);
        if failures.len() >= 256 {
            failures.retain(|_, f| now.duration_since(f.at) < FAILURE_MEMORY);
        }
        failures.insert(
            slot,
            Failure {
                node: node.map(|n| n.shown.clone()),
                at: now,
            },
        );
    }

    /// The node and slot of the last failure on `redis_key`'s slot, if it is recent: what an
    /// error on that key names.
    pub(crate) fn failure_site(&self, redis_key: &str) -> Option<(Option<String>, u16)> {
        let slot = key_slot(redis_key.as_bytes());
        let failures = locked(&self.failures);
        let failure = failures.get(&slot)?;
        (failure.at.elapsed() < FAILURE_MEMORY).then(|| (failure.node.clone(), slot))
    }

    /// Every master, for commands each node answers for its own keys (`SCAN`): read afresh,
    /// since a listing must not miss a master the direct route has not learnt of yet.
    pub(crate) async fn masters(&self) -> RedisResult<Vec<NodeAddress>> {
        Ok(masters_of(&self.read_slots().await?))
    }

    /// `CLUSTER SLOTS`, through the cluster client (any node).
    async fn read_slots(&self) -> RedisResult<Vec<SlotRange>> {
        let reply = self
            .cluster
            .clone()
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        parse_cluster_slots(reply)
    }

    /// Asks for the slot map to be read again, in the background.
    fn want_refresh(self: &Arc<Self>) {
        self.refresh.wanted.store(true, Ordering::Release);
        if self.refresh.running.swap(true, Ordering::AcqRel) {
            return; // the running refresh sees `wanted` when its pause ends
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(refresh_loop(Arc::downgrade(self)));
            }
            Err(_) => self.refresh.running.store(false, Ordering::Release),
        }
    }

    /// Reads the slot map and connects to every master without a live connection; returns
    /// whether anything changed (the ranges, or a connection made).
    async fn refresh_now(&self) -> bool {
        let ranges = match tokio::time::timeout(
            self.connector
                .connect_timeout
                .saturating_add(self.connector.response_timeout),
            self.read_slots(),
        )
        .await
        {
            Ok(Ok(ranges)) => ranges,
            Ok(Err(error)) => {
                tracing::debug!(%error, "could not read the Redis Cluster's slot map");
                return false;
            }
            Err(_) => {
                tracing::debug!("reading the Redis Cluster's slot map timed out");
                return false;
            }
        };
        let old = self.table();
        let made = AtomicBool::new(false);
        let nodes = futures::future::join_all(masters_of(&ranges).into_iter().map(|address| {
            let (old, made) = (&old, &made);
            async move {
                if let Some(node) = old.node(&address) {
                    if node.connection().is_some() || !reachable(&address) {
                        return node.clone();
                    }
                }
                if !reachable(&address) {
                    return Arc::new(Node {
                        shown: shown(&address),
                        address,
                        conn: None,
                        broken: Arc::new(AtomicBool::new(false)),
                    });
                }
                match self.connector.connect(&address).await {
                    Ok(node) => {
                        made.store(true, Ordering::Relaxed);
                        Arc::new(node)
                    }
                    Err(error) => {
                        tracing::debug!(node = %shown(&address), %error,
                            "no direct connection to a Redis Cluster master; its slots go \
                             through the cluster client");
                        Arc::new(Node {
                            shown: shown(&address),
                            address,
                            conn: None,
                            broken: Arc::new(AtomicBool::new(false)),
                        })
                    }
                }
            }
        }))
        .await;
        let changed = made.load(Ordering::Relaxed) || old.ranges != ranges;
        if old.ranges != ranges && !old.ranges.is_empty() {
            tracing::info!(
                masters = ?nodes.iter().map(|n| n.shown.as_str()).collect::<Vec<_>>(),
                "the Redis Cluster's slot map changed"
            );
        }
        *self.table.write().unwrap_or_else(PoisonError::into_inner) =
            Arc::new(Table::new(ranges, nodes));
        changed
    }
}

/// Reads the slot map while someone asks for it, pausing at least [`REFRESH_MIN`] between two
/// readings, longer (up to [`REFRESH_MAX`]) while they find nothing new. Ends when nobody asked
/// during a pause, or when the router is gone.
async fn refresh_loop(router: Weak<Router>) {
    let mut pause = REFRESH_MIN;
    loop {
        let Some(live) = router.upgrade() else {
            return;
        };
        live.refresh.wanted.store(false, Ordering::Release);
        let started = Instant::now();
        let changed = live.refresh_now().await;
        drop(live);
        pause = if changed {
            REFRESH_MIN
        } else {
            pause.saturating_mul(2).min(REFRESH_MAX)
        };
        tokio::time::sleep(pause.saturating_sub(started.elapsed())).await;
        let Some(live) = router.upgrade() else {
            return;
        };
        if live.refresh.wanted.load(Ordering::Acquire) {
            continue;
        }
        live.refresh.running.store(false, Ordering::Release);
        // A request between the check and the store saw `running` and left the work to this
        // loop: take it back, unless another loop already did.
        if !live.refresh.wanted.load(Ordering::Acquire)
            || live.refresh.running.swap(true, Ordering::AcqRel)
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use redis::cluster_routing::Slot;

    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![bulk(host), Value::Int(port), bulk(id)])
    }

    #[test]
    fn the_slot_of_a_key_is_redis_clusters() {
        // The check value of CRC16/XMODEM, and slots Redis documents.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // An empty tag hashes the whole key; so does an unclosed one.
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{bar"), crc16(b"foo{bar") % 16384);
        for i in 0..20_000 {
            let key = format!("leasehold:fence:{{DC#f1#app#k{i}}}");
            assert_eq!(
                Slot::new(key_slot(key.as_bytes())),
                Some(Slot::for_key(&key)),
                "{key}"
            );
        }
    }

    #[test]
    fn a_lock_script_has_the_slot_of_its_hash_tag() {
        let mut script = redis::cmd("EVALSHA");
        script
            .arg("0123abcd")
            .arg(3)
            .arg("p:{DC#f#a#k}")
            .arg("p:fence:{DC#f#a#k}")
            .arg("p:queue:{DC#f#a#k}")
            .arg("token")
            .arg(30_000);
        assert_eq!(single_slot(&script), Some((key_slot(b"DC#f#a#k"), false)));
        let read = redis::cmd("LRANGE")
            .arg("p:trace:{DC#f#a#k}")
            .arg(0)
            .arg(-1)
            .clone();
        assert_eq!(single_slot(&read), Some((key_slot(b"DC#f#a#k"), true)));
        let del = redis::cmd("del").arg("{a}1").arg("{a}2").clone();
        assert_eq!(single_slot(&del), Some((key_slot(b"a"), false)));
    }

    #[test]
    fn commands_without_one_slot_take_the_cluster_client() {
        let spread = redis::cmd("DEL").arg("a").arg("b").clone();
        assert_ne!(key_slot(b"a"), key_slot(b"b"));
        assert_eq!(single_slot(&spread), None);
        let keyless = redis::cmd("EVALSHA").arg("0123").arg(0).clone();
        assert_eq!(single_slot(&keyless), None);
        assert!(is_script_load(
            &redis::cmd("script").arg("load").arg("return 1").clone()
        ));
        assert!(!is_script_load(&redis::cmd("SCRIPT").arg("FLUSH").clone()));
        for cmd in [
            redis::cmd("SCAN").arg(0).clone(),
            redis::cmd("WAIT").arg(1).arg(100).clone(),
            redis::cmd("SCRIPT").arg("LOAD").arg("return 1").clone(),
            redis::cmd("SSUBSCRIBE").arg("{a}").clone(),
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
        ] {
            assert_eq!(single_slot(&cmd), None, "{:?}", cmd.args_iter().next());
        }
        // A key count beyond the arguments is not a command to route.
        let short = redis::cmd("EVALSHA").arg("0123").arg(2).arg("{a}1").clone();
        assert_eq!(single_slot(&short), None);
    }

    #[test]
    fn cluster_slots_gives_each_range_its_master() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                node("127.0.0.1", 7001, "a"),
                node("127.0.0.1", 7004, "d"),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                // Redis 7 adds a metadata map after the id; a replica-less range has no more.
                Value::Array(vec![
                    bulk("10.0.0.2"),
                    Value::Int(7002),
                    bulk("b"),
                    Value::Map(vec![(bulk("hostname"), bulk("n2"))]),
                ]),
            ]),
            Value::Array(vec![
                Value::Int(10923),
                Value::Int(16383),
                node("", 7003, "c"),
            ]),
            Value::Array(vec![
                Value::Int(100),
                Value::Int(100),
                node("127.0.0.1", 7001, "a"),
            ]),
        ]);
        let ranges = parse_cluster_slots(reply).unwrap();
        assert_eq!(
            ranges,
            [
                SlotRange {
                    start: 0,
                    end: 5460,
                    master: ("127.0.0.1".into(), 7001)
                },
                SlotRange {
                    start: 5461,
                    end: 10922,
                    master: ("10.0.0.2".into(), 7002)
                },
                SlotRange {
                    start: 10923,
                    end: 16383,
                    master: (String::new(), 7003)
                },
                SlotRange {
                    start: 100,
                    end: 100,
                    master: ("127.0.0.1".into(), 7001)
                },
            ]
        );
        assert_eq!(
            masters_of(&ranges),
            [
                ("127.0.0.1".to_owned(), 7001),
                ("10.0.0.2".to_owned(), 7002),
                (String::new(), 7003)
            ]
        );
        assert!(!reachable(&(String::new(), 7003)));
        assert!(!reachable(&("?".to_owned(), 7003)));
    }

    #[test]
    fn a_malformed_slots_reply_is_an_error() {
        for reply in [
            Value::Nil,
            Value::Array(vec![Value::Int(0)]),
            Value::Array(vec![Value::Array(vec![Value::Int(0), Value::Int(10)])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(10),
                Value::Int(0),
                node("h", 1, "a"),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(16384),
                node("h", 1, "a"),
            ])]),
            Value::Array(vec![Value::Array(vec![
                Value::Int(0),
                Value::Int(1),
                Value::Array(vec![bulk("h")]),
            ])]),
        ] {
            assert!(parse_cluster_slots(reply.clone()).is_err(), "{reply:?}");
        }
    }

    #[test]
    fn the_table_names_each_slots_master() {
        let ranges = parse_cluster_slots(Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(99), node("h", 1, "a")]),
            Value::Array(vec![Value::Int(200), Value::Int(16383), node("h", 2, "b")]),
        ]))
        .unwrap();
        let nodes = masters_of(&ranges)
            .into_iter()
            .map(|address| {
                Arc::new(Node {
                    shown: shown(&address),
                    address,
                    conn: None,
                    broken: Arc::new(AtomicBool::new(false)),
                })
            })
            .collect();
        let table = Table::new(ranges, nodes);
        assert_eq!(table.node_of(0).unwrap().shown, "h:1");
        assert_eq!(table.node_of(99).unwrap().shown, "h:1");
        assert!(
            table.node_of(150).is_none(),
            "an unserved slot has no master"
        );
        assert_eq!(table.node_of(16383).unwrap().shown, "h:2");
        assert!(table.node_of(16384).is_none());
        assert_eq!(shown(&("::1".to_owned(), 7001)), "[::1]:7001");
    }
}
