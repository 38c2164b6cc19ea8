//! The connection a store sends its commands on: one server, a Redis Cluster, or the master
//! Sentinel names. Scripts and commands run on it alike (it is a `ConnectionLike`); what differs
//! is where a command goes and how a failover is followed.
//!
//! - One server: the redis crate's `ConnectionManager` (reconnects to the same address).
//! - Cluster: each single-slot command goes from the caller's task straight to its slot's master,
//!   over a connection the store keeps per master (`crate::slots`); the redis crate's async
//!   cluster client takes everything else and whatever the direct route cannot vouch for — it
//!   follows `MOVED`/`ASK` and slot migrations, and refreshes its slot map after a failover.
//! - Sentinel: a `ConnectionManager` to the current master, replaced when the master stops
//!   serving (a `READONLY` reply from a demoted master, a refused or lost connection): the
//!   sentinels are asked again, and the next command goes to whichever master they name.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::sentinel::SentinelClient;
use redis::{Cmd, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::slots::Router;

/// Where a store's commands go. Cheap to clone.
#[derive(Clone)]
pub(crate) enum Connection {
    /// One server.
    Node(ConnectionManager),
    /// A Redis Cluster: the direct route per slot, and the cluster client behind it.
    Cluster(Arc<Router>),
    /// The master the sentinels name, followed across failovers.
    Sentinel(Arc<SentinelLink>),
}

impl Connection {
    /// `WAIT replicas timeout` on the node that holds `key` (the node the last write on `key`
    /// went to): how many replicas acknowledged every write sent before it on that connection.
    pub(crate) async fn wait_replicas(
        &mut self,
        key: &str,
        replicas: u32,
        timeout: Duration,
    ) -> RedisResult<u32> {
        let mut wait = redis::cmd("WAIT");
        wait.arg(replicas).arg(timeout.as_millis() as u64);
        match self {
            // The cluster client would send WAIT to every master and keep the least answer;
            // the write went to the key's master alone, on the connection WAIT must use.
            Connection::Cluster(router) => {
                let answer = router.wait_replicas(key, wait).await?;
                redis::from_redis_value(answer.extract_error()?).map_err(Into::into)
            }
            other => wait.query_async(other).await,
        }
    }

    /// Where a command on `redis_key` failed, for messages: on a cluster, the node (and slot)
    /// its last failure came from, if recent — `node 127.0.0.1:7001 (slot 1234) of <address>`;
    /// elsewhere, and when no failure is known, `address` as it is.
    pub(crate) fn failure_site<'a>(
        &self,
        redis_key: &str,
        address: &'a str,
    ) -> std::borrow::Cow<'a, str> {
        match self {
            Connection::Cluster(router) => match router.failure_site(redis_key) {
                Some((node, slot)) => crate::error::on_node(address, node.as_deref(), slot).into(),
                None => address.into(),
            },
            _ => address.into(),
        }
    }
}

impl ConnectionLike for Connection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Connection::Node(node) => node.req_packed_command(cmd),
            Connection::Cluster(router) => Box::pin(router.request(cmd)),
            Connection::Sentinel(link) => {
                let link = link.clone();
                Box::pin(async move {
                    let mut master = link.current();
                    let result = master.req_packed_command(cmd).await;
                    link.after(&result).await;
                    result
                })
            }
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Connection::Node(node) => node.req_packed_commands(pipeline, offset, count),
            Connection::Cluster(router) => {
                Box::pin(router.request_pipeline(pipeline, offset, count))
            }
            Connection::Sentinel(link) => {
                let link = link.clone();
                Box::pin(async move {
                    let mut master = link.current();
                    let result = master.req_packed_commands(pipeline, offset, count).await;
                    link.after(&result).await;
                    result
                })
            }
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(node) => node.get_db(),
            Connection::Cluster(_) => 0,
            Connection::Sentinel(link) => link.current().get_db(),
        }
    }
}

/// The master the sentinels named last, and how to ask them again.
pub(crate) struct SentinelLink {
    sentinels: tokio::sync::Mutex<SentinelClient>,
    master: RwLock<Master>,
    config: ConnectionManagerConfig,
    connect_timeout: Duration,
}

