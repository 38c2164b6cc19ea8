//! The Aerospike store against a real cluster when `AEROSPIKE_HOSTS` is set, the wire fixture
//! otherwise (`leasehold_testkit::aerospike::AerospikeTarget`; never skipped): the record layout,
//! interoperability with the Java lock manager's records, the Java manager's weaknesses 1 and 3
//! (each shown not to happen here), setup errors and `close`. Key names are unique per run, so a
//! persistent cluster's earlier records never interfere. The tests that need fault injection are
//! in `aerospike_faults.rs` (fixture only).
//!
//! ```sh
//! AEROSPIKE_HOSTS=10.0.0.5:3000 AEROSPIKE_NAMESPACE=test cargo test -p leasehold-aerospike
//! ```

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use aerospike::policy::{Expiration, GenerationPolicy};
use aerospike::{
    as_bin, Bins, Client, ClientPolicy, Key, ReadPolicy, Record, ResultCode, Value, WritePolicy,
};
use leasehold::core::{Acquire, Operation};
use leasehold::{ErrorKind, LockKey, LockStore, OwnerToken};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::AerospikeTarget;

const FARM: &str = "farm1";
const SUFFIX: &str = "distributed_lock";
const DC_SET: &str = "DC#farm1#distributed_lock";

async fn target() -> AerospikeTarget {
    let target = AerospikeTarget::from_env()
        .await
        .expect("start the fixture");
    eprintln!("running against {target}");
    target
}

fn config(target: &AerospikeTarget) -> AerospikeConfig {
    let mut config = AerospikeConfig::new(target.hosts(), target.namespace(), FARM);
    if target.fixture().is_some() {
        config = config
            .max_error_rate(0)
            .total_timeout(Duration::from_millis(300))
            .socket_timeout(Duration::from_millis(300));
    }
    if let Some((user, password)) = target.credentials() {
        config = config.credentials(user, password);
    }
    config
}

async fn setup() -> (AerospikeTarget, AerospikeStore) {
    let target = target().await;
    let store = AerospikeStore::connect(config(&target)).await.unwrap();
    (target, store)
}

fn key(entity: &str) -> LockKey {
    LockKey::dc(FARM, "orders", entity).unwrap()
}

fn acquire(entity: &str, ttl: Duration) -> Acquire {
    Acquire::new(key(entity), OwnerToken::generate(), ttl)
}

async fn raw_client(target: &AerospikeTarget) -> Client {
    let mut policy = ClientPolicy::default();
    if let Some((user, password)) = target.credentials() {
        policy.auth_mode = aerospike::policy::AuthMode::Internal(user.into(), password.into());
    }
    Client::new(&policy, &target.hosts().to_owned())
        .await
        .unwrap()
}

fn record_key(target: &AerospikeTarget, set: &str, user_key: &str) -> Key {
    Key::new(target.namespace(), set, Value::from(user_key)).unwrap()
}

/// Reads a record with the plain client: what any Aerospike reader (the Java manager) sees.
async fn read(
    client: &Client,
    target: &AerospikeTarget,
    set: &str,
    user_key: &str,
) -> Option<Record> {
    let key = record_key(target, set, user_key);
    match client.get(&ReadPolicy::default(), &key, Bins::All).await {
        Ok(record) => Some(record),
        Err(e) if e.server_result_code() == Some(ResultCode::KeyNotFoundError) => None,
        Err(e) => panic!("read {set}/{user_key}: {e}"),
    }
}

/// The Java manager's write: generation 0 with expect-generation-equal, no user key, its two bins.
fn java_write_policy(ttl_secs: u32) -> WritePolicy {
    WritePolicy {
        generation_policy: GenerationPolicy::ExpectGenEqual,
        generation: 0,
        expiration: Expiration::Seconds(ttl_secs),
        send_key: false,
        ..WritePolicy::default()
    }
}

fn java_bins() -> Vec<aerospike::Bin> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    vec![as_bin!("farm1##data", 1), as_bin!("farm1##uat", now)]
}

