//! Drives the Aerospike fixture with the real `aerospike` client.

use std::sync::Arc;
use std::time::{Duration, Instant};

use aerospike::expressions::{and, eq, int_bin, int_val, not, or, string_bin, string_val};
use aerospike::operations;
use aerospike::policy::{
    BasePolicy, Expiration, GenerationPolicy, QueryPolicy, RecordExistsAction,
};
use aerospike::{
    as_bin, as_key, Bins, Client, ClientPolicy, Key, PartitionFilter, ReadPolicy, ResultCode,
    Statement, Value, WritePolicy,
};
use futures::StreamExt;
use leasehold_testkit::aerospike::{result_code, AerospikeFixture, BinValue, Fault, Target};

const NS: &str = "test";

async fn client(fixture: &AerospikeFixture) -> Client {
    let policy = ClientPolicy {
        max_error_rate: 0,
        ..ClientPolicy::default()
    };
    Client::new(&policy, &fixture.host_string())
        .await
        .expect("client connects to the fixture")
}

fn write_policy() -> WritePolicy {
    WritePolicy::default()
}

fn server_code(err: &aerospike::Error) -> Option<ResultCode> {
    err.server_result_code()
}

/// Whether `err` or one of its causes is a connection error.
fn caused_by_connection_error(err: &aerospike::Error) -> bool {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if matches!(e.kind(), aerospike::ErrorKind::Connection) {
            return true;
        }
        cur = e.cause();
    }
    false
}

/// Base policy with a short total timeout and no retries, for fault tests.
fn short_timeout(ms: u32) -> BasePolicy {
    BasePolicy {
        total_timeout: ms,
        socket_timeout: ms,
        max_retries: 0,
        ..BasePolicy::default()
    }
}

#[tokio::test]
async fn put_get_exists_and_inspection() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let key = as_key!(NS, "locks", "lock-1");
    let mut wp = write_policy();
    wp.send_key = true;
    client
        .put(&wp, &key, &[as_bin!("owner", "alice"), as_bin!("fence", 7)])
        .await
        .unwrap();

    let rp = ReadPolicy::default();
    let rec = client.get(&rp, &key, Bins::All).await.unwrap();
    assert_eq!(rec.bins.get("owner"), Some(&Value::from("alice")));
    assert_eq!(rec.bins.get("fence"), Some(&Value::from(7)));
    assert_eq!(rec.generation, 1);
    assert_eq!(
        rec.time_to_live(),
        None,
        "namespace default is never expire"
    );

    let named = client.get(&rp, &key, ["fence"]).await.unwrap();
    assert_eq!(named.bins.len(), 1);
    assert_eq!(named.bins.get("fence"), Some(&Value::from(7)));

    let header = client.get(&rp, &key, Bins::None).await.unwrap();
    assert!(header.bins.is_empty());
    assert_eq!(header.generation, 1);

    assert!(client.exists(&rp, &key).await.unwrap());
    assert!(!client
        .exists(&rp, &as_key!(NS, "locks", "nope"))
        .await
        .unwrap());
    let missing = client
        .get(&rp, &as_key!(NS, "locks", "nope"), Bins::All)
        .await
        .unwrap_err();
    assert_eq!(server_code(&missing), Some(ResultCode::KeyNotFoundError));

    client
        .put(&write_policy(), &key, &[as_bin!("fence", 8)])
        .await
        .unwrap();
    let rec = client.get(&rp, &key, Bins::All).await.unwrap();
    assert_eq!(rec.generation, 2);
    assert_eq!(
        rec.bins.get("owner"),
        Some(&Value::from("alice")),
        "update merges bins"
    );
    assert_eq!(rec.bins.get("fence"), Some(&Value::from(8)));

    // Direct inspection.
    assert_eq!(fixture.record_count("locks"), 1);
    assert_eq!(fixture.record_count("other"), 0);
    assert_eq!(fixture.total_record_count(), 1);
    let stored = fixture.record(&key.digest()).unwrap();
    assert_eq!(stored, fixture.record_by_key("locks", "lock-1").unwrap());
    assert_eq!(stored.set, "locks");
    assert_eq!(stored.generation, 2);
    assert_eq!(stored.user_key, Some(BinValue::String("lock-1".into())));
    assert_eq!(stored.bin("fence"), Some(&BinValue::Int(8)));
    assert_eq!(stored.ttl, None);

    // A nil bin removes the bin.
    client
        .put(&write_policy(), &key, &[as_bin!("fence", None)])
        .await
        .unwrap();
    let rec = client.get(&rp, &key, Bins::All).await.unwrap();
    assert!(!rec.bins.contains_key("fence"));
    fixture.clear();
    assert_eq!(fixture.total_record_count(), 0);
    client.close().await.unwrap();
}

