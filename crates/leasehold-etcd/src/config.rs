//! Configuration: endpoints, credentials, key prefix, timeouts and fairness, validated before any
//! I/O; and the `etcd://` store URL.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use leasehold_core::{redact_url, validate_at_most, Error, Result, MAX_TIMEOUT};

/// Default key prefix: lock records are `leasehold:<lock key>` (the Redis store's default too).
pub const DEFAULT_PREFIX: &str = "leasehold:";
/// Default time to wait for a reply before a write is in doubt. etcd commits every write through
/// Raft and an fsync, so this is longer than the Redis store's.
pub const DEFAULT_RESPONSE_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time to wait for a connection.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
/// Default time [`EtcdStore::connect`](crate::EtcdStore::connect) waits for a cluster that is
/// reached but does not serve yet (its members elect a leader, or wait for a quorum). etcd's
/// own election timeout is 1 s by default, and an election takes one to two of them, more on a
/// loaded machine or with split votes.
pub const DEFAULT_LEADER_WAIT: Duration = Duration::from_secs(10);
/// The longest leader wait accepted: a longer one is a mistake (a unit), not a wait.
const MAX_LEADER_WAIT: Duration = Duration::from_secs(600);
/// Default TTL of the lease a store keeps its waiter keys on (kept alive in the background while
/// the process runs): a crashed waiter holds the line up at most this long.
pub const DEFAULT_WAITER_TIMEOUT: Duration = Duration::from_secs(5);

/// How an [`EtcdStore`](crate::EtcdStore) connects and lays out its keys.
///
/// Built with [`EtcdConfig::new`] from endpoints, or parsed from a store URL with
/// [`EtcdConfig::from_url`]. `Debug` and every message leave the password out.
///
/// ```
/// use leasehold_etcd::EtcdConfig;
/// let config = EtcdConfig::from_url("etcd://alice:s3cret@127.0.0.1:2379,127.0.0.1:22379?prefix=app:")?;
/// assert_eq!(config.endpoints(), ["http://127.0.0.1:2379", "http://127.0.0.1:22379"]);
/// assert!(!format!("{config:?}").contains("s3cret"));
/// # Ok::<(), leasehold_core::Error>(())
/// ```
#[derive(Clone)]
#[non_exhaustive]
pub struct EtcdConfig {
    pub(crate) endpoints: Vec<String>,
    pub(crate) user: Option<(String, String)>,
    pub(crate) prefix: String,
    pub(crate) response_timeout: Duration,
    pub(crate) connect_timeout: Duration,
    pub(crate) leader_wait: Duration,
    pub(crate) fair: bool,
    pub(crate) waiter_timeout: Duration,
    pub(crate) tls: Option<TlsFiles>,
}

/// Certificate files for TLS to etcd (all PEM): paths only, read at connect time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsFiles {
    /// CA certificate(s) to trust instead of the built-in roots.
    pub(crate) ca: Option<PathBuf>,
    /// Client certificate and key (etcd's `--client-cert-auth`).
    pub(crate) client: Option<(PathBuf, PathBuf)>,
}

impl EtcdConfig {
    /// A configuration for these endpoints: `host:port` (plain HTTP/2), or `http://host:port` /
    /// `https://host:port`. Several endpoints of one cluster, in any order: requests go to the
    /// member that answered last, and on to the next when it fails.
    pub fn new<E: Into<String>>(endpoints: impl IntoIterator<Item = E>) -> Self {
        EtcdConfig {
            endpoints: endpoints
                .into_iter()
                .map(|e| {
                    let e = e.into();
                    if e.contains("://") {
                        e
                    } else {
                        format!("http://{e}")
                    }
                })
                .collect(),
            user: None,
            prefix: DEFAULT_PREFIX.to_owned(),
            response_timeout: DEFAULT_RESPONSE_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            leader_wait: DEFAULT_LEADER_WAIT,
            fair: true,
            waiter_timeout: DEFAULT_WAITER_TIMEOUT,
            tls: None,
        }
    }

