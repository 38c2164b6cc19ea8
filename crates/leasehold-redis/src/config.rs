//! Configuration: the URL, key prefix, timeouts and fencing, validated before any I/O.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_core::{redact_url, validate_at_most, Error, Result, MAX_TIMEOUT};

use crate::topology::Topology;

/// Default key prefix: lock keys are `leasehold:<lock key>`.
pub const DEFAULT_PREFIX: &str = "leasehold:";
/// Default time to wait for a reply before the request is in doubt.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(1);
/// Default time to wait for a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Default time [`RedisStore::connect`](crate::RedisStore::connect) waits for a master the
/// sentinels name to answer as one: a failover under way when a service starts takes Sentinel's
/// `down-after-milliseconds` (30 s by default) and the promotion after it.
pub const DEFAULT_MASTER_WAIT: Duration = Duration::from_secs(60);
/// The longest master wait accepted: a longer one is a mistake (a unit), not a wait.
const MAX_MASTER_WAIT: Duration = Duration::from_secs(600);
/// Default time a waiting process keeps its place in a key's waiter queue without asking again
/// (Redisson's fair lock uses the same 5 s): a crashed waiter holds up the queue at most this long.
pub const DEFAULT_WAITER_TIMEOUT: Duration = Duration::from_secs(5);

/// How a [`RedisStore`](crate::RedisStore) connects and lays out its keys.
///
/// `Debug` and every message show the URL with its password replaced by `***`.
#[derive(Clone)]
pub struct RedisConfig {
    pub(crate) url: String,
    pub(crate) prefix: String,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) master_wait: Duration,
    pub(crate) fencing: bool,
    pub(crate) fair: bool,
    pub(crate) strict_fifo: bool,
    pub(crate) waiter_timeout: Duration,
    pub(crate) tls: TlsFiles,
    pub(crate) min_replicas: Option<MinReplicas>,
    pub(crate) direct_routing: bool,
}

/// How many replicas must acknowledge a grant or an extend, and how long to wait for them
/// ([`RedisConfig::min_replicas`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct MinReplicas {
    pub(crate) replicas: u32,
    pub(crate) timeout: Duration,
}

/// Certificate files for a `rediss://` connection (all PEM). Paths only: the contents (the
/// client's private key) are read at connect time and never kept, shown or logged.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// CA certificate(s) to trust instead of the built-in web roots.
    pub(crate) ca: Option<PathBuf>,
    /// Client certificate and key, for servers that ask for one (mutual TLS).
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

impl RedisConfig {
    /// A configuration for `url`:
    ///
    /// - one server: `redis://[user:password@]host[:port][/db]`, `rediss://…` (TLS, cargo
    ///   feature `tls`), or `redis+unix:///path/to/socket[?db=N]`;
    /// - a Redis Cluster: `redis+cluster://[user:password@]host:port[,host:port…]` (or
    ///   `rediss+cluster://`), any reachable nodes as seeds (see [`cluster`](Self::cluster));
    /// - a master watched by Sentinel:
    ///   `redis+sentinel://[user:password@]host:port[,host:port…]/MASTER_NAME[/db]` with the
    ///   sentinels' addresses, and `?sentinel_user=…&sentinel_password=…` if the sentinels want
    ///   credentials of their own (see [`sentinel`](Self::sentinel)).
    pub fn new(url: impl Into<String>) -> Self {
        RedisConfig {
            url: url.into(),
            prefix: DEFAULT_PREFIX.to_owned(),
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            master_wait: DEFAULT_MASTER_WAIT,
            fencing: true,
            fair: true,
            strict_fifo: false,
            waiter_timeout: DEFAULT_WAITER_TIMEOUT,
            tls: TlsFiles::default(),
            min_replicas: None,
            direct_routing: true,
        }
    }

