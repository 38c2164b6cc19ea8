//! The store under test: which deployment to start, how workers reach it, and how each kind of
//! fault is injected into it and healed. Every process is started by the testkit (or, for
//! Aerospike, by [`super::aerospike_node`]) on loopback and stopped by pid on drop.

use std::fmt;
use std::io;
use std::str::FromStr;
use std::time::Duration;

use leasehold_testkit::etcd_cluster::EtcdCluster;
use leasehold_testkit::redis::RedisServer;
use leasehold_testkit::redis_cluster::{RedisCluster, RedisSentinel};

use super::aerospike_node::AerospikeNode;
use super::fault::FaultKind;
use super::proxy::BlackholeProxy;
use super::rng::Rng;

/// The entity every worker locks; with client `nemesis` and farm `f1` its key is
/// `DC#f1#nemesis#resource`.
pub const ENTITY: &str = "resource";
/// The client id of every worker (one key for all of them).
pub const CLIENT_ID: &str = "nemesis";
/// The farm id of every worker.
pub const FARM_ID: &str = "f1";
/// The hash tag of the lock's Redis keys: it decides the lock's Redis Cluster slot.
const REDIS_TAG: &str = "{DC#f1#nemesis#resource}";

/// Which store a run uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    /// One redis-server.
    Redis,
    /// A Redis Cluster, 3 masters with one replica each.
    RedisCluster,
    /// A master with 2 replicas and 3 sentinels.
    Sentinel,
    /// etcd, 3 members.
    Etcd,
    /// The Aerospike wire fixture, one node (a process of its own).
    Aerospike,
}

impl StoreKind {
    /// Every store, in the order the table lists them.
    pub const ALL: [StoreKind; 5] = [
        StoreKind::Etcd,
        StoreKind::RedisCluster,
        StoreKind::Sentinel,
        StoreKind::Redis,
        StoreKind::Aerospike,
    ];

    /// The name `--store` takes.
    pub fn name(self) -> &'static str {
        match self {
            StoreKind::Redis => "redis",
            StoreKind::RedisCluster => "redis-cluster",
            StoreKind::Sentinel => "sentinel",
            StoreKind::Etcd => "etcd",
            StoreKind::Aerospike => "aerospike",
        }
    }

    /// The faults this store's deployment can be given.
    pub fn faults(self) -> &'static [FaultKind] {
        use FaultKind::*;
        match self {
            StoreKind::Redis => &[Kill, PauseShort, PauseLong, Blackhole, ClientPause],
            // The cluster client and the sentinel client learn the nodes' own addresses from
            // the deployment, so a proxy in front of one node would be bypassed: no black hole.
            StoreKind::RedisCluster | StoreKind::Sentinel => {
                &[Kill, PauseShort, PauseLong, Failover, ClientPause]
            }
            StoreKind::Etcd => &[
                Kill,
                PauseShort,
                PauseLong,
                Failover,
                Blackhole,
                ClientPause,
            ],
            StoreKind::Aerospike => &[Kill, PauseShort, PauseLong, ClientPause],
        }
    }

    /// Whether the deployment is a Redis one (`min_replicas` applies).
    pub fn is_redis(self) -> bool {
        matches!(
            self,
            StoreKind::Redis | StoreKind::RedisCluster | StoreKind::Sentinel
        )
    }
}

impl fmt::Display for StoreKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for StoreKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        StoreKind::ALL
            .into_iter()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                format!(
                    "unknown store {s:?}: one of redis, redis-cluster, sentinel, etcd, aerospike \
                     (the embedded store lives in one process and cannot be shared by worker \
                     processes)"
                )
            })
    }
}

/// How long each fault lasts, from the lease TTL.
#[derive(Debug, Clone, Copy)]
pub struct Durations {
    /// The workers' lease TTL.
    pub ttl: Duration,
}

