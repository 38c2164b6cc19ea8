//! Connecting: the client for the URL and its TLS files, the connection for the deployment (one
//! server, a cluster, or Sentinel's master), and what a failed connect or TLS handshake means.

use std::time::Duration;

use leasehold_core::{Error, ErrorKind, Operation, Result};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::{ProtocolVersion, PushInfo};
use tokio::sync::mpsc::UnboundedReceiver;

use crate::config::RedisConfig;
use crate::connection::Connection;
use crate::error::map;
use crate::sentinel::{Refusal, SentinelAccess, SentinelLink, Unconnected};
use crate::slots::nodes::NodeConnector;
use crate::slots::Router;
use crate::topology::{SentinelSpec, Topology};
use crate::waiting::subscriber::Subscriber;

/// How often the connection manager retries a broken connection before a command fails (each
/// command's caller retries on its own terms after that).
const RECONNECT_RETRIES: usize = 2;
/// The longest pause between those retries.
const RECONNECT_MAX_DELAY: Duration = Duration::from_millis(500);

/// How often the cluster client retries a request that met a moved slot or a dead node, and
/// its shortest and longest pause in milliseconds (jittered between them, growing).
const CLUSTER_RETRIES: u32 = 12;
const CLUSTER_RETRY_MIN_WAIT_MS: u64 = 10;
const CLUSTER_RETRY_MAX_WAIT_MS: u64 = 200;

/// A store's connection, the address its messages name, and how it hears release announcements.
pub(crate) struct Connected {
    pub(crate) connection: Connection,
    pub(crate) address: String,
    pub(crate) subscriber: Subscriber,
    /// On a cluster, the sharded pub/sub messages the cluster client receives.
    pub(crate) pushes: Option<UnboundedReceiver<PushInfo>>,
}

/// Connects to the deployment `topology` names and checks it answers.
pub(crate) async fn connect(config: &RedisConfig, topology: &Topology) -> Result<Connected> {
    match topology {
        Topology::Node => connect_node(config).await,
        Topology::Cluster { seeds, .. } => connect_cluster(config, seeds).await,
        Topology::Sentinel(spec) => connect_sentinel(config, spec).await,
    }
}

fn manager_config(config: &RedisConfig) -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_response_timeout(Some(config.response_timeout))
        .set_connection_timeout(Some(config.connect_timeout))
        .set_number_of_retries(RECONNECT_RETRIES)
        .set_max_delay(RECONNECT_MAX_DELAY)
}

async fn connect_node(config: &RedisConfig) -> Result<Connected> {
    let client = client(config)?;
    let address = address_of(&client);
    let mut connection = ConnectionManager::new_with_config(client.clone(), manager_config(config))
        .await
        .map_err(|e| {
            tls_error(&address, e).unwrap_or_else(|e| map(Operation::Connect, "", &address, e))
        })?;
    // A cluster node answers the keys of its own slots only, and a lock's keys would be spread
    // over slots: say so now rather than with a CROSSSLOT or MOVED on the first lock. (A proxy
    // that refuses INFO is taken at its word.)
    let info: redis::RedisResult<String> = redis::cmd("INFO")
        .arg("cluster")
        .query_async(&mut connection)
        .await;
    if info.is_ok_and(|info| info.contains("cluster_enabled:1")) {
        return Err(Error::new(
            ErrorKind::StoreSetup,
            format!(
                "Redis at {address} is a Redis Cluster node, and a single-server URL would spread \
                 a lock's keys over the cluster's slots: connect with \
                 redis+cluster://{} (RedisConfig::cluster)",
                address.trim_end_matches(" (TLS)")
            ),
        ));
    }
    Ok(Connected {
        connection: Connection::Node(connection),
        address,
        subscriber: Subscriber::Node(Box::new(client)),
        pushes: None,
    })
}