/// The master in use.
#[derive(Clone)]
struct Master {
    connection: ConnectionManager,
    /// `host:port`, for messages.
    address: String,
}

impl SentinelLink {
    /// Asks the sentinels for the master and connects to it.
    pub(crate) async fn connect(
        mut sentinels: SentinelClient,
        config: ConnectionManagerConfig,
        connect_timeout: Duration,
    ) -> RedisResult<SentinelLink> {
        let master = Self::find_master(&mut sentinels, &config, connect_timeout).await?;
        Ok(SentinelLink {
            sentinels: tokio::sync::Mutex::new(sentinels),
            master: RwLock::new(master),
            config,
            connect_timeout,
        })
    }

    async fn find_master(
        sentinels: &mut SentinelClient,
        config: &ConnectionManagerConfig,
        connect_timeout: Duration,
    ) -> RedisResult<Master> {
        let client = tokio::time::timeout(connect_timeout, sentinels.async_get_client())
            .await
            .map_err(|_| timed_out())??;
        let address = crate::connect::address_of(&client);
        let connection = ConnectionManager::new_with_config(client, config.clone()).await?;
        Ok(Master {
            connection,
            address,
        })
    }

    /// The connection to the master in use.
    fn current(&self) -> ConnectionManager {
        self.master
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .connection
            .clone()
    }

    /// The address of the master in use, for messages.
    pub(crate) fn address(&self) -> String {
        self.master
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .address
            .clone()
    }

    /// A client for the master in use (for the subscriber connection).
    pub(crate) async fn master_client(&self) -> RedisResult<redis::Client> {
        let mut sentinels = self.sentinels.lock().await;
        tokio::time::timeout(self.connect_timeout, sentinels.async_get_client())
            .await
            .map_err(|_| timed_out())?
    }

    /// After a command: if its answer says the master no longer serves, ask the sentinels again
    /// so the next command (the caller's retry) goes to the master they name now. The failed
    /// command's own error still goes to its caller: it is temporary, and nothing was applied
    /// (or, for a lost connection, the readback decides).
    async fn after<T>(&self, result: &RedisResult<T>) {
        let Err(error) = result else {
            return;
        };
        if !master_moved(error) {
            return;
        }
        let stale = self.address();
        let mut sentinels = self.sentinels.lock().await;
        // Another command may have followed the failover while this one waited for the lock.
        if self.address() != stale {
            return;
        }
        match Self::find_master(&mut sentinels, &self.config, self.connect_timeout).await {
            Ok(master) => {
                if master.address != stale {
                    tracing::warn!(from = %stale, to = %master.address,
                        "Redis Sentinel names a new master; following it");
                }
                *self
                    .master
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = master;
            }
            Err(error) => {
                tracing::debug!(%error, master = %stale,
                    "the sentinels named no usable master yet; the next command asks again");
            }
        }
    }
}

/// Answers after which the master in use may no longer be the master.
fn master_moved(error: &RedisError) -> bool {
    error.is_connection_refusal()
        || error.is_connection_dropped()
        || error.is_io_error()
        || error.is_timeout()
        || matches!(error.code(), Some("READONLY" | "MASTERDOWN" | "LOADING"))
}

fn timed_out() -> RedisError {
    RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut))
}

/// A cluster node, by address.
pub(crate) type NodeAddress = crate::slots::NodeAddress;

/// Every master of the cluster (`CLUSTER SLOTS`, read afresh), for commands that each node
/// answers for its own keys (`SCAN`).
pub(crate) async fn masters(router: &Router) -> RedisResult<Vec<Option<NodeAddress>>> {
    Ok(router.masters().await?.into_iter().map(Some).collect())
}

/// `cmd` on the cluster node at `node`, through the cluster client.
pub(crate) async fn query_node<T: redis::FromRedisValue>(
    router: &Router,
    cmd: Cmd,
    node: &NodeAddress,
) -> RedisResult<T> {
    let routing = RoutingInfo::SingleNode(SingleNodeRoutingInfo::ByAddress {
        host: node.0.clone(),
        port: node.1,
    });
    let answer = router.cluster().route_command(cmd, routing).await?;
    redis::from_redis_value(answer).map_err(Into::into)
}