#[tokio::test]
async fn record_exists_actions() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let key = as_key!(NS, "s", "k");
    let rp = ReadPolicy::default();
    let with = |action| WritePolicy {
        record_exists_action: action,
        ..write_policy()
    };

    let err = client
        .put(
            &with(RecordExistsAction::UpdateOnly),
            &key,
            &[as_bin!("a", 1)],
        )
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::KeyNotFoundError));
    let err = client
        .put(
            &with(RecordExistsAction::ReplaceOnly),
            &key,
            &[as_bin!("a", 1)],
        )
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::KeyNotFoundError));

    client
        .put(
            &with(RecordExistsAction::CreateOnly),
            &key,
            &[as_bin!("a", 1), as_bin!("b", 2)],
        )
        .await
        .unwrap();
    let err = client
        .put(
            &with(RecordExistsAction::CreateOnly),
            &key,
            &[as_bin!("a", 9)],
        )
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::KeyExistsError));

    client
        .put(
            &with(RecordExistsAction::UpdateOnly),
            &key,
            &[as_bin!("a", 3)],
        )
        .await
        .unwrap();
    let rec = client.get(&rp, &key, Bins::All).await.unwrap();
    assert_eq!(rec.bins.get("a"), Some(&Value::from(3)));
    assert_eq!(rec.bins.get("b"), Some(&Value::from(2)));

    client
        .put(&with(RecordExistsAction::Replace), &key, &[as_bin!("c", 4)])
        .await
        .unwrap();
    let rec = client.get(&rp, &key, Bins::All).await.unwrap();
    assert_eq!(rec.bins.len(), 1, "replace drops the other bins: {rec:?}");
    assert_eq!(rec.bins.get("c"), Some(&Value::from(4)));
    assert_eq!(rec.generation, 3);

    client
        .put(
            &with(RecordExistsAction::ReplaceOnly),
            &key,
            &[as_bin!("d", 5)],
        )
        .await
        .unwrap();
    let rec = client.get(&rp, &key, Bins::All).await.unwrap();
    assert_eq!(rec.bins.len(), 1);
    assert_eq!(rec.bins.get("d"), Some(&Value::from(5)));
    client.close().await.unwrap();
}

#[tokio::test]
async fn generation_policies_delete_and_touch() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let key = as_key!(NS, "s", "gen");
    let rp = ReadPolicy::default();
    client
        .put(&write_policy(), &key, &[as_bin!("v", 1)])
        .await
        .unwrap();

    let gen_policy = |policy, generation| WritePolicy {
        generation_policy: policy,
        generation,
        ..write_policy()
    };
    let err = client
        .put(
            &gen_policy(GenerationPolicy::ExpectGenEqual, 5),
            &key,
            &[as_bin!("v", 2)],
        )
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::GenerationError));
    client
        .put(
            &gen_policy(GenerationPolicy::ExpectGenEqual, 1),
            &key,
            &[as_bin!("v", 2)],
        )
        .await
        .unwrap();
    let err = client
        .put(
            &gen_policy(GenerationPolicy::ExpectGenGreater, 2),
            &key,
            &[as_bin!("v", 3)],
        )
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::GenerationError));
    client
        .put(
            &gen_policy(GenerationPolicy::ExpectGenGreater, 9),
            &key,
            &[as_bin!("v", 3)],
        )
        .await
        .unwrap();
    assert_eq!(
        client.get(&rp, &key, Bins::None).await.unwrap().generation,
        3
    );

    // Touch: bumps the generation, sets a new TTL, keeps the bins.
    let touch = WritePolicy {
        expiration: Expiration::Seconds(100),
        ..write_policy()
    };
    client.touch(&touch, &key).await.unwrap();
    let rec = client.get(&rp, &key, Bins::All).await.unwrap();
    assert_eq!(rec.generation, 4);
    assert_eq!(rec.bins.get("v"), Some(&Value::from(3)));
    let ttl = rec.time_to_live().expect("touched record has a TTL");
    assert!(
        ttl > Duration::from_secs(95) && ttl <= Duration::from_secs(100),
        "{ttl:?}"
    );
    let err = client
        .touch(&write_policy(), &as_key!(NS, "s", "absent"))
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::KeyNotFoundError));

    // Delete with a generation check.
    let err = client
        .delete(&gen_policy(GenerationPolicy::ExpectGenEqual, 1), &key)
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::GenerationError));
    assert!(client
        .delete(&gen_policy(GenerationPolicy::ExpectGenEqual, 4), &key)
        .await
        .unwrap());
    assert!(
        !client.delete(&write_policy(), &key).await.unwrap(),
        "missing key: KEY_NOT_FOUND"
    );
    assert!(!client.exists(&rp, &key).await.unwrap());
    assert_eq!(fixture.record_count("s"), 0);

    // After a delete, a create starts again at generation 1.
    client
        .put(&write_policy(), &key, &[as_bin!("v", 1)])
        .await
        .unwrap();
    assert_eq!(
        client.get(&rp, &key, Bins::None).await.unwrap().generation,
        1
    );
    client.close().await.unwrap();
}