async fn connect_cluster(config: &RedisConfig, seeds: &[String]) -> Result<Connected> {
    let address = format!(
        "the Redis Cluster at {}",
        config
            .redacted_url()
            .split_once("://")
            .map_or("", |(_, rest)| rest)
    );
    let (pushes_in, pushes) = tokio::sync::mpsc::unbounded_channel();
    let builder = ClusterClientBuilder::new(seeds.to_vec())
        .connection_timeout(config.connect_timeout)
        .response_timeout(config.response_timeout)
        // Sharded pub/sub messages arrive as RESP3 pushes, on the same connections; the
        // cluster client resubscribes when a slot moves to another node.
        .use_protocol(ProtocolVersion::RESP3)
        .push_sender(pushes_in)
        // The client retries a request that met a moving slot or a dead node by itself. Its
        // default pauses start at 1.28 s, which a failover pays on top of the cluster's own
        // detection; short pauses retry soon after the replica took over, and the caller's
        // budget (a blocking acquire's wait, a release's or renewal's retry) covers the rest.
        .retries(CLUSTER_RETRIES)
        .min_retry_wait(CLUSTER_RETRY_MIN_WAIT_MS)
        .max_retry_wait(CLUSTER_RETRY_MAX_WAIT_MS);
    #[cfg(feature = "tls")]
    let builder = match tls_certificates(config)? {
        Some(certificates) => builder.certs(certificates),
        None => builder,
    };
    let client = builder.build().map_err(|e| {
        Error::invalid_argument(format!(
            "{:?} is not a usable Redis Cluster URL",
            config.redacted_url()
        ))
        .with_source(e)
    })?;
    let connection = tokio::time::timeout(
        config.connect_timeout.saturating_mul(2),
        client.get_async_connection(),
    )
    .await
    .map_err(|_| {
        Error::connection(format!(
            "no node of {address} answered within {:?}: check the seed addresses",
            config.connect_timeout.saturating_mul(2)
        ))
    })?
    .map_err(|e| {
        if e.to_string().contains("cluster support disabled") {
            return Error::new(
                ErrorKind::StoreSetup,
                format!(
                    "{address} is not a cluster (cluster support disabled): connect to a single \
                     server with redis:// (or redis+sentinel:// for Sentinel)"
                ),
            )
            .with_source(e);
        }
        tls_error(&address, e).unwrap_or_else(|e| map(Operation::Connect, "", &address, e))
    })?;
    if config.fair {
        require_sharded_pubsub(&mut connection.clone(), &address).await?;
    }
    let connector = NodeConnector::new(
        node_template(config, seeds)?,
        config.connect_timeout,
        config.response_timeout,
    );
    let router = Router::connect(
        connection.clone(),
        connector,
        config.direct_routing,
        config.min_replicas.is_some(),
    )
    .await;
    Ok(Connected {
        connection: Connection::Cluster(router),
        address,
        subscriber: Subscriber::Cluster(connection),
        pushes: Some(pushes),
    })
}

/// The connection settings every direct connection to a cluster node starts from: the first
/// seed's (credentials, TLS files), in RESP3 as the cluster client's own connections, so replies
/// read the same whichever way a command went.
fn node_template(config: &RedisConfig, seeds: &[String]) -> Result<redis::ConnectionInfo> {
    let bad = |e: redis::RedisError| {
        Error::invalid_argument(format!(
            "{:?} is not a usable Redis Cluster URL",
            config.redacted_url()
        ))
        .with_source(e)
    };
    let seed = seeds.first().ok_or_else(|| {
        Error::invalid_argument(format!(
            "{:?} names no Redis Cluster node",
            config.redacted_url()
        ))
    })?;
    #[cfg(feature = "tls")]
    let client = match tls_certificates(config)? {
        // The redis crate's own message can quote the PEM it failed on: keep only ours.
        Some(certificates) => {
            redis::Client::build_with_tls(seed.as_str(), certificates).map_err(|e| {
                Error::invalid_argument(format!(
                    "the TLS files for {} cannot be used ({:?})",
                    config.redacted_url(),
                    e.kind()
                ))
            })?
        }
        None => redis::Client::open(seed.as_str()).map_err(bad)?,
    };
    #[cfg(not(feature = "tls"))]
    let client = redis::Client::open(seed.as_str()).map_err(bad)?;
    let info = client.get_connection_info().clone();
    let settings = info
        .redis_settings()
        .clone()
        .set_protocol(ProtocolVersion::RESP3);
    Ok(info.set_redis_settings(settings))
}

/// Fair waiting's release announcements on a cluster are sharded pub/sub (`SPUBLISH`), which
/// Redis has from 7.0 on: an older cluster is told at connect, not by its first fair script.
async fn require_sharded_pubsub(
    cluster: &mut redis::cluster_async::ClusterConnection,
    address: &str,
) -> Result<()> {
    let info = cluster
        .route_command(
            redis::cmd("INFO").arg("server").clone(),
            redis::cluster_routing::RoutingInfo::SingleNode(
                redis::cluster_routing::SingleNodeRoutingInfo::Random,
            ),
        )
        .await
        .and_then(|v| redis::from_redis_value::<String>(v).map_err(Into::into));
    let major = info.ok().and_then(|info| {
        info.lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .and_then(|v| v.trim().split('.').next()?.parse::<u32>().ok())
    });
    match major {
        Some(major) if major < 7 => Err(Error::new(
            ErrorKind::StoreSetup,
            format!(
                "{address} runs Redis {major}.x: fair waiting on a cluster announces releases \
                 with sharded pub/sub (SPUBLISH), which needs Redis 7.0 or later; upgrade, or \
                 turn fair waiting off (RedisConfig::fair(false): waiters poll)"
            ),
        )),
        _ => Ok(()),
    }
}