impl Durations {
    /// A node pause shorter than the TTL.
    pub fn pause_short(&self) -> Duration {
        self.ttl / 2
    }

    /// A node pause longer than the TTL.
    pub fn pause_long(&self) -> Duration {
        self.ttl * 2
    }

    /// A client pause: past the TTL, with time for another worker to take the lock and write.
    pub fn client_pause(&self) -> Duration {
        self.ttl * 2 + Duration::from_secs(1)
    }
}

/// A running deployment.
#[derive(Debug)]
pub enum Deployment {
    /// One redis-server, reached through a black-hole proxy.
    Redis {
        /// The server.
        server: RedisServer,
        /// The proxy the workers use.
        proxy: BlackholeProxy,
    },
    /// A Redis Cluster, 3 + 3.
    RedisCluster(RedisCluster),
    /// Sentinel: a master, 2 replicas, 3 sentinels.
    Sentinel(RedisSentinel),
    /// etcd, 3 members, each reached through a black-hole proxy.
    Etcd {
        /// The members.
        cluster: EtcdCluster,
        /// One proxy per member, in member order.
        proxies: Vec<BlackholeProxy>,
    },
    /// One Aerospike fixture node.
    Aerospike(AerospikeNode),
}

impl Deployment {
    /// Starts `kind` (the proxies on `runtime`); `exe` is the nemesis binary (it serves the
    /// Aerospike node).
    pub fn start(
        kind: StoreKind,
        runtime: &tokio::runtime::Handle,
        exe: &std::path::Path,
    ) -> io::Result<Self> {
        Ok(match kind {
            StoreKind::Redis => {
                let server = RedisServer::start()?;
                let proxy = runtime.block_on(BlackholeProxy::start(server.addr()))?;
                Deployment::Redis { server, proxy }
            }
            StoreKind::RedisCluster => Deployment::RedisCluster(RedisCluster::start()?),
            StoreKind::Sentinel => Deployment::Sentinel(RedisSentinel::start()?),
            StoreKind::Etcd => {
                let cluster = EtcdCluster::start(3)?;
                let mut proxies = Vec::new();
                for endpoint in cluster.endpoints() {
                    let addr = endpoint.parse().map_err(io::Error::other)?;
                    proxies.push(runtime.block_on(BlackholeProxy::start(addr))?);
                }
                Deployment::Etcd { cluster, proxies }
            }
            StoreKind::Aerospike => Deployment::Aerospike(AerospikeNode::start(exe)?),
        })
    }

    /// What the workers connect to: a store URL (Aerospike: its hosts).
    pub fn worker_url(&self) -> String {
        match self {
            Deployment::Redis { proxy, .. } => format!("redis://{}", proxy.addr()),
            Deployment::RedisCluster(cluster) => cluster.url(),
            Deployment::Sentinel(group) => group.url(),
            Deployment::Etcd { proxies, .. } => {
                let hosts: Vec<String> = proxies.iter().map(|p| p.addr().to_string()).collect();
                format!("etcd://{}", hosts.join(","))
            }
            Deployment::Aerospike(node) => node.host_string(),
        }
    }