#[tokio::test]
async fn records_use_the_java_managers_layout() {
    let (target, store) = setup().await;
    let client = raw_client(&target).await;
    let entity = target.unique("order-42");
    let user_key = format!("orders#{entity}");
    let req = acquire(&entity, Duration::from_secs(30));
    let lease = store.try_acquire(&req).await.unwrap();
    let record = read(&client, &target, DC_SET, &user_key)
        .await
        .expect("set DC#<farm>#<suffix>, user key <client>#<entity>");
    assert_eq!(record.bins.get("farm1##data"), Some(&Value::Int(1)));
    let Some(Value::Int(uat)) = record.bins.get("farm1##uat") else {
        panic!("uat bin: {record:?}")
    };
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    assert!((now - uat).abs() < 5_000, "acquisition time in epoch ms");
    assert_eq!(
        record.bins.get("lh_token"),
        Some(&Value::String(req.token.to_string()))
    );
    assert_eq!(
        record.bins.get("lh_fence"),
        None,
        "a token taken with the generation-checked increment is in the fence record only"
    );
    // A key's first token is the server's clock in microseconds (the uat is the client's, in
    // milliseconds: the same clock here, within the 5 s allowed above).
    let token = lease.fencing_token().expect("fenced");
    assert!(
        (token as i64 / 1_000 - uat).abs() < 5_000,
        "a first token is the server's clock in µs: {token}, uat {uat}"
    );
    let ttl = record.time_to_live().expect("expires");
    assert!(ttl <= Duration::from_secs(30) && ttl >= Duration::from_secs(28));
    let fence_set = format!("{DC_SET}#fence");
    let counter = read(&client, &target, &fence_set, &user_key)
        .await
        .expect("the fence counter lives in its own set");
    assert_eq!(
        counter.bins.get("lh_counter"),
        Some(&Value::Int(token as i64))
    );
    assert_eq!(
        counter.bins.get("lh_owner"),
        Some(&Value::String(req.token.to_string())),
        "naming the holder that took the counter's value"
    );
    let counter_ttl = counter.time_to_live().expect("the counter expires");
    assert!(
        counter_ttl <= Duration::from_secs(30) && counter_ttl >= Duration::from_secs(28),
        "with the hold's TTL: {counter_ttl:?}"
    );
    let info = store.inspect(&req.key).await.unwrap().unwrap();
    assert_eq!(info.fencing_token, Some(token), "inspect reads it there");
    if let Some(fixture) = target.fixture() {
        let stored = fixture.record_by_key(DC_SET, &user_key).unwrap();
        assert!(stored.user_key.is_some(), "send_key: `list` can name it");
    }
    assert!(store.release(&lease).await.unwrap());
    assert!(read(&client, &target, DC_SET, &user_key).await.is_none());
    assert!(
        read(&client, &target, &fence_set, &user_key)
            .await
            .is_some(),
        "the counter survives the lock record's deletion"
    );
    let xdc = Acquire::new(
        LockKey::xdc("orders", &entity).unwrap(),
        OwnerToken::generate(),
        Duration::from_secs(30),
    );
    let lease = store.try_acquire(&xdc).await.unwrap();
    assert!(read(&client, &target, "XDC#distributed_lock", &user_key)
        .await
        .is_some());
    assert!(store.release(&lease).await.unwrap());
}

