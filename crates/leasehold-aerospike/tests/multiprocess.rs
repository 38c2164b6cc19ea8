//! Mutual exclusion across OS processes on Aerospike, through the wire fixture or a real cluster
//! (`AEROSPIKE_HOSTS`, never skipped): the shared suite (`tests/suites/multiprocess.rs`). The
//! counter is a record read with a plain get and written with a plain put (no operate, no
//! generation check). Set suffixes are unique per run, so a persistent cluster's earlier records
//! never interfere.

use aerospike::policy::AuthMode;
use aerospike::{
    as_bin, Bins, Client, ClientPolicy, Key, ReadPolicy, ResultCode, Value, WritePolicy,
};
use leasehold_aerospike::AerospikeStore;

mod common;
use common::{Deployment, Place};

#[path = "../../../tests/suites/multiprocess.rs"]
mod suite;

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
        Deployment::on(runtime, "mp")
    }

    fn address(&self) -> String {
        self.place.encode()
    }

    async fn connect(address: &str) -> AerospikeStore {
        AerospikeStore::connect(Place::decode(address).config("f1"))
            .await
            .expect("connect")
    }

    async fn counter(address: &str) -> Counter {
        let place = Place::decode(address);
        let mut policy = ClientPolicy::default();
        if let Some((user, password)) = common::credentials() {
            policy.auth_mode = AuthMode::Internal(user, password);
        }
        let client = Client::new(&policy, &place.hosts)
            .await
            .expect("counter connection");
        let set = format!("counter{}", place.suffix);
        let key = Key::new(place.namespace, set, Value::from(suite::COUNTER)).unwrap();
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
