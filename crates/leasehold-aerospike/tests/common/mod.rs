//! What this crate's multi-process tests share: where a test's records go, written as one string
//! a worker process is given. Each test binary uses only part of it.
#![allow(dead_code)]

use std::time::{SystemTime, UNIX_EPOCH};

use leasehold_aerospike::AerospikeConfig;
use leasehold_testkit::aerospike::{AerospikeTarget, PASSWORD_ENV, USER_ENV};

/// Hosts, namespace and a set suffix unique to one test run (`hosts;namespace;suffix`), so tests
/// on one cluster, and a persistent cluster's earlier records, never interfere.
#[derive(Debug, Clone)]
pub(crate) struct Place {
    pub(crate) hosts: String,
    pub(crate) namespace: String,
    pub(crate) suffix: String,
}

impl Place {
    /// A new place on `target`, its suffix starting with `label`.
    pub(crate) fn new(target: &AerospikeTarget, label: &str) -> Place {
        Place {
            hosts: target.hosts().to_owned(),
            namespace: target.namespace().to_owned(),
            suffix: unique(label),
        }
    }

    /// The place as one string, for a worker's environment.
    pub(crate) fn encode(&self) -> String {
        format!("{};{};{}", self.hosts, self.namespace, self.suffix)
    }

    /// The place [`Place::encode`] wrote.
    pub(crate) fn decode(s: &str) -> Place {
        let mut parts = s.splitn(3, ';');
        let mut next = || parts.next().expect("hosts;namespace;suffix").to_owned();
        Place {
            hosts: next(),
            namespace: next(),
            suffix: next(),
        }
    }

    /// The store configuration for `farm`; a secured cluster's credentials come from the
    /// environment (a worker's too).
    pub(crate) fn config(&self, farm: &str) -> AerospikeConfig {
        let mut config =
            AerospikeConfig::new(&self.hosts, &self.namespace, farm).set_suffix(&self.suffix);
        if let Some((user, password)) = credentials() {
            config = config.credentials(user, password);
        }
        config
    }
}

/// `label` followed by this process's id and the clock's nanoseconds: a name no other test run
/// uses, so a persistent cluster's earlier records never interfere.
pub(crate) fn unique(label: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{label}{:x}{nanos:x}", std::process::id())
}

/// The fixture, started on the current runtime, or the cluster `AEROSPIKE_HOSTS` names.
pub(crate) async fn current_target() -> AerospikeTarget {
    let target = AerospikeTarget::from_env()
        .await
        .expect("start the fixture");
    eprintln!("running against {target}");
    target
}

/// The fixture (if no cluster is named) serving from a test's runtime, and the test's place: what
/// the multi-process suites' deployments are on this store.
pub(crate) struct Deployment {
    _target: AerospikeTarget,
    pub(crate) place: Place,
}

impl Deployment {
    /// Starts the fixture on `runtime` (or names the cluster) and a place of its own, its suffix
    /// starting with `label`.
    pub(crate) fn on(runtime: &tokio::runtime::Runtime, label: &str) -> Deployment {
        let target = target(runtime);
        let place = Place::new(&target, label);
        Deployment {
            _target: target,
            place,
        }
    }
}

/// A secured cluster's credentials, from the environment.
pub(crate) fn credentials() -> Option<(String, String)> {
    Some((
        std::env::var(USER_ENV).ok()?,
        std::env::var(PASSWORD_ENV).ok()?,
    ))
}

/// Starts the fixture on `runtime` (it serves from there while the test waits), or names the
/// cluster `AEROSPIKE_HOSTS` gives.
pub(crate) fn target(runtime: &tokio::runtime::Runtime) -> AerospikeTarget {
    let target = runtime
        .block_on(AerospikeTarget::from_env())
        .expect("start the fixture");
    eprintln!("running against {target}");
    target
}