    /// Parses a store URL:
    /// `etcd://[user:password@]host:port[,host:port…][/][?prefix=…]` (plain) or
    /// `etcds://…[?tls_ca=ca.pem&tls_cert=client.pem&tls_key=client.key]` (TLS, cargo feature
    /// `tls`). User and password are percent-decoded.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |problem: &str| {
            Error::invalid_argument(format!(
                "{:?} is not an etcd URL: {problem} (e.g. etcd://127.0.0.1:2379 or \
                 etcd://user:password@10.0.0.1:2379,10.0.0.2:2379?prefix=myapp:)",
                redact_url(url)
            ))
        };
        let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("no scheme"))?;
        let tls = match scheme {
            "etcd" => false,
            "etcds" => true,
            _ => return Err(bad("the scheme must be etcd:// or etcds://")),
        };
        let (authority, query) = match rest.split_once('?') {
            Some((a, q)) => (a, Some(q)),
            None => (rest, None),
        };
        let authority = authority.trim_end_matches('/');
        if authority.contains('/') {
            return Err(bad("an etcd URL has no path"));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((u, h)) => (Some(u), h),
            None => (None, authority),
        };
        let decode = |s: &str| {
            percent_encoding::percent_decode_str(s)
                .decode_utf8()
                .map(|s| s.into_owned())
                .map_err(|_| bad("the user or password is not UTF-8 once percent-decoded"))
        };
        let user = match userinfo {
            Some(info) => {
                let (name, password) = info
                    .split_once(':')
                    .ok_or_else(|| bad("credentials are user:password"))?;
                if name.is_empty() {
                    return Err(bad("the user name is empty"));
                }
                Some((decode(name)?, decode(password)?))
            }
            None => None,
        };
        let mut endpoints = Vec::new();
        for host in hosts.split(',') {
            let (name, port) = host
                .rsplit_once(':')
                .ok_or_else(|| bad("every host needs a port (host:2379)"))?;
            if name.is_empty() || !matches!(port.parse::<u16>(), Ok(1..)) {
                return Err(bad("every host is host:port with a port 1-65535"));
            }
            let scheme = if tls { "https" } else { "http" };
            endpoints.push(format!("{scheme}://{name}:{port}"));
        }
        let mut config = EtcdConfig::new(endpoints);
        config.user = user;
        if tls {
            config.tls = Some(TlsFiles::default());
        }
        let (mut cert, mut key) = (None, None);
        for pair in query
            .unwrap_or_default()
            .split('&')
            .filter(|p| !p.is_empty())
        {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let v = decode(v)?;
            match k {
                "prefix" => config.prefix = v,
                "tls_ca" | "tls_cert" | "tls_key" if !tls => {
                    return Err(bad("tls_ca, tls_cert and tls_key need TLS: use etcds://"))
                }
                "tls_ca" => config = config.tls_ca_file(v),
                "tls_cert" => cert = Some(v),
                "tls_key" => key = Some(v),
                other => {
                    return Err(bad(&format!(
                        "unknown parameter {other:?} (known: prefix, tls_ca, tls_cert, tls_key)"
                    )))
                }
            }
        }
        match (cert, key) {
            (Some(cert), Some(key)) => config = config.tls_client_cert(cert, key),
            (None, None) => {}
            _ => return Err(bad("tls_cert and tls_key go together")),
        }
        Ok(config)
    }

    /// Authenticates as `user` (etcd's `--auth` must be enabled with `etcdctl auth enable`). The
    /// same name as the other stores' setting.
    pub fn credentials(mut self, user: impl Into<String>, password: impl Into<String>) -> Self {
        self.user = Some((user.into(), password.into()));
        self
    }

    /// Speaks TLS to every endpoint (they become `https://`), trusting the CA certificate(s) in
    /// this PEM file. Needs the cargo feature `tls`.
    pub fn tls_ca_file(mut self, path: impl AsRef<Path>) -> Self {
        self.tls_files().ca = Some(path.as_ref().to_owned());
        self
    }

    /// Speaks TLS and presents this client certificate with its private key (both PEM), for
    /// etcd's `--client-cert-auth`. Needs the cargo feature `tls`.
    pub fn tls_client_cert(mut self, cert: impl AsRef<Path>, key: impl AsRef<Path>) -> Self {
        self.tls_files().client = Some((cert.as_ref().to_owned(), key.as_ref().to_owned()));
        self
    }

    /// The TLS settings, once every endpoint is `https://`: the client speaks TLS only to an
    /// `https` endpoint, and would otherwise speak plain HTTP/2 with the files set and unused.
    fn tls_files(&mut self) -> &mut TlsFiles {
        for endpoint in &mut self.endpoints {
            if let Some(host) = endpoint.strip_prefix("http://") {
                *endpoint = format!("https://{host}");
            }
        }
        self.tls.get_or_insert_with(TlsFiles::default)
    }

    /// The prefix of every key leasehold writes (default `leasehold:`). Use one per application
    /// or environment sharing a cluster. 1–64 printable characters without whitespace.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// How long to wait for a reply (default 2 s). A write without a reply by then is
    /// [`ErrorKind::InDoubt`](leasehold_core::ErrorKind::InDoubt). Requests in flight look at
    /// their deadlines eight times per timeout, not from a timer each, so one may end up to an
    /// eighth of it later.
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// How long to wait for a connection (default 2 s).
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// How long [`EtcdStore::connect`](crate::EtcdStore::connect) waits for a cluster that is
    /// reached but does not serve yet — its members elect a leader, or a quorum is not back —
    /// before it fails (default [`DEFAULT_LEADER_WAIT`], at most 10 minutes; never less than one
    /// attempt). A store connected while its cluster re-forms is handed out once the cluster
    /// serves. When no member can be reached at all (nothing listens, or no connection within
    /// the connect timeout), `connect` fails as soon as each has failed. Wrap `connect` in a
    /// timeout of your own to give up sooner.
    pub fn leader_wait(mut self, wait: Duration) -> Self {
        self.leader_wait = wait;
        self
    }

    /// Fair waiting across processes (default on): a waiting process puts a waiter key in the
    /// lock's line (create revision order, as etcd's own mutex does), only the first in line may
    /// take a released lock, and a try-lock never passes a waiter. Off: first come, first served,
    /// still woken by watch.
    pub fn fair(mut self, on: bool) -> Self {
        self.fair = on;
        self
    }

    /// How long a crashed waiter holds up the line: the TTL of the lease this store's waiter keys
    /// live on (default [`DEFAULT_WAITER_TIMEOUT`], whole seconds, at least 2 s), so a waiter
    /// leaves the line this long after its last keep-alive. The same name as the other stores'
    /// setting.
    pub fn waiter_timeout(mut self, timeout: Duration) -> Self {
        self.waiter_timeout = timeout;
        self
    }

    /// The endpoints, as handed to the client (`http://…` or `https://…`).
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// The key prefix.
    pub fn key_prefix(&self) -> &str {
        &self.prefix
    }

    /// The endpoints joined by commas, for messages (never credentials).
    pub(crate) fn address(&self) -> String {
        self.endpoints
            .iter()
            .map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Checks everything that can be checked without I/O.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.endpoints.is_empty() {
            return Err(Error::invalid_argument(
                "no etcd endpoint given (e.g. 127.0.0.1:2379)",
            ));
        }
        for endpoint in &self.endpoints {
            let host = endpoint
                .strip_prefix("http://")
                .or_else(|| endpoint.strip_prefix("https://"));
            if host.is_none_or(|h| h.is_empty() || h.contains('/') && !h.ends_with('/')) {
                return Err(Error::invalid_argument(format!(
                    "etcd endpoint {endpoint:?} must be host:port, http://host:port or \
                     https://host:port"
                )));
            }
        }
        if self.tls.is_some() && !cfg!(feature = "tls") {
            return Err(Error::invalid_argument(
                "TLS to etcd (etcds://, tls_ca_file, tls_client_cert) needs the `tls` cargo \
                 feature of leasehold-etcd",
            ));
        }
        if let Some(tls) = &self.tls {
            let files = tls
                .ca
                .iter()
                .chain(tls.client.iter().flat_map(|(c, k)| [c, k]));
            for file in files {
                if !file.is_file() {
                    return Err(Error::invalid_argument(format!(
                        "TLS file {} does not exist or is not a file",
                        file.display()
                    )));
                }
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
                "key prefix {:?} must be 1-64 printable characters without whitespace (e.g. \
                 \"leasehold:\")",
                self.prefix
            )));
        }
        if self.waiter_timeout < Duration::from_secs(2) {
            return Err(Error::invalid_argument(format!(
                "waiter timeout {:?} is too short: waiter keys live on an etcd lease, whole \
                 seconds, about 2 s at least (default 5s)",
                self.waiter_timeout
            )));
        }
        if self.leader_wait > MAX_LEADER_WAIT {
            return Err(Error::invalid_argument(format!(
                "leader wait {:?} is longer than {MAX_LEADER_WAIT:?}: it is how long connecting \
                 waits for an etcd election (default {DEFAULT_LEADER_WAIT:?})",
                self.leader_wait
            )));
        }
        if self.response_timeout.is_zero() || self.connect_timeout.is_zero() {
            return Err(Error::invalid_argument(
                "etcd timeouts must be greater than zero (default 2s)",
            ));
        }
        for (name, value) in [
            ("response timeout", self.response_timeout),
            ("connect timeout", self.connect_timeout),
            ("waiter timeout", self.waiter_timeout),
        ] {
            validate_at_most(name, value, MAX_TIMEOUT)?;
        }
        Ok(())
    }
}

