//! Which Redis deployment a URL names: one server, a Redis Cluster, or a master found through
//! Sentinel. Parsed before any I/O, so a bad host list is an `InvalidArgument` naming the URL.

use leasehold_core::{Error, Result};
use percent_encoding::percent_decode_str;

/// The deployment behind a [`RedisConfig`](crate::RedisConfig).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Topology {
    /// One server (`redis://`, `rediss://`, `redis+unix://`): the URL goes to the redis crate as
    /// it is.
    Node,
    /// A Redis Cluster (`redis+cluster://h1:p1,h2:p2`): the seed nodes, each as a `redis://` or
    /// `rediss://` URL carrying the credentials.
    Cluster { seeds: Vec<String>, tls: bool },
    /// A master watched by Sentinel (`redis+sentinel://s1:p1,s2:p2/MASTER[/DB]`).
    Sentinel(SentinelSpec),
}

/// Where the sentinels are and what to ask them for.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct SentinelSpec {
    /// `host:port` of every sentinel.
    pub(crate) sentinels: Vec<(String, u16)>,
    /// The monitored master's name (`sentinel monitor <name> …`).
    pub(crate) master: String,
    pub(crate) db: i64,
    /// TLS to the sentinels and to the data nodes (`rediss+sentinel://`).
    pub(crate) tls: bool,
    /// Credentials for the data nodes (the URL's user info).
    pub(crate) username: Option<String>,
    pub(crate) password: Option<String>,
    /// Credentials for the sentinels (`?sentinel_user=…&sentinel_password=…`).
    pub(crate) sentinel_username: Option<String>,
    pub(crate) sentinel_password: Option<String>,
}

impl std::fmt::Debug for SentinelSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SentinelSpec")
            .field("sentinels", &self.sentinels)
            .field("master", &self.master)
            .field("db", &self.db)
            .field("tls", &self.tls)
            .field("username", &self.username)
            .field("sentinel_username", &self.sentinel_username)
            .finish_non_exhaustive()
    }
}

/// Default port of a Redis node, and of a sentinel.
const REDIS_PORT: u16 = 6379;
const SENTINEL_PORT: u16 = 26379;

impl Topology {
    /// The deployment `url` names; `shown` is the URL with its password hidden, for messages.
    pub(crate) fn parse(url: &str, shown: &str) -> Result<Topology> {
        let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
        let (tls, cluster) = match scheme {
            "redis+cluster" => (false, true),
            "rediss+cluster" => (true, true),
            "redis+sentinel" => (false, false),
            "rediss+sentinel" => (true, false),
            _ => return Ok(Topology::Node),
        };
        let bad = |what: &str| {
            Error::invalid_argument(format!(
                "{shown:?} is not a usable {} URL: {what} (e.g. {})",
                if cluster {
                    "Redis Cluster"
                } else {
                    "Redis Sentinel"
                },
                if cluster {
                    "redis+cluster://127.0.0.1:7001,127.0.0.1:7002"
                } else {
                    "redis+sentinel://127.0.0.1:26379,127.0.0.1:26380/mymaster"
                }
            ))
        };
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hosts) = match authority.rfind('@') {
            Some(at) => (Some(&authority[..at]), &authority[at + 1..]),
            None => (None, authority),
        };
        let default_port = if cluster { REDIS_PORT } else { SENTINEL_PORT };
        let hosts = hosts
            .split(',')
            .map(|host| parse_host(host, default_port).map_err(|why| bad(&why)))
            .collect::<Result<Vec<_>>>()?;
        if cluster {
            if !path.trim_matches('/').is_empty() {
                return Err(bad(
                    "a cluster has one database and takes no path: remove everything after the \
                     hosts",
                ));
            }
            if !query.is_empty() {
                return Err(bad("a cluster URL takes no query parameters"));
            }
            let scheme = if tls { "rediss" } else { "redis" };
            let userinfo = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
            let seeds = hosts
                .iter()
                .map(|(host, port)| {
                    let host = if host.contains(':') {
                        format!("[{host}]")
                    } else {
                        host.clone()
                    };
                    format!("{scheme}://{userinfo}{host}:{port}")
                })
                .collect();
            return Ok(Topology::Cluster { seeds, tls });
        }
        let mut segments = path.split('/').filter(|s| !s.is_empty());
        let master = segments
            .next()
            .ok_or_else(|| bad("name the master after the hosts (…/mymaster)"))?;
        let db = match segments.next() {
            None => 0,
            Some(db) => db
                .parse()
                .map_err(|_| bad(&format!("database {db:?} is not a number")))?,
        };
        if segments.next().is_some() {
            return Err(bad("the path is /MASTER_NAME or /MASTER_NAME/DB"));
        }
        let (username, password) = split_userinfo(userinfo).map_err(|why| bad(&why))?;
        let mut spec = SentinelSpec {
            sentinels: hosts,
            master: decode(master).map_err(|why| bad(&why))?,
            db,
            tls,
            username,
            password,
            sentinel_username: None,
            sentinel_password: None,
        };
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
            let value = Some(decode(value).map_err(|why| bad(&why))?);
            match name {
                "sentinel_user" => spec.sentinel_username = value,
                "sentinel_password" => spec.sentinel_password = value,
                other => {
                    return Err(bad(&format!(
                        "unknown parameter {other:?} (known: sentinel_user, sentinel_password)"
                    )))
                }
            }
        }
        Ok(Topology::Sentinel(spec))
    }

    /// Whether keys must share a hash tag per lock (a cluster spreads keys over slots).
    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Topology::Cluster { .. })
    }
}

