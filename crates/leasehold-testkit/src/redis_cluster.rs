//! Private Redis deployments for tests: a Redis Cluster (3 masters, 3 replicas) and a
//! Sentinel-watched master (a master, 2 replicas, 3 sentinels). Every process is a
//! [`RedisServer`] on a free loopback port, stopped by pid on drop; faults are injected by
//! killing, pausing or restarting a node and by forcing failovers.
//!
//! ```no_run
//! # fn demo() -> std::io::Result<()> {
//! let cluster = leasehold_testkit::redis_cluster::RedisCluster::start()?;
//! println!("connect to {}", cluster.url());
//! let sentinel = leasehold_testkit::redis_cluster::RedisSentinel::start()?;
//! println!("connect to {}", sentinel.url());
//! # Ok(()) }
//! ```

use std::io;
use std::process::Command;
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::redis::RedisServer;

/// How long a cluster or a sentinel group may take to form or to settle after a fault.
const SETTLE_TIMEOUT: Duration = Duration::from_secs(30);
/// `cluster-node-timeout`: how long a master may be unreachable before its replica takes over.
pub const CLUSTER_NODE_TIMEOUT: Duration = Duration::from_millis(1000);
/// `down-after-milliseconds`: how long a master may be unreachable before the sentinels fail it
/// over.
pub const SENTINEL_DOWN_AFTER: Duration = Duration::from_millis(1000);
/// The master name the sentinels monitor.
pub const SENTINEL_MASTER: &str = "mymaster";

/// A Redis Cluster of 3 masters with one replica each.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

/// One line of `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node id.
    pub id: String,
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Whether it is a master (else a replica).
    pub master: bool,
    /// Whether the cluster considers it failed.
    pub failed: bool,
    /// For a replica, the id of its master.
    pub master_id: Option<String>,
    /// The slot ranges it serves (masters).
    pub slots: Vec<(u16, u16)>,
}

impl RedisCluster {
    /// Starts 6 nodes and joins them with `redis-cli --cluster create … --cluster-replicas 1`,
    /// then waits until every node reports `cluster_state:ok` and every replica is in sync.
    pub fn start() -> io::Result<Self> {
        Self::start_with_replicas(1)
    }

