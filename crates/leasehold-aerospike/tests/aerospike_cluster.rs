//! A node lost or a cluster re-forming: several seeds, transient errors, waits instead of
//! failures. The wire fixture is one node and cannot form a cluster, so it plays the failures a
//! cluster shows its clients: a seed that refuses connections, a node that answers "partition
//! unavailable" for a while, a node that owns no partition yet or has no partition table yet, and
//! a node that stops answering altogether (`freeze`, as a SIGSTOPped server).
//!
//! The seed-list tests run against the cluster in `AEROSPIKE_HOSTS` when it is set (several
//! hosts allowed: `AEROSPIKE_HOSTS=10.0.0.5:3000,10.0.0.6:3000`), the fixture otherwise; the
//! others need the fixture's switches and say so.

use std::net::TcpListener;
use std::time::Duration;

use leasehold::core::{Acquire, Operation};
use leasehold::{Error, ErrorKind, LockKey, LockStore, OwnerToken};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::{AerospikeFixture, AerospikeTarget, Fault, Partitions, Target};
use tokio::time::Instant;

const FARM: &str = "farm1";
const DC_SET: &str = "DC#farm1#distributed_lock";

/// First-come (the faults hit the lock record's own requests, not a waiter line), short timeouts,
/// the client's circuit breaker off.
fn config(hosts: &str, namespace: &str) -> AerospikeConfig {
    AerospikeConfig::new(hosts, namespace, FARM)
        .fair(false)
        .max_error_rate(0)
        .total_timeout(Duration::from_millis(300))
        .socket_timeout(Duration::from_millis(300))
}

fn target_config(target: &AerospikeTarget, hosts: &str) -> AerospikeConfig {
    let mut config = config(hosts, target.namespace());
    if target.is_real_cluster() {
        config = config
            .total_timeout(Duration::from_secs(2))
            .socket_timeout(Duration::from_secs(1));
    }
    match target.credentials() {
        Some((user, password)) => config.credentials(user, password),
        None => config,
    }
}

fn key(entity: &str) -> LockKey {
    LockKey::dc(FARM, "orders", entity).unwrap()
}

fn acquire(entity: &str, ttl: Duration) -> Acquire {
    Acquire::new(key(entity), OwnerToken::generate(), ttl)
}

/// A loopback port nothing listens on: connecting is refused.
fn closed_port() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    addr.to_string()
}

/// The lock record as the fixture stores it, if any (`None` against a real cluster).
fn stored(
    fixture: &AerospikeFixture,
    entity: &str,
) -> Option<leasehold_testkit::aerospike::StoredRecord> {
    fixture.record_by_key(DC_SET, &format!("orders#{entity}"))
}

/// Tries until the store acquires, for at most `within` (the cluster is expected to become
/// usable again meanwhile); every refusal on the way must be temporary.
async fn acquire_when_usable(
    store: &AerospikeStore,
    req: &Acquire,
    within: Duration,
) -> leasehold::Lease {
    let give_up = Instant::now() + within;
    loop {
        match store.try_acquire(req).await {
            Ok(lease) => return lease,
            Err(e) if e.is_temporary() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("not usable again: {e}"),
        }
    }
}

fn assert_transient(err: &Error, says: &str) {
    assert!(
        matches!(
            err.kind(),
            ErrorKind::Connection | ErrorKind::RetriesExhausted
        ),
        "{err}"
    );
    assert!(err.is_temporary(), "{err}");
    assert!(err.to_string().contains(says), "{err}");
}

#[tokio::test]
async fn a_first_seed_that_refuses_connections_is_passed_over() {
    let target = AerospikeTarget::from_env().await.unwrap();
    eprintln!("running against {target}");
    let hosts = format!("{},{}", closed_port(), target.hosts());
    let store = AerospikeStore::connect(target_config(&target, &hosts))
        .await
        .expect("the second seed serves");
    let entity = target.unique("seeded");
    let req = acquire(&entity, Duration::from_secs(30));
    let lease = store.try_acquire(&req).await.unwrap();
    assert!(store
        .inspect(&req.key)
        .await
        .unwrap()
        .unwrap()
        .is_owned_by(&req.token));
    if let Some(fixture) = target.fixture() {
        let record = stored(fixture, &entity).expect("the lock record");
        assert!(record.bin("lh_token").is_some(), "{record:?}");
    }
    assert!(store.release(&lease).await.unwrap());
    assert_eq!(store.inspect(&req.key).await.unwrap(), None, "nothing left");
    if let Some(fixture) = target.fixture() {
        assert!(stored(fixture, &entity).is_none());
    }

    // The same seeds as a list.
    let listed = target_config(&target, "unused:1").seed_hosts(hosts.split(',').map(str::to_owned));
    let store = AerospikeStore::connect(listed).await.expect("listed seeds");
    let lease = store
        .try_acquire(&acquire(&entity, Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(store.release(&lease).await.unwrap());
}

#[tokio::test]
async fn when_every_seed_refuses_the_error_names_each_after_the_connect_timeout() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let (a, b) = (closed_port(), closed_port());
    let config =
        target_config(&target, &format!("{a},{b}")).connect_timeout(Duration::from_millis(400));
    let err = AerospikeStore::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.is_temporary());
    let text = err.to_string();
    assert!(text.contains("no usable cluster after"), "{text}");
    assert!(
        text.contains(&a) && text.contains(&b),
        "names every seed: {text}"
    );
    assert!(
        !text.contains('\n'),
        "one line, the client's cause too: {text}"
    );
    let cause = std::error::Error::source(&err).expect("the client error");
    assert!(cause.source().is_some(), "the client error itself under it");

    // A bad host list never gets that far.
    for hosts in [format!("{a},,{b}"), format!("{a},127.0.0.1:99999")] {
        let err = AerospikeStore::connect(config_for(&hosts))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{hosts}: {err}");
    }
}

