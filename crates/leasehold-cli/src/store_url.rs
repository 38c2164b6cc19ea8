//! `--store` URLs: which store to use, parsed and checked before any I/O.

use std::fmt;
use std::path::PathBuf;

use leasehold::core::redact_url;
use url::Url;

/// Examples printed with every URL error, so a wrong value comes with a right one.
pub(crate) const EXAMPLES: &str = "memory://, redis://127.0.0.1:6379, \
     redis+cluster://127.0.0.1:7001,127.0.0.1:7002, \
     redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster, \
     rediss://user:password@redis.example:6380/0?tls_ca=/etc/ssl/ca.pem, \
     aerospike://127.0.0.1:3000/test?set_suffix=locks&farm=farm1, \
     etcd://user:password@10.0.0.1:2379,10.0.0.2:2379?prefix=myapp:";

/// A parsed `--store` URL.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum StoreUrl {
    /// The embedded store (this process only).
    Memory,
    /// A Redis server: the URL (without leasehold's `tls_*` parameters) is handed to the Redis
    /// store.
    Redis { url: Url, tls: TlsParams },
    /// A Redis Cluster (`redis+cluster://h1:p1,h2:p2`) or a master found through Sentinel
    /// (`redis+sentinel://s1:p1,s2:p2/MASTER`): checked by `RedisConfig::validate` and handed to
    /// the Redis store as it is.
    RedisGroup {
        /// The URL as given (with its password: never shown; see `Display`).
        raw: String,
        /// `host:port,host:port` (the seeds or the sentinels).
        hosts: String,
    },
    /// An Aerospike cluster, seeded by one host or several (`h1:3000,h2:3000`).
    Aerospike {
        /// The first seed host (without IPv6 brackets).
        host: String,
        /// The first seed host's port.
        port: u16,
        /// Every seed host, `host:port[,host:port…]` (IPv6 in brackets): the client's seed list.
        seeds: String,
        namespace: String,
        set_suffix: Option<String>,
        farm: Option<String>,
        user: Option<String>,
        password: Option<String>,
        /// The TLS name nodes' certificates must list (`tls_name=`); TLS is on when this or any
        /// TLS file is given.
        tls_name: Option<String>,
        tls: TlsParams,
    },
    /// An etcd cluster: the URL was checked by `EtcdConfig::from_url` and is parsed again at
    /// connect time.
    Etcd {
        /// The URL as given (with its password: never shown; see `Display`).
        raw: String,
        /// `host:port,host:port`.
        hosts: String,
    },
}

/// TLS files from the URL's query (`tls_ca`, `tls_cert`, `tls_key`): paths, never contents.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TlsParams {
    /// CA certificate(s) to trust (PEM).
    pub(crate) ca: Option<PathBuf>,
    /// Client certificate (PEM), with `key`.
    pub(crate) cert: Option<PathBuf>,
    /// Client private key (PEM), with `cert`.
    pub(crate) key: Option<PathBuf>,
}

impl TlsParams {
    /// Takes `tls_ca`, `tls_cert`, `tls_key` out of `url`'s query (the other pairs stay).
    fn take(url: &mut Url) -> Result<Self, String> {
        let mut tls = TlsParams::default();
        let mut rest = Vec::new();
        for (k, v) in url.query_pairs() {
            let path = || Some(PathBuf::from(v.as_ref()));
            match &*k {
                "tls_ca" => tls.ca = path(),
                "tls_cert" => tls.cert = path(),
                "tls_key" => tls.key = path(),
                _ => rest.push((k.into_owned(), v.into_owned())),
            }
        }
        if tls.cert.is_some() != tls.key.is_some() {
            return Err(
                "tls_cert and tls_key go together (the client certificate and its key)".into(),
            );
        }
        if rest.is_empty() {
            url.set_query(None);
        } else {
            url.query_pairs_mut().clear().extend_pairs(rest);
        }
        Ok(tls)
    }

    fn is_empty(&self) -> bool {
        *self == TlsParams::default()
    }
}

/// A `--store` value that cannot be used.
#[derive(Debug, thiserror::Error)]
#[error("invalid --store {shown}: {problem} (examples: {EXAMPLES})")]
pub(crate) struct StoreUrlError {
    shown: String,
    problem: String,
}

