//! How to reach the sentinels and the data nodes they name, and what one sentinel says of the
//! master.

use std::collections::HashMap;
use std::time::Duration;

use redis::{
    AsyncConnectionConfig, ConnectionAddr, ConnectionInfo, IntoConnectionInfo, ProtocolVersion,
    RedisConnectionInfo, RedisResult,
};

use super::unfound::{Refusal, Unfound};
use crate::topology::SentinelSpec;

/// How to reach the sentinels and the data nodes: addresses, credentials, TLS.
#[derive(Clone)]
pub(crate) struct SentinelAccess {
    pub(crate) spec: SentinelSpec,
    #[cfg(feature = "tls")]
    pub(crate) certificates: Option<redis::TlsCertificates>,
    pub(crate) connect_timeout: Duration,
    pub(crate) response_timeout: Duration,
    /// How long connecting waits for a named master to answer as one
    /// ([`RedisConfig::master_wait`](crate::RedisConfig::master_wait)).
    pub(crate) master_wait: Duration,
}

impl SentinelAccess {
    fn info(
        &self,
        host: &str,
        port: u16,
        settings: RedisConnectionInfo,
    ) -> RedisResult<ConnectionInfo> {
        let addr = if self.spec.tls {
            ConnectionAddr::TcpTls {
                host: host.to_owned(),
                port,
                insecure: false,
                tls_params: None,
            }
        } else {
            ConnectionAddr::Tcp(host.to_owned(), port)
        };
        Ok(addr.into_connection_info()?.set_redis_settings(settings))
    }

    fn client(&self, info: ConnectionInfo) -> RedisResult<redis::Client> {
        #[cfg(feature = "tls")]
        if let Some(certificates) = &self.certificates {
            return redis::Client::build_with_tls(info, certificates.clone());
        }
        redis::Client::open(info)
    }

    /// A client for the data node at `host:port` (the URL's credentials and database).
    pub(super) fn node_client(
        &self,
        host: &str,
        port: u16,
        protocol: ProtocolVersion,
    ) -> RedisResult<redis::Client> {
        let mut settings = RedisConnectionInfo::default()
            .set_db(self.spec.db)
            .set_protocol(protocol);
        if let Some(user) = &self.spec.username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.spec.password {
            settings = settings.set_password(password);
        }
        self.client(self.info(host, port, settings)?)
    }

    fn sentinel_client(&self, host: &str, port: u16) -> RedisResult<redis::Client> {
        let mut settings = RedisConnectionInfo::default();
        if let Some(user) = &self.spec.sentinel_username {
            settings = settings.set_username(user);
        }
        if let Some(password) = &self.spec.sentinel_password {
            settings = settings.set_password(password);
        }
        self.client(self.info(host, port, settings)?)
    }

    pub(super) fn connection_config(&self) -> AsyncConnectionConfig {
        AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.connect_timeout))
            .set_response_timeout(Some(self.response_timeout))
    }

    /// What one sentinel says of the master: its address and the configuration epoch.
    pub(super) async fn ask(&self, host: &str, port: u16) -> Result<Named, Unfound> {
        let shown = format!("{host}:{port}");
        let asked = async {
            let client = self.sentinel_client(host, port)?;
            let mut connection = client
                .get_multiplexed_async_connection_with_config(&self.connection_config())
                .await?;
            redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.spec.master)
                .query_async::<HashMap<String, String>>(&mut connection)
                .await
        };
        let unanswered = |problem| Unfound {
            named: false,
            problem,
            refused: None,
        };
        let answer = tokio::time::timeout(self.connect_timeout + self.response_timeout, asked)
            .await
            .map_err(|_| unanswered(format!("sentinel {shown} did not answer")))?
            .map_err(|e| Unfound {
                refused: {
                    let sentinel = format!("sentinel {shown}");
                    Refusal::of(&sentinel, &sentinel, &e)
                },
                ..unanswered(format!("sentinel {shown}: {e}"))
            })?;
        let host = answer.get("ip").cloned();
        let port = answer.get("port").and_then(|p| p.parse::<u16>().ok());
        let (Some(host), Some(port)) = (host, port) else {
            return Err(unanswered(format!(
                "sentinel {shown} named no address for master {:?}",
                self.spec.master
            )));
        };
        Ok(Named {
            host,
            port,
            epoch: answer
                .get("config-epoch")
                .and_then(|e| e.parse().ok())
                .unwrap_or(0),
            sentinel: shown,
        })
    }
}

/// A master as one sentinel names it.
#[derive(Debug, Clone)]
pub(super) struct Named {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) epoch: u64,
    /// The sentinel that named it, for messages.
    pub(super) sentinel: String,
}
