//! The direct connections: one multiplexed connection per master of the slot map, made with a
//! seed's settings, and marked broken the moment it drops so nothing more is sent on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, PushInfo, PushKind, RedisError,
    RedisResult,
};

/// The name the direct connections give themselves (`CLIENT SETNAME`), so `CLIENT LIST` on a
/// node tells them from the cluster client's.
pub(crate) const CLIENT_NAME: &str = "leasehold-direct";

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

/// A master in the slot map, and the direct connection to it.
pub(crate) struct Node {
    pub(crate) address: NodeAddress,
    /// `host:port`, for messages.
    pub(crate) shown: String,
    /// `None` when the connection could not be made (its slots go through the cluster client).
    pub(super) conn: Option<MultiplexedConnection>,
    /// Set when the connection dropped (its `Disconnection` push) or a command on it failed:
    /// from then on nothing is sent on it, and the next refresh makes a new one.
    pub(super) broken: Arc<AtomicBool>,
}

impl Node {
    /// The connection, if it is usable.
    pub(super) fn connection(&self) -> Option<MultiplexedConnection> {
        if self.broken.load(Ordering::Acquire) {
            None
        } else {
            self.conn.clone()
        }
    }

    pub(super) fn mark_broken(&self, slot: u16, error: &RedisError) {
        if !self.broken.swap(true, Ordering::AcqRel) {
            tracing::warn!(node = %self.shown, slot, %error,
                "the direct connection to a Redis Cluster node failed; its slots go through the \
                 cluster client until the slot map is read again");
        }
    }
}

/// Makes the direct connections: a seed's connection settings (credentials, TLS, protocol) with
/// the node's address, and the cluster client's timeouts.
pub(crate) struct NodeConnector {
    template: ConnectionInfo,
    pub(super) connect_timeout: Duration,
    pub(super) response_timeout: Duration,
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

    pub(super) async fn connect(&self, address: &NodeAddress) -> RedisResult<Node> {
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