impl StoreUrl {
    /// Parses and checks a URL: scheme, host, port, and for Aerospike the namespace.
    pub(crate) fn parse(raw: &str) -> Result<Self, StoreUrlError> {
        let fail = |problem: &str| StoreUrlError {
            shown: format!("{:?}", redact_url(raw)),
            problem: problem.to_owned(),
        };
        if raw == "memory" || raw == "memory:" || raw == "memory://" {
            return Ok(StoreUrl::Memory);
        }
        if raw.starts_with("etcd://") || raw.starts_with("etcds://") {
            // Several hosts (`h1:2379,h2:2379`) are no URL to the url crate: the etcd store parses
            // its own.
            let config = leasehold_etcd::EtcdConfig::from_url(raw).map_err(|e| StoreUrlError {
                shown: format!("{:?}", redact_url(raw)),
                problem: e.chain().to_string(),
            })?;
            let hosts = config
                .endpoints()
                .iter()
                .map(|e| e.split_once("://").map_or(e.as_str(), |(_, h)| h))
                .collect::<Vec<_>>()
                .join(",");
            return Ok(StoreUrl::Etcd {
                raw: raw.to_owned(),
                hosts,
            });
        }
        let group = [
            "redis+cluster",
            "rediss+cluster",
            "redis+sentinel",
            "rediss+sentinel",
        ];
        if let Some((_, rest)) = raw
            .split_once("://")
            .filter(|(scheme, _)| group.contains(scheme))
        {
            // Several hosts are no URL to the url crate: the Redis store parses its own.
            let config = leasehold_redis::RedisConfig::new(raw);
            config.validate().map_err(|e| StoreUrlError {
                shown: format!("{:?}", config.redacted_url()),
                problem: e.chain().to_string(),
            })?;
            let authority = rest.split(['/', '?']).next().unwrap_or_default();
            let hosts = authority.rsplit('@').next().unwrap_or_default().to_owned();
            return Ok(StoreUrl::RedisGroup {
                raw: raw.to_owned(),
                hosts,
            });
        }
        if let Some((first, seeds)) = aerospike_seeds(raw).map_err(|p| fail(&p))? {
            // Several seed hosts are no URL to the url crate: the URL with the first one alone
            // is parsed as any, and the seed list is every host.
            let mut parsed = Self::parse(&first).map_err(|e| fail(&e.problem))?;
            if let StoreUrl::Aerospike { seeds: all, .. } = &mut parsed {
                *all = seeds;
            }
            return Ok(parsed);
        }
        let url = Url::parse(raw).map_err(|e| fail(&format!("not a URL ({e})")))?;
        match url.scheme() {
            "memory" => Ok(StoreUrl::Memory),
            "redis" | "rediss" => {
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(fail("a redis URL needs a host"));
                }
                let mut url = url;
                let tls = TlsParams::take(&mut url).map_err(|p| fail(&p))?;
                check_redis_query(&url, REDIS_TCP_PARAMS).map_err(|p| fail(&p))?;
                if url.scheme() == "redis" && !tls.is_empty() {
                    return Err(fail("tls_ca, tls_cert and tls_key need TLS: use rediss://"));
                }
                Ok(StoreUrl::Redis { url, tls })
            }
            "redis+unix" | "unix" => {
                if url.path().is_empty() || url.path() == "/" {
                    return Err(fail("a unix socket URL needs a socket path"));
                }
                check_redis_query(&url, REDIS_UNIX_PARAMS).map_err(|p| fail(&p))?;
                Ok(StoreUrl::Redis {
                    url,
                    tls: TlsParams::default(),
                })
            }
            "aerospike" => {
                let mut url = url;
                let tls = TlsParams::take(&mut url).map_err(|p| fail(&p))?;
                let bracketed = url
                    .host_str()
                    .filter(|h| !h.is_empty())
                    .ok_or_else(|| fail("an aerospike URL needs a host"))?;
                let seeds = format!("{bracketed}:{}", url.port().unwrap_or(3000));
                let host = bracketed
                    .trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_owned();
                let namespace = url.path().trim_matches('/').to_owned();
                if namespace.is_empty() {
                    return Err(fail(
                        "an aerospike URL needs the namespace as its path: aerospike://host:3000/<namespace>",
                    ));
                }
                if namespace.contains('/') {
                    return Err(fail("the namespace is one path segment"));
                }
                let mut set_suffix = None;
                let mut farm = None;
                let mut tls_name = None;
                for (k, v) in url.query_pairs() {
                    match &*k {
                        "set_suffix" => set_suffix = Some(v.into_owned()),
                        "farm" => farm = Some(v.into_owned()),
                        "tls_name" => tls_name = Some(v.into_owned()),
                        other => {
                            return Err(fail(&format!(
                                "unknown aerospike parameter {other:?} (known: set_suffix, farm, \
                                 tls_name, tls_ca, tls_cert, tls_key)"
                            )))
                        }
                    }
                }
                // A URL carries credentials percent-encoded (`p%40ss` for `p@ss`); the client
                // wants them as typed.
                let decode = |what: &str, raw: &str| {
                    percent_encoding::percent_decode_str(raw)
                        .decode_utf8()
                        .map(|s| s.into_owned())
                        .map_err(|_| fail(&format!("the {what} is not UTF-8 once percent-decoded")))
                };
                let user = match url.username() {
                    "" => None,
                    raw => Some(decode("user name", raw)?),
                };
                let password = url
                    .password()
                    .map(|raw| decode("password", raw))
                    .transpose()?;
                // Internal authentication takes both: one alone would connect without any.
                if user.is_some() != password.is_some() {
                    return Err(fail(
                        "give both a user and a password (aerospike://user:password@host:port/ns), \
                         or neither",
                    ));
                }
                Ok(StoreUrl::Aerospike {
                    host,
                    port: url.port().unwrap_or(3000),
                    seeds,
                    namespace,
                    set_suffix,
                    farm,
                    user,
                    password,
                    tls_name,
                    tls,
                })
            }
            other => Err(fail(&format!(
                "unknown scheme {other:?} (known: memory, redis, rediss, redis+unix, \
                 redis+cluster, rediss+cluster, redis+sentinel, rediss+sentinel, aerospike, etcd, \
                 etcds)"
            ))),
        }
    }

    /// The farm id the URL names (Aerospike's `farm=`), if any.
    pub(crate) fn farm(&self) -> Option<&str> {
        match self {
            StoreUrl::Aerospike { farm, .. } => farm.as_deref(),
            _ => None,
        }
    }

    /// The address to name in a "cannot reach" message, without credentials.
    pub(crate) fn address(&self) -> String {
        match self {
            StoreUrl::Memory => "memory (this process)".to_owned(),
            StoreUrl::Redis { url, .. } => match (url.host_str(), url.port_or_known_default()) {
                (Some(h), Some(p)) if !h.is_empty() => format!("{h}:{p}"),
                _ => url.path().to_owned(),
            },
            StoreUrl::Aerospike { seeds, .. } => seeds.clone(),
            StoreUrl::Etcd { hosts, .. } => hosts.clone(),
            StoreUrl::RedisGroup { hosts, .. } => hosts.clone(),
        }
    }
}