    /// A Redis Cluster reached through `seeds` (`host:port`, any nodes of the cluster; the
    /// client learns the rest and follows `MOVED`/`ASK` redirections and failovers). Every key of
    /// one lock shares a hash tag (`<prefix>{<lock key>}`, `<prefix>fence:{<lock key>}`, …), so
    /// each operation stays one script on one node; release announcements use sharded pub/sub
    /// (`SPUBLISH`/`SSUBSCRIBE`, Redis 7.0+). Credentials and TLS: use the URL form,
    /// `rediss+cluster://user:password@host:port,…`.
    ///
    /// ```
    /// use leasehold_redis::RedisConfig;
    /// let config = RedisConfig::cluster(["127.0.0.1:7001", "127.0.0.1:7002"]);
    /// assert_eq!(config.redacted_url(), "redis+cluster://127.0.0.1:7001,127.0.0.1:7002");
    /// ```
    pub fn cluster<S: AsRef<str>>(seeds: impl IntoIterator<Item = S>) -> Self {
        let seeds: Vec<String> = seeds.into_iter().map(|s| s.as_ref().to_owned()).collect();
        RedisConfig::new(format!("redis+cluster://{}", seeds.join(",")))
    }

    /// The master named `master` in the sentinels at `sentinels` (`host:port`). The store asks
    /// the sentinels for the master, and asks again whenever the master stops serving (a
    /// `READONLY` reply from a demoted master, a lost connection), so it follows a failover.
    /// Credentials and TLS: use the URL form,
    /// `rediss+sentinel://user:password@host:port,…/MASTER?sentinel_user=…&sentinel_password=…`.
    ///
    /// ```
    /// use leasehold_redis::RedisConfig;
    /// let config = RedisConfig::sentinel(["127.0.0.1:26379", "127.0.0.1:26380"], "mymaster");
    /// assert_eq!(
    ///     config.redacted_url(),
    ///     "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster"
    /// );
    /// ```
    pub fn sentinel<S: AsRef<str>>(sentinels: impl IntoIterator<Item = S>, master: &str) -> Self {
        let sentinels: Vec<String> = sentinels
            .into_iter()
            .map(|s| s.as_ref().to_owned())
            .collect();
        RedisConfig::new(format!("redis+sentinel://{}/{master}", sentinels.join(",")))
    }

    /// Replica acknowledgement (default off): a grant or an extend counts only once `replicas`
    /// replicas have it, confirmed by `WAIT replicas timeout` on the node that took the write.
    /// With fewer acknowledgements by then the grant is undone (an owner-checked release) and
    /// the caller gets a temporary [`ErrorKind::Connection`](leasehold_core::ErrorKind::Connection)
    /// error, never a lock reported held; an unconfirmed extend is reported the same way, so
    /// renewal tries again.
    ///
    /// What it buys: a lock acknowledged to its holder survives a failover that promotes one of
    /// those replicas (Redis Cluster and Sentinel promote the most up-to-date replica). What it
    /// cannot buy: consensus. Replication stays asynchronous, a partition can still leave an old
    /// master granting for a while, and a failover can promote a replica that missed the write;
    /// the fencing token is what protects the resource. `timeout` must be shorter than the
    /// response timeout. Costs one more round trip per grant and extend.
    ///
    /// ```
    /// use std::time::Duration;
    /// use leasehold_redis::RedisConfig;
    /// let config = RedisConfig::cluster(["127.0.0.1:7001"])
    ///     .min_replicas(1, Duration::from_millis(200));
    /// ```
    pub fn min_replicas(mut self, replicas: u32, timeout: Duration) -> Self {
        self.min_replicas = (replicas > 0).then_some(MinReplicas { replicas, timeout });
        self
    }

    /// On a Redis Cluster, send each lock operation straight to its slot's master (default on):
    /// the store keeps the cluster's slot map and one multiplexed connection per master, and a
    /// command goes from the calling task to that node's connection. Anything the direct route
    /// cannot vouch for — a redirection (`MOVED`, `ASK`), `TRYAGAIN`, `CLUSTERDOWN`, a node it
    /// cannot reach — goes through the redis crate's cluster client, which follows it, while the
    /// slot map is refreshed. Off: every command goes through the cluster client, which costs
    /// one more hop (a task and a channel) per request. Ignored outside a cluster.
    ///
    /// ```
    /// use leasehold_redis::RedisConfig;
    /// let config = RedisConfig::cluster(["127.0.0.1:7001"]).direct_routing(false);
    /// ```
    pub fn direct_routing(mut self, on: bool) -> Self {
        self.direct_routing = on;
        self
    }

