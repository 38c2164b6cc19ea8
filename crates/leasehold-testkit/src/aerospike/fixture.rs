//! The fixture itself: its builder, the running server and the records it stores, as tests
//! read them.

use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::admin;
use super::command::NsConfig;
use super::faults::{self, Faults, Partitions};
use super::info::NodeInfo;
use super::server::{self, Shared};
use super::store::Store;
use super::wire;

/// Namespace served when the builder names none.
pub const DEFAULT_NAMESPACE: &str = "test";
/// Cluster name reported when the builder names none.
pub const DEFAULT_CLUSTER_NAME: &str = "leasehold-fixture";

/// A running Aerospike test server. Stops when dropped (or, to wait for it, on
/// [`shutdown`](Self::shutdown)).
#[derive(Debug)]
pub struct AerospikeFixture {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

/// Configures an [`AerospikeFixture`] before it starts.
#[derive(Debug, Clone)]
pub struct AerospikeFixtureBuilder {
    namespace: String,
    cluster_name: String,
    bind: SocketAddr,
    default_ttl: Option<Duration>,
    tls: Option<(std::path::PathBuf, std::path::PathBuf)>,
    credentials: Option<FixtureUser>,
}

/// The fixture's user; `Debug` shows the name only.
#[derive(Clone)]
struct FixtureUser {
    user: String,
    password: String,
}

impl std::fmt::Debug for FixtureUser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FixtureUser")
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

impl Default for AerospikeFixtureBuilder {
    fn default() -> Self {
        AerospikeFixtureBuilder {
            namespace: DEFAULT_NAMESPACE.to_owned(),
            cluster_name: DEFAULT_CLUSTER_NAME.to_owned(),
            bind: SocketAddr::from((Ipv4Addr::LOCALHOST, 0)),
            default_ttl: None,
            tls: None,
            credentials: None,
        }
    }
}

impl AerospikeFixtureBuilder {
    /// The namespace to serve (default `test`). Requests for any other namespace answer
    /// `NAMESPACE_NOT_FOUND`; the client refuses them before sending, since the partition map
    /// only lists this one.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// The cluster name reported by `cluster-name` (default `leasehold-fixture`); set the
    /// client's `cluster_name` to it to exercise the client's check.
    pub fn cluster_name(mut self, cluster_name: impl Into<String>) -> Self {
        self.cluster_name = cluster_name.into();
        self
    }

    /// The address to listen on (default `127.0.0.1:0`, a free loopback port).
    pub fn bind(mut self, addr: SocketAddr) -> Self {
        self.bind = addr;
        self
    }

    /// The namespace default TTL, used by writes with expiration 0 (default: never expire).
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = Some(ttl);
        self
    }

    /// Speak TLS only, with this server certificate (chain) and private key (PEM files, e.g.
    /// [`TestPki::server_cert_file`](crate::tls::TestPki::server_cert_file)): every connection,
    /// info and data alike, starts with a TLS handshake, as on a node with a `tls` service. A
    /// client must connect with a TLS name the certificate lists (`host:tls_name:port`).
    pub fn tls(
        mut self,
        cert_pem: impl Into<std::path::PathBuf>,
        key_pem: impl Into<std::path::PathBuf>,
    ) -> Self {
        self.tls = Some((cert_pem.into(), key_pem.into()));
        self
    }

