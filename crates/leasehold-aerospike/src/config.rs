//! Configuration, in the spirit of the seeds' builders: hosts, namespace, set suffix, farm id,
//! credentials, timeouts, connection pool, commit level, retries.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use aerospike::policy::{CommitLevel, Replica};
use leasehold_core::{validate_at_most, Error, Result, MAX_TIMEOUT, MAX_TTL};

use crate::layout::Layout;

/// The Java lock manager's set suffix.
pub const DEFAULT_SET_SUFFIX: &str = "distributed_lock";
/// Attempts of a store operation on errors where nothing was applied (the seed: 5).
pub const DEFAULT_RETRIES: u32 = 5;
/// Pause between those attempts (the seed: 80 ms).
pub const DEFAULT_RETRY_DELAY: Duration = Duration::from_millis(80);
/// How long a waiting process keeps its place in a key's line without asking again (Redisson's
/// fair lock: 5 s).
pub const DEFAULT_WAITER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long [`AerospikeStore::connect`](crate::AerospikeStore::connect) waits for a usable
/// cluster: a node lost or a cluster re-forming (a few seconds on a default heartbeat) fits.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a release or an extension keeps retrying a transient failure (node lost, partition
/// unavailable, cluster re-forming, reply lost) before it gives up.
pub const DEFAULT_RETRY_BUDGET: Duration = Duration::from_secs(10);
/// The port of a seed host that names none.
pub const DEFAULT_PORT: u16 = 3000;

/// How an [`AerospikeStore`](crate::AerospikeStore) connects and names its records.
///
/// `Debug` never shows the password.
///
/// ```
/// use std::time::Duration;
/// use leasehold_aerospike::AerospikeConfig;
/// let config = AerospikeConfig::new("127.0.0.1:3000", "locks", "farm1")
///     .set_suffix("distributed_lock")
///     .credentials("app", "secret")
///     .total_timeout(Duration::from_millis(500));
/// assert!(!format!("{config:?}").contains("secret"));
/// ```
#[derive(Clone)]
pub struct AerospikeConfig {
    /// Seed hosts as given, one entry per host (checked by `validate`).
    pub(crate) hosts: Vec<String>,
    pub(crate) namespace: String,
    pub(crate) set_suffix: String,
    pub(crate) farm_id: String,
    pub(crate) user: Option<String>,
    pub(crate) password: Option<String>,
    pub(crate) socket_timeout: Duration,
    pub(crate) total_timeout: Duration,
    pub(crate) max_conns_per_node: usize,
    pub(crate) commit_levels: CommitLevels,
    pub(crate) read_replica: Replica,
    pub(crate) retries: u32,
    pub(crate) retry_delay: Duration,
    pub(crate) retry_budget: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) fencing: bool,
    pub(crate) max_error_rate: Option<usize>,
    pub(crate) send_key: bool,
    pub(crate) fair: bool,
    pub(crate) waiter_timeout: Duration,
    pub(crate) tls: TlsSettings,
}

/// Commit level of each kind of write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CommitLevels {
    /// The create, the fence increment and the fence write.
    pub(crate) acquire: CommitLevel,
    /// The filtered delete.
    pub(crate) release: CommitLevel,
    /// The filtered touch.
    pub(crate) extend: CommitLevel,
}

impl CommitLevels {
    fn all(level: CommitLevel) -> Self {
        CommitLevels {
            acquire: level,
            release: level,
            extend: level,
        }
    }
}

/// TLS settings: file paths and a name, never key contents (read at connect time).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    /// TLS name for hosts that do not give their own (`host:tls_name:port`).
    pub(crate) name: Option<String>,
    /// CA certificate(s) to trust instead of the web roots.
    pub(crate) ca: Option<PathBuf>,
    /// Client certificate and key (mutual TLS).
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

impl TlsSettings {
    pub(crate) fn enabled(&self) -> bool {
        *self != TlsSettings::default()
    }
}

/// One seed host: `host[:tls_name][:port]`, an IPv6 address in brackets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seed {
    /// The host name or address (an IPv6 address with its brackets).
    pub(crate) host: String,
    /// The TLS name this host gives itself (`host:tls_name:port`).
    pub(crate) tls_name: Option<String>,
    pub(crate) port: u16,
}