async fn connect_sentinel(config: &RedisConfig, spec: &SentinelSpec) -> Result<Connected> {
    let sentinels_shown = spec
        .sentinels
        .iter()
        .map(|(host, port)| format!("{host}:{port}"))
        .collect::<Vec<_>>()
        .join(",");
    let address = format!(
        "master {:?} of the sentinels {sentinels_shown}",
        spec.master
    );
    let access = SentinelAccess {
        spec: spec.clone(),
        #[cfg(feature = "tls")]
        certificates: tls_certificates(config)?,
        connect_timeout: config.connect_timeout,
        response_timeout: config.response_timeout,
        master_wait: config.master_wait,
    };
    let link = SentinelLink::connect(access).await.map_err(|unconnected| {
        let e = match unconnected {
            Unconnected::Refused(refusal) => return refused(&address, refusal),
            Unconnected::Unreached(e) => e,
        };
        tls_error(&address, e).unwrap_or_else(|e| {
            Error::connection(format!(
                "could not reach the {address}: check that a sentinel listed runs and \
                 monitors a master named {:?} (sentinel monitor <name> …), and that the \
                 master is up ({e})",
                spec.master
            ))
            .with_source(e)
        })
    })?;
    Ok(Connected {
        connection: Connection::Sentinel(link.clone()),
        address,
        subscriber: Subscriber::Sentinel(link),
        pushes: None,
    })
}

/// The setup error for a Sentinel deployment whose node or sentinels refused the URL's
/// credentials or permissions, naming which and keeping its error.
fn refused(address: &str, refusal: Refusal) -> Error {
    let Refusal { by, error, .. } = refusal;
    Error::new(
        ErrorKind::StoreSetup,
        format!(
            "{by} refused the credentials or permissions the URL gives, connecting to the \
             {address}: check the data nodes' user and password (redis+sentinel://user:password@…), \
             the sentinels' (?sentinel_user=…&sentinel_password=…), and their ACLs ({error})"
        ),
    )
    .with_source(error)
}

/// The CA and client certificate files, read (never kept), for a TLS connection.
#[cfg(feature = "tls")]
fn tls_certificates(config: &RedisConfig) -> Result<Option<redis::TlsCertificates>> {
    if config.tls == crate::config::TlsFiles::default() {
        return Ok(None);
    }
    let read = |path: &std::path::Path, what: &str| {
        std::fs::read(path).map_err(|e| {
            Error::invalid_argument(format!("cannot read the TLS {what} {}", path.display()))
                .with_source(e)
        })
    };
    let root_cert = match &config.tls.ca {
        Some(path) => Some(read(path, "CA file")?),
        None => None,
    };
    let client_tls = match &config.tls.client {
        Some((cert, key)) => Some(redis::ClientTlsConfig {
            client_cert: read(cert, "client certificate")?,
            client_key: read(key, "client key")?,
        }),
        None => None,
    };
    Ok(Some(redis::TlsCertificates {
        client_tls,
        root_cert,
    }))
}

/// The client for `config`: with the configured CA and client certificate when any is set.
pub(crate) fn client(config: &RedisConfig) -> Result<redis::Client> {
    let bad_url = |e: redis::RedisError| {
        Error::invalid_argument(format!(
            "{:?} is not a usable Redis URL (e.g. redis://127.0.0.1:6379)",
            config.redacted_url()
        ))
        .with_source(e)
    };
    #[cfg(feature = "tls")]
    if let Some(certificates) = tls_certificates(config)? {
        return redis::Client::build_with_tls(config.url.as_str(), certificates)
            // The redis crate's own message can quote the PEM it failed on: keep only ours.
            .map_err(|e| {
                Error::invalid_argument(format!(
                    "the TLS files for {} cannot be used ({:?}): check they are PEM \
                 certificates (CA, client) and a PEM private key",
                    config.redacted_url(),
                    e.kind()
                ))
            });
    }
    redis::Client::open(config.url.as_str()).map_err(bad_url)
}

/// A failed TLS handshake, said plainly, with the client's error as its cause: an untrusted
/// certificate or a wrong host name is a setup problem, not an unreachable server. Any other
/// error is handed back.
pub(crate) fn tls_error(
    address: &str,
    error: redis::RedisError,
) -> std::result::Result<Error, redis::RedisError> {
    leasehold_core::TlsFailure::setup_error(&format!("Redis at {address}"), error)
}

pub(crate) fn address_of(client: &redis::Client) -> String {
    match client.get_connection_info().addr() {
        redis::ConnectionAddr::Tcp(host, port) => format!("{host}:{port}"),
        redis::ConnectionAddr::TcpTls { host, port, .. } => format!("{host}:{port} (TLS)"),
        redis::ConnectionAddr::Unix(path) => path.display().to_string(),
        other => format!("{other:?}"),
    }
}
