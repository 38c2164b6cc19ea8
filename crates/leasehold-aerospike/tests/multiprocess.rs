//! Mutual exclusion across OS processes on Aerospike, through the wire fixture or a real cluster
//! (`AEROSPIKE_HOSTS`, never skipped): the shared suite (`tests/suites/multiprocess.rs`). The
//! counter is a record read with a plain get and written with a plain put (no operate, no
//! generation check). Set suffixes are unique per run, so a persistent cluster's earlier records
//! never interfere.

use std::time::{SystemTime, UNIX_EPOCH};

use aerospike::policy::AuthMode;
use aerospike::{
    as_bin, Bins, Client, ClientPolicy, Key, ReadPolicy, ResultCode, Value, WritePolicy,
};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::{AerospikeTarget, PASSWORD_ENV, USER_ENV};

#[path = "../../../tests/suites/multiprocess.rs"]
mod suite;

/// The fixture (if no cluster is named) serving from the test's runtime, and where this run's
/// records go, as one string a worker process is given (`hosts;namespace;suffix`).
struct Deployment {
    _target: AerospikeTarget,
    address: String,
}

/// The parts of an address.
fn place(address: &str) -> (String, String, String) {
    let mut parts = address.splitn(3, ';');
    let mut next = || parts.next().expect("hosts;namespace;suffix").to_owned();
    (next(), next(), next())
}

/// A secured cluster's credentials, from the environment (the workers' too).
fn credentials() -> Option<(String, String)> {
    Some((
        std::env::var(USER_ENV).ok()?,
        std::env::var(PASSWORD_ENV).ok()?,
    ))
}

/// A plain client and the counter's key.
struct Counter {
    client: Client,
    key: Key,
}

impl suite::Deployment for Deployment {
    type Store = AerospikeStore;
    type Counter = Counter;
    const INCREMENTS: usize = 25;

    fn start(runtime: &tokio::runtime::Runtime) -> Self {
        let target = runtime
            .block_on(AerospikeTarget::from_env())
            .expect("start the fixture");
        eprintln!("running against {target}");
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let suffix = format!("mp{:x}{nanos:x}", std::process::id());
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
        let (hosts, namespace, suffix) = place(address);
        let mut config = AerospikeConfig::new(hosts, namespace, "f1").set_suffix(suffix);
        if let Some((user, password)) = credentials() {
            config = config.credentials(user, password);
        }
        AerospikeStore::connect(config).await.expect("connect")
    }

    async fn counter(address: &str) -> Counter {
        let (hosts, namespace, suffix) = place(address);
        let mut policy = ClientPolicy::default();
        if let Some((user, password)) = credentials() {
            policy.auth_mode = AuthMode::Internal(user, password);
        }
        let client = Client::new(&policy, &hosts)
            .await
            .expect("counter connection");
        let key = Key::new(
            namespace,
            format!("counter{suffix}"),
            Value::from(suite::COUNTER),
        )
        .unwrap();
        Counter { client, key }
    }

    async fn read(counter: &mut Counter) -> u64 {
        match counter
            .client
            .get(&ReadPolicy::default(), &counter.key, Bins::All)
            .await
        {
            Ok(record) => match record.bins.get("n") {
                Some(Value::Int(n)) => u64::try_from(*n).expect("a count"),
                other => panic!("the counter's bin: {other:?}"),
            },
            Err(e) if e.server_result_code() == Some(ResultCode::KeyNotFoundError) => 0,
            Err(e) => panic!("get: {e}"),
        }
    }

    async fn write(counter: &mut Counter, value: u64) {
        let value = i64::try_from(value).expect("a small count");
        counter
            .client
            .put(
                &WritePolicy::default(),
                &counter.key,
                &[as_bin!("n", value)],
            )
            .await
            .expect("put");
    }
}

suite::multiprocess_suite!(Deployment);
