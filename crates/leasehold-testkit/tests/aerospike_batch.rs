//! Batch requests through the real `aerospike` client (`Client::batch`), as the Aerospike store's
//! acquisition uses them: the lock record's create-only write and the reads of the records the
//! next step needs, in one request. Against the wire fixture, or against a real cluster when
//! `AEROSPIKE_HOSTS` is set (server 6.0 or later, which serves writes in batches):
//! `AEROSPIKE_HOSTS=10.0.0.5:3000 cargo test -p leasehold-testkit --test aerospike_batch`.
//!
//! And the generation-checked write the store's fence step is (a single `operate`): expect
//! generation 0 on an absent record creates it, a stale generation is `GENERATION_ERROR`.

use aerospike::expressions::{eq, int_bin, int_val};
use aerospike::operations as ops;
use aerospike::policy::{BatchPolicy, Expiration, GenerationPolicy, RecordExistsAction};
use aerospike::{
    as_bin, BatchOperation, BatchReadPolicy, BatchWritePolicy, Bins, Client, Key, ResultCode,
    Value, WritePolicy,
};
use leasehold_testkit::aerospike::{AerospikeTarget, Fault, Target};

mod common;
use common::client;

const SET: &str = "batchrows";

fn key(target: &AerospikeTarget, name: &str) -> Key {
    Key::new(target.namespace(), SET, Value::from(target.unique(name))).unwrap()
}

fn create_only() -> BatchWritePolicy {
    BatchWritePolicy {
        record_exists_action: RecordExistsAction::CreateOnly,
        expiration: Expiration::Seconds(30),
        send_key: true,
        ..BatchWritePolicy::default()
    }
}

fn create(key: &Key, value: i64) -> BatchOperation {
    BatchOperation::write(
        &create_only(),
        key.clone(),
        vec![ops::put(&as_bin!("v", value))],
    )
}

async fn put(client: &Client, key: &Key, value: i64) {
    let policy = WritePolicy {
        expiration: Expiration::Seconds(30),
        ..WritePolicy::default()
    };
    client
        .put(&policy, key, &[as_bin!("v", value)])
        .await
        .unwrap();
}

async fn value(client: &Client, key: &Key) -> Option<Value> {
    match client
        .get(&aerospike::ReadPolicy::default(), key, Bins::All)
        .await
    {
        Ok(record) => record.bins.get("v").cloned(),
        Err(e) if e.server_result_code() == Some(ResultCode::KeyNotFoundError) => None,
        Err(e) => panic!("{e}"),
    }
}

#[tokio::test]
async fn a_create_and_reads_of_other_records_are_answered_row_by_row() {
    let target = AerospikeTarget::from_env().await.unwrap();
    println!("running against {target}");
    let client = client(&target).await;
    let (fresh, absent, present) = (
        key(&target, "fresh"),
        key(&target, "absent"),
        key(&target, "present"),
    );
    put(&client, &present, 7).await;
    put(&client, &present, 8).await; // generation 2
    let mut rows = vec![
        create(&fresh, 1),
        BatchOperation::read(
            &BatchReadPolicy::default(),
            absent.clone(),
            Bins::from(["v"]),
        ),
        BatchOperation::read(&BatchReadPolicy::default(), present.clone(), Bins::None),
        BatchOperation::read(
            &BatchReadPolicy::default(),
            present.clone(),
            Bins::from(["v"]),
        ),
    ];
    client
        .batch(&BatchPolicy::default(), &mut rows)
        .await
        .unwrap();
    assert_eq!(rows[0].result_code(), Some(ResultCode::Ok), "created");
    assert_eq!(value(&client, &fresh).await, Some(Value::Int(1)));
    assert_eq!(
        rows[1].result_code(),
        Some(ResultCode::KeyNotFoundError),
        "a read of an absent record fails its row only"
    );
    assert!(rows[1].record().is_none());
    let header = rows[2].record().expect("header read");
    assert_eq!(header.generation, 2, "a header read answers the generation");
    assert!(header.bins.is_empty());
    let bins = rows[3].record().expect("bin read");
    assert_eq!(bins.bins.get("v"), Some(&Value::Int(8)));

    // The same create again: that row is refused, the others are still answered.
    let mut rows = vec![
        create(&fresh, 2),
        BatchOperation::read(
            &BatchReadPolicy::default(),
            present.clone(),
            Bins::from(["v"]),
        ),
    ];
    client
        .batch(&BatchPolicy::default(), &mut rows)
        .await
        .unwrap();
    assert_eq!(rows[0].result_code(), Some(ResultCode::KeyExistsError));
    assert!(!rows[0].in_doubt(), "a refusal is no doubt");
    assert_eq!(value(&client, &fresh).await, Some(Value::Int(1)));
    assert_eq!(rows[1].result_code(), Some(ResultCode::Ok));
}