    /// Require a login as this user (internal authentication, the password hashed with bcrypt as
    /// every client does): data messages on a connection that has not logged in (or
    /// authenticated with a session token from a login) answer `NOT_AUTHENTICATED`; a wrong user
    /// or password answers `INVALID_CREDENTIAL`. Without it, a login answers
    /// `SECURITY_NOT_ENABLED`, as a server without security does, and the client goes on.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.credentials = Some(FixtureUser {
            user: user.into(),
            password: password.into(),
        });
        self
    }

    /// Binds and starts serving on the current tokio runtime.
    ///
    /// # Errors
    ///
    /// Binding fails, or the namespace name is empty, longer than 31 bytes, or contains a
    /// character the info protocol cannot carry (`:;,\t\n`).
    pub async fn start(self) -> io::Result<AerospikeFixture> {
        let ns = &self.namespace;
        if ns.is_empty() || ns.len() > 31 || ns.contains([':', ';', ',', '\t', '\n']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid namespace name {ns:?}"),
            ));
        }
        if self.cluster_name.contains(['\t', '\n']) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cluster name contains a tab or newline",
            ));
        }
        let tls = match &self.tls {
            Some((cert, key)) => Some(tls_acceptor(cert, key)?),
            None => None,
        };
        let security = match &self.credentials {
            Some(u) => Some(admin::Security::new(&u.user, &u.password)?),
            None => None,
        };
        let listener = TcpListener::bind(self.bind).await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            store: Mutex::new(Store::default()),
            ns: NsConfig {
                namespace: self.namespace.clone(),
                default_ttl: self.default_ttl,
            },
            info: NodeInfo {
                node_name: format!(
                    "BB9F1{:04X}{:06X}",
                    addr.port(),
                    std::process::id() & 0xFF_FFFF
                ),
                cluster_name: self.cluster_name,
                namespace: self.namespace,
                port: addr.port(),
            },
            faults: Faults::new(),
            tls,
            security,
            requests: std::sync::atomic::AtomicU64::new(0),
        });
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(server::serve(listener, shared.clone(), stop_rx));
        Ok(AerospikeFixture {
            addr,
            shared,
            stop,
            task: Some(task),
        })
    }
}

/// A TLS acceptor for the certificate chain and key in these PEM files.
fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
) -> io::Result<tokio_rustls::TlsAcceptor> {
    use tokio_rustls::rustls::pki_types::pem::PemObject;
    use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let invalid = |what: &str, e: &dyn std::fmt::Display| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("fixture TLS {what}: {e}"),
        )
    };
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| invalid("certificate", &e))?;
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| invalid("key", &e))?;
    let provider = std::sync::Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
    let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid("protocol versions", &e))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| invalid("certificate and key", &e))?;
    Ok(tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config)))
}

/// A stored record, as seen by [`AerospikeFixture::record`].
#[derive(Debug, Clone, PartialEq)]
pub struct StoredRecord {
    /// The set the record belongs to (empty for none).
    pub set: String,
    /// The user key, when the client sent it (`send_key`).
    pub user_key: Option<BinValue>,
    /// The record's generation.
    pub generation: u16,
    /// Time left before the record expires; `None` if it never does.
    pub ttl: Option<Duration>,
    /// The bins, in the order they were first written.
    pub bins: Vec<(String, BinValue)>,
}

impl StoredRecord {
    /// The value of one bin.
    pub fn bin(&self, name: &str) -> Option<&BinValue> {
        self.bins.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }
}

/// A bin value (or user key) as stored.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum BinValue {
    /// A 64-bit integer.
    Int(i64),
    /// A 64-bit float.
    Float(f64),
    /// A string.
    String(String),
    /// A byte array.
    Blob(Vec<u8>),
    /// A boolean.
    Bool(bool),
    /// Any other particle type (list, map, geo, ...), raw.
    Other {
        /// The wire particle type.
        particle_type: u8,
        /// The wire bytes.
        bytes: Vec<u8>,
    },
}

impl BinValue {
    fn from_particle(p: &wire::Particle) -> BinValue {
        let raw = || BinValue::Other {
            particle_type: p.ptype,
            bytes: p.data.clone(),
        };
        match p.ptype {
            wire::PARTICLE_INTEGER => p.as_i64().map_or_else(raw, BinValue::Int),
            wire::PARTICLE_FLOAT => <[u8; 8]>::try_from(p.data.as_slice())
                .map_or_else(|_| raw(), |b| BinValue::Float(f64::from_be_bytes(b))),
            wire::PARTICLE_STRING => {
                String::from_utf8(p.data.clone()).map_or_else(|_| raw(), BinValue::String)
            }
            wire::PARTICLE_BLOB => BinValue::Blob(p.data.clone()),
            wire::PARTICLE_BOOL if p.data.len() == 1 => BinValue::Bool(p.data[0] != 0),
            _ => raw(),
        }
    }
}

