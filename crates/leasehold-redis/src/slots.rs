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
//!
//! The parts: [`key_slots`] (the slot of a key and of a command), [`map`] (the slot map read from
//! `CLUSTER SLOTS`), [`nodes`] (the direct connections to masters); this module routes between
//! them and the cluster client, and keeps the slot map fresh.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{Cmd, Pipeline, RedisResult, Value};
use tokio::time::Instant;

use key_slots::{is_script_load, key_slot, single_slot};
use map::{masters_of, parse_cluster_slots, reachable, SlotRange, Table};
use nodes::{shown, Node, NodeAddress, NodeConnector};

mod key_slots;
mod map;
pub(crate) mod nodes;

/// The shortest pause between two readings of the slot map.
pub(crate) const REFRESH_MIN: Duration = Duration::from_millis(100);
/// The longest pause between two readings while they keep finding nothing new (a master that
/// stays unreachable): the commands for its slots go through the cluster client meanwhile.
pub(crate) const REFRESH_MAX: Duration = Duration::from_secs(1);

/// How long a failure on a slot is remembered for the error the caller builds from it.
const FAILURE_MEMORY: Duration = Duration::from_secs(2);

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
