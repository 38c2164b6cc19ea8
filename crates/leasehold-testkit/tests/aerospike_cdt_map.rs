//! CDT map operations and map-read filter expressions, through the real `aerospike` client:
//! against the wire fixture, or against a real cluster when `AEROSPIKE_HOSTS` is set (so the
//! fixture's map semantics are checked against the server's:
//! `AEROSPIKE_HOSTS=10.0.0.5:3000 cargo test -p leasehold-testkit --test aerospike_cdt_map`).

use std::collections::HashMap;

use aerospike::expressions::{and, eq, gt, int_val, lt, map_bin, maps as map_exp, string_val};
use aerospike::expressions::{ttl, ExpType};
use aerospike::operations::maps::MapOrder;
use aerospike::operations::maps::{self, MapPolicy, MapReturnType, MapWriteFlags};
use aerospike::operations::{self as ops};
use aerospike::policy::{Expiration, RecordExistsAction};
use aerospike::WritePolicy;
use aerospike::{as_bin, Bins, Client, Key, ReadPolicy, ResultCode, Value};
use leasehold_testkit::aerospike::AerospikeTarget;

mod common;
use common::client;

const SET: &str = "cdtmap";

fn key(target: &AerospikeTarget, name: &str) -> Key {
    Key::new(target.namespace(), SET, Value::from(target.unique(name))).unwrap()
}

fn code(err: &aerospike::Error) -> Option<ResultCode> {
    err.server_result_code()
}

fn s(text: &str) -> Value {
    Value::from(text)
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

async fn holders(client: &Client, key: &Key) -> HashMap<String, i64> {
    let record = client
        .get(&ReadPolicy::default(), key, Bins::All)
        .await
        .expect("read back");
    let mut out = HashMap::new();
    let entries: Vec<(Value, Value)> = match record.bins.get("m") {
        Some(Value::HashMap(m)) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        Some(Value::OrderedMap(m)) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        Some(Value::SortedMap(m)) => m.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        other => panic!("map bin reads as {other:?}"),
    };
    for (k, v) in entries {
        if let (Value::String(k), Value::Int(v)) = (k, v) {
            out.insert(k, v);
        }
    }
    out
}

#[tokio::test]
async fn map_put_remove_and_ranges_in_one_operate() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let client = client(&target).await;
    let key = key(&target, "ranges");
    let policy = WritePolicy {
        expiration: Expiration::Seconds(60),
        ..WritePolicy::default()
    };
    let mp = MapPolicy::default();
    // Create the record with three entries; put answers the map size.
    let record = client
        .operate(
            &policy,
            &key,
            &[
                ops::put(&as_bin!("mode", "shared")),
                maps::put(&mp, "m", s("a"), Value::from(10)),
                maps::put(&mp, "m", s("b"), Value::from(20)),
                maps::put(&mp, "m", s("c"), Value::from(30)),
            ],
        )
        .await
        .expect("create");
    assert_eq!(result(&record, "m", 2), Value::from(3));
    // Sweep values below 20, count what is left at or above 20, remove one key answering its
    // value, all in one operate.
    let record = client
        .operate(
            &policy,
            &key,
            &[
                maps::remove_by_value_range("m", Value::Nil, Value::from(20), MapReturnType::COUNT),
                maps::get_by_value_range("m", Value::from(20), Value::Nil, MapReturnType::COUNT),
                maps::remove_by_key("m", s("c"), MapReturnType::VALUE),
                maps::size("m"),
            ],
        )
        .await
        .expect("operate");
    assert_eq!(result(&record, "m", 0), Value::from(1), "removed below 20");
    assert_eq!(result(&record, "m", 1), Value::from(2), "b and c left");
    assert_eq!(result(&record, "m", 2), Value::from(30), "c's value");
    assert_eq!(result(&record, "m", 3), Value::from(1), "only b left");
    assert_eq!(
        holders(&client, &key).await,
        HashMap::from([("b".into(), 20)])
    );

    // Removing a missing key removes nothing and answers nil.
    let record = client
        .operate(
            &policy,
            &key,
            &[maps::remove_by_key("m", s("zz"), MapReturnType::VALUE)],
        )
        .await
        .expect("remove missing");
    assert_eq!(result(&record, "m", 0), Value::Nil);

    // Update-only put of a missing key fails with ELEMENT_NOT_FOUND; with no-fail it is skipped.
    let update_only = MapPolicy::new(MapOrder::Unordered, MapWriteFlags::UPDATE_ONLY);
    let err = client
        .operate(
            &policy,
            &key,
            &[maps::put(&update_only, "m", s("x"), Value::from(1))],
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(ResultCode::ElementNotFound), "{err}");
    let create_only = MapPolicy::new(MapOrder::Unordered, MapWriteFlags::CREATE_ONLY);
    let err = client
        .operate(
            &policy,
            &key,
            &[maps::put(&create_only, "m", s("b"), Value::from(1))],
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(ResultCode::ElementExists), "{err}");
    client
        .operate(
            &policy,
            &key,
            &[maps::put(&update_only, "m", s("b"), Value::from(25))],
        )
        .await
        .expect("update-only of an existing key");
    assert_eq!(
        holders(&client, &key).await,
        HashMap::from([("b".into(), 25)])
    );

    // A map op on a bin of another type is a bin type error.
    let err = client
        .operate(
            &policy,
            &key,
            &[maps::put(&mp, "mode", s("k"), Value::from(1))],
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(ResultCode::BinTypeError), "{err}");
    client.delete(&policy, &key).await.unwrap();
}