impl Seed {
    /// Parses one entry of a hosts list (`entry` is trimmed, never empty).
    fn parse(entry: &str) -> std::result::Result<Seed, String> {
        let (host, rest) = match entry.strip_prefix('[') {
            Some(v6) => match v6.split_once(']') {
                Some((addr, rest)) if !addr.is_empty() => match rest {
                    "" => (format!("[{addr}]"), None),
                    rest => match rest.strip_prefix(':') {
                        Some(rest) => (format!("[{addr}]"), Some(rest)),
                        None => return Err("has text after its `]` that is not `:port`".into()),
                    },
                },
                _ => return Err("opens a `[` IPv6 address it does not close".into()),
            },
            None => match entry.split_once(':') {
                Some((host, rest)) => (host.to_owned(), Some(rest)),
                None => (entry.to_owned(), None),
            },
        };
        if host.is_empty() {
            return Err("has no host name".into());
        }
        if host.contains(|c: char| c.is_whitespace() || "/?#@".contains(c)) {
            return Err("is not a host name or address".into());
        }
        let parts: Vec<&str> = rest.map(|r| r.split(':').collect()).unwrap_or_default();
        let (tls_name, port) = match parts.as_slice() {
            [] => (None, None),
            [port] => (None, Some(*port)),
            [name, port] if !name.is_empty() => (Some((*name).to_owned()), Some(*port)),
            _ if !entry.starts_with('[') && parts.len() > 2 => {
                return Err(
                    "has too many `:` (an IPv6 address goes in brackets: [::1]:3000)".into(),
                )
            }
            _ => return Err("is not host:port or host:tls_name:port".into()),
        };
        let port = match port {
            None => DEFAULT_PORT,
            Some(port) => match port.parse::<u16>() {
                Ok(port) if port > 0 => port,
                _ => return Err(format!("has an invalid port {port:?} (1-65535)")),
            },
        };
        Ok(Seed {
            host,
            tls_name,
            port,
        })
    }

    /// `host:port` (the address to name in messages).
    pub(crate) fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }
}

/// Parses a list of seed hosts: every entry must be a host, and the list must not be empty.
pub(crate) fn parse_seeds<S: AsRef<str>>(hosts: &[S]) -> Result<Vec<Seed>> {
    let shown = hosts
        .iter()
        .map(AsRef::as_ref)
        .collect::<Vec<_>>()
        .join(",");
    let example = "write host:port[,host:port…], e.g. \"10.0.0.5:3000,10.0.0.6:3000\"";
    if hosts.is_empty() || hosts.iter().all(|h| h.as_ref().trim().is_empty()) {
        return Err(Error::invalid_argument(format!(
            "Aerospike hosts must not be empty ({example})"
        )));
    }
    let mut seeds: Vec<Seed> = Vec::new();
    for (n, entry) in hosts.iter().enumerate() {
        let entry = entry.as_ref().trim();
        if entry.is_empty() {
            return Err(Error::invalid_argument(format!(
                "Aerospike hosts {shown:?}: host {} of the list is empty ({example})",
                n + 1
            )));
        }
        let seed = Seed::parse(entry).map_err(|problem| {
            Error::invalid_argument(format!(
                "Aerospike hosts {shown:?}: host {entry:?} {problem} ({example})"
            ))
        })?;
        // The same host twice is harmless to the client: given once.
        if !seeds.contains(&seed) {
            seeds.push(seed);
        }
    }
    Ok(seeds)
}

impl AerospikeConfig {
    /// A configuration for the cluster seeded by `hosts` (`"host:port[,host:port…]"`; a host
    /// without a port is on 3000, an IPv6 address goes in brackets, `host:tls_name:port` names
    /// a host's TLS name), lock records in `namespace`, bins named after `farm_id` (at most 9
    /// characters). Give several seeds: connect tries every one, so a cluster whose first seed is
    /// down is still reached. [`seed_hosts`](Self::seed_hosts) takes them as a list.
    pub fn new(
        hosts: impl Into<String>,
        namespace: impl Into<String>,
        farm_id: impl Into<String>,
    ) -> Self {
        let hosts: String = hosts.into();
        AerospikeConfig {
            hosts: hosts.split(',').map(|h| h.trim().to_owned()).collect(),
            namespace: namespace.into(),
            set_suffix: DEFAULT_SET_SUFFIX.to_owned(),
            farm_id: farm_id.into(),
            user: None,
            password: None,
            socket_timeout: Duration::from_millis(1000),
            total_timeout: Duration::from_millis(2000),
            max_conns_per_node: 256,
            commit_levels: CommitLevels::all(CommitLevel::CommitMaster),
            read_replica: Replica::Sequence,
            retries: DEFAULT_RETRIES,
            retry_delay: DEFAULT_RETRY_DELAY,
            retry_budget: DEFAULT_RETRY_BUDGET,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            fencing: true,
            max_error_rate: None,
            send_key: true,
            fair: true,
            waiter_timeout: DEFAULT_WAITER_TIMEOUT,
            tls: TlsSettings::default(),
        }
    }

