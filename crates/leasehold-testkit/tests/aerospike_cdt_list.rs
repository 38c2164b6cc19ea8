//! CDT list operations through the real `aerospike` client: against the wire fixture, or against a
//! real cluster when `AEROSPIKE_HOSTS` is set (so the fixture's list semantics are checked against
//! the server's:
//! `AEROSPIKE_HOSTS=10.0.0.5:3000 cargo test -p leasehold-testkit --test aerospike_cdt_list`).
//!
//! The first test is the lock trace's own pattern (leasehold-aerospike's `trace` module): insert
//! at the front, trim to the newest N and set the record's TTL in one operate; read back by index
//! range.

use aerospike::operations::lists::{
    self, ListOrderType, ListPolicy, ListReturnType, ListWriteFlags,
};
use aerospike::policy::Expiration;
use aerospike::{Bins, Key, ReadPolicy, ResultCode, Value, WritePolicy};
use leasehold_testkit::aerospike::AerospikeTarget;

mod common;
use common::client;

const SET: &str = "cdtlist";

fn key(target: &AerospikeTarget, name: &str) -> Key {
    Key::new(target.namespace(), SET, Value::from(target.unique(name))).unwrap()
}

fn s(text: &str) -> Value {
    Value::from(text)
}

fn strings(items: &[&str]) -> Value {
    Value::List(items.iter().map(|t| s(t)).collect())
}

/// The result of op `i` of an operate on bin `bin`: the bin's value, or the `i`-th of its
/// results when several ops answered on the same bin.
fn result(record: &aerospike::Record, bin: &str, i: usize) -> Value {
    match record.bins.get(bin) {
        Some(Value::MultiResult(values)) => values.get(i).cloned().unwrap_or(Value::Nil),
        Some(v) if i == 0 => v.clone(),
        _ => Value::Nil,
    }
}

fn policy(ttl_secs: u32) -> WritePolicy {
    WritePolicy {
        expiration: Expiration::Seconds(ttl_secs),
        ..WritePolicy::default()
    }
}

#[tokio::test]
async fn insert_at_the_front_trim_and_read_the_newest_first() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let client = client(&target).await;
    let key = key(&target, "trace");
    let lp = ListPolicy::default();
    for (n, entry) in ["e1", "e2", "e3", "e4"].into_iter().enumerate() {
        let record = client
            .operate(
                &policy(60),
                &key,
                &[lists::insert(&lp, "t", 0, s(entry)), lists::trim("t", 0, 3)],
            )
            .await
            .expect("insert and trim");
        assert_eq!(
            result(&record, "t", 0),
            Value::from(n as i64 + 1),
            "insert answers the size before the trim"
        );
    }
    let record = client
        .operate(
            &policy(60),
            &key,
            &[
                lists::get_by_index_range("t", 0, ListReturnType::VALUES),
                lists::get_by_index_range_count("t", 0, 2, ListReturnType::VALUES),
                lists::size("t"),
                lists::get("t", -1),
            ],
        )
        .await
        .expect("read");
    assert_eq!(result(&record, "t", 0), strings(&["e4", "e3", "e2"]));
    assert_eq!(result(&record, "t", 1), strings(&["e4", "e3"]));
    assert_eq!(result(&record, "t", 2), Value::from(3));
    assert_eq!(result(&record, "t", 3), s("e2"));
    // A plain get reads the whole list, and the record carries the operate's TTL.
    let record = client
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .expect("get");
    assert_eq!(record.bins.get("t"), Some(&strings(&["e4", "e3", "e2"])));
    let ttl = record.time_to_live().expect("expires");
    assert!(ttl.as_secs() <= 60 && ttl.as_secs() >= 55, "{ttl:?}");
    client.delete(&WritePolicy::default(), &key).await.unwrap();
}

#[tokio::test]
async fn append_clear_ranges_and_errors() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let client = client(&target).await;
    let key = key(&target, "append");
    let lp = ListPolicy::default();
    let record = client
        .operate(
            &policy(60),
            &key,
            &[
                lists::append(&lp, "l", Value::from(1)),
                lists::append_items(&lp, "l", vec![Value::from(2), Value::from(3)]),
                lists::get_by_index_range_count("l", 0, 1, ListReturnType::COUNT.inverted()),
                lists::get_range("l", -2, 5),
            ],
        )
        .await
        .expect("append");
    assert_eq!(result(&record, "l", 0), Value::from(1));
    assert_eq!(result(&record, "l", 1), Value::from(3));
    assert_eq!(result(&record, "l", 2), Value::from(2), "all but the first");
    assert_eq!(
        result(&record, "l", 3),
        Value::List(vec![Value::from(2), Value::from(3)]),
        "a range partly outside the list reads the part inside"
    );

    // Add-unique refuses a value already there; with no-fail the write is dropped.
    let unique = ListPolicy::new(ListOrderType::Unordered, ListWriteFlags::ADD_UNIQUE);
    let err = client
        .operate(
            &policy(60),
            &key,
            &[lists::append(&unique, "l", Value::from(2))],
        )
        .await
        .unwrap_err();
    assert_eq!(
        err.server_result_code(),
        Some(ResultCode::ElementExists),
        "{err}"
    );
    let no_fail = ListPolicy::new(
        ListOrderType::Unordered,
        ListWriteFlags::ADD_UNIQUE | ListWriteFlags::NO_FAIL,
    );
    let record = client
        .operate(
            &policy(60),
            &key,
            &[lists::append(&no_fail, "l", Value::from(2))],
        )
        .await
        .expect("no-fail");
    assert_eq!(result(&record, "l", 0), Value::from(3), "size unchanged");

    // Trimming to a range outside the list empties it; clear keeps the empty bin.
    let record = client
        .operate(
            &policy(60),
            &key,
            &[lists::trim("l", 1, 1), lists::size("l")],
        )
        .await
        .expect("trim");
    assert_eq!(result(&record, "l", 1), Value::from(1));
    let record = client
        .operate(
            &policy(60),
            &key,
            &[
                lists::clear("l"),
                lists::size("l"),
                aerospike::operations::put(&aerospike::as_bin!("other", 1)),
            ],
        )
        .await
        .expect("clear");
    assert_eq!(result(&record, "l", 1), Value::from(0));

    // A list op on a bin of another type is a bin type error.
    let err = client
        .operate(&policy(60), &key, &[lists::append(&lp, "other", s("x"))])
        .await
        .unwrap_err();
    assert_eq!(
        err.server_result_code(),
        Some(ResultCode::BinTypeError),
        "{err}"
    );
    client.delete(&WritePolicy::default(), &key).await.unwrap();
}
