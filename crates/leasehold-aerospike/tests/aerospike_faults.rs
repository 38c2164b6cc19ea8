//! The Aerospike store under injected faults, on the wire fixture only: every test here needs
//! fault injection (a reply delayed past the timeout, a dropped connection, a write applied but
//! its reply lost, a busy server, a paused server, an acquirer held between its steps), which a
//! real cluster cannot do on demand. The tests that make sense against a real server are in
//! `aerospike_store.rs` and run against `AEROSPIKE_HOSTS` when it is set.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use aerospike::{Key, Value};
use leasehold::core::Acquire;
use leasehold::layers::ReadbackLayer;
use leasehold::Lease;
use leasehold::{ErrorKind, LockEvent, LockKey, LockManager, LockStore, OwnerToken};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::{AerospikeFixture, Fault, Target};

const FARM: &str = "farm1";

/// First-come: these faults hit the lock record's own round trips (the create, with the fence
/// record's read in the same request, the fence steps, the delete); the fair line's requests have
/// their own fault tests (`aerospike_cluster.rs`).
fn config(fixture: &AerospikeFixture) -> AerospikeConfig {
    AerospikeConfig::new(fixture.host_string(), "test", FARM)
        .fair(false)
        .max_error_rate(0)
        .total_timeout(Duration::from_millis(300))
        .socket_timeout(Duration::from_millis(300))
}

async fn setup() -> (AerospikeFixture, AerospikeStore) {
    let fixture = AerospikeFixture::start().await.unwrap();
    let store = AerospikeStore::connect(config(&fixture)).await.unwrap();
    (fixture, store)
}

fn key(entity: &str) -> LockKey {
    LockKey::dc(FARM, "orders", entity).unwrap()
}

/// The digest of a lock record (not its fence counter, which has the same user key in another
/// set), for faults that must hit the lock write itself.
fn lock_digest(entity: &str) -> [u8; 20] {
    Key::new(
        "test",
        "DC#farm1#distributed_lock",
        Value::from(format!("orders#{entity}")),
    )
    .unwrap()
    .digest()
}

fn acquire(entity: &str, ttl: Duration) -> Acquire {
    Acquire::new(key(entity), OwnerToken::generate(), ttl)
}