/// The query parameters a `redis://` or `rediss://` URL takes: the redis client's `protocol`
/// (`resp2`/`resp3`) and leasehold's TLS files (`rediss://` only).
const REDIS_TCP_PARAMS: &[&str] = &["protocol", "tls_ca", "tls_cert", "tls_key"];

/// The query parameters a `redis+unix://` or `unix://` URL takes (all read by the redis client).
const REDIS_UNIX_PARAMS: &[&str] = &["db", "user", "pass", "protocol"];

/// Refuses a query parameter the redis client would silently ignore (`?bogus=1`, a misspelt
/// `?protocl=resp3`), naming the ones that exist. The `tls_*` parameters were taken out before.
fn check_redis_query(url: &Url, known: &[&str]) -> Result<(), String> {
    for (k, _) in url.query_pairs() {
        if known.contains(&&*k) {
            continue;
        }
        let hint = match &*k {
            "db" => " (the database is the path: redis://host:6379/2)",
            "user" | "pass" | "password" | "username" => {
                " (credentials go before the host: redis://user:password@host:6379)"
            }
            _ => "",
        };
        return Err(format!(
            "unknown redis parameter {k:?}{hint} (known: {})",
            known.join(", ")
        ));
    }
    Ok(())
}

/// For an `aerospike://` URL with several seed hosts (`user:pw@h1:3000,h2:3000/ns?…`): the URL
/// with the first host alone, and every host as `host:port[,…]` (port 3000 when none is given).
/// `None` for any other URL. Each host is checked as a URL's host and port would be.
fn aerospike_seeds(raw: &str) -> Result<Option<(String, String)>, String> {
    let Some((scheme, rest)) = raw.split_once("://") else {
        return Ok(None);
    };
    if !scheme.eq_ignore_ascii_case("aerospike") {
        return Ok(None);
    }
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let (userinfo, hosts) = match authority.rfind('@') {
        Some(at) => authority.split_at(at + 1),
        None => ("", authority),
    };
    if !hosts.contains(',') {
        return Ok(None);
    }
    let mut seeds = Vec::new();
    for (n, host) in hosts.split(',').enumerate() {
        if host.is_empty() {
            return Err(format!(
                "seed host {} of {hosts:?} is empty (write host:port,host:port)",
                n + 1
            ));
        }
        let url = Url::parse(&format!("aerospike://{host}/"))
            .map_err(|e| format!("seed host {host:?} is not host:port ({e})"))?;
        let name = url
            .host_str()
            .filter(|h| !h.is_empty())
            .ok_or_else(|| format!("seed host {host:?} has no host name"))?;
        seeds.push(format!("{name}:{}", url.port().unwrap_or(3000)));
    }
    let first = hosts.split(',').next().unwrap_or_default();
    Ok(Some((
        format!("{scheme}://{userinfo}{first}{tail}"),
        seeds.join(","),
    )))
}