fn config_for(hosts: &str) -> AerospikeConfig {
    config(hosts, "test")
}

/// Fixture only: it answers PARTITION_UNAVAILABLE (11) on demand.
#[tokio::test]
async fn a_partition_unavailable_for_a_while_is_waited_out_by_extend_and_release() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let store = AerospikeStore::connect(config_for(&fixture.host_string()))
        .await
        .unwrap();
    let req = acquire("reforming", Duration::from_secs(30));
    let lease = store.try_acquire(&req).await.unwrap();

    // Three answers "partition unavailable" (the cluster re-forming), then it serves: the
    // extension and the release each wait it out.
    fixture
        .faults()
        .inject(Fault::ResultCode(11), Target::NextRequests(3));
    let lease = store
        .extend(&lease, Duration::from_secs(40))
        .await
        .expect("extended after the wait");
    assert_eq!(fixture.faults().pending(), 0, "every refusal was met");
    let ttl = stored(&fixture, "reforming").unwrap().ttl.unwrap();
    assert!(ttl > Duration::from_secs(30), "the new TTL: {ttl:?}");
    fixture
        .faults()
        .inject(Fault::ResultCode(11), Target::NextRequests(3));
    assert!(store
        .release(&lease)
        .await
        .expect("released after the wait"));
    assert_eq!(fixture.faults().pending(), 0);
    assert!(
        stored(&fixture, "reforming").is_none(),
        "nothing left behind"
    );

    // An acquisition fails fast and temporary (a blocking acquire asks again), naming the node.
    let rule = fixture
        .faults()
        .inject(Fault::ResultCode(11), Target::NextRequests(u32::MAX));
    let req = acquire("reforming-2", Duration::from_secs(30));
    let err = store.try_acquire(&req).await.unwrap_err();
    assert_transient(&err, "partition is unavailable");
    assert!(
        err.to_string().contains(fixture.node_name()),
        "names the node: {err}"
    );
    assert!(
        err.to_string().contains(&fixture.host_string()),
        "and its address: {err}"
    );

    // A release that never gets through gives up at its budget: temporary, the lock left to
    // its TTL, and the message says so.
    fixture.faults().remove(rule);
    let lease = store.try_acquire(&req).await.unwrap();
    let short = AerospikeStore::connect(
        config_for(&fixture.host_string()).retry_budget(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let rule = fixture
        .faults()
        .inject(Fault::ResultCode(11), Target::NextRequests(u32::MAX));
    let err = short.release(&lease).await.unwrap_err();
    assert_transient(&err, "stays until its TTL (30 s)");
    assert!(err.to_string().contains(fixture.node_name()), "{err}");
    fixture.faults().remove(rule);
    assert!(
        stored(&fixture, "reforming-2").is_some(),
        "still there, as the error says"
    );
    assert!(store.release(&lease).await.unwrap());
    assert!(stored(&fixture, "reforming-2").is_none());
}

/// Fixture only: it owns no partition on demand.
#[tokio::test]
async fn a_node_without_partitions_fails_acquisitions_temporarily_until_it_has_them() {
    let fixture = AerospikeFixture::start().await.unwrap();
    fixture.set_partitions(Partitions::Unowned);
    // The partition table formed, only without masters: connect is done, keys fail for now.
    let store = AerospikeStore::connect(config_for(&fixture.host_string()))
        .await
        .expect("connects, the partitions still masterless");
    let req = acquire("homeless", Duration::from_secs(30));
    let err = store.try_acquire(&req).await.unwrap_err();
    assert_transient(&err, "no node serves the key's partition");
    assert_eq!(fixture.requests(), 0, "nothing was sent");

    // The node takes its partitions (the client learns it at its next tend): acquisitions go
    // through again.
    let owned_at = Instant::now();
    fixture.set_partitions(Partitions::Owned);
    let lease = acquire_when_usable(&store, &req, Duration::from_secs(10)).await;
    eprintln!(
        "acquired {:?} after the node took its partitions",
        owned_at.elapsed()
    );
    assert!(stored(&fixture, "homeless").is_some());
    assert!(store.release(&lease).await.unwrap());
    assert!(
        stored(&fixture, "homeless").is_none(),
        "nothing left behind"
    );
}

/// Fixture only: connect waits while the node has no partition table yet (a node that has not
/// joined a cluster: the client's "the partition table never formed").
#[tokio::test]
async fn connect_waits_for_the_partition_table() {
    let fixture = AerospikeFixture::start().await.unwrap();
    fixture.set_partitions(Partitions::NoTable);
    let started = Instant::now();
    let connecting = tokio::spawn(AerospikeStore::connect(config_for(&fixture.host_string())));
    tokio::time::sleep(Duration::from_millis(500)).await;
    fixture.set_partitions(Partitions::Owned);
    let store = connecting
        .await
        .unwrap()
        .expect("connected once the table formed");
    eprintln!(
        "no partition table for 0.5 s: connected after {:?}",
        started.elapsed()
    );
    let req = acquire("formed", Duration::from_secs(30));
    let lease = store.try_acquire(&req).await.unwrap();
    assert!(store.release(&lease).await.unwrap());
    assert!(stored(&fixture, "formed").is_none());

    // A table that never forms within the connect timeout: Connection, saying why.
    fixture.set_partitions(Partitions::NoTable);
    let config = config_for(&fixture.host_string()).connect_timeout(Duration::from_millis(300));
    let err = AerospikeStore::connect(config).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(err.is_temporary());
    assert!(
        err.chain()
            .to_string()
            .contains("partition table never formed"),
        "{}",
        err.chain()
    );
}

/// Fixture only: the node stops answering anything (as SIGSTOPped), shorter than the budget.
#[tokio::test]
async fn a_frozen_node_delays_extend_and_release_without_failing_them() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let store = AerospikeStore::connect(config_for(&fixture.host_string()))
        .await
        .unwrap();
    let req = acquire("frozen", Duration::from_secs(30));
    let lease = store.try_acquire(&req).await.unwrap();

    let frozen_at = Instant::now();
    fixture.freeze();
    let extending = tokio::spawn({
        let (store, lease) = (store.clone(), lease.clone());
        async move { store.extend(&lease, Duration::from_secs(50)).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    fixture.thaw();
    let lease = extending
        .await
        .unwrap()
        .expect("extended once the node answered again");
    eprintln!("extend through a 1 s freeze took {:?}", frozen_at.elapsed());
    let ttl = stored(&fixture, "frozen").unwrap().ttl.unwrap();
    assert!(ttl > Duration::from_secs(40), "the new TTL: {ttl:?}");

    // The delete reaches the frozen node and waits there; its reply is lost to the client's
    // timeout. The store reads the record back once the node answers: gone, so released.
    let frozen_at = Instant::now();
    fixture.freeze();
    let releasing = tokio::spawn({
        let (store, lease) = (store.clone(), lease.clone());
        async move { store.release(&lease).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    fixture.thaw();
    assert!(releasing
        .await
        .unwrap()
        .expect("released once the node answered again"));
    eprintln!(
        "release through a 1 s freeze took {:?}",
        frozen_at.elapsed()
    );
    assert!(stored(&fixture, "frozen").is_none(), "nothing left behind");
    assert_eq!(store.inspect(&req.key).await.unwrap(), None);
}

/// Fixture only: data requests held (info still answered) past the client's timeout.
#[tokio::test]
async fn a_paused_node_makes_a_release_in_doubt_and_the_readback_settles_it() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let store = AerospikeStore::connect(config_for(&fixture.host_string()))
        .await
        .unwrap();
    let lease = store
        .try_acquire(&acquire("paused", Duration::from_secs(30)))
        .await
        .unwrap();
    fixture.pause();
    let releasing = tokio::spawn({
        let (store, lease) = (store.clone(), lease.clone());
        async move { store.release(&lease).await }
    });
    tokio::time::sleep(Duration::from_millis(800)).await;
    fixture.resume();
    assert!(releasing.await.unwrap().expect("settled by the readback"));
    assert!(stored(&fixture, "paused").is_none());

    // Paused past the whole budget: InDoubt (the delete may land), never a false answer.
    let lease = store
        .try_acquire(&acquire("paused-2", Duration::from_secs(30)))
        .await
        .unwrap();
    let short = AerospikeStore::connect(
        config_for(&fixture.host_string()).retry_budget(Duration::from_millis(700)),
    )
    .await
    .unwrap();
    fixture.pause();
    let err = short.release(&lease).await.unwrap_err();
    fixture.resume();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert_eq!(err.operation(), Some(Operation::Release), "{err:?}");
    assert!(err.to_string().contains("reply was lost"), "{err}");
    assert!(
        err.to_string().contains(fixture.node_name()),
        "names the node: {err}"
    );
}

/// Fixture only: a create sent to a paused node lands when it resumes, after the fenced
/// acquisition that sent it gave up; the store deletes it (it has our token and no fencing
/// token), so the key is free again long before the record's TTL.
#[tokio::test]
async fn a_create_that_lands_after_its_acquisition_gave_up_is_deleted() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let store = AerospikeStore::connect(
        config_for(&fixture.host_string()).retries(1, Duration::from_millis(10)),
    )
    .await
    .unwrap();
    fixture.pause();
    let req = acquire("late", Duration::from_secs(60));
    let attempt = tokio::spawn({
        let (store, req) = (store.clone(), req.clone());
        async move { store.try_acquire(&req).await }
    });
    tokio::time::sleep(Duration::from_secs(1)).await;
    fixture.resume();
    let err = attempt.await.unwrap().unwrap_err();
    assert!(err.is_temporary(), "{err}");
    assert_ne!(
        err.kind(),
        ErrorKind::InDoubt,
        "fenced: never in doubt: {err}"
    );
    // The held create (and the clean-up's delete) are applied now, in any order.
    let give_up = Instant::now() + Duration::from_secs(10);
    while let Some(record) = stored(&fixture, "late") {
        assert!(
            Instant::now() < give_up,
            "the late create was left for its TTL: {record:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lease = store
        .try_acquire(&acquire("late", Duration::from_secs(60)))
        .await
        .expect("free again");
    assert!(lease.fencing_token().is_some());
    assert!(store.release(&lease).await.unwrap());
}

/// Fixture only: the key's waiter line (fair waiting, the default) sits in a partition that is
/// unavailable for a while. The acquisition fails temporary, naming the node, and leaves nothing;
/// once the partition serves, the lock is taken and released.
#[tokio::test]
async fn a_waiter_line_in_an_unavailable_partition_is_a_temporary_error() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let store = AerospikeStore::connect(config_for(&fixture.host_string()).fair(true))
        .await
        .unwrap();
    let line = aerospike::Key::new(
        "test",
        leasehold_aerospike::layout::queue_set(DC_SET),
        aerospike::Value::from("orders#lined"),
    )
    .unwrap()
    .digest();
    let rule = fixture
        .faults()
        .inject(Fault::ResultCode(11), Target::Digest(line));
    let req = acquire("lined", Duration::from_secs(30));
    let err = store.try_acquire(&req).await.unwrap_err();
    assert_transient(&err, "partition is unavailable");
    assert!(err.to_string().contains(fixture.node_name()), "{err}");
    assert!(stored(&fixture, "lined").is_none(), "nothing taken");
    fixture.faults().remove(rule);
    let lease = store
        .try_acquire(&req)
        .await
        .expect("the line serves again");
    assert!(store.release(&lease).await.unwrap());
    assert!(stored(&fixture, "lined").is_none(), "nothing left behind");
}

/// Fixture only: it fails the lock record's requests on demand. A fair try that created the lock
/// record, found the waiter line unreadable and could not give the record back either says that
/// the record blocks the key until its TTL; it is never reported as a plain refusal.
#[tokio::test]
async fn a_record_a_fair_try_cannot_give_back_is_reported_as_blocking_the_key() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let store = AerospikeStore::connect(
        config_for(&fixture.host_string())
            .fair(true)
            .retry_budget(Duration::from_millis(500)),
    )
    .await
    .unwrap();
    let line = aerospike::Key::new(
        "test",
        leasehold_aerospike::layout::queue_set(DC_SET),
        aerospike::Value::from("orders#stuck"),
    )
    .unwrap()
    .digest();
    let lock = aerospike::Key::new("test", DC_SET, aerospike::Value::from("orders#stuck"))
        .unwrap()
        .digest();
    let faults = fixture.faults();
    // The first rule that matches a batch decides it, for the rows it matches: the create's
    // batch (the lock record and its line) has its line read fail and its create go through.
    // Every request on the lock record after it (the give-back) fails.
    let unreadable = faults.inject(Fault::ResultCode(11), Target::Digest(line));
    let stuck = faults.inject(Fault::ResultCode(11), Target::Digest(lock));
    let err = store
        .try_acquire(&acquire("stuck", Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert_transient(&err, "blocks the key until its TTL (30 s)");
    let chain = err.chain().to_string();
    assert!(
        chain.contains(fixture.node_name()),
        "names the node: {chain}"
    );
    for rule in [unreadable, stuck] {
        faults.remove(rule);
    }
    assert!(
        stored(&fixture, "stuck").is_some(),
        "still there, as the error says"
    );
}