#[tokio::test]
async fn filters_read_maps_by_value_range_and_key() {
    let target = AerospikeTarget::from_env().await.unwrap();
    let client = client(&target).await;
    let key = key(&target, "filters");
    let mp = MapPolicy::default();
    let policy = WritePolicy {
        expiration: Expiration::Seconds(60),
        ..WritePolicy::default()
    };
    client
        .operate(
            &policy,
            &key,
            &[
                ops::put(&as_bin!("mode", "semaphore:2")),
                maps::put(&mp, "m", s("t1"), Value::from(100)),
                maps::put(&mp, "m", s("t2"), Value::from(200)),
            ],
        )
        .await
        .unwrap();
    let live = |from: i64| {
        map_exp::get_by_value_range(
            MapReturnType::COUNT,
            Some(int_val(from)),
            None,
            map_bin("m"),
            &[],
        )
    };
    let filtered = |exp| WritePolicy {
        base_policy: aerospike::policy::BasePolicy {
            filter_expression: Some(exp),
            ..Default::default()
        },
        expiration: Expiration::DontUpdate,
        ..WritePolicy::default()
    };
    let touch = [ops::put(&as_bin!("x", 1))];
    // Two entries at or above 150? No: one.
    let err = client
        .operate(&filtered(eq(live(150), int_val(2))), &key, &touch)
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(ResultCode::FilteredOut));
    client
        .operate(
            &filtered(and(vec![
                eq(live(150), int_val(1)),
                eq(
                    aerospike::expressions::string_bin("mode"),
                    string_val("semaphore:2"),
                ),
                lt(live(0), int_val(3)),
            ])),
            &key,
            &touch,
        )
        .await
        .expect("one live entry from 150");
    // A key's value, typed as an integer.
    let value_of = |token: &str| {
        map_exp::get_by_key(
            MapReturnType::VALUE,
            ExpType::Int,
            aerospike::expressions::string_val(token),
            map_bin("m"),
            &[],
        )
    };
    client
        .operate(&filtered(gt(value_of("t2"), int_val(150))), &key, &touch)
        .await
        .expect("t2 above 150");
    let err = client
        .operate(&filtered(gt(value_of("t1"), int_val(150))), &key, &touch)
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(ResultCode::FilteredOut), "t1 below");
    let err = client
        .operate(&filtered(gt(value_of("nobody"), int_val(0))), &key, &touch)
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(ResultCode::FilteredOut), "a missing key");
    // A missing map bin is unknown: filtered out.
    let err = client
        .operate(
            &filtered(eq(
                map_exp::get_by_value_range(MapReturnType::COUNT, None, None, map_bin("nope"), &[]),
                int_val(0),
            )),
            &key,
            &touch,
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(ResultCode::FilteredOut), "missing map bin");
    // The record's TTL in a filter (60 s set above, a little less left).
    client
        .operate(
            &filtered(and(vec![gt(ttl(), int_val(50)), lt(ttl(), int_val(61))])),
            &key,
            &touch,
        )
        .await
        .expect("ttl in range");
    // Update-only on an absent record is KEY_NOT_FOUND, map op or not.
    let absent = Key::new(
        target.namespace(),
        SET,
        Value::from(target.unique("absent")),
    )
    .unwrap();
    let mut update_only = filtered(eq(live(0), int_val(0)));
    update_only.record_exists_action = RecordExistsAction::UpdateOnly;
    let err = client
        .operate(
            &update_only,
            &absent,
            &[maps::remove_by_key("m", s("t1"), MapReturnType::VALUE)],
        )
        .await
        .unwrap_err();
    assert_eq!(code(&err), Some(ResultCode::KeyNotFoundError));
    client.delete(&policy, &key).await.unwrap();
}