    /// Connect with TLS, checking that each node's certificate names `name` — for every host of
    /// the hosts string that gives no TLS name of its own (`"host:tls_name:port"` names one per
    /// host). Turns TLS on (cargo feature `tls`).
    pub fn tls_name(mut self, name: impl Into<String>) -> Self {
        self.tls.name = Some(name.into());
        self
    }

    /// Connect with TLS, trusting the CA certificate(s) in this PEM file instead of the built-in
    /// web roots. Turns TLS on (cargo feature `tls`).
    pub fn tls_ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.tls.ca = Some(path.as_ref().to_owned());
        self
    }

    /// Connect with TLS, presenting this client certificate and key (PEM) to nodes that ask for
    /// one. The key is read at connect time, never kept or shown. Turns TLS on (cargo feature
    /// `tls`).
    pub fn tls_client_cert(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.tls.client = Some((cert.as_ref().to_owned(), key.as_ref().to_owned()));
        self
    }

    /// Replaces the seed hosts with this list (each `host:port`, `host:tls_name:port` or
    /// `[v6]:port`; see [`new`](Self::new)). Checked, like every setting, before any I/O.
    ///
    /// ```
    /// use leasehold_aerospike::AerospikeConfig;
    /// let config = AerospikeConfig::new("10.0.0.5:3000", "locks", "farm1")
    ///     .seed_hosts(["10.0.0.5:3000", "10.0.0.6:3000", "10.0.0.7"]);
    /// assert_eq!(config.seeds(), ["10.0.0.5:3000", "10.0.0.6:3000", "10.0.0.7"]);
    /// ```
    pub fn seed_hosts<I, S>(mut self, hosts: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.hosts = hosts
            .into_iter()
            .map(|h| h.into().trim().to_owned())
            .collect();
        self
    }

    /// The seed hosts, as given.
    pub fn seeds(&self) -> &[String] {
        &self.hosts
    }

    /// The seed hosts as one string, for messages (`"h1:3000,h2:3000"`).
    pub(crate) fn hosts_shown(&self) -> String {
        self.hosts.join(",")
    }

    /// The hosts string the client gets, every host with its port: with TLS, every host carries
    /// a TLS name (`host:tls_name:port`), its own or [`tls_name`](Self::tls_name)'s.
    pub(crate) fn client_hosts(&self) -> Result<String> {
        let seeds = parse_seeds(&self.hosts)?;
        let mut out = Vec::with_capacity(seeds.len());
        for seed in seeds {
            let name = if self.tls.enabled() {
                let Some(name) = seed.tls_name.clone().or_else(|| self.tls.name.clone()) else {
                    return Err(Error::invalid_argument(format!(
                        "TLS needs the name each node's certificate is checked against, and host \
                         {:?} has none: write it as host:tls_name:port, or set tls_name (e.g. \
                         tls_name(\"aerospike.example\"))",
                        seed.address()
                    )));
                };
                Some(name)
            } else {
                seed.tls_name.clone()
            };
            out.push(match name {
                Some(name) => format!("{}:{name}:{}", seed.host, seed.port),
                None => seed.address(),
            });
        }
        Ok(out.join(","))
    }

    /// The set suffix (default `distributed_lock`): sets are `DC#<farmId>#<suffix>` and
    /// `XDC#<suffix>`.
    pub fn set_suffix(mut self, suffix: impl Into<String>) -> Self {
        self.set_suffix = suffix.into();
        self
    }

    /// User and password for a secured cluster (internal authentication).
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some(user.into());
        self.password = Some(password.into());
        self
    }

    /// Socket idle timeout of one attempt (default 1 s).
    pub fn socket_timeout(mut self, timeout: Duration) -> Self {
        self.socket_timeout = timeout;
        self
    }

    /// Total time of one request (default 2 s). A write without a reply by then is
    /// [`ErrorKind::InDoubt`](leasehold_core::ErrorKind::InDoubt).
    pub fn total_timeout(mut self, timeout: Duration) -> Self {
        self.total_timeout = timeout;
        self
    }

    /// Connection pool size per node (default 256).
    pub fn max_conns_per_node(mut self, max: usize) -> Self {
        self.max_conns_per_node = max;
        self
    }

    /// Commit level of every write (default commit-master: a lock write needs no replica round
    /// trip before the reply, as the seed argues; `CommitAll` — the message-queue backend's
    /// choice — waits for the replicas, so a lock survives a master failover right after it was
    /// taken, at one more intra-cluster round trip per write). Per operation:
    /// [`acquire_commit_level`](Self::acquire_commit_level) and the others below.
    pub fn commit_level(mut self, level: CommitLevel) -> Self {
        self.commit_levels = CommitLevels::all(level);
        self
    }

    /// Commit level of an acquisition's writes (the create, the fence increment, the fence write).
    /// `CommitAll` here keeps a new lock through a failover; the default is commit-master.
    pub fn acquire_commit_level(mut self, level: CommitLevel) -> Self {
        self.commit_levels.acquire = level;
        self
    }

    /// Commit level of a release (the filtered delete). Commit-master is usually enough: a
    /// release lost on failover only makes the lock expire with its TTL.
    pub fn release_commit_level(mut self, level: CommitLevel) -> Self {
        self.commit_levels.release = level;
        self
    }

    /// Commit level of an extension (the filtered touch).
    pub fn extend_commit_level(mut self, level: CommitLevel) -> Self {
        self.commit_levels.extend = level;
        self
    }

    /// Which node serves `inspect` (default `Sequence`: the master, then a replica if the
    /// master cannot be reached; `MasterProles` — the message-queue backend's choice — spreads
    /// reads over master and replicas, which may be a moment behind). Writes always go to the
    /// master, and the read that resolves a lost acquire reply too.
    pub fn read_replica(mut self, replica: Replica) -> Self {
        self.read_replica = replica;
        self
    }

    /// Attempts and pause for errors where nothing was applied (default 5 × 80 ms, the seed's).
    /// A write whose outcome is in doubt is never retried here: it is reported as `InDoubt`.
    pub fn retries(mut self, attempts: u32, delay: Duration) -> Self {
        self.retries = attempts.max(1);
        self.retry_delay = delay;
        self
    }

    /// How long a release or an extension keeps retrying a transient failure — a node lost, a
    /// partition unavailable while the cluster re-forms, a reply lost — with backoff from the
    /// retry delay up to 1 s, before it gives up (default [`DEFAULT_RETRY_BUDGET`]). An
    /// extension never retries past its lease's end. A release whose reply was lost reads the
    /// record back instead of guessing. Acquisitions keep to [`retries`](Self::retries): they
    /// fail fast with a temporary error, and a blocking acquire waits and asks again.
    pub fn retry_budget(mut self, budget: Duration) -> Self {
        self.retry_budget = budget;
        self
    }

    /// How long [`connect`](crate::AerospikeStore::connect) waits for a usable cluster (default
    /// [`DEFAULT_CONNECT_TIMEOUT`]): it tries every seed, again with backoff while none answers
    /// or the partition table has not formed, until the client's partition map has the
    /// namespace.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Fencing tokens (default on): a counter record per key, incremented while the new holder's
    /// record exists, so tokens grow in the order of the holds (2 round trips per acquire). The
    /// counter expires with the hold's TTL and starts again from the server's clock, so keys
    /// nobody holds leave nothing behind (the namespace must let records expire). `false` is the
    /// Java manager's plain cycle: one create-only write to acquire, one delete to release, no
    /// token.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// The client's circuit breaker: errors per node per tend interval before it stops sending
    /// (the client's default when unset; `0` disables it, which fault tests need).
    pub fn max_error_rate(mut self, rate: usize) -> Self {
        self.max_error_rate = Some(rate);
        self
    }

    /// Whether lock records store their user key (default on, as leasehold always did). The Java
    /// manager sends only the digest; with `false` leasehold does the same, and `list` cannot
    /// name (so leaves out) the records it writes.
    pub fn send_key(mut self, on: bool) -> Self {
        self.send_key = on;
        self
    }

    /// Fair waiting across processes (default on): a waiter line per key in its own record
    /// (`<lock set>#queue`), one place per process (per store), served in arrival order; only the
    /// head of the line tries the lock record's create-only write, a try-lock never passes a
    /// queued process, and waiters ask again when the line says their turn is near (see
    /// docs/AEROSPIKE.md). Off: first come, first served (the Java manager's behaviour).
    /// Readers and permits stay first-come either way.
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }

    /// How long a waiting process keeps its place in line without asking again (default
    /// [`DEFAULT_WAITER_TIMEOUT`], at least 100 ms). A waiter asks again well within it; a
    /// crashed waiter holds the line up at most this long.
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.waiter_timeout = timeout;
        self
    }

    /// Checks names and values before any I/O, and returns the record layout.
    pub(crate) fn validate(&self) -> Result<Layout> {
        parse_seeds(&self.hosts)?;
        if self.namespace.is_empty()
            || self.namespace.len() > 31
            || self
                .namespace
                .chars()
                .any(|c| c.is_whitespace() || c == ':' || c == ';')
        {
            return Err(Error::invalid_argument(format!(
                "namespace {:?} must be 1-31 characters without whitespace, `:` or `;` (e.g. \"test\")",
                self.namespace
            )));
        }
        if self.tls.enabled() {
            if !cfg!(feature = "tls") {
                return Err(Error::invalid_argument(
                    "Aerospike TLS needs the `tls` cargo feature of leasehold-aerospike (the \
                     leasehold CLI has it)",
                ));
            }
            let files = self
                .tls
                .ca
                .iter()
                .chain(self.tls.client.iter().flat_map(|(c, k)| [c, k]));
            for file in files {
                if !file.is_file() {
                    return Err(Error::invalid_argument(format!(
                        "TLS file {} does not exist or is not a file",
                        file.display()
                    )));
                }
            }
            self.client_hosts()?;
        }
        if self.total_timeout.is_zero()
            || self.socket_timeout.is_zero()
            || self.connect_timeout.is_zero()
        {
            return Err(Error::invalid_argument(
                "Aerospike timeouts must be greater than zero",
            ));
        }
        if self.max_conns_per_node == 0 {
            return Err(Error::invalid_argument(
                "max_conns_per_node must be at least 1: with no connection a node can be sent \
                 nothing (the default is 256)",
            ));
        }
        if self.waiter_timeout < Duration::from_millis(100) {
            return Err(Error::invalid_argument(format!(
                "waiter timeout {:?} is too short: a waiting process must be able to ask again \
                 within it (at least 100 ms; the default is 5 s)",
                self.waiter_timeout
            )));
        }
        for (name, value) in [
            ("total timeout", self.total_timeout),
            ("socket timeout", self.socket_timeout),
            ("connect timeout", self.connect_timeout),
            ("retry delay", self.retry_delay),
            ("waiter timeout", self.waiter_timeout),
        ] {
            validate_at_most(name, value, MAX_TIMEOUT)?;
        }
        // A write is never retried past its lease's expiry, so the longest TTL is the most a
        // budget can use.
        validate_at_most("retry budget", self.retry_budget, MAX_TTL)?;
        Layout::new(&self.farm_id, &self.set_suffix)
    }
}

