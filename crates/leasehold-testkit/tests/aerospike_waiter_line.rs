//! The operations the Aerospike store's fair waiter line depends on, through the real `aerospike`
//! client: against the wire fixture, or against a real cluster when `AEROSPIKE_HOSTS` is set (so
//! these fixture semantics are checked against the server's:
//! `AEROSPIKE_HOSTS=10.0.0.5:3000 cargo test -p leasehold-testkit --test aerospike_waiter_line`).
//!
//! A line is a map bin `waiter id → [ticket, deadline]` (list values) in its own record, changed
//! by one `operate` at a time: join with a create-only, no-fail map put (a kept place stays where
//! it is) and read the line in the same request; sweep a lapsed place by the exact value it was
//! read with (a value interval of lists `[t, d]` to `[t, d + 1]`), so a place refreshed meanwhile
//! survives; leave by key.

use aerospike::operations::maps::{self, MapOrder, MapPolicy, MapReturnType, MapWriteFlags};
use aerospike::operations::{self as ops};
use aerospike::policy::Expiration;
use aerospike::WritePolicy;
use aerospike::{as_bin, Client, Key, Value};
use leasehold_testkit::aerospike::AerospikeTarget;

mod common;
use common::client;

const SET: &str = "waiterline";
const LINE: &str = "line";

fn place(ticket: i64, deadline: i64) -> Value {
    Value::List(vec![Value::Int(ticket), Value::Int(deadline)])
}

/// The line as a sorted list of (id, ticket, deadline).
fn entries(value: Option<&Value>) -> Vec<(String, i64, i64)> {
    let pairs: Vec<(&Value, &Value)> = match value {
        Some(Value::HashMap(m)) => m.iter().collect(),
        Some(Value::OrderedMap(m)) => m.iter().collect(),
        Some(Value::SortedMap(m)) => m.iter().collect(),
        Some(Value::Nil) | None => Vec::new(),
        other => panic!("the line reads as {other:?}"),
    };
    let mut out: Vec<(String, i64, i64)> = pairs
        .into_iter()
        .map(|(k, v)| match (k, v) {
            (Value::String(id), Value::List(p)) => match p.as_slice() {
                [Value::Int(t), Value::Int(d)] => (id.clone(), *t, *d),
                other => panic!("a place reads as {other:?}"),
            },
            other => panic!("an entry reads as {other:?}"),
        })
        .collect();
    out.sort();
    out
}

/// Joins `id` with `[ticket, deadline]` unless it has a place, and reads the line (result 1).
async fn join(
    client: &Client,
    key: &Key,
    id: &str,
    ticket: i64,
    deadline: i64,
) -> Vec<(String, i64, i64)> {
    let policy = WritePolicy {
        expiration: Expiration::Seconds(60),
        ..WritePolicy::default()
    };
    let keep = MapPolicy::new(
        MapOrder::Unordered,
        MapWriteFlags::CREATE_ONLY | MapWriteFlags::NO_FAIL,
    );
    let record = client
        .operate(
            &policy,
            key,
            &[
                maps::put(&keep, LINE, Value::from(id), place(ticket, deadline)),
                ops::get_bin(LINE),
                ops::get_bin("granted"),
            ],
        )
        .await
        .expect("join");
    let results = record.results.expect("positional results");
    assert_eq!(results.len(), 3, "one result per op: {results:?}");
    entries(results.get(1))
}

#[tokio::test]
async fn a_line_of_list_places_joins_keeps_sweeps_exactly_and_leaves() {
    let target = AerospikeTarget::from_env()
        .await
        .expect("start the fixture");
    eprintln!("running against {target}");
    let client = client(&target).await;
    let key = Key::new(target.namespace(), SET, Value::from(target.unique("line"))).unwrap();

    // Joining: a place per id; joining again keeps the first place (create-only, no-fail).
    assert_eq!(
        join(&client, &key, "b", 20, 100).await,
        [("b".to_owned(), 20, 100)]
    );
    let line = join(&client, &key, "a", 10, 100).await;
    assert_eq!(line, [("a".to_owned(), 10, 100), ("b".to_owned(), 20, 100)]);
    let line = join(&client, &key, "b", 99, 999).await;
    assert!(line.contains(&("b".to_owned(), 20, 100)), "kept: {line:?}");

    // A plain put refreshes a place (b asks again: same ticket, later deadline).
    let policy = WritePolicy::default();
    client
        .operate(
            &policy,
            &key,
            &[maps::put(
                &MapPolicy::default(),
                LINE,
                Value::from("b"),
                place(20, 200),
            )],
        )
        .await
        .expect("refresh");

    // Sweeping by the exact value read: `a` as read ([10, 100]) goes; `b` as read before its
    // refresh ([20, 100]) stays, for it asked again. Other bins are written in the same request.
    let exact = |t: i64, d: i64| (place(t, d), place(t, d + 1));
    let (a_from, a_to) = exact(10, 100);
    let (b_from, b_to) = exact(20, 100);
    client
        .operate(
            &policy,
            &key,
            &[
                maps::remove_by_value_range(LINE, a_from, a_to, MapReturnType::NONE),
                maps::remove_by_value_range(LINE, b_from, b_to, MapReturnType::NONE),
                ops::put(&as_bin!("granted", 7)),
            ],
        )
        .await
        .expect("sweep");
    let line = join(&client, &key, "c", 30, 100).await;
    assert_eq!(line, [("b".to_owned(), 20, 200), ("c".to_owned(), 30, 100)]);

    // Leaving by key; leaving twice is harmless.
    for _ in 0..2 {
        client
            .operate(
                &policy,
                &key,
                &[maps::remove_by_key(
                    LINE,
                    Value::from("b"),
                    MapReturnType::NONE,
                )],
            )
            .await
            .expect("leave");
    }
    assert_eq!(
        join(&client, &key, "c", 31, 101).await,
        [("c".to_owned(), 30, 100)]
    );
    client.close().await.ok();
}
