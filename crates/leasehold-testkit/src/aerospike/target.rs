//! One switch for a real cluster: [`AerospikeTarget`].

use std::fmt;
use std::io;

use super::fixture::{AerospikeFixture, DEFAULT_NAMESPACE};

/// Environment variable naming a real cluster's seed hosts (`host:port[,host:port…]`).
pub const HOSTS_ENV: &str = "AEROSPIKE_HOSTS";
/// Environment variable naming the namespace on that cluster (default `test`).
pub const NAMESPACE_ENV: &str = "AEROSPIKE_NAMESPACE";
/// Environment variable with the user of a secured cluster (with [`PASSWORD_ENV`]).
pub const USER_ENV: &str = "AEROSPIKE_USER";
/// Environment variable with the password of a secured cluster.
pub const PASSWORD_ENV: &str = "AEROSPIKE_PASSWORD";

/// Where an Aerospike test runs: the real cluster named by `AEROSPIKE_HOSTS` when it is set, the
/// wire fixture ([`AerospikeFixture`]) otherwise — never skipped, one or the other always runs.
///
/// Against a cluster, records outlive the test (and earlier runs' records are there): build key
/// names with [`unique`](Self::unique). Tests that need fault injection or the fixture's record
/// view use [`AerospikeTarget::fixture_only`] and say so.
///
/// ```no_run
/// # async fn demo() -> std::io::Result<()> {
/// use leasehold_testkit::aerospike::AerospikeTarget;
/// let target = AerospikeTarget::from_env().await?;
/// println!("running against {target}");
/// let hosts = target.hosts(); // for the client or store under test
/// let entity = target.unique("order-42");
/// # Ok(()) }
/// ```
pub struct AerospikeTarget {
    hosts: String,
    namespace: String,
    credentials: Option<(String, String)>,
    fixture: Option<AerospikeFixture>,
    run_id: String,
}

impl AerospikeTarget {
    /// The cluster in `AEROSPIKE_HOSTS` (namespace `AEROSPIKE_NAMESPACE`, default `test`;
    /// credentials `AEROSPIKE_USER` / `AEROSPIKE_PASSWORD` if both are set), or a new fixture
    /// serving namespace `test` when `AEROSPIKE_HOSTS` is unset or empty.
    ///
    /// # Errors
    ///
    /// Starting the fixture fails (binding a loopback port).
    pub async fn from_env() -> io::Result<Self> {
        let hosts = std::env::var(HOSTS_ENV).unwrap_or_default();
        if hosts.trim().is_empty() {
            return Self::fixture_only().await;
        }
        let namespace = std::env::var(NAMESPACE_ENV)
            .ok()
            .filter(|ns| !ns.is_empty())
            .unwrap_or_else(|| DEFAULT_NAMESPACE.to_owned());
        let credentials = match (std::env::var(USER_ENV), std::env::var(PASSWORD_ENV)) {
            (Ok(user), Ok(password)) if !user.is_empty() => Some((user, password)),
            _ => None,
        };
        Ok(AerospikeTarget {
            hosts,
            namespace,
            credentials,
            fixture: None,
            run_id: run_id(),
        })
    }

    /// Always a new fixture (namespace `test`), whatever the environment: for tests that inject
    /// faults or read the fixture's records directly.
    ///
    /// # Errors
    ///
    /// Starting the fixture fails (binding a loopback port).
    pub async fn fixture_only() -> io::Result<Self> {
        let fixture = AerospikeFixture::start().await?;
        Ok(AerospikeTarget {
            hosts: fixture.host_string(),
            namespace: fixture.namespace().to_owned(),
            credentials: None,
            fixture: Some(fixture),
            run_id: run_id(),
        })
    }

    /// Seed hosts, `"host:port[,host:port…]"`.
    pub fn hosts(&self) -> &str {
        &self.hosts
    }

    /// The namespace to use.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// User and password of a secured cluster, if given.
    pub fn credentials(&self) -> Option<(&str, &str)> {
        self.credentials
            .as_ref()
            .map(|(u, p)| (u.as_str(), p.as_str()))
    }

    /// The fixture, when this is not a real cluster.
    pub fn fixture(&self) -> Option<&AerospikeFixture> {
        self.fixture.as_ref()
    }

    /// Whether this is a real cluster (`AEROSPIKE_HOSTS`).
    pub fn is_real_cluster(&self) -> bool {
        self.fixture.is_none()
    }

    /// `name` made unique to this target (`name-<run id>`), so that a run against a persistent
    /// cluster never meets the records (and fence counters) of an earlier run.
    pub fn unique(&self, name: &str) -> String {
        format!("{name}-{}", self.run_id)
    }
}

fn run_id() -> String {
    uuid::Uuid::new_v4().simple().to_string()[..12].to_owned()
}

impl fmt::Display for AerospikeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.fixture {
            Some(_) => write!(f, "the Aerospike wire fixture at {}", self.hosts),
            None => write!(
                f,
                "the Aerospike cluster at {} (namespace {}, from {HOSTS_ENV})",
                self.hosts, self.namespace
            ),
        }
    }
}

impl fmt::Debug for AerospikeTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AerospikeTarget")
            .field("hosts", &self.hosts)
            .field("namespace", &self.namespace)
            .field("user", &self.credentials.as_ref().map(|(u, _)| u))
            .field("password", &self.credentials.as_ref().map(|_| "***"))
            .field("fixture", &self.fixture.is_some())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fixture_target_names_itself_and_makes_unique_names() {
        let target = AerospikeTarget::fixture_only().await.unwrap();
        assert!(!target.is_real_cluster());
        assert_eq!(target.namespace(), "test");
        assert!(target.to_string().contains("wire fixture"), "{target}");
        let (a, b) = (target.unique("k"), target.unique("k"));
        assert_eq!(a, b, "stable within a target");
        assert_ne!(
            a,
            AerospikeTarget::fixture_only().await.unwrap().unique("k")
        );
    }

    #[test]
    fn debug_hides_the_password() {
        let target = AerospikeTarget {
            hosts: "h:3000".into(),
            namespace: "test".into(),
            credentials: Some(("app".into(), "hunter2".into())),
            fixture: None,
            run_id: run_id(),
        };
        let debug = format!("{target:?}");
        assert!(
            !debug.contains("hunter2") && debug.contains("app"),
            "{debug}"
        );
    }
}