#[tokio::test]
async fn records_expire_after_their_ttl() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let rp = ReadPolicy::default();
    let short = as_key!(NS, "ttl", "short");
    let never = as_key!(NS, "ttl", "never");
    let kept = as_key!(NS, "ttl", "kept");
    let ttl = |e| WritePolicy {
        expiration: e,
        ..write_policy()
    };
    client
        .put(&ttl(Expiration::Seconds(1)), &short, &[as_bin!("v", 1)])
        .await
        .unwrap();
    client
        .put(&ttl(Expiration::Never), &never, &[as_bin!("v", 1)])
        .await
        .unwrap();
    client
        .put(&ttl(Expiration::Seconds(60)), &kept, &[as_bin!("v", 1)])
        .await
        .unwrap();
    // Don't-update keeps the 60 s TTL through a write.
    client
        .put(&ttl(Expiration::DontUpdate), &kept, &[as_bin!("v", 2)])
        .await
        .unwrap();

    let rec = client.get(&rp, &short, Bins::All).await.unwrap();
    let left = rec.time_to_live().expect("1 s TTL");
    assert!(left <= Duration::from_secs(2), "{left:?}");
    assert_eq!(
        client
            .get(&rp, &never, Bins::All)
            .await
            .unwrap()
            .time_to_live(),
        None
    );
    let kept_ttl = client
        .get(&rp, &kept, Bins::All)
        .await
        .unwrap()
        .time_to_live()
        .unwrap();
    assert!(kept_ttl > Duration::from_secs(50), "{kept_ttl:?}");
    assert_eq!(fixture.record_count("ttl"), 3);

    tokio::time::sleep(Duration::from_millis(1500)).await;

    let err = client.get(&rp, &short, Bins::All).await.unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::KeyNotFoundError));
    assert!(!client.exists(&rp, &short).await.unwrap());
    assert!(fixture.record(&short.digest()).is_none());
    assert_eq!(fixture.record_count("ttl"), 2);
    // An expired record is gone for writes too: create-only succeeds, generation restarts.
    let create = WritePolicy {
        record_exists_action: RecordExistsAction::CreateOnly,
        ..write_policy()
    };
    client
        .put(&create, &short, &[as_bin!("v", 9)])
        .await
        .unwrap();
    assert_eq!(
        client
            .get(&rp, &short, Bins::None)
            .await
            .unwrap()
            .generation,
        1
    );
    client.close().await.unwrap();
}

#[tokio::test]
async fn operate_reads_writes_and_adds() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let key = as_key!(NS, "ops", "counter");
    let wp = write_policy();

    // add creates the bin; one result per op, in order.
    let rec = client
        .operate(
            &wp,
            &key,
            &[
                operations::add(&as_bin!("n", 5)),
                operations::put(&as_bin!("owner", "bob")),
                operations::get_bin("n"),
                operations::get_bin("owner"),
            ],
        )
        .await
        .unwrap();
    assert_eq!(rec.generation, 1);
    assert_eq!(rec.operation_result(0), Some(&Value::Nil));
    assert_eq!(rec.operation_result(1), Some(&Value::Nil));
    assert_eq!(rec.operation_result(2), Some(&Value::from(5)));
    assert_eq!(rec.operation_result(3), Some(&Value::from("bob")));

    let rec = client
        .operate(
            &wp,
            &key,
            &[operations::add(&as_bin!("n", 10)), operations::get()],
        )
        .await
        .unwrap();
    assert_eq!(rec.bins.get("n"), Some(&Value::from(15)));
    assert_eq!(rec.bins.get("owner"), Some(&Value::from("bob")));
    assert_eq!(rec.generation, 2);

    // Read-only operate.
    let rec = client
        .operate(&wp, &key, &[operations::get_bin("n")])
        .await
        .unwrap();
    assert_eq!(rec.bins.get("n"), Some(&Value::from(15)));
    assert_eq!(rec.generation, 2);

    // add on a string bin is a bin type error and changes nothing.
    let err = client
        .operate(&wp, &key, &[operations::add(&as_bin!("owner", 1))])
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::BinTypeError));

    // touch op, then delete op.
    let touch = WritePolicy {
        expiration: Expiration::Seconds(30),
        ..write_policy()
    };
    let rec = client
        .operate(
            &touch,
            &key,
            &[operations::touch(), operations::get_header()],
        )
        .await
        .unwrap();
    assert_eq!(rec.generation, 3);
    assert!(rec.time_to_live().is_some());
    client
        .operate(&wp, &key, &[operations::delete()])
        .await
        .unwrap();
    assert!(!client.exists(&ReadPolicy::default(), &key).await.unwrap());
    let err = client
        .operate(&wp, &key, &[operations::get_bin("n")])
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::KeyNotFoundError));
    client.close().await.unwrap();
}