/// `host[:port]` or `[v6]:port`.
fn parse_host(host: &str, default_port: u16) -> std::result::Result<(String, u16), String> {
    if host.is_empty() {
        return Err("a host is empty (hosts are separated by commas)".to_owned());
    }
    let (name, port) = if let Some(v6) = host.strip_prefix('[') {
        let (name, after) = v6
            .split_once(']')
            .ok_or_else(|| format!("{host:?} has no closing ]"))?;
        (name, after.strip_prefix(':'))
    } else {
        match host.rsplit_once(':') {
            Some((name, port)) => (name, Some(port)),
            None => (host, None),
        }
    };
    if name.is_empty() || name.contains(['/', '@', ' ']) {
        return Err(format!("{host:?} is not a host name"));
    }
    let port = match port {
        None => default_port,
        Some(port) => port
            .parse::<u16>()
            .ok()
            .filter(|p| *p != 0)
            .ok_or_else(|| format!("{host:?} has no valid port (1-65535)"))?,
    };
    Ok((name.to_owned(), port))
}

type Credentials = (Option<String>, Option<String>);

fn split_userinfo(userinfo: Option<&str>) -> std::result::Result<Credentials, String> {
    let Some(userinfo) = userinfo else {
        return Ok((None, None));
    };
    let (user, password) = match userinfo.split_once(':') {
        Some((user, password)) => (user, Some(password)),
        None => (userinfo, None),
    };
    let user = (!user.is_empty()).then(|| decode(user)).transpose()?;
    let password = password.map(decode).transpose()?;
    Ok((user, password))
}

fn decode(text: &str) -> std::result::Result<String, String> {
    percent_decode_str(text)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| "a percent-encoded part is not UTF-8".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<Topology> {
        Topology::parse(url, url)
    }

    #[test]
    fn plain_urls_are_one_node() {
        for url in ["redis://h:1", "rediss://h:1/2", "redis+unix:///tmp/s"] {
            assert_eq!(parse(url).unwrap(), Topology::Node, "{url}");
        }
    }

    #[test]
    fn a_cluster_url_gives_every_seed_its_credentials() {
        let Topology::Cluster { seeds, tls } =
            parse("rediss+cluster://u:p%40ss@10.0.0.1:7001,[::1]:7002,node3").unwrap()
        else {
            panic!("not a cluster");
        };
        assert!(tls);
        assert_eq!(
            seeds,
            [
                "rediss://u:p%40ss@10.0.0.1:7001",
                "rediss://u:p%40ss@[::1]:7002",
                "rediss://u:p%40ss@node3:6379"
            ]
        );
    }

    #[test]
    fn a_sentinel_url_names_the_master_the_db_and_the_sentinels_credentials() {
        let Topology::Sentinel(spec) = parse(
            "redis+sentinel://app:pw@s1:26379,s2/mymaster/3?sentinel_user=sen&sentinel_password=x%2Fy",
        )
        .unwrap() else {
            panic!("not sentinel");
        };
        assert_eq!(
            spec.sentinels,
            [("s1".to_owned(), 26379), ("s2".to_owned(), 26379)]
        );
        assert_eq!(spec.master, "mymaster");
        assert_eq!(spec.db, 3);
        assert_eq!(spec.username.as_deref(), Some("app"));
        assert_eq!(spec.password.as_deref(), Some("pw"));
        assert_eq!(spec.sentinel_username.as_deref(), Some("sen"));
        assert_eq!(spec.sentinel_password.as_deref(), Some("x/y"));
        assert!(!format!("{spec:?}").contains("pw"), "Debug hides passwords");
    }

    #[test]
    fn bad_host_lists_say_what_is_wrong() {
        for (url, says) in [
            ("redis+cluster://h1:1,,h2:2", "a host is empty"),
            ("redis+cluster://h1:0", "valid port"),
            ("redis+cluster://h1:x", "valid port"),
            ("redis+cluster://h1:1/0", "takes no path"),
            ("redis+cluster://h1:1?protocol=resp3", "no query"),
            ("redis+sentinel://s1:1", "name the master"),
            ("redis+sentinel://s1:1/m/x", "not a number"),
            (
                "redis+sentinel://s1:1/m?bogus=1",
                "unknown parameter \"bogus\"",
            ),
        ] {
            let err = parse(url).unwrap_err();
            assert_eq!(
                err.kind(),
                leasehold_core::ErrorKind::InvalidArgument,
                "{url}"
            );
            assert!(err.to_string().contains(says), "{url}: {err}");
        }
    }
}