#[tokio::test]
async fn rows_keep_their_own_filters_and_repeated_rows_each_answer() {
    let target = AerospikeTarget::from_env().await.unwrap();
    println!("running against {target}");
    let client = client(&target).await;
    let keys: Vec<Key> = (0..4)
        .map(|i| key(&target, &format!("repeat-{i}")))
        .collect();
    for (i, k) in keys.iter().enumerate() {
        put(&client, k, i as i64).await;
    }
    // One read policy and bin list for every row: the client sends the later rows as repeats.
    let read = BatchReadPolicy::default();
    let mut rows: Vec<BatchOperation> = keys
        .iter()
        .map(|k| BatchOperation::read(&read, k.clone(), Bins::from(["v"])))
        .collect();
    client
        .batch(&BatchPolicy::default(), &mut rows)
        .await
        .unwrap();
    for (i, row) in rows.iter().enumerate() {
        assert_eq!(
            row.record().and_then(|r| r.bins.get("v")),
            Some(&Value::Int(i as i64)),
            "row {i}"
        );
    }

    // A filtered write: applied where the filter holds, FILTERED_OUT where it does not.
    let only = |v: i64| BatchWritePolicy {
        filter_expression: Some(eq(int_bin("v".to_owned()), int_val(v))),
        ..BatchWritePolicy::default()
    };
    let mut rows = vec![
        BatchOperation::write(&only(0), keys[0].clone(), vec![ops::put(&as_bin!("v", 10))]),
        BatchOperation::write(&only(0), keys[1].clone(), vec![ops::put(&as_bin!("v", 11))]),
    ];
    client
        .batch(&BatchPolicy::default(), &mut rows)
        .await
        .unwrap();
    assert_eq!(rows[0].result_code(), Some(ResultCode::Ok));
    assert_eq!(rows[1].result_code(), Some(ResultCode::FilteredOut));
    assert_eq!(value(&client, &keys[0]).await, Some(Value::Int(10)));
    assert_eq!(value(&client, &keys[1]).await, Some(Value::Int(1)));
}

#[tokio::test]
async fn a_generation_checked_write_creates_at_zero_and_refuses_a_stale_generation() {
    let target = AerospikeTarget::from_env().await.unwrap();
    println!("running against {target}");
    let client = client(&target).await;
    let k = key(&target, "counter");
    let cas = |generation: u32| WritePolicy {
        generation_policy: GenerationPolicy::ExpectGenEqual,
        generation,
        expiration: Expiration::Never,
        ..WritePolicy::default()
    };
    let bump = [
        ops::add(&as_bin!("n", 1)),
        ops::put(&as_bin!("owner", "a")),
        ops::get_bin("n"),
    ];
    let record = client.operate(&cas(0), &k, &bump).await.unwrap();
    assert_eq!(
        record.generation, 1,
        "expect 0 on an absent record creates it"
    );
    let err = client.operate(&cas(0), &k, &bump).await.unwrap_err();
    assert_eq!(
        err.server_result_code(),
        Some(ResultCode::GenerationError),
        "{err}"
    );
    let record = client.operate(&cas(1), &k, &bump).await.unwrap();
    assert_eq!(record.generation, 2);
    let n = match record.bins.get("n") {
        Some(Value::MultiResult(v)) => v.last().cloned(),
        other => other.cloned(),
    };
    assert_eq!(n, Some(Value::Int(2)));
    client
        .delete(&WritePolicy::default(), &k)
        .await
        .expect("cleanup");
}

/// Fixture only: a fault on one row's record answers that row with the code; a lost reply
/// leaves the batch's writes in doubt.
#[tokio::test]
async fn a_result_code_hits_its_row_and_a_lost_reply_leaves_writes_in_doubt() {
    let target = AerospikeTarget::fixture_only().await.unwrap();
    let fixture = target.fixture().unwrap();
    let client = client(&target).await;
    let (a, b) = (key(&target, "fault-a"), key(&target, "fault-b"));
    fixture
        .faults()
        .inject(Fault::ResultCode(11), Target::DigestTimes(b.digest(), 1));
    let mut rows = vec![create(&a, 1), create(&b, 1)];
    let before = fixture.requests();
    client
        .batch(&BatchPolicy::default(), &mut rows)
        .await
        .unwrap();
    assert_eq!(fixture.requests() - before, 1, "one request");
    assert_eq!(rows[0].result_code(), Some(ResultCode::Ok));
    assert_eq!(
        rows[1].result_code(),
        Some(ResultCode::PartitionUnavailable)
    );
    assert_eq!(value(&client, &b).await, None, "not applied");

    let c = key(&target, "fault-c");
    fixture
        .faults()
        .inject(Fault::DropReply, Target::DigestTimes(c.digest(), 1));
    let policy = BatchPolicy {
        base_policy: aerospike::policy::BasePolicy {
            max_retries: 0,
            ..Default::default()
        },
        ..BatchPolicy::default()
    };
    let mut rows = vec![
        create(&c, 1),
        BatchOperation::read(&BatchReadPolicy::default(), a.clone(), Bins::None),
    ];
    let _ = client.batch(&policy, &mut rows).await;
    assert!(rows[0].in_doubt(), "{:?}", rows[0].error());
    assert_eq!(value(&client, &c).await, Some(Value::Int(1)), "it landed");
}