#[tokio::test]
async fn filter_expressions() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let key = as_key!(NS, "f", "lock");
    client
        .put(
            &write_policy(),
            &key,
            &[as_bin!("owner", "alice"), as_bin!("fence", 3)],
        )
        .await
        .unwrap();
    let filtered = |exp| {
        let mut wp = write_policy();
        wp.base_policy.filter_expression = Some(exp);
        wp
    };

    // Write guarded by owner == "bob": filtered out, nothing changes.
    let err = client
        .put(
            &filtered(eq(string_bin("owner"), string_val("bob"))),
            &key,
            &[as_bin!("fence", 4)],
        )
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::FilteredOut));
    assert_eq!(fixture.record(&key.digest()).unwrap().generation, 1);

    // owner == "alice" and fence == 3: applies.
    client
        .put(
            &filtered(and(vec![
                eq(string_bin("owner"), string_val("alice")),
                eq(int_bin("fence"), int_val(3)),
            ])),
            &key,
            &[as_bin!("fence", 4)],
        )
        .await
        .unwrap();
    assert_eq!(
        fixture.record(&key.digest()).unwrap().bin("fence"),
        Some(&BinValue::Int(4))
    );

    // or / not, and a missing bin is "unknown" (filtered out).
    let err = client
        .put(
            &filtered(or(vec![
                eq(string_bin("missing"), string_val("x")),
                not(eq(int_bin("fence"), int_val(4))),
            ])),
            &key,
            &[as_bin!("fence", 5)],
        )
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::FilteredOut));

    // Delete guarded by a filter.
    let err = client
        .delete(&filtered(eq(int_bin("fence"), int_val(99))), &key)
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::FilteredOut));
    assert!(client
        .delete(&filtered(eq(int_bin("fence"), int_val(4))), &key)
        .await
        .unwrap());

    // Read with a filter.
    client
        .put(&write_policy(), &key, &[as_bin!("owner", "carol")])
        .await
        .unwrap();
    let mut rp = ReadPolicy::default();
    rp.base_policy.filter_expression = Some(eq(string_bin("owner"), string_val("dave")));
    let err = client.get(&rp, &key, Bins::All).await.unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::FilteredOut));
    rp.base_policy.filter_expression = Some(eq(string_bin("owner"), string_val("carol")));
    assert!(client.get(&rp, &key, Bins::All).await.is_ok());
    client.close().await.unwrap();
}

#[tokio::test]
async fn scan_lists_every_live_record_of_a_set() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let mut wp = write_policy();
    wp.send_key = true;
    for i in 0..20 {
        let key = as_key!(NS, "leases", format!("lock-{i}"));
        client
            .put(
                &wp,
                &key,
                &[as_bin!("owner", format!("o{i}")), as_bin!("i", i)],
            )
            .await
            .unwrap();
    }
    client
        .put(&wp, &as_key!(NS, "other", "x"), &[as_bin!("owner", "x")])
        .await
        .unwrap();
    // One without send_key, and one that expires before the scan.
    client
        .put(
            &write_policy(),
            &as_key!(NS, "leases", "nokey"),
            &[as_bin!("i", 100)],
        )
        .await
        .unwrap();
    let expiring = WritePolicy {
        expiration: Expiration::Seconds(1),
        ..write_policy()
    };
    client
        .put(
            &expiring,
            &as_key!(NS, "leases", "gone"),
            &[as_bin!("i", 200)],
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;

    let rs = client
        .query(
            &QueryPolicy::default(),
            PartitionFilter::all(),
            Statement::new(NS, "leases", Bins::All),
        )
        .await
        .unwrap();
    let mut stream = Arc::clone(&rs).into_stream();
    let mut seen = Vec::new();
    while let Some(rec) = stream.next().await {
        let rec = rec.unwrap();
        let key = rec.key.clone().expect("scan records carry their key");
        assert_eq!(key.set_name(), "leases");
        assert_eq!(rec.generation, 1);
        seen.push((key.user_key().cloned(), rec.bins.get("i").cloned()));
    }
    assert_eq!(seen.len(), 21, "{seen:?}");
    for i in 0..20 {
        assert!(seen.contains(&(Some(Value::from(format!("lock-{i}"))), Some(Value::from(i)))));
    }
    assert!(seen.contains(&(None, Some(Value::from(100)))));

    // Named bins and a filter expression on the scan.
    let mut qp = QueryPolicy::default();
    qp.base_policy.filter_expression = Some(eq(string_bin("owner"), string_val("o3")));
    let rs = client
        .query(
            &qp,
            PartitionFilter::all(),
            Statement::new(NS, "leases", Bins::from(["owner"].as_slice())),
        )
        .await
        .unwrap();
    let recs: Vec<_> = Arc::clone(&rs).into_stream().collect().await;
    assert_eq!(recs.len(), 1);
    let rec = recs.into_iter().next().unwrap().unwrap();
    assert_eq!(rec.bins.len(), 1);
    assert_eq!(rec.bins.get("owner"), Some(&Value::from("o3")));
    client.close().await.unwrap();
}

