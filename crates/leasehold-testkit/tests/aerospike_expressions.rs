//! Expression operations through the real `aerospike` client, as the Aerospike store's fence step
//! uses them: a bin computed on the server by `write_exp` from the record's bins and metadata —
//! the counter plus one, or, for an absent counter, the server's clock from `last_update` and
//! `since_update` (on a record that exists and on one the write creates). Against the wire
//! fixture, or against a real cluster when `AEROSPIKE_HOSTS` is set:
//! `AEROSPIKE_HOSTS=10.0.0.5:3000 cargo test -p leasehold-testkit --test aerospike_expressions`.

use std::time::{SystemTime, UNIX_EPOCH};

use aerospike::expressions::{
    bin_exists, cond, int_bin, int_val, last_update, num_add, num_div, num_mul, since_update,
    Expression,
};
use aerospike::operations as ops;
use aerospike::operations::exp::{read_exp, write_exp, ExpReadFlags, ExpWriteFlags};
use aerospike::policy::Expiration;
use aerospike::{as_bin, Client, Key, ResultCode, Value, WritePolicy};
use leasehold_testkit::aerospike::AerospikeTarget;

mod common;
use common::client;

const SET: &str = "expops";

fn key(target: &AerospikeTarget, name: &str) -> Key {
    Key::new(target.namespace(), SET, Value::from(target.unique(name))).unwrap()
}

fn policy() -> WritePolicy {
    WritePolicy {
        expiration: Expiration::Seconds(30),
        ..WritePolicy::default()
    }
}

/// The server's clock in microseconds since 1970: last update (ns) plus the time since (ms).
fn server_clock_micros() -> Expression {
    num_add(vec![
        num_div(vec![last_update(), int_val(1_000)]),
        num_mul(vec![since_update(), int_val(1_000)]),
    ])
}

/// The store's fence counter: plus one, or the clock when absent.
fn next_counter() -> Expression {
    cond(vec![
        bin_exists("c"),
        num_add(vec![int_bin("c".to_owned()), int_val(1)]),
        server_clock_micros(),
    ])
}

fn local_micros() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as i64
}

/// The last result of `bin` in an operate's answer (a bin written and read answers both).
fn last(record: &aerospike::Record, bin: &str) -> i64 {
    let value = match record.bins.get(bin) {
        Some(Value::MultiResult(results)) => results.last(),
        other => other,
    };
    match value {
        Some(Value::Int(n)) => *n,
        other => panic!("{bin}: {other:?}"),
    }
}

async fn operate(
    client: &Client,
    key: &Key,
    ops: &[ops::Operation],
) -> aerospike::Result<aerospike::Record> {
    client.operate(&policy(), key, ops).await
}

#[tokio::test]
async fn the_server_clock_is_read_on_a_record_being_created_and_on_an_existing_one() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let client = client(&target).await;
    let key = key(&target, "clock");
    // Created by this write: its last-update time is the fresh record's, and the sum is still
    // the clock (the same clock as ours on the fixture; a cluster's within seconds of it).
    let record = operate(
        &client,
        &key,
        &[
            write_exp("t", server_clock_micros(), ExpWriteFlags::DEFAULT),
            ops::get_bin("t"),
        ],
    )
    .await
    .unwrap();
    let created = last(&record, "t");
    assert!(
        (created - local_micros()).abs() < 5_000_000,
        "the clock in µs: {created}"
    );
    // On the existing record: its last-update time is the first write's, and the sum is the
    // clock again, not that time.
    let record = operate(
        &client,
        &key,
        &[
            read_exp("lu", last_update(), ExpReadFlags::DEFAULT),
            write_exp("t", server_clock_micros(), ExpWriteFlags::DEFAULT),
            ops::get_bin("t"),
        ],
    )
    .await
    .unwrap();
    let updated = last(&record, "t");
    let first_write_micros = last(&record, "lu") / 1_000;
    assert!(updated >= created, "{updated} after {created}");
    assert!(
        first_write_micros >= created - 1_000 && first_write_micros <= updated,
        "last update {first_write_micros} is the first write's ({created}..={updated})"
    );
}

#[tokio::test]
async fn a_counter_starts_from_the_clock_and_counts_by_one() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let client = client(&target).await;
    let key = key(&target, "counter");
    let step = [
        write_exp("c", next_counter(), ExpWriteFlags::DEFAULT),
        ops::get_bin("c"),
    ];
    let first = last(&operate(&client, &key, &step).await.unwrap(), "c");
    assert!(
        (first - local_micros()).abs() < 5_000_000,
        "an absent counter starts from the clock: {first}"
    );
    let second = last(&operate(&client, &key, &step).await.unwrap(), "c");
    let third = last(&operate(&client, &key, &step).await.unwrap(), "c");
    assert_eq!((second, third), (first + 1, first + 2));

    // A counter written as a small integer (an earlier version's) goes on from its value.
    let small = self::key(&target, "small");
    client
        .put(&policy(), &small, &[as_bin!("c", 7)])
        .await
        .unwrap();
    assert_eq!(
        last(&operate(&client, &small, &step).await.unwrap(), "c"),
        8
    );
}

#[tokio::test]
async fn unknown_values_and_bin_rules_fail_or_are_skipped_as_the_flags_say() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let client = client(&target).await;
    let key = key(&target, "rules");
    client
        .put(&policy(), &key, &[as_bin!("a", 1)])
        .await
        .unwrap();
    let code = |e: aerospike::Error| e.server_result_code();
    let missing_plus_one = || num_add(vec![int_bin("missing".to_owned()), int_val(1)]);

    // A value computed from a missing bin is unknown.
    let err = operate(
        &client,
        &key,
        &[write_exp("b", missing_plus_one(), ExpWriteFlags::DEFAULT)],
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), Some(ResultCode::OpNotApplicable));
    operate(
        &client,
        &key,
        &[write_exp(
            "b",
            missing_plus_one(),
            ExpWriteFlags::EVAL_NO_FAIL,
        )],
    )
    .await
    .unwrap();
    let record = client
        .get(
            &aerospike::ReadPolicy::default(),
            &key,
            aerospike::Bins::All,
        )
        .await
        .unwrap();
    assert_eq!(record.bins.get("b"), None, "nothing written");

    // Create-only and update-only bins.
    let err = operate(
        &client,
        &key,
        &[write_exp("a", int_val(2), ExpWriteFlags::CREATE_ONLY)],
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), Some(ResultCode::BinExistsError));
    let err = operate(
        &client,
        &key,
        &[write_exp("z", int_val(2), ExpWriteFlags::UPDATE_ONLY)],
    )
    .await
    .unwrap_err();
    assert_eq!(code(err), Some(ResultCode::BinNotFound));
    let record = operate(
        &client,
        &key,
        &[
            write_exp(
                "a",
                int_val(2),
                ExpWriteFlags::CREATE_ONLY | ExpWriteFlags::POLICY_NO_FAIL,
            ),
            write_exp(
                "n",
                num_mul(vec![int_bin("a".to_owned()), int_val(10)]),
                ExpWriteFlags::DEFAULT,
            ),
            ops::get_bin("a"),
            ops::get_bin("n"),
        ],
    )
    .await
    .unwrap();
    assert_eq!(last(&record, "a"), 1, "skipped without failing");
    assert_eq!(last(&record, "n"), 10, "computed from the bin as it is");
}
