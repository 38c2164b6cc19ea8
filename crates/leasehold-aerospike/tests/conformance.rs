//! The store conformance suite against the Aerospike wire fixture — or against a real cluster when
//! `AEROSPIKE_HOSTS` is set (`AEROSPIKE_HOSTS=10.0.0.5:3000 AEROSPIKE_NAMESPACE=test cargo test -p
//! leasehold-aerospike --test conformance`). Never skipped: one or the other always runs.

use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::AerospikeTarget;

/// The cluster in `AEROSPIKE_HOSTS`, or a fixture (kept alive next to the store).
async fn store(fencing: bool, fair: bool) -> (AerospikeStore, AerospikeTarget) {
    let target = AerospikeTarget::from_env()
        .await
        .expect("start the fixture");
    let mut config = AerospikeConfig::new(target.hosts(), target.namespace(), "conf")
        .fencing(fencing)
        .fair(fair)
        .max_error_rate(0);
    if let Some((user, password)) = target.credentials() {
        config = config.credentials(user, password);
    }
    let store = AerospikeStore::connect(config).await.expect("connect");
    (store, target)
}

mod fenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(true, true));
}

mod unfenced {
    leasehold_testkit::conformance_tests!(with_guard: super::store(false, true));
}

/// First come, first served (`fair(false)`): the Java manager's behaviour.
mod first_come {
    leasehold_testkit::conformance_tests!(with_guard: super::store(true, false));
}

/// Fencing keeps no state for keys nobody holds: a key's fence record expires with the hold it
/// was last incremented for, and a token issued after it expired is still above every earlier
/// one (an absent counter starts from the server's clock).
mod bounded_fencing {
    use std::collections::HashSet;
    use std::sync::Arc;
    use std::time::Duration;

    use aerospike::policy::Expiration;
    use aerospike::{
        as_bin, Bins, Client, ClientPolicy, Key, PartitionFilter, QueryPolicy, Statement, Value,
        WritePolicy,
    };
    use futures::StreamExt;
    use leasehold_core::{Acquire, LockKey, LockStore, OwnerToken};
    use leasehold_testkit::aerospike::AerospikeTarget;

    /// The shortest TTL a record can have (whole seconds).
    const TTL: Duration = Duration::from_secs(1);
    /// Past the longest TTL of any hold: a real server expires a record when the second after its
    /// void time begins, so up to a second later than the TTL.
    const PAST_EVERY_TTL: Duration = Duration::from_millis(2_500);
    const LOCK_SET: &str = "DC#conf#distributed_lock";
    const FENCE_SET: &str = "DC#conf#distributed_lock#fence";

    fn acquire(key: &LockKey) -> Acquire {
        Acquire::new(key.clone(), OwnerToken::generate(), TTL)
    }

    async fn raw_client(target: &AerospikeTarget) -> Client {
        let mut policy = ClientPolicy::default();
        if let Some((user, password)) = target.credentials() {
            policy.auth_mode = aerospike::policy::AuthMode::Internal(user.into(), password.into());
        }
        Client::new(&policy, &target.hosts().to_owned())
            .await
            .expect("connect the plain client")
    }

    fn digest(target: &AerospikeTarget, set: &str, key: &LockKey) -> [u8; 20] {
        Key::new(target.namespace(), set, Value::from(key.lock_id()))
            .unwrap()
            .digest()
    }