    /// Starts 3 masters with `replicas` replicas each (0 for a cluster without replication,
    /// to measure what replication costs).
    pub fn start_with_replicas(replicas: usize) -> io::Result<Self> {
        let timeout = CLUSTER_NODE_TIMEOUT.as_millis().to_string();
        let mut nodes = Vec::new();
        for _ in 0..3 * (1 + replicas) {
            nodes.push(RedisServer::start_with_args(&[
                "--cluster-enabled",
                "yes",
                "--cluster-config-file",
                "nodes.conf",
                "--cluster-node-timeout",
                &timeout,
                // A replica with stale data may still be promoted: the tests measure what
                // min_replicas buys, not what a cautious server setting hides.
                "--cluster-replica-validity-factor",
                "0",
            ])?);
        }
        let mut create = Command::new("redis-cli");
        create.args(["--cluster", "create"]);
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port()));
        }
        let out = create
            .args(["--cluster-replicas", &replicas.to_string(), "--cluster-yes"])
            .output()
            .map_err(|e| {
                if e.kind() == io::ErrorKind::NotFound {
                    io::Error::new(
                        io::ErrorKind::NotFound,
                        "redis-cli not found: install the `redis-tools` package (it comes with \
                         `redis-server`) to run the Redis Cluster tests",
                    )
                } else {
                    e
                }
            })?;
        if !out.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let cluster = RedisCluster { nodes };
        cluster.wait_healthy()?;
        Ok(cluster)
    }

    /// The cluster of this test binary that a test holds at the moment, or a new one. It lives
    /// while a test holds the returned handle: tests that run at the same time share it (give
    /// each store its own key prefix), and the last one to finish stops it.
    pub fn shared(slot: &'static Mutex<Weak<RedisCluster>>) -> io::Result<Arc<RedisCluster>> {
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = slot.upgrade() {
            return Ok(running);
        }
        let started = Arc::new(RedisCluster::start()?);
        *slot = Arc::downgrade(&started);
        Ok(started)
    }

    /// `redis+cluster://` with every node as a seed.
    pub fn url(&self) -> String {
        format!("redis+cluster://{}", self.seeds().join(","))
    }

    /// `127.0.0.1:<port>` of every node.
    pub fn seeds(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port()))
            .collect()
    }

    /// The node on `port`.
    pub fn node(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    fn node_mut(&mut self, port: u16) -> io::Result<&mut RedisServer> {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .ok_or_else(|| io::Error::other(format!("no node on port {port}")))
    }

    /// `CLUSTER NODES` as a running node sees it.
    pub fn topology(&self) -> io::Result<Vec<ClusterNode>> {
        let mut last = None;
        for node in self.nodes.iter().filter(|n| n.pid().is_some()) {
            match node.command(&["CLUSTER", "NODES"]) {
                Ok(text) if !text.starts_with('-') => return Ok(parse_nodes(&text)),
                Ok(text) => last = Some(io::Error::other(text)),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no node runs")))
    }

    /// The slot of a Redis key (`CLUSTER KEYSLOT`).
    pub fn slot_of(&self, redis_key: &str) -> io::Result<u16> {
        let node = self
            .nodes
            .iter()
            .find(|n| n.pid().is_some())
            .ok_or_else(|| io::Error::other("no node runs"))?;
        let reply = node.command(&["CLUSTER", "KEYSLOT", redis_key])?;
        reply
            .trim_start_matches(':')
            .parse()
            .map_err(|_| io::Error::other(format!("CLUSTER KEYSLOT answered {reply}")))
    }

    /// The port of the master serving `redis_key`'s slot.
    pub fn master_of(&self, redis_key: &str) -> io::Result<u16> {
        let slot = self.slot_of(redis_key)?;
        self.topology()?
            .into_iter()
            .find(|n| {
                n.master && !n.failed && n.slots.iter().any(|(a, b)| (*a..=*b).contains(&slot))
            })
            .map(|n| n.port)
            .ok_or_else(|| io::Error::other(format!("no live master serves slot {slot}")))
    }

    /// The port of a live replica of the master on `master_port`.
    pub fn replica_of(&self, master_port: u16) -> io::Result<u16> {
        let nodes = self.topology()?;
        let master = nodes
            .iter()
            .find(|n| n.port == master_port)
            .ok_or_else(|| io::Error::other(format!("no node on {master_port}")))?;
        nodes
            .iter()
            .find(|n| !n.master && !n.failed && n.master_id.as_deref() == Some(&master.id))
            .map(|n| n.port)
            .ok_or_else(|| io::Error::other(format!("the master on {master_port} has no replica")))
    }

    /// `CLUSTER FAILOVER TAKEOVER` on the replica of `master_port`'s master: the replica becomes
    /// master at once, without the old master's agreement. Returns the new master's port once
    /// the cluster agrees.
    pub fn failover_takeover(&self, master_port: u16) -> io::Result<u16> {
        let replica = self.replica_of(master_port)?;
        let node = self
            .node(replica)
            .ok_or_else(|| io::Error::other("replica not found"))?;
        let reply = node.command(&["CLUSTER", "FAILOVER", "TAKEOVER"])?;
        if reply != "+OK" {
            return Err(io::Error::other(format!(
                "CLUSTER FAILOVER answered {reply}"
            )));
        }
        self.wait_until(|nodes| {
            nodes.iter().any(|n| n.port == replica && n.master)
                && nodes.iter().any(|n| n.port == master_port && !n.master)
        })?;
        Ok(replica)
    }

    /// Kills the node on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) -> io::Result<()> {
        self.node_mut(port)?.stop();
        Ok(())
    }

    /// Starts the node on `port` again (same port and `nodes.conf`, empty data): it rejoins,
    /// as a replica if its slots were taken over meanwhile.
    pub fn restart(&mut self, port: u16) -> io::Result<()> {
        self.node_mut(port)?.restart()?;
        self.wait_healthy()
    }

    /// Waits until every running node reports `cluster_state:ok`, no running node is flagged
    /// failed, every master has a replica and every replica is in sync with its master.
    pub fn wait_healthy(&self) -> io::Result<()> {
        let started = Instant::now();
        loop {
            let healthy = self.nodes.iter().filter(|n| n.pid().is_some()).all(|n| {
                n.info_field("cluster", "cluster_enabled").is_ok()
                    && n.command(&["CLUSTER", "INFO"])
                        .is_ok_and(|info| info.contains("cluster_state:ok"))
                    && n.info_field("replication", "role").is_ok_and(|role| {
                        role == "master"
                            || n.info_field("replication", "master_link_status")
                                .is_ok_and(|s| s == "up")
                    })
            }) && self.topology().is_ok_and(|nodes| {
                let running: Vec<u16> = self
                    .nodes
                    .iter()
                    .filter(|n| n.pid().is_some())
                    .map(|n| n.port())
                    .collect();
                nodes
                    .iter()
                    .filter(|n| running.contains(&n.port))
                    .all(|n| !n.failed)
                    && nodes
                        .iter()
                        .filter(|n| n.master && !n.slots.is_empty())
                        .count()
                        == 3
            });
            if healthy {
                return Ok(());
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err(io::Error::other(format!(
                    "the Redis Cluster did not become healthy within {SETTLE_TIMEOUT:?}: {:?}",
                    self.topology()
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until `ready` holds for `CLUSTER NODES`.
    pub fn wait_until(&self, ready: impl Fn(&[ClusterNode]) -> bool) -> io::Result<()> {
        let started = Instant::now();
        loop {
            if self.topology().is_ok_and(|nodes| ready(&nodes)) {
                return Ok(());
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err(io::Error::other(format!(
                    "the Redis Cluster did not settle within {SETTLE_TIMEOUT:?}: {:?}",
                    self.topology()
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

fn parse_nodes(text: &str) -> Vec<ClusterNode> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 8 {
                return None;
            }
            let port = fields[1]
                .split('@')
                .next()?
                .rsplit(':')
                .next()?
                .parse()
                .ok()?;
            let flags = fields[2];
            let slots = fields[8..]
                .iter()
                .filter(|s| !s.starts_with('['))
                .filter_map(|range| match range.split_once('-') {
                    Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                    None => range.parse().ok().map(|s| (s, s)),
                })
                .collect();
            Some(ClusterNode {
                id: fields[0].to_owned(),
                port,
                master: flags.contains("master"),
                // `fail` (agreed) or `fail?` (suspected by this node).
                failed: flags.contains("fail"),
                master_id: (fields[3] != "-").then(|| fields[3].to_owned()),
                slots,
            })
        })
        .collect()
}

/// A master with 2 replicas, watched by 3 sentinels (quorum 2).
#[derive(Debug)]
pub struct RedisSentinel {
    /// The data nodes; the first was the master at start.
    nodes: Vec<RedisServer>,
    sentinels: Vec<RedisServer>,
}

impl RedisSentinel {
    /// Starts the master, its 2 replicas and 3 sentinels, and waits until every sentinel sees
    /// the master with 2 replicas and 2 other sentinels.
    pub fn start() -> io::Result<Self> {
        let master = RedisServer::start()?;
        let master_port = master.port().to_string();
        let mut nodes = vec![master];
        for _ in 0..2 {
            nodes.push(RedisServer::start_with_args(&[
                "--replicaof",
                "127.0.0.1",
                &master_port,
            ])?);
        }
        let config = format!(
            "sentinel monitor {SENTINEL_MASTER} 127.0.0.1 {master_port} 2\n\
             sentinel down-after-milliseconds {SENTINEL_MASTER} {}\n\
             sentinel failover-timeout {SENTINEL_MASTER} 5000\n\
             sentinel parallel-syncs {SENTINEL_MASTER} 2\n",
            SENTINEL_DOWN_AFTER.as_millis()
        );
        let mut sentinels = Vec::new();
        for _ in 0..3 {
            sentinels.push(RedisServer::start_with_config(&config, &["--sentinel"])?);
        }
        let group = RedisSentinel { nodes, sentinels };
        group.wait_settled()?;
        Ok(group)
    }

    /// The sentinel group of this test binary that a test holds at the moment, or a new one. It lives
    /// while a test holds the returned handle: tests that run at the same time share it (give
    /// each store its own key prefix), and the last one to finish stops it.
    pub fn shared(slot: &'static Mutex<Weak<RedisSentinel>>) -> io::Result<Arc<RedisSentinel>> {
        let mut slot = slot.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(running) = slot.upgrade() {
            return Ok(running);
        }
        let started = Arc::new(RedisSentinel::start()?);
        *slot = Arc::downgrade(&started);
        Ok(started)
    }

    /// `redis+sentinel://` with every sentinel, naming [`SENTINEL_MASTER`].
    pub fn url(&self) -> String {
        format!(
            "redis+sentinel://{}/{SENTINEL_MASTER}",
            self.sentinel_addresses().join(",")
        )
    }

    /// `127.0.0.1:<port>` of every sentinel.
    pub fn sentinel_addresses(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect()
    }

    /// The port of the master the sentinels name now.
    pub fn master_port(&self) -> io::Result<u16> {
        let mut last = None;
        for sentinel in self.sentinels.iter().filter(|s| s.pid().is_some()) {
            match sentinel.info_field("sentinel", "master0") {
                Ok(line) => {
                    let address = line
                        .split(',')
                        .find_map(|f| f.strip_prefix("address="))
                        .unwrap_or_default();
                    if let Some(port) = address.rsplit(':').next().and_then(|p| p.parse().ok()) {
                        return Ok(port);
                    }
                    last = Some(io::Error::other(line));
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("no sentinel runs")))
    }

    /// The data node on `port`.
    pub fn node(&self, port: u16) -> Option<&RedisServer> {
        self.nodes.iter().find(|n| n.port() == port)
    }

    /// Kills the data node on `port` (SIGKILL).
    pub fn kill(&mut self, port: u16) -> io::Result<()> {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .ok_or_else(|| io::Error::other(format!("no node on {port}")))?
            .stop();
        Ok(())
    }

    /// Starts the data node on `port` again (empty data; the sentinels make it a replica of
    /// the master they name) and waits until the group settles.
    pub fn restart(&mut self, port: u16) -> io::Result<()> {
        self.nodes
            .iter_mut()
            .find(|n| n.port() == port)
            .ok_or_else(|| io::Error::other(format!("no node on {port}")))?
            .restart()?;
        self.wait_settled()
    }

    /// `SENTINEL FAILOVER`: the sentinels promote a replica at once. Returns the new master's
    /// port once every sentinel names it and it serves as master.
    pub fn failover(&self) -> io::Result<u16> {
        let old = self.master_port()?;
        let sentinel = self
            .sentinels
            .iter()
            .find(|s| s.pid().is_some())
            .ok_or_else(|| io::Error::other("no sentinel runs"))?;
        let reply = sentinel.command(&["SENTINEL", "FAILOVER", SENTINEL_MASTER])?;
        if reply != "+OK" {
            return Err(io::Error::other(format!(
                "SENTINEL FAILOVER answered {reply}"
            )));
        }
        self.wait_new_master(old)
    }

    /// Waits until the sentinels name a master other than `old` and it serves as master.
    pub fn wait_new_master(&self, old: u16) -> io::Result<u16> {
        let started = Instant::now();
        loop {
            if let Ok(port) = self.master_port() {
                let serving = self.node(port).is_some_and(|n| {
                    n.info_field("replication", "role")
                        .is_ok_and(|r| r == "master")
                });
                if port != old && serving {
                    return Ok(port);
                }
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                return Err(io::Error::other(format!(
                    "the sentinels named no new master within {SETTLE_TIMEOUT:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Waits until every running sentinel sees the master as `ok` with its replicas and the
    /// other sentinels.
    pub fn wait_settled(&self) -> io::Result<()> {
        let started = Instant::now();
        let replicas = self.nodes.iter().filter(|n| n.pid().is_some()).count() - 1;
        loop {
            let settled = self
                .sentinels
                .iter()
                .filter(|s| s.pid().is_some())
                .all(|s| {
                    s.info_field("sentinel", "master0").is_ok_and(|line| {
                        line.contains("status=ok")
                            && line.contains(&format!("slaves={replicas}"))
                            && line.contains(&format!("sentinels={}", self.sentinels.len()))
                    })
                });
            // A replica the sentinels know may still be in its first sync; WAIT counts only
            // replicas whose link is up.
            let master = self.master_port().ok();
            let synced = self
                .nodes
                .iter()
                .filter(|n| n.pid().is_some() && Some(n.port()) != master)
                .all(|n| {
                    n.info_field("replication", "master_link_status")
                        .is_ok_and(|s| s == "up")
                });
            if settled && synced {
                return Ok(());
            }
            if started.elapsed() > SETTLE_TIMEOUT {
                let seen: Vec<_> = self
                    .sentinels
                    .iter()
                    .map(|s| s.info_field("sentinel", "master0"))
                    .collect();
                return Err(io::Error::other(format!(
                    "the sentinels did not settle within {SETTLE_TIMEOUT:?}: {seen:?}"
                )));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