/// Lets the request held in the fixture go on, and waits until it was applied.
async fn land_held(fixture: &AerospikeFixture) {
    fixture.faults().release_held();
    let landed = tokio::time::Instant::now() + Duration::from_secs(1);
    while fixture.faults().held() > 0 {
        assert!(
            tokio::time::Instant::now() < landed,
            "the held request was applied"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Waits (2 s at most, long before a 30 s TTL) until the lock record of `entity` is gone, then
/// takes and releases the key: it is free again. `stuck` says what failed otherwise.
async fn removed_then_free(store: &AerospikeStore, entity: &str, stuck: &str) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(2);
    while store.inspect(&key(entity)).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < give_up, "{stuck}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let next = store
        .try_acquire(&acquire(entity, Duration::from_secs(30)))
        .await
        .expect("the key is free again");
    assert!(store.release(&next).await.unwrap());
}

#[tokio::test]
async fn weakness_2_a_landed_write_with_a_lost_reply_is_never_reported_unavailable() {
    let (fixture, fenced) = setup().await;
    // The Java manager re-sends the create after a timeout; if the first one landed, the retry
    // fails and the caller is told LOCK_UNAVAILABLE while holding the lock itself for 90 s.
    // Unfenced (the Java cycle), the store reports the lost reply as InDoubt.
    let store = AerospikeStore::connect(config(&fixture).fencing(false))
        .await
        .unwrap();
    let req = acquire("landed", Duration::from_secs(90));
    let fault = fixture
        .faults()
        .inject(Fault::DropReply, Target::Digest(lock_digest("landed")));
    let err = store.try_acquire(&req).await.unwrap_err();
    fixture.faults().remove(fault);
    assert_eq!(
        err.kind(),
        ErrorKind::InDoubt,
        "never LockUnavailable: {err}"
    );
    assert!(
        store
            .inspect(&req.key)
            .await
            .unwrap()
            .unwrap()
            .is_owned_by(&req.token),
        "the write landed: we hold it"
    );

    // With the readback layer the caller simply gets the lock.
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let locks = LockManager::builder()
        .client_id("orders")
        .farm_id(FARM)
        .store(store.clone())
        .readback(ReadbackLayer::new())
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    // The first write to the lock record loses its reply; the readback (a read) goes through.
    let applied_before = fixture.faults().applied();
    let fault = fixture
        .faults()
        .inject(Fault::DropReply, Target::Digest(lock_digest("landed-2")));
    let attempt = tokio::spawn({
        let locks = locks.clone();
        async move { locks.try_lock("landed-2").await }
    });
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    while fixture.faults().applied() == applied_before && tokio::time::Instant::now() < give_up {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    fixture.faults().remove(fault);
    let guard = attempt.await.unwrap().expect("held after readback");
    assert!(events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::RecoveredByReadback { held: true, .. })));
    assert!(guard.release().await.unwrap());

    // Fenced, the store reads the record back itself (a lease recovered from the record alone
    // could lack its fencing token): the caller gets the lock, with its token.
    let req = acquire("landed-3", Duration::from_secs(90));
    fixture.faults().inject(
        Fault::DropReply,
        Target::DigestTimes(lock_digest("landed-3"), 1),
    );
    let lease = fenced
        .try_acquire(&req)
        .await
        .expect("resolved by the store");
    assert_eq!(fixture.faults().pending(), 0, "the create's reply was lost");
    let info = fenced.inspect(&req.key).await.unwrap().unwrap();
    assert!(info.is_owned_by(&req.token));
    assert_eq!(info.fencing_token, lease.fencing_token());
    assert!(lease.fencing_token().is_some());
}

#[tokio::test]
async fn a_delayed_reply_is_in_doubt_not_a_false_result() {
    let (fixture, fenced) = setup().await;
    let store = AerospikeStore::connect(config(&fixture).fencing(false))
        .await
        .unwrap();
    let req = acquire("slow", Duration::from_secs(30));
    let fault = fixture.faults().inject(
        Fault::DelayReply(Duration::from_millis(800)),
        Target::Digest(lock_digest("slow")),
    );
    let err = store.try_acquire(&req).await.unwrap_err();
    fixture.faults().remove(fault);
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(store
        .inspect(&req.key)
        .await
        .unwrap()
        .unwrap()
        .is_owned_by(&req.token));

    // Fenced: the late create is read back by the store and the acquisition completes.
    let req = acquire("slow-fenced", Duration::from_secs(30));
    fixture.faults().inject(
        Fault::DelayReply(Duration::from_millis(800)),
        Target::DigestTimes(lock_digest("slow-fenced"), 1),
    );
    let lease = fenced
        .try_acquire(&req)
        .await
        .expect("read back, then fenced");
    assert!(lease.fencing_token().is_some());

    // And when the readback fails too, the answer is never InDoubt (a layer could recover a lease
    // without its token from the record): the record is deleted again, nothing is held.
    let req = acquire("slow-lost", Duration::from_secs(30));
    let fault = fixture.faults().inject(
        Fault::DelayReply(Duration::from_millis(800)),
        Target::DigestTimes(lock_digest("slow-lost"), 6),
    );
    let err = fenced.try_acquire(&req).await.unwrap_err();
    assert_ne!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert!(err.is_temporary(), "{err}");
    fixture.faults().remove(fault);
    tokio::time::sleep(Duration::from_millis(900)).await;
    let info = fenced.inspect(&req.key).await.unwrap();
    assert!(
        info.is_none() || err.to_string().contains("blocks the key until its TTL"),
        "deleted again, or the error says it stays until its TTL: {err} / {info:?}"
    );
}

#[tokio::test]
async fn a_busy_server_answer_is_retried_by_the_client_and_ends_temporary() {
    let (fixture, store) = setup().await;
    let lease = store
        .try_acquire(&acquire("overloaded", Duration::from_secs(30)))
        .await
        .unwrap();
    // DEVICE_OVERLOAD (18), like KEY_BUSY (14), is one the client retries itself; a node that
    // answered it to the one send did not apply the delete (the client still flags it in doubt
    // when it wraps the answer: the store knows better). The release asks again within its
    // budget, then gives up: temporary, never a permanent failure, the lock left to its TTL.
    let store_short =
        AerospikeStore::connect(config(&fixture).retry_budget(Duration::from_millis(600)))
            .await
            .unwrap();
    fixture.faults().inject(
        Fault::ResultCode(18),
        Target::Digest(lock_digest("overloaded")),
    );
    let err = store_short.release(&lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::RetriesExhausted, "{err}");
    assert!(err.is_temporary());
    assert!(err.to_string().contains("the node is overloaded"), "{err}");
    assert!(err.to_string().contains("stays until its TTL"), "{err}");
    assert!(
        err.chain().to_string().contains("Device overload"),
        "cause kept: {}",
        err.chain()
    );
    fixture.faults().clear();
    assert!(store.release(&lease).await.unwrap(), "still ours, released");
}

#[tokio::test]
async fn a_dropped_connection_before_applying_is_retried_then_succeeds() {
    let (fixture, store) = setup().await;
    // The next data request (the fence increment) loses its connection before anything is
    // applied: nothing is in doubt, so the store retries (the seed's 5 × 80 ms) and succeeds.
    fixture
        .faults()
        .inject(Fault::DropConnection, Target::NextRequests(1));
    let lease = store
        .try_acquire(&acquire("dropped", Duration::from_secs(30)))
        .await
        .unwrap();
    assert!(fixture.faults().applied() >= 1);
    assert!(store.release(&lease).await.unwrap());

    // When every attempt fails: retries exhausted, nothing held. (The create and its five
    // readbacks fail; the clean-up delete, retried within the release budget, meets two more.)
    fixture
        .faults()
        .inject(Fault::DropConnection, Target::NextRequests(8));
    let err = store
        .try_acquire(&acquire("dropped-2", Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            err.kind(),
            ErrorKind::RetriesExhausted | ErrorKind::Connection
        ),
        "{err}"
    );
    fixture.faults().clear();
    assert_eq!(store.inspect(&key("dropped-2")).await.unwrap(), None);
}

#[tokio::test]
async fn a_paused_server_times_out_in_doubt_and_the_write_lands_on_resume() {
    let (fixture, store) = setup().await;
    let warm = store
        .try_acquire(&acquire("warm", Duration::from_secs(30)))
        .await
        .unwrap();
    store.release(&warm).await.unwrap();
    let store = AerospikeStore::connect(config(&fixture).fencing(false))
        .await
        .unwrap();
    fixture.pause();
    let req = acquire("paused", Duration::from_secs(30));
    let err = store.try_acquire(&req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    fixture.resume();
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        match store.inspect(&req.key).await {
            Ok(Some(info)) => {
                assert!(info.is_owned_by(&req.token), "the held request was applied");
                break;
            }
            _ if tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            other => panic!("not applied after resume: {other:?}"),
        }
    }
}

/// The digest of a lock's fence counter record (set `<lock set>#fence`, same user key).
fn fence_digest(entity: &str) -> [u8; 20] {
    Key::new(
        "test",
        "DC#farm1#distributed_lock#fence",
        Value::from(format!("orders#{entity}")),
    )
    .unwrap()
    .digest()
}

/// Waits (up to 10 s) until `b` acquires `entity`: it is unavailable while a's record lives.
async fn acquire_when_free(store: &AerospikeStore, entity: &str) -> leasehold::Lease {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match store
            .try_acquire(&acquire(entity, Duration::from_secs(30)))
            .await
        {
            Ok(lease) => return lease,
            Err(e) if e.is_unavailable() && tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// Fixture only: it pauses one acquirer between its steps (fault injection). Acquirer A is held
/// between its create and its fence step; then, made to take the verified steps (its
/// generation-checked increment answered `GENERATION_ERROR`), between the increment and the
/// fence write. Meanwhile its 1 s record expires and B acquires, holds and releases. A's
/// acquisition must fail (never a hold with a smaller token than B's), nothing of A's stays, and
/// the tokens of the successive holders B, C, B', C' strictly grow.
#[tokio::test]
async fn fencing_tokens_grow_in_hold_order_when_an_acquirer_pauses_between_its_steps() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let b = AerospikeStore::connect(config(&fixture)).await.unwrap();
    // A waits for its held request instead of timing out.
    let a = AerospikeStore::connect(
        config(&fixture)
            .total_timeout(Duration::from_secs(30))
            .socket_timeout(Duration::from_secs(30)),
    )
    .await
    .unwrap();
    let entity = "paused";
    let mut holders: Vec<(&str, u64)> = Vec::new();
    for step in ["create -> fence step", "increment -> fence write"] {
        // A's first request (the create, with the fence record's generation read in the same
        // batch) passes.
        fixture.faults().inject(
            Fault::PassThrough,
            Target::DigestTimes(lock_digest(entity), 1),
        );
        if step == "create -> fence step" {
            // Its next request on the fence record is the generation-checked increment.
            fixture
                .faults()
                .inject(Fault::Hold, Target::DigestTimes(fence_digest(entity), 1));
        } else {
            // The generation-checked increment is refused, the verified increment passes, and
            // A's next request on the lock record (the fence write) is held.
            fixture.faults().inject(
                Fault::ResultCode(leasehold_testkit::aerospike::result_code::GENERATION_ERROR),
                Target::DigestTimes(fence_digest(entity), 1),
            );
            fixture
                .faults()
                .inject(Fault::Hold, Target::DigestTimes(lock_digest(entity), 1));
        }
        let req_a = acquire(entity, Duration::from_secs(1));
        let paused = tokio::spawn({
            let (a, req_a) = (a.clone(), req_a.clone());
            async move { a.try_acquire(&req_a).await }
        });
        let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
        while fixture.faults().held() == 0 {
            assert!(tokio::time::Instant::now() < give_up, "A never got held");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        let seen = b.inspect(&key(entity)).await.unwrap().expect("A's record");
        assert!(seen.is_owned_by(&req_a.token), "{step}: A holds the record");
        assert_eq!(seen.fencing_token, None, "{step}: no token written yet");

        // B takes over once A's record expired, holds, releases.
        let lease_b = acquire_when_free(&b, entity).await;
        let token_b = lease_b.fencing_token().expect("fenced");
        let info = b.inspect(&key(entity)).await.unwrap().unwrap();
        assert_eq!(info.fencing_token, Some(token_b), "{step}");
        holders.push(("B", token_b));

        // A resumes while B holds: its acquisition fails, and what the record says of B's token
        // is never the counter A's steps moved on.
        fixture.faults().release_held();
        let err = paused
            .await
            .unwrap()
            .expect_err("A lost its record while paused");
        assert_eq!(err.kind(), ErrorKind::LockUnavailable, "{step}: {err}");
        let info = b.inspect(&key(entity)).await.unwrap().expect("B holds");
        assert!(info.is_owned_by(lease_b.token()), "{step}");
        assert!(
            info.fencing_token.is_none_or(|t| t == token_b),
            "{step}: B holds {token_b}, inspect says {:?}",
            info.fencing_token
        );
        assert!(b.release(&lease_b).await.unwrap());
        assert_eq!(b.inspect(&key(entity)).await.unwrap(), None, "{step}");
        assert_eq!(fixture.faults().pending(), 0, "{step}: every rule was used");

        // The next holder's token is larger than B's.
        let lease_c = acquire_when_free(&a, entity).await;
        holders.push(("C", lease_c.fencing_token().expect("fenced")));
        assert!(a.release(&lease_c).await.unwrap());
    }
    assert!(
        holders.windows(2).all(|w| w[0].1 < w[1].1),
        "tokens of successive holders grow: {holders:?}"
    );
}

#[tokio::test]
async fn an_in_doubt_permit_acquire_is_resolved_by_readback() {
    let (fixture, store) = setup().await;
    // At the store: the permit's operate lands but its reply is lost: InDoubt, and the record
    // holds the permit (inspect lists it, as the readback layer checks).
    let req = acquire("permit-doubt", Duration::from_secs(30))
        .with_mode(leasehold::LockMode::semaphore(2).unwrap());
    fixture.faults().inject(
        Fault::DropReply,
        Target::DigestTimes(lock_digest("permit-doubt"), 1),
    );
    let err = store.try_acquire(&req).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    let info = store
        .inspect(&req.key)
        .await
        .unwrap()
        .expect("the permit landed");
    assert!(info.is_owned_by(&req.token));
    assert_eq!(info.holders.len(), 1);

    // Through the manager with the readback layer: the caller simply gets the permit.
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let locks = LockManager::builder()
        .client_id("orders")
        .farm_id(FARM)
        .store(store.clone())
        .readback(ReadbackLayer::new())
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    fixture.faults().inject(
        Fault::DropReply,
        Target::DigestTimes(lock_digest("permit-doubt-2"), 1),
    );
    let guard = locks
        .try_semaphore("permit-doubt-2", 2)
        .await
        .expect("held after readback");
    assert_eq!(
        fixture.faults().pending(),
        0,
        "the acquire's reply was lost"
    );
    assert!(events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::RecoveredByReadback { held: true, .. })));
    let info = store
        .inspect(&key("permit-doubt-2"))
        .await
        .unwrap()
        .expect("held");
    assert_eq!(info.holders.len(), 1, "one permit, not two");
    assert!(guard.release().await.unwrap());
    assert_eq!(store.inspect(&key("permit-doubt-2")).await.unwrap(), None);
}

/// An acquisition the caller drops before its answer is undone in the background — also when the
/// dropped request lands after the undo (the undo travels on another pooled connection and can
/// overtake it): the undo looks again and removes what landed.
#[tokio::test]
async fn an_abandoned_acquisition_is_undone_even_when_its_request_lands_after_the_undo() {
    let (fixture, store) = setup().await;
    // The create's request waits in the fixture until released: the caller gives up first.
    fixture
        .faults()
        .inject(Fault::Hold, Target::DigestTimes(lock_digest("dropped"), 1));
    let req = acquire("dropped", Duration::from_secs(30));
    let dropped = tokio::time::timeout(Duration::from_millis(100), store.try_acquire(&req)).await;
    assert!(dropped.is_err(), "the caller stopped waiting");
    assert_eq!(fixture.faults().held(), 1);
    // The undo's first delete finds nothing; then the held create lands.
    tokio::time::sleep(Duration::from_millis(20)).await;
    land_held(&fixture).await;
    // Removed by the undo's next look, long before the record's 30 s TTL.
    removed_then_free(&store, "dropped", "the late create was never undone").await;
}

/// The undo of an abandoned acquisition rides out temporary errors: its release meets a busy
/// record (and its looks fail) while the dropped create lands; it keeps asking within the retry
/// budget and removes the lock once the node answers again, instead of leaving it to its TTL.
#[tokio::test]
async fn an_abandoned_acquisition_is_undone_after_its_first_undo_meets_a_temporary_error() {
    let (fixture, store) = setup().await;
    let digest = lock_digest("dropped-busy");
    fixture
        .faults()
        .inject(Fault::Hold, Target::DigestTimes(digest, 1));
    let req = acquire("dropped-busy", Duration::from_secs(30));
    // Once the create is held, every request on the record answers "key busy" (temporary):
    // the undo's first release among them, when the caller gives up.
    let attempt = tokio::time::timeout(Duration::from_millis(300), store.try_acquire(&req));
    let make_busy = async {
        while fixture.faults().held() == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let applied = fixture.faults().applied();
        let busy = fixture.faults().inject(
            Fault::ResultCode(leasehold_testkit::aerospike::result_code::KEY_BUSY),
            Target::Digest(digest),
        );
        (busy, applied)
    };
    let (dropped, (busy, applied)) = tokio::join!(attempt, make_busy);
    assert!(dropped.is_err(), "the caller stopped waiting");
    let refused = tokio::time::Instant::now() + Duration::from_secs(5);
    while fixture.faults().applied() == applied {
        assert!(
            tokio::time::Instant::now() < refused,
            "the undo's release met the busy record"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Then the held create lands, and a moment later the node answers again.
    fixture.faults().release_held();
    while fixture.faults().held() > 0 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(fixture.faults().remove(busy));
    // Removed by a later look, long before the record's 30 s TTL.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.inspect(&req.key).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the undo gave up at its first temporary error"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A node that lost its data (a restarted in-memory node, a record lost in a migration) loses
/// the fence counters with it: the next token starts from the server's clock, above every token
/// issued before, so the fenced resource accepts the new holder's writes at once.
#[tokio::test]
async fn tokens_stay_above_every_earlier_one_after_the_node_lost_its_data() {
    let (fixture, store) = setup().await;
    let mut before = Vec::new();
    for _ in 0..5 {
        let lease = store
            .try_acquire(&acquire("wiped", Duration::from_secs(30)))
            .await
            .unwrap();
        before.push(lease.fencing_token().expect("fenced"));
        assert!(store.release(&lease).await.unwrap());
    }
    assert!(before.windows(2).all(|w| w[1] > w[0]), "{before:?}");
    // A node's restart takes seconds; the clock's resolution is a millisecond, and the last
    // token must lie a millisecond or more behind the node's return (at most a thousand grants
    // of one key per millisecond: see docs/FENCING.md).
    tokio::time::sleep(Duration::from_millis(10)).await;
    fixture.clear();
    assert_eq!(fixture.total_record_count(), 0, "the counter is gone");
    let lease = store
        .try_acquire(&acquire("wiped", Duration::from_secs(30)))
        .await
        .unwrap();
    let after = lease.fencing_token().expect("fenced");
    assert!(
        after > *before.last().unwrap(),
        "{after} after {before:?}: from the clock, not from 1"
    );
}

/// A blocking attempt whose entry in the line the caller stops waiting for (its wait's deadline)
/// leaves the line when its wait ends, once the entry has landed: a try by another process then
/// gets the free key at once, instead of being refused behind the place for the waiter timeout.
#[tokio::test]
async fn a_blocking_attempt_abandoned_during_its_entry_leaves_the_line_with_its_wait() {
    use leasehold::core::{ReleaseWatch, Wait};
    let fixture = AerospikeFixture::start().await.unwrap();
    let fair = || {
        AerospikeConfig::new(fixture.host_string(), "test", FARM)
            .max_error_rate(0)
            .total_timeout(Duration::from_secs(2))
    };
    let holder = AerospikeStore::connect(fair()).await.unwrap();
    let waiter = AerospikeStore::connect(fair()).await.unwrap();
    let held = holder
        .try_acquire(&acquire("abandoned-entry", Duration::from_secs(30)))
        .await
        .unwrap();
    let queue_digest = Key::new(
        "test",
        leasehold_aerospike::layout::queue_set("DC#farm1#distributed_lock"),
        Value::from("orders#abandoned-entry"),
    )
    .unwrap()
    .digest();
    // The entry waits in the fixture until released: the caller gives up first.
    fixture
        .faults()
        .inject(Fault::Hold, Target::DigestTimes(queue_digest, 1));
    let watch: ReleaseWatch = waiter.watch(held.key()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let req = acquire("abandoned-entry", Duration::from_secs(30))
        .with_wait(Some(Wait::new(deadline, watch.waiter())));
    let dropped = tokio::time::timeout(Duration::from_millis(100), waiter.acquire(&req)).await;
    assert!(dropped.is_err(), "the caller stopped waiting");
    // The held entry lands; then the wait ends.
    land_held(&fixture).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(watch);
    assert!(holder.release(&held).await.unwrap());
    // Well inside the 5 s waiter timeout, a try gets the free key.
    let give_up = tokio::time::Instant::now() + Duration::from_secs(2);
    let next = loop {
        match holder
            .try_acquire(&acquire("abandoned-entry", Duration::from_secs(30)))
            .await
        {
            Ok(lease) => break lease,
            Err(e) if e.is_unavailable() && tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("the abandoned place still holds the line: {e}"),
        }
    };
    assert!(holder.release(&next).await.unwrap());
}

/// A node out of space (stop-writes) or with the key busy shipping to XDR refuses before it
/// applies anything: temporary, retried within the budget. A namespace that refuses writes with
/// a TTL (`FORBIDDEN`: `nsup-period` 0) is a setup error that says what to set.
#[tokio::test]
async fn refusals_for_room_are_temporary_and_a_forbidden_ttl_says_what_to_set() {
    let (fixture, store) = setup().await;
    let short = AerospikeStore::connect(config(&fixture).retry_budget(Duration::from_millis(300)))
        .await
        .unwrap();
    for (code, entity) in [(8, "out-of-space"), (32, "xdr-busy")] {
        let fault = fixture
            .faults()
            .inject(Fault::ResultCode(code), Target::Digest(lock_digest(entity)));
        let err = short
            .try_acquire(&acquire(entity, Duration::from_secs(30)))
            .await
            .unwrap_err();
        assert!(err.is_temporary(), "{code}: {err}");
        fixture.faults().remove(fault);
        assert_eq!(store.inspect(&key(entity)).await.unwrap(), None, "{code}");
    }
    let fault = fixture.faults().inject(
        Fault::ResultCode(22),
        Target::Digest(lock_digest("forbidden")),
    );
    let err = short
        .try_acquire(&acquire("forbidden", Duration::from_secs(30)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::StoreSetup, "{err}");
    assert!(err.to_string().contains("nsup-period"), "{err}");
    fixture.faults().remove(fault);
}

/// A permit's release whose first reply is lost (it landed) and whose later attempts all fail is
/// in doubt, not "retries exhausted": the first attempt may have removed the entry, so the
/// readback decides rather than the caller believing the permit is kept until its TTL.
#[tokio::test]
async fn a_permit_release_that_lost_a_reply_then_ran_out_of_budget_is_in_doubt() {
    let fixture = AerospikeFixture::start().await.unwrap();
    let store = AerospikeStore::connect(config(&fixture).retry_budget(Duration::from_millis(600)))
        .await
        .unwrap();
    let mode = leasehold::LockMode::semaphore(2).unwrap();
    let ours = store
        .try_acquire(&acquire("permit-gone", Duration::from_secs(30)).with_mode(mode))
        .await
        .unwrap();
    let other = store
        .try_acquire(&acquire("permit-gone", Duration::from_secs(30)).with_mode(mode))
        .await
        .unwrap();
    let digest = lock_digest("permit-gone");
    // The release lands but its reply is lost; every attempt after it is refused unapplied
    // (DEVICE_OVERLOAD: the node is overloaded).
    fixture
        .faults()
        .inject(Fault::DropReply, Target::DigestTimes(digest, 1));
    fixture
        .faults()
        .inject(Fault::ResultCode(18), Target::Digest(digest));
    let err = store.release(&ours).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert!(err.to_string().contains("may have been applied"), "{err}");
    assert!(
        err.to_string().contains("127.0.0.1"),
        "names the node: {err}"
    );
    assert!(
        err.chain().to_string().contains("Device overload"),
        "the cause kept: {}",
        err.chain()
    );
    fixture.faults().clear();
    let info = store.inspect(&key("permit-gone")).await.unwrap().unwrap();
    assert_eq!(info.holders.len(), 1, "the first attempt removed ours");
    assert!(info.is_owned_by(other.token()), "{info:?}");
}

/// A create whose reply was lost, then sent again and granted, can still land once the grant's
/// record is gone: after the caller released. Watched for and removed, long before its TTL, and
/// the caller's own record is never touched meanwhile.
#[tokio::test]
async fn a_create_in_doubt_that_lands_after_a_granted_retry_is_released_is_removed() {
    let (fixture, store) = setup().await;
    // The first create waits in the fixture past the client's timeout (in doubt); the readback
    // finds nothing, so the create is sent again and granted.
    fixture
        .faults()
        .inject(Fault::Hold, Target::DigestTimes(lock_digest("late"), 1));
    let req = acquire("late", Duration::from_secs(30));
    let lease = store
        .try_acquire(&req)
        .await
        .expect("granted by the second create");
    assert_eq!(fixture.faults().held(), 1, "the first create is still held");
    // Held across several of the sweep's looks: our live record is left alone.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let info = store.inspect(&req.key).await.unwrap().expect("still ours");
    assert!(info.is_owned_by(&req.token), "{info:?}");
    assert!(store.release(&lease).await.unwrap());
    // Now the first create lands, under our token.
    land_held(&fixture).await;
    removed_then_free(
        &store,
        "late",
        "the late create blocks the key until its 30 s TTL",
    )
    .await;
}

/// A fair store pair on a fresh fixture: one holds, one waits (a 2 s timeout, so a held entry
/// is given up by its caller, not by the client).
async fn fair_pair(fixture: &AerospikeFixture) -> (AerospikeStore, AerospikeStore) {
    let fair = || {
        AerospikeConfig::new(fixture.host_string(), "test", FARM)
            .max_error_rate(0)
            .total_timeout(Duration::from_secs(2))
    };
    (
        AerospikeStore::connect(fair()).await.unwrap(),
        AerospikeStore::connect(fair()).await.unwrap(),
    )
}

fn queue_digest(entity: &str) -> [u8; 20] {
    Key::new(
        "test",
        leasehold_aerospike::layout::queue_set("DC#farm1#distributed_lock"),
        Value::from(format!("orders#{entity}")),
    )
    .unwrap()
    .digest()
}

/// Runs the blocking attempt `req` until its entry into the line is held in the fixture, then
/// stops waiting for it (the task is cancelled, as a wait's deadline does).
async fn abandon_once_its_entry_is_held(
    fixture: &AerospikeFixture,
    waiter: &AerospikeStore,
    req: &Acquire,
) {
    let attempt = tokio::spawn({
        let (waiter, req) = (waiter.clone(), req.clone());
        async move { waiter.acquire(&req).await.map(drop) }
    });
    let arrived = tokio::time::Instant::now() + Duration::from_secs(5);
    while fixture.faults().held() == 0 {
        assert!(
            tokio::time::Instant::now() < arrived,
            "the entry reached the node"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    attempt.abort();
    assert!(attempt.await.unwrap_err().is_cancelled());
}

/// Lands the held entry after the wait left the line, frees the key, and expects a try to get
/// it well inside the 5 s waiter timeout (the place that landed late was removed).
async fn land_late_then_try(fixture: &AerospikeFixture, holder: &AerospikeStore, held: Lease) {
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(fixture.faults().held(), 1, "the entry has not landed yet");
    land_held(fixture).await;
    assert!(holder.release(&held).await.unwrap());
    let give_up = tokio::time::Instant::now() + Duration::from_secs(2);
    let next = loop {
        match holder
            .try_acquire(&Acquire::new(
                held.key().clone(),
                OwnerToken::generate(),
                Duration::from_secs(30),
            ))
            .await
        {
            Ok(lease) => break lease,
            Err(e) if e.is_unavailable() && tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(20)).await
            }
            Err(e) => panic!("the place that landed after the leave holds the line: {e}"),
        }
    };
    assert!(holder.release(&next).await.unwrap());
}

/// An entry into the line whose caller stopped waiting can reach the node after the wait left
/// the line (it travels on its own pooled connection): the leave looks again and removes the
/// place, so a try gets the free key instead of being refused behind it for the waiter timeout.
#[tokio::test]
async fn an_entry_that_lands_after_its_wait_left_the_line_is_removed() {
    use leasehold::core::{ReleaseWatch, Wait};
    let fixture = AerospikeFixture::start().await.unwrap();
    let (holder, waiter) = fair_pair(&fixture).await;
    let held = holder
        .try_acquire(&acquire("late-entry", Duration::from_secs(30)))
        .await
        .unwrap();
    fixture.faults().inject(
        Fault::Hold,
        Target::DigestTimes(queue_digest("late-entry"), 1),
    );
    let watch: ReleaseWatch = waiter.watch(held.key()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let req = acquire("late-entry", Duration::from_secs(30))
        .with_wait(Some(Wait::new(deadline, watch.waiter())));
    abandon_once_its_entry_is_held(&fixture, &waiter, &req).await;
    // The wait ends, and its leave is answered, while the entry is still held.
    drop(watch);
    land_late_then_try(&fixture, &holder, held).await;
}

/// The same when the process already had a place: its wait's leave removes that one, and the
/// entry refreshing it, still in flight, lands after.
#[tokio::test]
async fn an_entry_that_lands_after_the_leave_removed_an_earlier_place_is_removed() {
    use leasehold::core::{ReleaseWatch, Wait};
    let fixture = AerospikeFixture::start().await.unwrap();
    let (holder, waiter) = fair_pair(&fixture).await;
    let held = holder
        .try_acquire(&acquire("late-again", Duration::from_secs(30)))
        .await
        .unwrap();
    let watch: ReleaseWatch = waiter.watch(held.key()).await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let req = acquire("late-again", Duration::from_secs(30))
        .with_wait(Some(Wait::new(deadline, watch.waiter())));
    // A first attempt takes a place, answered, and is refused: the key is held.
    let first = waiter.acquire(&req).await;
    assert!(
        matches!(first, Ok(ref attempt) if !attempt.is_granted()),
        "{first:?}"
    );
    // Past a third of the waiter timeout the next attempt enters again (refreshing its place);
    // that entry is held, and its caller stops waiting.
    tokio::time::sleep(Duration::from_millis(1800)).await;
    fixture.faults().inject(
        Fault::Hold,
        Target::DigestTimes(queue_digest("late-again"), 1),
    );
    abandon_once_its_entry_is_held(&fixture, &waiter, &req).await;
    drop(watch);
    land_late_then_try(&fixture, &holder, held).await;
}