#[tokio::test]
async fn a_java_lock_blocks_leasehold_and_a_leasehold_lock_blocks_java() {
    let (target, store) = setup().await;
    let client = raw_client(&target).await;
    // A lock taken by the Java manager.
    let java = target.unique("java");
    let java_key = record_key(&target, DC_SET, &format!("orders#{java}"));
    client
        .put(&java_write_policy(30), &java_key, &java_bins())
        .await
        .unwrap();
    let err = store
        .try_acquire(&acquire(&java, Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockUnavailable, "{err}");
    let info = store
        .inspect(&key(&java))
        .await
        .unwrap()
        .expect("held by Java");
    assert_eq!(info.token, None, "the Java manager stores no owner token");
    assert!(info.acquired_at.is_some(), "read from the farm1##uat bin");

    // A lock taken by leasehold fails the Java manager's existence check (GENERATION_ERROR).
    let rust = target.unique("rust");
    let lease = store
        .try_acquire(&acquire(&rust, Duration::from_secs(30)))
        .await
        .unwrap();
    let rust_key = record_key(&target, DC_SET, &format!("orders#{rust}"));
    let err = client
        .put(&java_write_policy(30), &rust_key, &java_bins())
        .await
        .unwrap_err();
    assert_eq!(err.server_result_code(), Some(ResultCode::GenerationError));
    // And a leasehold release with a foreign token leaves the Java lock alone.
    let impostor = lease.clone().with_token(OwnerToken::generate());
    assert!(!store.release(&impostor).await.unwrap());
    assert!(store.release(&lease).await.unwrap());
    assert!(client.exists(&Default::default(), &java_key).await.unwrap());
    let java_lease = leasehold::Lease::new(
        key(&java),
        OwnerToken::generate(),
        Duration::from_secs(30),
        tokio::time::Instant::now(),
    );
    assert!(
        !store.release(&java_lease).await.unwrap(),
        "leasehold never breaks a Java holder's lock by a release"
    );
    client
        .delete(&WritePolicy::default(), &java_key)
        .await
        .unwrap();
}

#[tokio::test]
async fn weakness_1_a_late_release_never_deletes_the_next_holders_lock() {
    let (target, store) = setup().await;
    let entity = target.unique("late");
    // The Java manager deletes blindly: after its TTL passed and someone else took the lock, its
    // release deleted the new holder's record. leasehold's delete is filtered on the token.
    let old = store
        .try_acquire(&acquire(&entity, Duration::from_secs(1)))
        .await
        .unwrap();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    let new = loop {
        match store
            .try_acquire(&acquire(&entity, Duration::from_secs(30)))
            .await
        {
            Ok(lease) => break lease,
            Err(e) if e.is_unavailable() && tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(!store.release(&old).await.unwrap(), "not ours any more");
    let info = store
        .inspect(&key(&entity))
        .await
        .unwrap()
        .expect("still held");
    assert!(info.is_owned_by(new.token()));
    assert!(
        new.fencing_token() > old.fencing_token(),
        "the next holder's token is larger"
    );
    assert!(store.release(&new).await.unwrap());
}

#[tokio::test]
async fn weakness_3_a_sub_second_ttl_is_rounded_up_never_truncated_to_zero() {
    let (target, store) = setup().await;
    let entity = target.unique("short");
    // The Java manager truncates the TTL to seconds: 900 ms became 0, "namespace default".
    store
        .try_acquire(&acquire(&entity, Duration::from_millis(900)))
        .await
        .unwrap();
    let info = store.inspect(&key(&entity)).await.unwrap().expect("held");
    let ttl = info.ttl_remaining.expect("expires, not namespace default");
    assert!(ttl <= Duration::from_secs(1), "rounded up to 1 s: {info:?}");
    if let Some(fixture) = target.fixture() {
        let record = fixture
            .record_by_key(DC_SET, &format!("orders#{entity}"))
            .unwrap();
        let ttl = record.ttl.expect("expires");
        assert!(ttl > Duration::from_millis(900), "1 s, not 0: {record:?}");
    }
    // And it does expire.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    while store.inspect(&key(&entity)).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < give_up, "never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn setup_errors_are_clear_and_found_before_use() {
    let target = target().await;
    let mut missing = AerospikeConfig::new(target.hosts(), "nope", FARM).max_error_rate(0);
    if let Some((user, password)) = target.credentials() {
        missing = missing.credentials(user, password);
    }
    let err = AerospikeStore::connect(missing).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreSetup, "{err}");
    assert!(err.to_string().contains("\"nope\" does not exist"), "{err}");
    assert_eq!(err.operation(), Some(Operation::Connect), "{err:?}");

    for config in [
        AerospikeConfig::new(target.hosts(), "test", "farm123456"),
        AerospikeConfig::new(target.hosts(), "test", FARM).set_suffix("x".repeat(60)),
        AerospikeConfig::new("", "test", FARM),
        AerospikeConfig::new(target.hosts(), "", FARM),
    ] {
        let err = AerospikeStore::connect(config).await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
        assert_eq!(
            err.operation(),
            None,
            "bad input, found before any I/O: {err:?}"
        );
    }
    let debug = format!(
        "{:?}",
        AerospikeConfig::new("h:3000", "test", FARM).credentials("app", "hunter2")
    );
    assert!(!debug.contains("hunter2"), "{debug}");
    assert_eq!(SUFFIX, leasehold_aerospike::DEFAULT_SET_SUFFIX);
}

#[tokio::test]
async fn close_leaves_a_borrowed_client_open() {
    let target = target().await;
    let client = Arc::new(raw_client(&target).await);
    let store = AerospikeStore::with_client(client.clone(), config(&target))
        .await
        .unwrap();
    store.close(false).await.unwrap();
    assert!(client.is_connected(), "not ours to close");
    let owned = AerospikeStore::connect(config(&target)).await.unwrap();
    owned.close(false).await.unwrap();
    assert!(owned
        .try_acquire(&acquire(
            &target.unique("after-close"),
            Duration::from_secs(5)
        ))
        .await
        .is_err());
}

#[tokio::test]
async fn commit_levels_read_replica_and_send_key_are_configurable() {
    use aerospike::policy::CommitLevel;
    use aerospike::Replica;
    let target = target().await;
    let config = config(&target)
        .acquire_commit_level(CommitLevel::CommitAll)
        .release_commit_level(CommitLevel::CommitMaster)
        .extend_commit_level(CommitLevel::CommitAll)
        .read_replica(Replica::MasterProles)
        .send_key(false);
    let debug = format!("{config:?}");
    assert!(
        debug.contains("acquire: CommitAll") && debug.contains("MasterProles"),
        "{debug}"
    );
    let store = AerospikeStore::connect(config).await.unwrap();
    let entity = target.unique("digest-only");
    let req = acquire(&entity, Duration::from_secs(30));
    let lease = store.try_acquire(&req).await.unwrap();
    let lease = store.extend(&lease, Duration::from_secs(20)).await.unwrap();
    let info = store.inspect(&key(&entity)).await.unwrap().expect("held");
    assert!(info.is_owned_by(&req.token));
    assert_eq!(info.fencing_token, lease.fencing_token());
    // Like the Java manager's records: only the digest, so `list` cannot name it.
    let listed = store.list("DC#farm1#orders#").await.unwrap();
    assert!(!listed.iter().any(|l| l.key == key(&entity)), "{listed:?}");
    if let Some(fixture) = target.fixture() {
        let record = fixture
            .record_by_key(DC_SET, &format!("orders#{entity}"))
            .unwrap();
        assert_eq!(record.user_key, None, "send_key(false)");
    }
    assert!(store.release(&lease).await.unwrap());
}

/// A refused login is a setup error that names the address and keeps the client's answer as its
/// cause. Fixture only: it needs a node whose user and password the test sets.
#[tokio::test]
async fn a_refused_login_keeps_the_clients_answer() {
    let fixture = leasehold_testkit::aerospike::AerospikeFixture::builder()
        .credentials("app", "s3cret-pw")
        .start()
        .await
        .unwrap();
    let hosts = fixture.host_string();
    let config = AerospikeConfig::new(hosts.as_str(), "test", FARM)
        .credentials("app", "wr0ng-pw")
        .max_error_rate(0);
    let err = AerospikeStore::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreSetup, "{err}");
    assert!(err.to_string().contains("authentication failed"), "{err}");
    assert!(err.to_string().contains(&hosts), "{err}");
    let cause = std::error::Error::source(&err).expect("the client's answer is kept");
    let chain = err.chain().to_string();
    assert!(chain.contains(&cause.to_string()), "{chain}");
    assert!(!chain.contains("wr0ng-pw"), "{chain}");
}