#[tokio::test]
async fn fault_delay_reply_times_out_in_doubt_after_applying() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let key = as_key!(NS, "faults", "slow");
    fixture.faults().inject(
        Fault::DelayReply(Duration::from_millis(800)),
        Target::NextRequests(1),
    );
    let wp = WritePolicy {
        base_policy: short_timeout(200),
        ..write_policy()
    };
    let started = Instant::now();
    let err = client.put(&wp, &key, &[as_bin!("v", 1)]).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_millis(700),
        "the client gave up first"
    );
    assert!(
        err.is_client_timeout(),
        "expected a client timeout, got {err:?}"
    );
    assert!(err.in_doubt(), "a timed-out write is in doubt: {err:?}");
    assert_eq!(fixture.faults().pending(), 0);
    // The write was applied.
    let rec = client
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .unwrap();
    assert_eq!(rec.bins.get("v"), Some(&Value::from(1)));
    client.close().await.unwrap();
}

#[tokio::test]
async fn fault_drop_connection_is_a_connection_error_and_not_applied() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let key = as_key!(NS, "faults", "dropped");
    fixture
        .faults()
        .inject(Fault::DropConnection, Target::NextRequests(1));
    let wp = WritePolicy {
        base_policy: short_timeout(1000),
        ..write_policy()
    };
    let err = client.put(&wp, &key, &[as_bin!("v", 1)]).await.unwrap_err();
    // With no retries left the client reports "max retries exceeded" (kind Timeout) caused by
    // the connection error.
    assert!(
        caused_by_connection_error(&err),
        "expected a connection error, got {err:?}"
    );
    assert!(err.in_doubt(), "the request was sent: {err:?}");
    assert!(server_code(&err).is_none(), "not a server answer: {err:?}");
    assert_eq!(fixture.faults().applied(), 1);
    assert!(
        fixture.record(&key.digest()).is_none(),
        "dropped before applying"
    );
    assert!(!client.exists(&ReadPolicy::default(), &key).await.unwrap());
    // The next request goes through.
    client.put(&wp, &key, &[as_bin!("v", 2)]).await.unwrap();
    assert_eq!(fixture.record_count("faults"), 1);
    client.close().await.unwrap();
}

#[tokio::test]
async fn fault_drop_reply_applies_the_write() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let key = as_key!(NS, "faults", "lost-reply");
    fixture
        .faults()
        .inject(Fault::DropReply, Target::Key("lost-reply".into()));
    let wp = WritePolicy {
        base_policy: short_timeout(1000),
        ..write_policy()
    };
    let err = client.put(&wp, &key, &[as_bin!("v", 1)]).await.unwrap_err();
    assert!(err.in_doubt(), "{err:?}");
    assert!(caused_by_connection_error(&err), "{err:?}");
    assert!(server_code(&err).is_none(), "{err:?}");
    // Applied: the fixture has it, and a read (once the rule is gone) sees it.
    assert_eq!(
        fixture.record(&key.digest()).unwrap().bin("v"),
        Some(&BinValue::Int(1))
    );
    // Other keys are not affected by a key rule.
    client
        .put(&wp, &as_key!(NS, "faults", "fine"), &[as_bin!("v", 1)])
        .await
        .unwrap();
    fixture.faults().clear();
    let rec = client
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .unwrap();
    assert_eq!(rec.bins.get("v"), Some(&Value::from(1)));
    client.close().await.unwrap();
}

#[tokio::test]
async fn fault_result_code() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = client(&fixture).await;
    let key = as_key!(NS, "faults", "busy");
    let id = fixture.faults().inject(
        Fault::ResultCode(result_code::KEY_BUSY),
        Target::Key("busy".into()),
    );
    let wp = WritePolicy {
        base_policy: short_timeout(1000),
        ..write_policy()
    };
    let err = client.put(&wp, &key, &[as_bin!("v", 1)]).await.unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::KeyBusy), "{err:?}");
    assert!(fixture.record(&key.digest()).is_none(), "not applied");
    let err = client
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::KeyBusy));
    assert!(fixture.faults().remove(id));
    client.put(&wp, &key, &[as_bin!("v", 1)]).await.unwrap();

    // A count-limited result-code fault on any key.
    fixture.faults().inject(
        Fault::ResultCode(result_code::GENERATION_ERROR),
        Target::NextRequests(1),
    );
    let err = client.put(&wp, &key, &[as_bin!("v", 2)]).await.unwrap_err();
    assert_eq!(server_code(&err), Some(ResultCode::GenerationError));
    client.put(&wp, &key, &[as_bin!("v", 2)]).await.unwrap();
    client.close().await.unwrap();
}

