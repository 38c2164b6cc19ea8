//! The connection a store sends its commands on: one server, a Redis Cluster, or the master
//! Sentinel names. Scripts and commands run on it alike (it is a `ConnectionLike`); what differs
//! is where a command goes and how a failover is followed.
//!
//! - One server: the redis crate's `ConnectionManager` (reconnects to the same address).
//! - Cluster: each single-slot command goes from the caller's task straight to its slot's master,
//!   over a connection the store keeps per master (`crate::slots`); the redis crate's async
//!   cluster client takes everything else and whatever the direct route cannot vouch for — it
//!   follows `MOVED`/`ASK` and slot migrations, and refreshes its slot map after a failover.
//! - Sentinel: a connection to the master the sentinels name and that answers as a master, replaced
//!   when it stops serving (`crate::sentinel`).

use std::sync::Arc;
use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

use crate::sentinel::SentinelLink;
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
        // Rounded up: `WAIT n 0` would block until the replicas answer, however long.
        wait.arg(replicas).arg(leasehold_core::ttl_millis(timeout));
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
            Connection::Sentinel(link) => Box::pin(link.request(cmd)),
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
            Connection::Sentinel(link) => Box::pin(link.request_pipeline(pipeline, offset, count)),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Connection::Node(node) => node.get_db(),
            Connection::Cluster(_) => 0,
            Connection::Sentinel(link) => link.db(),
        }
    }
}

/// A cluster node, by address.
pub(crate) type NodeAddress = crate::slots::nodes::NodeAddress;

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