impl fmt::Display for StoreUrl {
    /// The URL without its password.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            StoreUrl::Memory => f.write_str("memory://"),
            StoreUrl::Redis { url, .. } => f.write_str(&redact_url(url.as_str())),
            StoreUrl::Aerospike {
                seeds,
                namespace,
                user,
                password,
                ..
            } => {
                let auth = match (user, password) {
                    (Some(u), Some(_)) => format!("{u}:***@"),
                    (Some(u), None) => format!("{u}@"),
                    _ => String::new(),
                };
                write!(f, "aerospike://{auth}{seeds}/{namespace}")
            }
            StoreUrl::Etcd { raw, .. } => f.write_str(&redact_url(raw)),
            StoreUrl::RedisGroup { raw, .. } => {
                f.write_str(&leasehold_redis::RedisConfig::new(raw).redacted_url())
            }
        }
    }
}

impl fmt::Debug for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "StoreUrl({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_cluster_and_sentinel_urls_take_several_hosts() {
        let cluster =
            StoreUrl::parse("redis+cluster://u:pw@127.0.0.1:7001,127.0.0.1:7002").unwrap();
        assert_eq!(cluster.address(), "127.0.0.1:7001,127.0.0.1:7002");
        assert_eq!(
            cluster.to_string(),
            "redis+cluster://u:***@127.0.0.1:7001,127.0.0.1:7002"
        );
        let sentinel = StoreUrl::parse("redis+sentinel://s1:26379,s2:26380/mymaster").unwrap();
        assert_eq!(sentinel.address(), "s1:26379,s2:26380");
        for (bad, says) in [
            ("redis+cluster://h1:1,,h2:2", "a host is empty"),
            ("redis+sentinel://s1:1", "name the master"),
            ("redis+cluster://u:secret@h1:x", "valid port"),
        ] {
            let err = StoreUrl::parse(bad).unwrap_err().to_string();
            assert!(err.contains(says), "{bad}: {err}");
            assert!(!err.contains("secret"), "{err}");
        }
    }

    #[test]
    fn parses_every_scheme() {
        assert_eq!(StoreUrl::parse("memory://").unwrap(), StoreUrl::Memory);
        assert!(matches!(
            StoreUrl::parse("redis://127.0.0.1:6379").unwrap(),
            StoreUrl::Redis { .. }
        ));
        assert!(matches!(
            StoreUrl::parse("rediss://u:p@h:6380/2").unwrap(),
            StoreUrl::Redis { .. }
        ));
        let a = StoreUrl::parse("aerospike://127.0.0.1:3100/locks?set_suffix=dlm&farm=f1").unwrap();
        assert_eq!(
            a,
            StoreUrl::Aerospike {
                host: "127.0.0.1".into(),
                port: 3100,
                seeds: "127.0.0.1:3100".into(),
                namespace: "locks".into(),
                set_suffix: Some("dlm".into()),
                farm: Some("f1".into()),
                user: None,
                password: None,
                tls_name: None,
                tls: TlsParams::default(),
            }
        );
        assert_eq!(a.farm(), Some("f1"));
        assert_eq!(a.address(), "127.0.0.1:3100");
    }

    #[test]
    fn bad_urls_say_what_is_wrong_with_examples() {
        for (raw, expect) in [
            ("zookeeper://h:1", "unknown scheme"),
            ("not a url", "not a URL"),
            ("aerospike://127.0.0.1:3000", "namespace"),
            (
                "aerospike://127.0.0.1:3000/ns?color=red",
                "unknown aerospike parameter",
            ),
            ("redis://:6379", "not a URL"),
        ] {
            let err = StoreUrl::parse(raw).unwrap_err().to_string();
            assert!(err.contains(expect), "{raw}: {err}");
            assert!(err.contains("examples: memory://"), "{err}");
        }
    }

    #[test]
    fn rediss_takes_its_tls_files_from_the_query() {
        let url = StoreUrl::parse(
            "rediss://u:p@h:6380/2?tls_ca=/etc/ca.pem&tls_cert=/c.pem&tls_key=/c.key&protocol=resp3",
        )
        .unwrap();
        let StoreUrl::Redis { url: redis, tls } = &url else {
            panic!("{url:?}")
        };
        assert_eq!(tls.ca.as_deref(), Some(std::path::Path::new("/etc/ca.pem")));
        assert_eq!(tls.cert.as_deref(), Some(std::path::Path::new("/c.pem")));
        assert_eq!(tls.key.as_deref(), Some(std::path::Path::new("/c.key")));
        assert_eq!(
            redis.as_str(),
            "rediss://u:p@h:6380/2?protocol=resp3",
            "the rest stays"
        );
        for (raw, expect) in [
            ("redis://h:1?tls_ca=/ca.pem", "use rediss://"),
            ("rediss://h:1?tls_cert=/c.pem", "go together"),
        ] {
            let err = StoreUrl::parse(raw).unwrap_err().to_string();
            assert!(err.contains(expect), "{raw}: {err}");
        }
    }

    #[test]
    fn redis_urls_refuse_unknown_parameters() {
        for (raw, expect) in [
            (
                "redis://127.0.0.1:6379/?bogus=1",
                "unknown redis parameter \"bogus\" (known: protocol, tls_ca, tls_cert, tls_key)",
            ),
            (
                "rediss://u:s3cret@h:6380/0?tls_ca=/ca.pem&protocl=resp3",
                "unknown redis parameter \"protocl\"",
            ),
            ("redis://h:6379?db=2", "the database is the path"),
            (
                "redis://h:6379?password=x",
                "credentials go before the host",
            ),
            (
                "redis+unix:///run/redis.sock?db=1&bogus=1",
                "unknown redis parameter \"bogus\" (known: db, user, pass, protocol)",
            ),
        ] {
            let err = StoreUrl::parse(raw).unwrap_err().to_string();
            assert!(err.contains(expect), "{raw}: {err}");
            assert!(err.contains("examples: memory://"), "{err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
        for ok in [
            "redis://127.0.0.1:6379/?protocol=resp3",
            "redis://127.0.0.1:6379/2",
            "rediss://h:6380/?protocol=3&tls_ca=/ca.pem",
            "redis+unix:///run/redis.sock?db=1&user=u&pass=p&protocol=resp3",
        ] {
            StoreUrl::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn aerospike_takes_a_tls_name_and_files() {
        let url = StoreUrl::parse(
            "aerospike://h:4333/ns?farm=f1&tls_name=as.example&tls_ca=/ca.pem&tls_cert=/c.pem&tls_key=/c.key",
        )
        .unwrap();
        let StoreUrl::Aerospike { tls_name, tls, .. } = &url else {
            panic!("{url:?}")
        };
        assert_eq!(tls_name.as_deref(), Some("as.example"));
        assert_eq!(tls.ca.as_deref(), Some(std::path::Path::new("/ca.pem")));
        assert!(tls.cert.is_some() && tls.key.is_some());
    }

    #[test]
    fn aerospike_takes_several_seed_hosts() {
        let url = StoreUrl::parse(
            "aerospike://app:s3cret@10.0.0.5:3100,node6,[::1]:3200/locks?farm=f1&tls_name=as.example",
        )
        .unwrap();
        let StoreUrl::Aerospike {
            host,
            port,
            seeds,
            namespace,
            user,
            password,
            tls_name,
            farm,
            ..
        } = &url
        else {
            panic!("{url:?}")
        };
        assert_eq!(seeds, "10.0.0.5:3100,node6:3000,[::1]:3200");
        assert_eq!((host.as_str(), *port), ("10.0.0.5", 3100), "the first seed");
        assert_eq!(namespace, "locks");
        assert_eq!(
            (user.as_deref(), password.as_deref()),
            (Some("app"), Some("s3cret"))
        );
        assert_eq!(tls_name.as_deref(), Some("as.example"));
        assert_eq!(farm.as_deref(), Some("f1"));
        assert_eq!(url.address(), "10.0.0.5:3100,node6:3000,[::1]:3200");
        assert_eq!(
            url.to_string(),
            "aerospike://app:***@10.0.0.5:3100,node6:3000,[::1]:3200/locks"
        );
        let one = StoreUrl::parse("aerospike://[::1]:3200/ns").unwrap();
        assert_eq!(one.address(), "[::1]:3200");

        for (raw, expect) in [
            ("aerospike://h1:3000,,h2:3000/ns", "seed host 2"),
            (
                "aerospike://h1:3000,h2:99999/ns",
                "\"h2:99999\" is not host:port",
            ),
            ("aerospike://h1:3000,h2:x/ns", "\"h2:x\" is not host:port"),
            ("aerospike://u:s3cret@h1:3000,h2:3000", "namespace"),
            (
                "aerospike://h1:3000,h2:3000/ns?color=red",
                "unknown aerospike parameter",
            ),
        ] {
            let err = StoreUrl::parse(raw).unwrap_err().to_string();
            assert!(err.contains(expect), "{raw}: {err}");
            assert!(err.contains("examples: memory://"), "{err}");
            assert!(!err.contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn aerospike_credentials_are_percent_decoded() {
        let url =
            StoreUrl::parse("aerospike://ops%2Fteam:p%40ss%3Aw0rd@127.0.0.1:3000/ns").unwrap();
        let StoreUrl::Aerospike { user, password, .. } = &url else {
            panic!("{url:?}")
        };
        assert_eq!(user.as_deref(), Some("ops/team"));
        assert_eq!(password.as_deref(), Some("p@ss:w0rd"));
        assert!(!url.to_string().contains("p@ss"), "{url}");
        let err = StoreUrl::parse("aerospike://u:%FF@h:3000/ns")
            .unwrap_err()
            .to_string();
        assert!(err.contains("password is not UTF-8"), "{err}");
        assert!(!err.contains("%FF"), "{err}");
        for one_sided in ["aerospike://app@h:3000/ns", "aerospike://:s3cret@h:3000/ns"] {
            let err = StoreUrl::parse(one_sided).unwrap_err().to_string();
            assert!(
                err.contains("both a user and a password"),
                "{one_sided}: {err}"
            );
            assert!(!err.contains("s3cret"), "{err}");
        }
    }

    #[test]
    fn etcd_urls_take_several_hosts_and_credentials() {
        let url = StoreUrl::parse("etcd://alice:s3cret@127.0.0.1:2379,127.0.0.1:22379?prefix=a:")
            .unwrap();
        assert_eq!(url.address(), "127.0.0.1:2379,127.0.0.1:22379");
        assert_eq!(
            url.to_string(),
            "etcd://alice:***@127.0.0.1:2379,127.0.0.1:22379?prefix=a:"
        );
        assert!(!format!("{url:?}").contains("s3cret"));
        let err = StoreUrl::parse("etcd://alice:s3cret@h")
            .unwrap_err()
            .to_string();
        assert!(err.contains("port"), "{err}");
        assert!(err.contains("examples: memory://"), "{err}");
        assert!(!err.contains("s3cret"), "{err}");
    }

    #[test]
    fn passwords_never_show() {
        for raw in [
            "redis://alice:s3cret@127.0.0.1:6379",
            "aerospike://alice:s3cret@127.0.0.1:3000/ns",
        ] {
            let url = StoreUrl::parse(raw).unwrap();
            assert!(!url.to_string().contains("s3cret"), "{url}");
            assert!(!format!("{url:?}").contains("s3cret"));
            assert!(url.to_string().contains("alice"));
        }
        let err = StoreUrl::parse("zoo://alice:s3cret@h:1")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
        let err = StoreUrl::parse("aerospike://alice:s3cret@h:1")
            .unwrap_err()
            .to_string();
        assert!(!err.contains("s3cret"), "{err}");
    }
}