#[tokio::test]
async fn pause_holds_data_requests_until_resume() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = Arc::new(client(&fixture).await);
    let key = as_key!(NS, "p", "k");
    client
        .put(&write_policy(), &key, &[as_bin!("v", 1)])
        .await
        .unwrap();

    fixture.pause();
    assert!(fixture.faults().is_paused());
    let rp = ReadPolicy {
        base_policy: short_timeout(300),
    };
    let err = client.get(&rp, &key, Bins::All).await.unwrap_err();
    assert!(err.is_client_timeout(), "{err:?}");

    // A request made while paused completes once resumed.
    let pending = {
        let client = client.clone();
        let key = key.clone();
        tokio::spawn(async move {
            let rp = ReadPolicy {
                base_policy: short_timeout(3000),
            };
            client.get(&rp, &key, Bins::All).await
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!pending.is_finished());
    fixture.resume();
    let rec = pending.await.unwrap().unwrap();
    assert_eq!(rec.bins.get("v"), Some(&Value::from(1)));
    client.close().await.unwrap();
}

#[tokio::test]
async fn freeze_stops_answering_info_too_until_thaw() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let client = Arc::new(client(&fixture).await);
    let key = as_key!(NS, "f", "k");

    fixture.freeze();
    assert!(fixture.faults().is_frozen());
    // Info is not answered either, as from a SIGSTOPped server.
    let admin = aerospike::AdminPolicy { timeout: 300 };
    assert!(client.info(&admin, &["namespaces"]).await.is_err());
    // A write sent while frozen times out in doubt, and is applied once thawed.
    let wp = WritePolicy {
        base_policy: short_timeout(300),
        ..WritePolicy::default()
    };
    let err = client.put(&wp, &key, &[as_bin!("v", 7)]).await.unwrap_err();
    assert!(err.in_doubt(), "{err:?}");
    fixture.thaw();
    let give_up = Instant::now() + Duration::from_secs(10);
    let record = loop {
        match client.get(&ReadPolicy::default(), &key, Bins::All).await {
            Ok(record) => break record,
            Err(e) => {
                assert!(
                    Instant::now() < give_up,
                    "not answering after the thaw: {e}"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(record.bins.get("v"), Some(&Value::from(7)));
    assert!(client.info(&admin, &["namespaces"]).await.is_ok());
    client.close().await.unwrap();
}

#[tokio::test]
async fn partition_ownership_follows_the_switch() {
    use leasehold_testkit::aerospike::Partitions;
    // Owning nothing: the client connects but finds no node for any key.
    let fixture = AerospikeFixture::start().await.unwrap();
    fixture.set_partitions(Partitions::Unowned);
    let client = client(&fixture).await;
    assert!(!client.partition_map_complete());
    let key = as_key!(NS, "o", "k");
    let err = client
        .put(&write_policy(), &key, &[as_bin!("v", 1)])
        .await
        .unwrap_err();
    assert!(
        format!("{err:?}").contains("Cannot get appropriate node"),
        "{err:?}"
    );
    assert_eq!(fixture.requests(), 0, "nothing reached the node");
    // Owning them again: the client's next tend maps them.
    fixture.set_partitions(Partitions::Owned);
    let give_up = Instant::now() + Duration::from_secs(10);
    while !client.partition_map_complete() {
        assert!(Instant::now() < give_up, "never mapped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    client
        .put(&write_policy(), &key, &[as_bin!("v", 1)])
        .await
        .unwrap();
    assert_eq!(fixture.record_count("o"), 1);

    // No table at all: a connecting client gives up.
    let fixture = AerospikeFixture::start().await.unwrap();
    fixture.set_partitions(Partitions::NoTable);
    assert_eq!(fixture.faults().partitions(), Partitions::NoTable);
    let Err(err) = Client::new(&ClientPolicy::default(), &fixture.host_string()).await else {
        panic!("connected without a partition table");
    };
    assert!(
        err.to_string().contains("partition table never formed"),
        "{err}"
    );
}

#[tokio::test]
async fn custom_namespace_and_unknown_namespace() {
    let fixture = AerospikeFixture::builder()
        .namespace("locks")
        .cluster_name("ci")
        .start()
        .await
        .unwrap();
    assert_eq!(fixture.namespace(), "locks");
    let policy = ClientPolicy {
        max_error_rate: 0,
        cluster_name: Some("ci".into()),
        ..ClientPolicy::default()
    };
    let client = Client::new(&policy, &fixture.host_string()).await.unwrap();
    let key = as_key!("locks", "s", "k");
    client
        .put(&write_policy(), &key, &[as_bin!("v", 1)])
        .await
        .unwrap();
    assert_eq!(fixture.record_count("s"), 1);
    let wrong: Key = as_key!("test", "s", "k");
    assert!(client
        .put(&write_policy(), &wrong, &[as_bin!("v", 1)])
        .await
        .is_err());
    assert!(AerospikeFixture::builder()
        .namespace("bad:name")
        .start()
        .await
        .is_err());
    client.close().await.unwrap();
}

#[tokio::test]
async fn malformed_frames_close_only_their_connection() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fixture = AerospikeFixture::start().await.unwrap();

    // A raw info request is answered.
    let mut raw = tokio::net::TcpStream::connect(fixture.addr())
        .await
        .unwrap();
    let body = b"node\nbuild\nunknown-thing\n";
    let mut frame = vec![2u8, 1, 0, 0, 0, 0, 0, body.len() as u8];
    frame.extend_from_slice(body);
    raw.write_all(&frame).await.unwrap();
    let mut header = [0u8; 8];
    raw.read_exact(&mut header).await.unwrap();
    let len = u64::from_be_bytes([
        0, 0, header[2], header[3], header[4], header[5], header[6], header[7],
    ]);
    let mut answer = vec![0u8; len as usize];
    raw.read_exact(&mut answer).await.unwrap();
    let answer = String::from_utf8(answer).unwrap();
    assert!(
        answer.starts_with(&format!("node\t{}\n", fixture.node_name())),
        "{answer}"
    );
    assert!(answer.contains("build\t7.2.0.1\n"));
    assert!(answer.ends_with("unknown-thing\t\n"));

    // Garbage, a bad version, a truncated message, a lying op size: each connection is closed.
    let bad_frames: Vec<Vec<u8>> = vec![
        b"GET / HTTP/1.1\r\n\r\n".to_vec(),
        vec![2, 3, 0, 0, 0, 0, 0, 3, 22, 0, 0],
        {
            let mut m = vec![2, 3, 0, 0, 0, 0, 0, 34, 22];
            m.extend_from_slice(&[0; 19]);
            m.extend_from_slice(&[0, 1]); // one op
            m.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 1, 0, 0, 0]);
            m.extend_from_slice(&[0; 4]);
            m
        },
        vec![2, 3, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff],
    ];
    for bad in bad_frames {
        let mut conn = tokio::net::TcpStream::connect(fixture.addr())
            .await
            .unwrap();
        conn.write_all(&bad).await.unwrap();
        let mut buf = [0u8; 64];
        let n = tokio::time::timeout(Duration::from_secs(2), conn.read(&mut buf))
            .await
            .expect("the fixture closes the connection")
            .unwrap_or(0);
        assert_eq!(n, 0, "no answer to a malformed frame");
    }

    // The server still serves clients.
    let client = client(&fixture).await;
    client
        .put(&write_policy(), &as_key!(NS, "s", "k"), &[as_bin!("v", 1)])
        .await
        .unwrap();
    assert_eq!(fixture.record_count("s"), 1);
    client.close().await.unwrap();
}

#[tokio::test]
async fn shutdown_stops_serving() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let addr = fixture.addr();
    assert_eq!(fixture.host_string(), addr.to_string());
    assert!(addr.ip().is_loopback());
    assert_ne!(addr.port(), 0);
    fixture.shutdown().await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());

    let fixture = AerospikeFixture::start().await.unwrap();
    let addr = fixture.addr();
    drop(fixture);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(tokio::net::TcpStream::connect(addr).await.is_err());
}

#[tokio::test]
async fn binary_serves_and_exits_on_sigterm() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    /// Kills the child (by its own handle, i.e. its pid) if the test fails before it exits.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if matches!(self.0.try_wait(), Ok(None)) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_aerospike-fixture"))
            .args(["--bind", "127.0.0.1:0", "--namespace", "bin"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    let addr = line
        .trim_end()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();

    let policy = ClientPolicy {
        max_error_rate: 0,
        ..ClientPolicy::default()
    };
    let client = Client::new(&policy, &addr).await.unwrap();
    let key = as_key!("bin", "s", "k");
    client
        .put(&write_policy(), &key, &[as_bin!("v", 42)])
        .await
        .unwrap();
    let rec = client
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .unwrap();
    assert_eq!(rec.bins.get("v"), Some(&Value::from(42)));
    client.close().await.unwrap();

    let status = Command::new("kill")
        .args(["-TERM", &child.0.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let exit = loop {
        if let Some(exit) = child.0.try_wait().unwrap() {
            break exit;
        }
        assert!(
            Instant::now() < deadline,
            "fixture binary did not exit on SIGTERM"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(exit.success(), "{exit:?}");
}

#[tokio::test]
async fn a_fixture_with_a_user_needs_a_login() {
    let fixture = AerospikeFixture::builder()
        .credentials("app", "s3cret")
        .start()
        .await
        .unwrap();
    assert!(!format!("{fixture:?}").contains("s3cret"));
    let secured = |user: &str, password: &str| ClientPolicy {
        max_error_rate: 0,
        auth_mode: aerospike::policy::AuthMode::Internal(user.into(), password.into()),
        ..ClientPolicy::default()
    };
    let key = Key::new("test", "s", Value::from("k")).unwrap();
    // The right user and password: logged in (also the tend's connections), data goes through.
    let logged_in = Client::new(&secured("app", "s3cret"), &fixture.host_string())
        .await
        .unwrap();
    logged_in
        .put(&write_policy(), &key, &[as_bin!("b", 1)])
        .await
        .unwrap();
    // A wrong password or user: the login is refused.
    for (user, password) in [("app", "wrong"), ("nobody", "s3cret")] {
        let Err(err) = Client::new(&secured(user, password), &fixture.host_string()).await else {
            panic!("{user}/{password}: logged in")
        };
        assert!(err.to_string().contains("Invalid credential"), "{err}");
    }
    // No login at all: data messages are refused.
    let anonymous = client(&fixture).await;
    let err = anonymous
        .get(&ReadPolicy::default(), &key, Bins::All)
        .await
        .unwrap_err();
    assert_eq!(
        server_code(&err),
        Some(ResultCode::NotAuthenticated),
        "{err}"
    );

    // A fixture without a user answers a login with SECURITY_NOT_ENABLED: the client goes on.
    let open = AerospikeFixture::start().await.unwrap();
    let unsecured = Client::new(&secured("app", "any"), &open.host_string())
        .await
        .unwrap();
    unsecured
        .put(&write_policy(), &key, &[as_bin!("b", 1)])
        .await
        .unwrap();
}

/// The fixture process SIGSTOPped answers nothing, as `freeze` plays it in-process: a write sent
/// meanwhile times out in doubt and is applied after SIGCONT, info is not answered either.
#[tokio::test]
async fn a_sigstopped_fixture_process_behaves_as_freeze_plays_it() {
    use std::io::BufRead;
    use std::process::{Command, Stdio};
    /// Kills the child (by its own handle, i.e. its pid) if the test fails before it exits; a
    /// stopped process dies of SIGKILL too.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            if matches!(self.0.try_wait(), Ok(None)) {
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
    let signal = |sig: &str, pid: u32| {
        let status = Command::new("kill")
            .args([sig, &pid.to_string()])
            .status()
            .unwrap();
        assert!(status.success(), "kill {sig} {pid}");
    };
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_aerospike-fixture"))
            .args(["--bind", "127.0.0.1:0", "--namespace", "bin"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let line = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        std::io::BufReader::new(stdout)
            .read_line(&mut line)
            .map(|_| line)
    })
    .await
    .unwrap()
    .unwrap();
    let addr = line
        .trim_end()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_owned();
    let policy = ClientPolicy {
        max_error_rate: 0,
        ..ClientPolicy::default()
    };
    let client = Client::new(&policy, &addr).await.unwrap();
    let key = as_key!("bin", "s", "stopped");

    let pid = child.0.id();
    signal("-STOP", pid);
    let wp = WritePolicy {
        base_policy: short_timeout(300),
        ..WritePolicy::default()
    };
    let err = client.put(&wp, &key, &[as_bin!("v", 9)]).await.unwrap_err();
    assert!(err.in_doubt(), "{err:?}");
    let admin = aerospike::AdminPolicy { timeout: 300 };
    assert!(client.info(&admin, &["namespaces"]).await.is_err());
    signal("-CONT", pid);
    let give_up = Instant::now() + Duration::from_secs(10);
    let record = loop {
        match client.get(&ReadPolicy::default(), &key, Bins::All).await {
            Ok(record) => break record,
            Err(e) => {
                assert!(Instant::now() < give_up, "not answering after SIGCONT: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    assert_eq!(
        record.bins.get("v"),
        Some(&Value::from(9)),
        "applied after SIGCONT"
    );
    client.close().await.unwrap();
    signal("-TERM", pid);
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.0.try_wait().unwrap().is_none() {
        assert!(Instant::now() < deadline, "did not exit on SIGTERM");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