impl fmt::Debug for AerospikeConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AerospikeConfig")
            .field("hosts", &self.hosts)
            .field("namespace", &self.namespace)
            .field("set_suffix", &self.set_suffix)
            .field("farm_id", &self.farm_id)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .field("socket_timeout", &self.socket_timeout)
            .field("total_timeout", &self.total_timeout)
            .field("max_conns_per_node", &self.max_conns_per_node)
            .field("commit_levels", &self.commit_levels)
            .field("read_replica", &self.read_replica)
            .field("retries", &self.retries)
            .field("retry_delay", &self.retry_delay)
            .field("retry_budget", &self.retry_budget)
            .field("connect_timeout", &self.connect_timeout)
            .field("fencing", &self.fencing)
            .field("max_error_rate", &self.max_error_rate)
            .field("send_key", &self.send_key)
            .field("fair", &self.fair)
            .field("waiter_timeout", &self.waiter_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_timeouts_and_budgets_are_rejected_before_io() {
        let base = || AerospikeConfig::new("127.0.0.1:3000", "test", "f");
        for config in [
            base().socket_timeout(Duration::MAX),
            base().total_timeout(Duration::from_secs(601)),
            base().connect_timeout(Duration::MAX),
            base().waiter_timeout(Duration::MAX),
        ] {
            let err = config.validate().unwrap_err();
            assert!(err.to_string().contains("10 minutes"), "{err}");
        }
        let err = base().retry_budget(Duration::MAX).validate().unwrap_err();
        assert!(err.to_string().contains("30 days"), "{err}");
        assert!(base().retry_budget(MAX_TTL).validate().is_ok());
        let err = base().max_conns_per_node(0).validate().unwrap_err();
        assert_eq!(err.kind(), leasehold_core::ErrorKind::InvalidArgument);
        assert!(err.to_string().contains("max_conns_per_node"), "{err}");
    }

    #[test]
    fn tls_names_go_to_every_host_without_one() {
        let config = AerospikeConfig::new("a:3000, b:own.example:4333,[::1]:4333,c", "ns", "f")
            .tls_name("cluster.example");
        assert_eq!(
            config.client_hosts().unwrap(),
            "a:cluster.example:3000,b:own.example:4333,[::1]:cluster.example:4333,c:cluster.example:3000"
        );
        let plain = AerospikeConfig::new("a:3000,b:3000", "ns", "f");
        assert_eq!(plain.client_hosts().unwrap(), "a:3000,b:3000");
        let unnamed = AerospikeConfig::new("a:3000", "ns", "f").tls_ca_file("/etc/hostname");
        let err = unnamed.client_hosts().unwrap_err();
        assert!(err.to_string().contains("host:tls_name:port"), "{err}");
    }

    #[test]
    fn tls_settings_are_checked_before_io_and_debug_shows_no_secret() {
        let config = AerospikeConfig::new("a:3000", "ns", "f")
            .tls_name("n")
            .tls_client_cert("/nonexistent/c.pem", "/nonexistent/c.key")
            .credentials("app", "hunter2");
        let err = config.validate().unwrap_err();
        if cfg!(feature = "tls") {
            assert!(err.to_string().contains("/nonexistent/c.pem"), "{err}");
        } else {
            assert!(err.to_string().contains("`tls` cargo feature"), "{err}");
        }
        let debug = format!("{config:?}");
        assert!(
            !debug.contains("hunter2") && debug.contains("c.key"),
            "{debug}"
        );
    }

    #[test]
    fn several_seed_hosts_are_parsed_with_their_ports() {
        let config = AerospikeConfig::new("10.0.0.5:3100, node6 ,[::1]:3200,[fe80::2]", "ns", "f");
        assert_eq!(
            config.client_hosts().unwrap(),
            "10.0.0.5:3100,node6:3000,[::1]:3200,[fe80::2]:3000"
        );
        let listed =
            AerospikeConfig::new("x:1", "ns", "f").seed_hosts(["a:3000", "b:3001", "a:3000"]);
        assert_eq!(listed.seeds(), ["a:3000", "b:3001", "a:3000"]);
        assert_eq!(
            listed.client_hosts().unwrap(),
            "a:3000,b:3001",
            "a repeat is given once"
        );
        assert!(listed.validate().is_ok());
    }

    #[test]
    fn bad_host_lists_are_invalid_arguments_naming_the_host() {
        for (hosts, expect) in [
            ("", "must not be empty"),
            (" , ", "must not be empty"),
            ("a:3000,,b:3000", "host 2 of the list is empty"),
            (
                "a:3000,b:99999",
                "\"b:99999\" has an invalid port \"99999\"",
            ),
            ("a:3000,b:0", "invalid port \"0\""),
            ("a:x", "invalid port \"x\""),
            ("fe80::1:3000", "IPv6 address goes in brackets"),
            ("[::1", "does not close"),
            ("[::1]x", "not `:port`"),
            (":3000", "has no host name"),
            ("a b:3000", "not a host name"),
        ] {
            let err = AerospikeConfig::new(hosts, "ns", "f")
                .validate()
                .unwrap_err();
            assert_eq!(
                err.kind(),
                leasehold_core::ErrorKind::InvalidArgument,
                "{hosts}"
            );
            assert!(err.to_string().contains(expect), "{hosts:?}: {err}");
        }
        let err = AerospikeConfig::new("a:1", "ns", "f")
            .seed_hosts(Vec::<String>::new())
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("must not be empty"), "{err}");
    }

    #[test]
    fn timeouts_and_budgets_must_be_positive() {
        let err = AerospikeConfig::new("a:1", "ns", "f")
            .connect_timeout(Duration::ZERO)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("greater than zero"), "{err}");
        assert!(
            AerospikeConfig::new("a:1", "ns", "f")
                .retry_budget(Duration::ZERO)
                .validate()
                .is_ok(),
            "a zero budget means: no retry after the first attempt"
        );
    }
}