    /// For `rediss://`: trust the CA certificate(s) in this PEM file instead of the built-in web
    /// roots (a private CA, or a self-signed server certificate). The server's certificate must
    /// still name the URL's host.
    pub fn tls_ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.tls.ca = Some(path.as_ref().to_owned());
        self
    }

    /// For `rediss://`: present this client certificate, with its private key (both PEM), to a
    /// server that asks for one (`tls-auth-clients`). The key is read at connect time and never
    /// shown.
    pub fn tls_client_cert(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.tls.client = Some((cert.as_ref().to_owned(), key.as_ref().to_owned()));
        self
    }

    /// The prefix of every key leasehold writes (default `leasehold:`). Use one per application
    /// or environment sharing a Redis. Must be 1–64 printable characters without whitespace.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long to wait for a reply (default 1 s). A write without a reply by then is
    /// [`ErrorKind::InDoubt`](leasehold_core::ErrorKind::InDoubt).
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long to wait for a connection (default 1 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long [`RedisStore::connect`](crate::RedisStore::connect) waits, on a Sentinel URL,
    /// while the sentinels name a master that does not answer as one — it is down or restarting
    /// and the sentinels have not failed it over yet, or they are promoting a replica (default
    /// [`DEFAULT_MASTER_WAIT`], at most 10 minutes; never less than twice the connect timeout).
    /// A store connected during a failover is handed out once the new master answers. When no
    /// sentinel names a master (none answers, or none monitors the name), `connect` fails after
    /// twice the connect timeout. Wrap `connect` in a timeout of your own to give up sooner. Not
    /// used by one server or a Redis Cluster.
    pub fn master_wait(mut self, wait: Duration) -> Self {
        self.master_wait = wait;
        self
    }

    /// Fencing tokens (default on): acquisition runs a script that also increments a per-key
    /// counter (one round trip either way). Off: the script only sets the hold (`SET NX PX`), and
    /// leases carry no token.
    pub fn fencing(mut self, on: bool) -> Self {
        self.fencing = on;
        self
    }

    /// Fair waiting across processes (default on): a key's waiting processes queue in the store in
    /// arrival order, only the first in line may take a released lock, a try-lock never passes a
    /// queued waiter, and a release notifies exactly the next process in line (pub/sub, one
    /// subscriber connection per store) instead of leaving everyone to poll. Off: the plain
    /// first-come script, polling only.
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }

    /// Strict FIFO across the fleet (default off; on implies [`fair`](Self::fair)): every blocking
    /// `lock()` call takes its own place in the key's queue (the store's id plus the wait's
    /// [`WaiterId`](leasehold_core::WaiterId)), so grants follow the order in which calls started
    /// waiting, whichever process they are in, instead of one turn per process in round-robin.
    /// A release wakes only the waiter named next; a waiter that gives up leaves the queue at
    /// once; readers and semaphore permits queue the same way. The store then reports
    /// [`Capabilities::waiter_line`](leasehold_core::Capabilities::waiter_line), so local
    /// competition lets every blocking waiter ask the store itself. Costs: every waiting call
    /// keeps its own place fresh (one request per poll interval each), and local hand-off never
    /// applies to blocking waiters. See docs/REDIS.md, "Strict FIFO".
    ///
    /// ```
    /// use leasehold_redis::RedisConfig;
    /// let config = RedisConfig::new("redis://127.0.0.1:6379").strict_fifo(true);
    /// assert!(config.is_strict_fifo() && config.is_fair());
    /// ```
    pub fn strict_fifo(mut self, on: bool) -> Self {
        self.strict_fifo = on;
        if on {
            self.fair = true;
        }
        self
    }

    /// Whether fair waiting is on (see [`fair`](Self::fair)).
    pub fn is_fair(&self) -> bool {
        self.fair
    }

    /// Whether strict FIFO is on (see [`strict_fifo`](Self::strict_fifo)).
    pub fn is_strict_fifo(&self) -> bool {
        self.strict_fifo
    }

    /// How long a waiting process keeps its place in line without asking again (default
    /// [`DEFAULT_WAITER_TIMEOUT`]). Waiters ask again at least every retry interval of the
    /// manager (1 s by default), which must stay below half of this (a place a process is served
    /// from again and again is renewed once per half of it); a crashed waiter holds the line up
    /// at most this long after a release.
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.waiter_timeout = timeout;
        self
    }

    /// The URL with its password hidden.
    pub fn redacted_url(&self) -> String {
        redact_url(&self.url)
    }

    /// Checks everything that can be checked without I/O (the URL and its hosts, TLS files,
    /// prefix, timeouts); [`RedisStore::connect`](crate::RedisStore::connect) does it first.
    ///
    /// ```
    /// use leasehold_redis::RedisConfig;
    /// assert!(RedisConfig::new("redis+cluster://h1:7001,h2:7002").validate().is_ok());
    /// let err = RedisConfig::new("redis+cluster://h1:7001,,h2").validate().unwrap_err();
    /// assert!(err.to_string().contains("a host is empty"));
    /// ```
    pub fn validate(&self) -> Result<()> {
        let scheme = self.url.split("://").next().unwrap_or_default();
        if !matches!(
            scheme,
            "redis"
                | "rediss"
                | "redis+unix"
                | "unix"
                | "redis+cluster"
                | "rediss+cluster"
                | "redis+sentinel"
                | "rediss+sentinel"
        ) || !self.url.contains("://")
        {
            return Err(Error::invalid_argument(format!(
                "{:?} is not a Redis URL: expected redis://host:port, rediss://host:port, \
                 redis+unix:///path, redis+cluster://host:port,host:port or \
                 redis+sentinel://host:port,host:port/MASTER (e.g. redis://127.0.0.1:6379)",
                self.redacted_url()
            )));
        }
        let topology = self.topology()?;
        let tls_scheme = scheme.starts_with("rediss");
        if tls_scheme && !cfg!(feature = "tls") {
            return Err(Error::invalid_argument(
                "rediss:// (TLS) needs the `tls` cargo feature of leasehold-redis",
            ));
        }
        if !tls_scheme && self.tls != TlsFiles::default() {
            return Err(Error::invalid_argument(format!(
                "TLS certificate files were given for {:?}, which does not use TLS: use a \
                 rediss:// URL (e.g. rediss://redis.example:6380)",
                self.redacted_url()
            )));
        }
        let files = self
            .tls
            .ca
            .iter()
            .chain(self.tls.client.iter().flat_map(|(cert, key)| [cert, key]));
        for file in files {
            if !file.is_file() {
                return Err(Error::invalid_argument(format!(
                    "TLS file {} does not exist or is not a file",
                    file.display()
                )));
            }
        }
        if self.prefix.is_empty()
            || self.prefix.len() > 64
            || self
                .prefix
                .chars()
                .any(|c| c.is_whitespace() || c.is_control())
        {
            return Err(Error::invalid_argument(format!(
                "key prefix {:?} must be 1-64 printable characters without whitespace (e.g. \"leasehold:\")",
                self.prefix
            )));
        }
        if self.strict_fifo && !self.fair {
            return Err(Error::invalid_argument(
                "strict FIFO keeps its order in the fair waiter queue, but fair waiting was turned \
                 off (fair(false) after strict_fifo(true)): drop fair(false), or strict_fifo(false)",
            ));
        }
        if self.waiter_timeout < Duration::from_millis(100) {
            return Err(Error::invalid_argument(format!(
                "waiter timeout {:?} is too short for waiters to keep their place (at least 100ms; \
                 default 5s)",
                self.waiter_timeout
            )));
        }
        if self.response_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::invalid_argument(
                "Redis timeouts must be greater than zero (default 1s)",
            ));
        }
        for (name, value) in [
            ("response timeout", self.response_timeout),
            ("connect timeout", self.connect_timeout),
            ("waiter timeout", self.waiter_timeout),
        ] {
            validate_at_most(name, value, MAX_TIMEOUT)?;
        }
        if self.master_wait > MAX_MASTER_WAIT {
            return Err(Error::invalid_argument(format!(
                "master wait {:?} is longer than {MAX_MASTER_WAIT:?}: it is how long connecting \
                 waits for a Sentinel failover (default {DEFAULT_MASTER_WAIT:?})",
                self.master_wait
            )));
        }
        if let Some(min) = self.min_replicas {
            if min.timeout.is_zero() || min.timeout >= self.response_timeout {
                return Err(Error::invalid_argument(format!(
                    "the replica acknowledgement timeout {:?} must be above zero and below the \
                     response timeout {:?} (WAIT would be cut off as a lost reply): shorten it \
                     or raise response_timeout",
                    min.timeout, self.response_timeout
                )));
            }
        }
        if topology.is_cluster() && self.prefix.contains(['{', '}']) {
            return Err(Error::invalid_argument(format!(
                "key prefix {:?} holds a brace, which would change the hash tag that keeps a \
                 lock's keys on one cluster slot: use a prefix without {{ or }}",
                self.prefix
            )));
        }
        Ok(())
    }

    /// The deployment the URL names (one server, a cluster, or Sentinel).
    pub(crate) fn topology(&self) -> Result<Topology> {
        Topology::parse(&self.url, &self.redacted_url())
    }
}

