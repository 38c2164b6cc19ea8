//! Holders that die, on Aerospike, through the wire fixture or a real cluster (`AEROSPIKE_HOSTS`,
//! never skipped): the shared suite (`tests/suites/graceful_shutdown.rs`). A lock left by a killed
//! holder stays until its record's TTL runs out. Set suffixes are unique per test, so tests on one
//! cluster, and a persistent cluster's earlier records, never interfere.

use std::time::{SystemTime, UNIX_EPOCH};

use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::{AerospikeTarget, PASSWORD_ENV, USER_ENV};

#[path = "../../../tests/suites/graceful_shutdown.rs"]
mod suite;

/// The fixture (if no cluster is named) serving from the test's runtime, and where this test's
/// records go, as one string a holder process is given (`hosts;namespace;suffix`).
struct Deployment {
    _target: AerospikeTarget,
    address: String,
}

impl suite::Deployment for Deployment {
    type Store = AerospikeStore;

    fn start(runtime: &tokio::runtime::Runtime) -> Self {
        let target = runtime
            .block_on(AerospikeTarget::from_env())
            .expect("start the fixture");
        eprintln!("running against {target}");
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let suffix = format!("down{:x}{nanos:x}", std::process::id());
        let address = format!("{};{};{suffix}", target.hosts(), target.namespace());
        Deployment {
            _target: target,
            address,
        }
    }

    fn address(&self) -> String {
        self.address.clone()
    }

    async fn connect(address: &str) -> AerospikeStore {
        let mut parts = address.splitn(3, ';');
        let mut next = || parts.next().expect("hosts;namespace;suffix").to_owned();
        let (hosts, namespace, suffix) = (next(), next(), next());
        let mut config = AerospikeConfig::new(hosts, namespace, "f1").set_suffix(suffix);
        // A secured cluster's credentials come from the environment (the holder's too).
        if let (Ok(user), Ok(password)) = (std::env::var(USER_ENV), std::env::var(PASSWORD_ENV)) {
            config = config.credentials(user, password);
        }
        AerospikeStore::connect(config).await.expect("connect")
    }
}

suite::graceful_shutdown_suite!(Deployment);