impl fmt::Debug for EtcdConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdConfig")
            .field("endpoints", &self.endpoints)
            .field("user", &self.user.as_ref().map(|(u, _)| u))
            .field("prefix", &self.prefix)
            .field("response_timeout", &self.response_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("leader_wait", &self.leader_wait)
            .field("fair", &self.fair)
            .field("waiter_timeout", &self.waiter_timeout)
            .field("tls", &self.tls)
            .finish()
    }
}

/// Whole seconds for an etcd lease TTL, rounded up: etcd must never expire a lock before the
/// client's lease says it does. `None` when it does not fit etcd's `int64` seconds.
pub(crate) fn lease_seconds(ttl: Duration) -> Option<i64> {
    i64::try_from(leasehold_core::ttl_seconds(ttl)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absurd_timeouts_and_port_zero_are_rejected_before_io() {
        let base = || EtcdConfig::new(["127.0.0.1:2379"]);
        for config in [
            base().response_timeout(Duration::MAX),
            base().connect_timeout(Duration::from_secs(601)),
            base().waiter_timeout(Duration::MAX),
        ] {
            let err = config.validate().unwrap_err();
            assert!(err.to_string().contains("10 minutes"), "{err}");
        }
        assert!(base().response_timeout(MAX_TIMEOUT).validate().is_ok());
        let err = EtcdConfig::from_url("etcd://h:0").unwrap_err();
        assert!(err.to_string().contains("1-65535"), "{err}");
    }

    #[test]
    fn urls_parse_with_hosts_credentials_and_prefix() {
        let c = EtcdConfig::from_url("etcd://127.0.0.1:2379").unwrap();
        assert_eq!(c.endpoints(), ["http://127.0.0.1:2379"]);
        let tls = EtcdConfig::new(["h1:1", "http://h2:2", "https://h3:3"]).tls_ca_file("ca.pem");
        assert_eq!(
            tls.endpoints(),
            ["https://h1:1", "https://h2:2", "https://h3:3"],
            "TLS set in the builder speaks TLS to every endpoint"
        );
        let tls = EtcdConfig::new(["h1:1"]).tls_client_cert("c.pem", "k.pem");
        assert_eq!(tls.endpoints(), ["https://h1:1"]);
        assert_eq!(c.key_prefix(), DEFAULT_PREFIX);
        assert!(c.user.is_none());
        let c = EtcdConfig::from_url("etcd://al%40ce:p%3Ass@h1:1,h2:2/?prefix=x:").unwrap();
        assert_eq!(c.endpoints(), ["http://h1:1", "http://h2:2"]);
        assert_eq!(c.user, Some(("al@ce".into(), "p:ss".into())));
        assert_eq!(c.key_prefix(), "x:");
        assert!(!format!("{c:?}").contains("p:ss"));
        c.validate().unwrap();
    }

    #[test]
    fn bad_urls_are_rejected_saying_why() {
        for (url, says) in [
            ("http://h:1", "etcd:// or etcds://"),
            ("etcd://h", "port"),
            ("etcd://h:x", "port"),
            ("etcd://h:1/path", "no path"),
            ("etcd://h:1?tls_ca=/x", "etcds://"),
            ("etcd://h:1?bogus=1", "unknown parameter"),
            ("etcd://:pw@h:1", "user name"),
        ] {
            let err = EtcdConfig::from_url(url).unwrap_err();
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
        let err = EtcdConfig::from_url("etcd://u:secret@h").unwrap_err();
        assert!(!err.to_string().contains("secret"), "{err}");
    }

    #[test]
    fn bad_settings_are_rejected_before_io() {
        let ok = EtcdConfig::new(["127.0.0.1:2379"]);
        ok.validate().unwrap();
        assert!(ok.clone().prefix("").validate().is_err());
        assert!(ok.clone().prefix("a b").validate().is_err());
        assert!(ok
            .clone()
            .waiter_timeout(Duration::from_millis(500))
            .validate()
            .is_err());
        assert!(ok
            .clone()
            .response_timeout(Duration::ZERO)
            .validate()
            .is_err());
        let err = ok
            .clone()
            .leader_wait(Duration::from_secs(3600))
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("leader wait"), "{err}");
        // No wait beyond one attempt is a choice, not a mistake.
        assert!(ok.clone().leader_wait(Duration::ZERO).validate().is_ok());
        assert!(EtcdConfig::new(Vec::<String>::new()).validate().is_err());
        if !cfg!(feature = "tls") {
            let err = EtcdConfig::from_url("etcds://h:1")
                .unwrap()
                .validate()
                .unwrap_err();
            assert!(err.to_string().contains("`tls` cargo feature"), "{err}");
        }
    }

    #[test]
    fn lease_seconds_round_up() {
        assert_eq!(lease_seconds(Duration::from_millis(1)), Some(1));
        assert_eq!(lease_seconds(Duration::from_millis(1000)), Some(1));
        assert_eq!(lease_seconds(Duration::from_millis(1001)), Some(2));
        assert_eq!(lease_seconds(Duration::from_secs(90)), Some(90));
        assert_eq!(lease_seconds(Duration::MAX), None);
    }
}