impl fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisConfig")
            .field("url", &self.redacted_url())
            .field("prefix", &self.prefix)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("master_wait", &self.master_wait)
            .field("fencing", &self.fencing)
            .field("fair", &self.fair)
            .field("strict_fifo", &self.strict_fifo)
            .field("waiter_timeout", &self.waiter_timeout)
            .field("min_replicas", &self.min_replicas)
            .field("direct_routing", &self.direct_routing)
            .field("tls_ca_file", &self.tls.ca)
            .field("tls_client_cert", &self.tls.client.as_ref().map(|(c, _)| c))
            .field("tls_client_key", &self.tls.client.as_ref().map(|(_, k)| k))
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_timeouts_are_rejected_before_io() {
        let base = || RedisConfig::new("redis://h:1");
        for config in [
            base().response_timeout(Duration::MAX),
            base().connect_timeout(Duration::from_secs(601)),
            base().waiter_timeout(Duration::MAX),
        ] {
            let err = config.validate().unwrap_err();
            assert!(err.to_string().contains("10 minutes"), "{err}");
        }
        assert!(base().response_timeout(MAX_TIMEOUT).validate().is_ok());
    }

    #[test]
    fn passwords_are_redacted() {
        assert_eq!(
            redact_url("redis://alice:s3cret@127.0.0.1:6379/0"),
            "redis://alice:***@127.0.0.1:6379/0"
        );
        assert_eq!(redact_url("redis://:s3cret@h:1"), "redis://:***@h:1");
        assert_eq!(
            redact_url("redis://127.0.0.1:6379"),
            "redis://127.0.0.1:6379"
        );
        let config = RedisConfig::new("redis://alice:s3cret@h:1");
        assert!(!format!("{config:?}").contains("s3cret"));
        assert_eq!(
            redact_url("redis+sentinel://a:pw@s1,s2/m?sentinel_password=x&sentinel_user=u"),
            "redis+sentinel://a:***@s1,s2/m?sentinel_password=***&sentinel_user=u"
        );
    }

    #[test]
    fn bad_input_is_rejected_before_io() {
        for url in ["", "http://h:1", "localhost:6379"] {
            assert!(RedisConfig::new(url).validate().is_err(), "{url}");
        }
        assert!(RedisConfig::new("redis://h:1")
            .prefix("")
            .validate()
            .is_err());
        assert!(RedisConfig::new("redis://h:1")
            .prefix("a b")
            .validate()
            .is_err());
        assert!(RedisConfig::new("redis://h:1")
            .response_timeout(Duration::ZERO)
            .validate()
            .is_err());
        let err = RedisConfig::new("redis://h:1")
            .strict_fifo(true)
            .fair(false)
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("drop fair(false)"), "{err}");
        assert!(RedisConfig::new("redis://h:1")
            .fair(false)
            .strict_fifo(true)
            .validate()
            .is_ok());
        assert!(RedisConfig::new("redis+unix:///tmp/r.sock")
            .validate()
            .is_ok());
        let err = RedisConfig::new("redis+sentinel://h:1/m")
            .master_wait(Duration::from_secs(3600))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("master wait 3600s"), "{err}");
        assert!(RedisConfig::new("redis+sentinel://h:1/m")
            .master_wait(Duration::ZERO)
            .validate()
            .is_ok());
        let err = RedisConfig::new("redis://h:1")
            .tls_ca_file("/etc/hostname")
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("use a rediss:// URL"), "{err}");
        if cfg!(feature = "tls") {
            let err = RedisConfig::new("rediss://h:1")
                .tls_client_cert("/nonexistent/c.pem", "/nonexistent/c.key")
                .validate()
                .unwrap_err();
            assert!(err.to_string().contains("/nonexistent/c.pem"), "{err}");
        }
    }
}