impl AerospikeFixture {
    /// Starts a fixture serving namespace `test` on a free loopback port.
    ///
    /// # Errors
    ///
    /// Binding the port fails.
    pub async fn start() -> io::Result<AerospikeFixture> {
        AerospikeFixture::builder().start().await
    }

    /// A builder, to choose namespace, address, cluster name or default TTL.
    pub fn builder() -> AerospikeFixtureBuilder {
        AerospikeFixtureBuilder::default()
    }

    /// The address the fixture listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `"IP:PORT"`, usable as the `aerospike` client's hosts string.
    pub fn host_string(&self) -> String {
        self.addr.to_string()
    }

    /// The namespace served.
    pub fn namespace(&self) -> &str {
        &self.shared.ns.namespace
    }

    /// The node name the fixture reports (constant for its lifetime).
    pub fn node_name(&self) -> &str {
        &self.shared.info.node_name
    }

    /// The fault injection handle.
    pub fn faults(&self) -> &Faults {
        &self.shared.faults
    }

    /// Holds every data request until [`resume`](Self::resume); see [`Faults::pause`].
    pub fn pause(&self) {
        self.shared.faults.pause();
    }

    /// Releases held data requests; see [`Faults::resume`].
    pub fn resume(&self) {
        self.shared.faults.resume();
    }

    /// Stops answering anything, info included, as a SIGSTOPped node; see [`Faults::freeze`].
    pub fn freeze(&self) {
        self.shared.faults.freeze();
    }

    /// Answers again after [`freeze`](Self::freeze); see [`Faults::thaw`].
    pub fn thaw(&self) {
        self.shared.faults.thaw();
    }

    /// Changes what the node says it owns (a cluster re-forming); see
    /// [`Faults::set_partitions`].
    pub fn set_partitions(&self, partitions: Partitions) {
        self.shared.faults.set_partitions(partitions);
    }

    /// Number of live (unexpired) records in `set`.
    pub fn record_count(&self, set: &str) -> usize {
        let now = tokio::time::Instant::now();
        self.shared.store().live(Some(set), now).count()
    }

    /// Number of live records in the namespace, all sets together.
    pub fn total_record_count(&self) -> usize {
        let now = tokio::time::Instant::now();
        self.shared.store().live(None, now).count()
    }

    /// The live record with this digest (the client's `Key::digest`), if any.
    pub fn record(&self, digest: &[u8; 20]) -> Option<StoredRecord> {
        let now = tokio::time::Instant::now();
        let mut store = self.shared.store();
        let r = store.get_live(digest, now)?;
        Some(StoredRecord {
            set: r.set.clone(),
            user_key: r.user_key.as_ref().map(BinValue::from_particle),
            generation: r.generation,
            ttl: r.expiry.remaining(now),
            bins: r
                .bins
                .iter()
                .map(|(n, p)| (n.clone(), BinValue::from_particle(p)))
                .collect(),
        })
    }

    /// The live record of `set` with string user key `user_key` (found by its digest, so the
    /// client need not have sent the key), if any.
    pub fn record_by_key(&self, set: &str, user_key: &str) -> Option<StoredRecord> {
        self.record(&faults::string_key_digest(set.as_bytes(), user_key))
    }

    /// Data messages received so far (single-record commands and scans, each one round trip of
    /// the client; info and login messages are not counted): what a benchmark reports as
    /// Aerospike requests.
    pub fn requests(&self) -> u64 {
        self.shared
            .requests
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Removes every record.
    pub fn clear(&self) {
        self.shared.store().clear();
    }

    /// Stops accepting connections, closes every open one and waits for the server task.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            // The task only ends by shutdown; a join error means it was aborted or panicked,
            // and either way it is gone.
            let _ = task.await;
        }
    }
}

impl Drop for AerospikeFixture {
    fn drop(&mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}