    /// How many records of `set` are among `ours` (by digest: fence records carry no user key).
    async fn ours_left(
        client: &Client,
        target: &AerospikeTarget,
        set: &str,
        ours: &HashSet<[u8; 20]>,
    ) -> usize {
        let statement = Statement::new(target.namespace(), set, Bins::None);
        let records = client
            .query(&QueryPolicy::default(), PartitionFilter::all(), statement)
            .await
            .expect("scan");
        let mut stream = Arc::clone(&records).into_stream();
        let mut left = 0;
        while let Some(record) = stream.next().await {
            let record = record.expect("scanned record");
            if record
                .key
                .as_ref()
                .is_some_and(|k| ours.contains(&k.digest()))
            {
                left += 1;
            }
        }
        left
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_hundred_thousand_keys_leave_nothing_behind_and_tokens_keep_growing() {
        let (store, target) = super::store(true, true).await;
        let run = target.unique("order");
        let keys: Vec<LockKey> = (0..100_000)
            .map(|i| LockKey::dc("conf", "orders", &format!("{run}-{i}")).unwrap())
            .collect();
        // 64 acquisitions in flight. In a debug build this loop is CPU-bound (client and
        // fixture both unoptimised, 300,000 requests): about a minute on two cores.
        let first_round: Vec<u64> = futures::stream::iter(&keys)
            .map(|key| {
                let store = &store;
                async move {
                    let lease = store.try_acquire(&acquire(key)).await.expect("free");
                    assert!(store.release(&lease).await.expect("release"));
                    lease.fencing_token().expect("fenced")
                }
            })
            .buffered(64)
            .collect()
            .await;

        // Past the longest TTL of any hold, the namespace holds none of our records.
        tokio::time::sleep(PAST_EVERY_TTL).await;
        let client = raw_client(&target).await;
        let locks: HashSet<[u8; 20]> = keys.iter().map(|k| digest(&target, LOCK_SET, k)).collect();
        let fences: HashSet<[u8; 20]> =
            keys.iter().map(|k| digest(&target, FENCE_SET, k)).collect();
        assert_eq!(ours_left(&client, &target, LOCK_SET, &locks).await, 0);
        assert_eq!(
            ours_left(&client, &target, FENCE_SET, &fences).await,
            0,
            "every fence record of 100,000 locked keys expired with its hold"
        );
        if let Some(fixture) = target.fixture() {
            assert_eq!(fixture.total_record_count(), 0, "nothing at all is left");
        }

        // A token issued after the key's counter expired is above all the earlier ones.
        let highest = *first_round.iter().max().unwrap();
        for (key, before) in keys.iter().zip(&first_round).step_by(10_000) {
            let lease = store.try_acquire(&acquire(key)).await.unwrap();
            let after = lease.fencing_token().unwrap();
            assert!(after > *before, "{key}: {after} after {before}");
            assert!(after > highest, "above every token issued before");
            store.release(&lease).await.unwrap();
        }
    }

    /// An earlier version's counter (a small integer, never expiring) goes on counting, gets the
    /// hold's TTL at its next grant, and once it expired the next token (from the clock) is
    /// above it; a counter ahead of the clock (the clock went back) is still exceeded.
    #[tokio::test]
    async fn an_earlier_versions_counter_and_one_ahead_of_the_clock_keep_tokens_growing() {
        let (store, target) = super::store(true, true).await;
        let client = raw_client(&target).await;
        let never = WritePolicy {
            expiration: Expiration::Never,
            ..WritePolicy::default()
        };
        for (name, counter) in [("upgraded", 7_i64), ("ahead", 4_000_000_000_000_000)] {
            let key = LockKey::dc("conf", "orders", &target.unique(name)).unwrap();
            let fence_key =
                Key::new(target.namespace(), FENCE_SET, Value::from(key.lock_id())).unwrap();
            client
                .put(&never, &fence_key, &[as_bin!("lh_counter", counter)])
                .await
                .unwrap();
            let lease = store.try_acquire(&acquire(&key)).await.unwrap();
            assert_eq!(lease.fencing_token(), Some(counter as u64 + 1), "{name}");
            let record = client
                .get(&aerospike::ReadPolicy::default(), &fence_key, Bins::None)
                .await
                .unwrap();
            let ttl = record.time_to_live().expect("the counter now expires");
            assert!(ttl <= TTL, "{name}: with the hold's TTL, {ttl:?}");
            store.release(&lease).await.unwrap();
            if name == "upgraded" {
                tokio::time::sleep(PAST_EVERY_TTL).await;
                let lease = store.try_acquire(&acquire(&key)).await.unwrap();
                let after = lease.fencing_token().unwrap();
                assert!(after > counter as u64 + 1, "from the clock: {after}");
                store.release(&lease).await.unwrap();
            }
        }
    }
}