    /// Injects one fault of `kind`, keeps it for its duration, heals it and waits until the
    /// deployment has settled. Returns what it hit. Client pauses are the resource's job
    /// ([`super::resource::FencedResource::pause_next_holder`]), not the deployment's.
    pub fn inject(
        &mut self,
        kind: FaultKind,
        durations: Durations,
        rng: &mut Rng,
        runtime: &tokio::runtime::Handle,
    ) -> io::Result<String> {
        let pause = match kind {
            FaultKind::PauseShort => durations.pause_short(),
            _ => durations.pause_long(),
        };
        match (self, kind) {
            (Deployment::Redis { server, .. }, FaultKind::Kill) => {
                server.stop();
                std::thread::sleep(rng.between(Duration::ZERO, Duration::from_secs(1)));
                server.restart()?;
                Ok(format!("redis-server :{}", server.port()))
            }
            (Deployment::Redis { server, .. }, FaultKind::PauseShort | FaultKind::PauseLong) => {
                server.pause()?;
                std::thread::sleep(pause);
                server.resume()?;
                Ok(format!("redis-server :{}", server.port()))
            }
            (Deployment::Redis { proxy, .. }, FaultKind::Blackhole) => {
                let cut = rng.between(durations.pause_short(), durations.pause_long());
                proxy.set_cut(true);
                std::thread::sleep(cut);
                proxy.set_cut(false);
                Ok(format!(
                    "redis-server :{} for {cut:?}",
                    proxy.upstream().port()
                ))
            }
            (Deployment::RedisCluster(cluster), FaultKind::Kill) => {
                let master = cluster.master_of(REDIS_TAG)?;
                let replica = cluster.replica_of(master)?;
                let killed = std::time::Instant::now();
                cluster.kill(master)?;
                let promoted =
                    cluster.wait_until(|nodes| nodes.iter().any(|n| n.port == replica && n.master));
                // The deployment's own failover time, to set the lock's gap against.
                let failover = killed.elapsed();
                cluster.restart(master)?;
                promoted?;
                Ok(format!(
                    "slot master :{master} → :{replica} after {failover:.1?}"
                ))
            }
            (Deployment::RedisCluster(cluster), FaultKind::PauseShort | FaultKind::PauseLong) => {
                let master = cluster.master_of(REDIS_TAG)?;
                let node = cluster
                    .node(master)
                    .ok_or_else(|| io::Error::other("no such node"))?;
                node.pause()?;
                std::thread::sleep(pause);
                node.resume()?;
                cluster.wait_healthy()?;
                Ok(format!("slot master :{master}"))
            }
            (Deployment::RedisCluster(cluster), FaultKind::Failover) => {
                let master = cluster.master_of(REDIS_TAG)?;
                let new = cluster.failover_takeover(master)?;
                cluster.wait_healthy()?;
                Ok(format!("slot master :{master} → :{new}"))
            }
            (Deployment::Sentinel(group), FaultKind::Kill) => {
                let master = group.master_port()?;
                let killed = std::time::Instant::now();
                group.kill(master)?;
                let promoted = group.wait_new_master(master);
                let failover = killed.elapsed();
                group.restart(master)?;
                let new = promoted?;
                Ok(format!("master :{master} → :{new} after {failover:.1?}"))
            }
            (Deployment::Sentinel(group), FaultKind::PauseShort | FaultKind::PauseLong) => {
                let master = group.master_port()?;
                let node = group
                    .node(master)
                    .ok_or_else(|| io::Error::other("no such node"))?;
                node.pause()?;
                std::thread::sleep(pause);
                node.resume()?;
                group.wait_settled()?;
                Ok(format!("master :{master}"))
            }
            (Deployment::Sentinel(group), FaultKind::Failover) => {
                let master = group.master_port()?;
                let new = group.failover()?;
                group.wait_settled()?;
                Ok(format!("master :{master} → :{new}"))
            }
            (Deployment::Etcd { cluster, .. }, FaultKind::Kill) => {
                let leader = cluster.wait_for_leader()?;
                let killed = std::time::Instant::now();
                cluster.kill(leader)?;
                let elected = cluster.wait_for_leader();
                let election = killed.elapsed();
                cluster.restart(leader)?;
                let new = elected?;
                cluster.wait_healthy()?;
                Ok(format!("leader m{leader} → m{new} after {election:.1?}"))
            }
            (Deployment::Etcd { cluster, .. }, FaultKind::PauseShort | FaultKind::PauseLong) => {
                let leader = cluster.wait_for_leader()?;
                cluster.pause(leader)?;
                std::thread::sleep(pause);
                cluster.resume(leader)?;
                cluster.wait_healthy()?;
                cluster.wait_for_leader()?;
                Ok(format!("leader m{leader}"))
            }
            (Deployment::Etcd { cluster, .. }, FaultKind::Failover) => {
                let leader = cluster.wait_for_leader()?;
                let target = (leader + 1 + rng.below(2)) % cluster.size();
                runtime.block_on(move_leader(
                    &cluster.endpoint(leader),
                    &cluster.endpoint(target),
                ))?;
                let started = std::time::Instant::now();
                let new = loop {
                    let now = cluster.wait_for_leader()?;
                    if now != leader || started.elapsed() > Duration::from_secs(10) {
                        break now;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                };
                Ok(format!("leader m{leader} → m{new}"))
            }
            (Deployment::Etcd { cluster, proxies }, FaultKind::Blackhole) => {
                let member = rng.below(proxies.len());
                let cut = rng.between(durations.pause_short(), durations.pause_long());
                proxies[member].set_cut(true);
                std::thread::sleep(cut);
                proxies[member].set_cut(false);
                cluster.wait_healthy()?;
                Ok(format!("member m{member} for {cut:?}"))
            }
            (Deployment::Aerospike(node), FaultKind::Kill) => {
                node.kill();
                std::thread::sleep(rng.between(Duration::ZERO, Duration::from_secs(1)));
                node.restart()?;
                Ok(format!("node {}", node.host_string()))
            }
            (Deployment::Aerospike(node), FaultKind::PauseShort | FaultKind::PauseLong) => {
                node.pause(true)?;
                std::thread::sleep(pause);
                node.pause(false)?;
                Ok(format!("node {}", node.host_string()))
            }
            (deployment, kind) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{} cannot be given a {} fault",
                    deployment.kind(),
                    kind.name()
                ),
            )),
        }
    }

    /// Which store this is.
    pub fn kind(&self) -> StoreKind {
        match self {
            Deployment::Redis { .. } => StoreKind::Redis,
            Deployment::RedisCluster(_) => StoreKind::RedisCluster,
            Deployment::Sentinel(_) => StoreKind::Sentinel,
            Deployment::Etcd { .. } => StoreKind::Etcd,
            Deployment::Aerospike(_) => StoreKind::Aerospike,
        }
    }

    /// Heals whatever a fault that failed midway may have left: every node running, unpaused,
    /// reachable. Best effort (the run reports the fault's error).
    pub fn heal_all(&mut self) {
        match self {
            Deployment::Redis { server, proxy } => {
                proxy.set_cut(false);
                let _ = server.resume();
                if server.pid().is_none() {
                    let _ = server.restart();
                }
            }
            Deployment::RedisCluster(cluster) => {
                let _ = cluster.wait_healthy();
            }
            Deployment::Sentinel(group) => {
                let _ = group.wait_settled();
            }
            Deployment::Etcd { cluster, proxies } => {
                for proxy in proxies.iter() {
                    proxy.set_cut(false);
                }
                let _ = cluster.heal_all();
            }
            Deployment::Aerospike(node) => {
                let _ = node.pause(false);
                if node.pid().is_none() {
                    let _ = node.restart();
                }
            }
        }
    }
}

/// Moves etcd's leadership from the member at `leader` to the member at `target` (etcd's
/// `move-leader`, which only the leader accepts).
async fn move_leader(leader: &str, target: &str) -> io::Result<()> {
    let mut client = etcd_client::Client::connect([format!("http://{leader}")], None)
        .await
        .map_err(io::Error::other)?;
    let members = client.member_list().await.map_err(io::Error::other)?;
    let target_url = format!("http://{target}");
    let id = members
        .members()
        .iter()
        .find(|m| m.client_urls().contains(&target_url))
        .map(|m| m.id())
        .ok_or_else(|| io::Error::other(format!("no member serves {target}")))?;
    client.move_leader(id).await.map_err(io::Error::other)?;
    Ok(())
}
