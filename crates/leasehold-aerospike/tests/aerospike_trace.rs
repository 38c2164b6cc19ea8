//! The lock trace (per-key history) on Aerospike: written by every traced operation into the
//! key's history record, read back newest first, bounded and expiring; through the store and
//! through the manager. Against a real cluster when `AEROSPIKE_HOSTS` is set, the wire fixture
//! otherwise (never skipped); the trace-write failure test needs fault injection and runs on the
//! fixture only.
//!
//! ```sh
//! AEROSPIKE_HOSTS=10.0.0.5:3000 cargo test -p leasehold-aerospike --test aerospike_trace
//! ```

use std::time::Duration;

use aerospike::{Bins, ClientPolicy, ReadPolicy, ResultCode, WritePolicy};
use leasehold::core::{Acquire, HistoryEntry, HistoryEvent, TraceConfig, Wait, WaiterId};
use leasehold::scenario::{Scenario, ScenarioRegistry};
use leasehold::{ErrorKind, LockKey, LockManager, LockMode, LockStore, OwnerToken};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::{result_code, AerospikeTarget, Fault, Target};

const FARM: &str = "farm1";

fn config(target: &AerospikeTarget, fencing: bool) -> AerospikeConfig {
    let mut config = AerospikeConfig::new(target.hosts(), target.namespace(), FARM)
        .fencing(fencing)
        .max_error_rate(0);
    if let Some((user, password)) = target.credentials() {
        config = config.credentials(user, password);
    }
    config
}

async fn setup(fencing: bool) -> (AerospikeTarget, AerospikeStore) {
    let target = AerospikeTarget::from_env()
        .await
        .expect("start the fixture");
    eprintln!("running against {target}");
    let store = AerospikeStore::connect(config(&target, fencing))
        .await
        .expect("connect");
    (target, store)
}

fn key(target: &AerospikeTarget, entity: &str) -> LockKey {
    LockKey::dc(FARM, "trace", &target.unique(entity)).unwrap()
}

fn events(history: &[HistoryEntry]) -> Vec<HistoryEvent> {
    history.iter().map(|e| e.event).collect()
}

async fn raw_client(target: &AerospikeTarget) -> aerospike::Client {
    let mut policy = ClientPolicy::default();
    if let Some((user, password)) = target.credentials() {
        policy.auth_mode = aerospike::policy::AuthMode::Internal(user.into(), password.into());
    }
    aerospike::Client::new(&policy, &target.hosts().to_owned())
        .await
        .unwrap()
}

async fn check_trace(fencing: bool) {
    let (target, store) = setup(fencing).await;
    let trace = TraceConfig::new(3, Duration::from_secs(60)).unwrap();
    let k = key(&target, if fencing { "fenced" } else { "plain" });
    let req = || {
        Acquire::new(k.clone(), OwnerToken::generate(), Duration::from_secs(30))
            .with_trace(Some(trace))
    };

    let first = req();
    let lease = store.try_acquire(&first).await.unwrap();
    assert_eq!(lease.trace(), Some(&trace), "the lease carries the trace");
    let refused = req();
    assert!(store
        .try_acquire(&refused)
        .await
        .unwrap_err()
        .is_unavailable());
    let lease = store.extend(&lease, Duration::from_secs(30)).await.unwrap();
    assert!(store.release(&lease).await.unwrap());
    assert!(!store.release(&lease).await.unwrap());

    // Newest first, bounded to 3: the first `acquired` was trimmed away; a renewal that worked
    // writes nothing.
    let history = store.history(&k).await.unwrap();
    assert_eq!(
        events(&history),
        [
            HistoryEvent::NotHeld,
            HistoryEvent::Released,
            HistoryEvent::Refused
        ]
    );
    assert_eq!(history[1].token, first.token.as_str());
    assert_eq!(history[2].token, refused.token.as_str());
    assert_eq!(history[0].pid, std::process::id());
    assert!(!history[0].host.is_empty());

    // A lost lease: the failed extend writes `lost`.
    let lease = store.try_acquire(&req()).await.unwrap();
    let client = raw_client(&target).await;
    client
        .delete(&WritePolicy::default(), &store.record_key(&k).unwrap())
        .await
        .unwrap();
    let error = store
        .extend(&lease, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotHeld);
    let history = store.history(&k).await.unwrap();
    assert_eq!(
        events(&history)[..2],
        [HistoryEvent::Lost, HistoryEvent::Acquired]
    );

    // Expiring: the history record carries the trace TTL, set again by each write.
    let record = client
        .get(
            &ReadPolicy::default(),
            &store.trace_key(&k).unwrap(),
            Bins::All,
        )
        .await
        .unwrap();
    let ttl = record.time_to_live().expect("the history expires");
    assert!(
        ttl > Duration::from_secs(50) && ttl <= Duration::from_secs(60),
        "{ttl:?}"
    );
    // The lock record itself is untouched by the trace (no trace bin in the Java layout).
    let lease = store.try_acquire(&req()).await.unwrap();
    let lock = client
        .get(
            &ReadPolicy::default(),
            &store.record_key(&k).unwrap(),
            Bins::All,
        )
        .await
        .unwrap();
    assert!(!lock.bins.contains_key("lh_trace"), "{lock:?}");
    store.release(&lease).await.unwrap();

    // Untraced operations write nothing.
    let other = key(&target, "untraced");
    let lease = store
        .try_acquire(&Acquire::new(
            other.clone(),
            OwnerToken::generate(),
            Duration::from_secs(5),
        ))
        .await
        .unwrap();
    store.release(&lease).await.unwrap();
    assert!(store.history(&other).await.unwrap().is_empty());
    let gone = client
        .get(
            &ReadPolicy::default(),
            &store.trace_key(&other).unwrap(),
            Bins::All,
        )
        .await
        .unwrap_err();
    assert_eq!(
        gone.server_result_code(),
        Some(ResultCode::KeyNotFoundError)
    );
}

#[tokio::test]
async fn acquire_release_and_extend_are_traced_and_read_back_newest_first() {
    check_trace(false).await;
}

#[tokio::test]
async fn fenced_acquisitions_are_traced_too() {
    check_trace(true).await;
}

#[tokio::test]
async fn the_history_keeps_the_newest_entries_only() {
    let (target, store) = setup(false).await;
    let k = key(&target, "bounded");
    let trace = TraceConfig::new(4, Duration::from_secs(60)).unwrap();
    let tokens: Vec<OwnerToken> = (0..10).map(|_| OwnerToken::generate()).collect();
    for (n, token) in tokens.iter().enumerate() {
        let entry = HistoryEntry::new(HistoryEvent::Skipped, token, format!("entry {n}"));
        store.append_history(&k, &trace, &entry).await.unwrap();
    }
    let history = store.history(&k).await.unwrap();
    let details: Vec<&str> = history.iter().map(|e| e.detail.as_str()).collect();
    assert_eq!(details, ["entry 9", "entry 8", "entry 7", "entry 6"]);
    assert_eq!(history[0].token, tokens[9].as_str());
}

#[tokio::test]
async fn the_history_expires_its_ttl_after_the_last_write() {
    let (target, store) = setup(false).await;
    let k = key(&target, "expiring");
    let trace = TraceConfig::new(10, Duration::from_secs(1)).unwrap();
    let req = Acquire::new(k.clone(), OwnerToken::generate(), Duration::from_secs(5))
        .with_trace(Some(trace));
    let lease = store.try_acquire(&req).await.unwrap();
    store.release(&lease).await.unwrap();
    assert_eq!(store.history(&k).await.unwrap().len(), 2);
    // Real time on both the fixture and a cluster: the record expires after 1 s (a cluster's
    // expiry is checked on read, so the history reads empty as soon as it has passed).
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    while !store.history(&k).await.unwrap().is_empty() {
        assert!(
            tokio::time::Instant::now() < give_up,
            "the history never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn read_write_locks_and_semaphores_are_traced() {
    let (target, store) = setup(false).await;
    let trace = TraceConfig::default();
    let k = key(&target, "shared");
    let acquire = |mode| {
        Acquire::new(k.clone(), OwnerToken::generate(), Duration::from_secs(30))
            .with_mode(mode)
            .with_trace(Some(trace))
    };
    let reader = store.try_acquire(&acquire(LockMode::Shared)).await.unwrap();
    assert_eq!(reader.trace(), Some(&trace));
    let writer = acquire(LockMode::Exclusive);
    assert!(store
        .try_acquire(&writer)
        .await
        .unwrap_err()
        .is_unavailable());
    store
        .extend(&reader, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(store.release(&reader).await.unwrap());
    let history = store.history(&k).await.unwrap();
    assert_eq!(
        events(&history),
        [
            HistoryEvent::Released,
            HistoryEvent::Refused,
            HistoryEvent::Acquired
        ]
    );
    assert_eq!(history[1].token, writer.token.as_str());
    assert!(history[2].detail.starts_with("shared"), "{:?}", history[2]);

    let permits = LockMode::semaphore(1).unwrap();
    let s = key(&target, "semaphore");
    let acquire = |mode| {
        Acquire::new(s.clone(), OwnerToken::generate(), Duration::from_secs(30))
            .with_mode(mode)
            .with_trace(Some(trace))
    };
    let holder = store.try_acquire(&acquire(permits)).await.unwrap();
    let waiting = acquire(permits).with_wait(Some(Wait::new(
        tokio::time::Instant::now() + Duration::from_secs(5),
        WaiterId::new(),
    )));
    assert!(store
        .try_acquire(&waiting)
        .await
        .unwrap_err()
        .is_unavailable());
    assert!(store.release(&holder).await.unwrap());
    let history = store.history(&s).await.unwrap();
    assert_eq!(
        events(&history),
        [
            HistoryEvent::Released,
            HistoryEvent::Waited,
            HistoryEvent::Acquired
        ],
        "a blocking attempt that found every permit taken waited"
    );
}

#[tokio::test]
async fn a_traced_scenario_records_waits_and_skipped_releases_through_the_manager() {
    let (target, store) = setup(false).await;
    let entity = target.unique("job-1");
    let registry = ScenarioRegistry::new()
        .with(
            Scenario::new("jobs")
                .keys("job-*")
                .ttl(Duration::from_millis(1200))
                .wait(Duration::from_millis(100))
                .trace(TraceConfig::default()),
        )
        .unwrap();
    let locks = LockManager::builder()
        .client_id("trace")
        .farm_id(FARM)
        .store(store)
        .scenarios(registry)
        .local_competition(false)
        .build()
        .unwrap();
    let holder = locks.acquire(entity.as_str()).await.unwrap();
    // Another instance waits and gives up.
    let other = LockManager::builder()
        .client_id("trace")
        .farm_id(FARM)
        .store(
            AerospikeStore::connect(config(&target, false))
                .await
                .unwrap(),
        )
        .scenarios(locks.scenarios().clone())
        .build()
        .unwrap();
    assert_eq!(
        other.acquire(entity.as_str()).await.unwrap_err().kind(),
        ErrorKind::Timeout
    );
    // The holder releases after its unlock window closed: skipped, and recorded.
    tokio::time::sleep(Duration::from_millis(1300)).await;
    assert!(!holder.release().await.unwrap());
    let events = events(&locks.history(entity.as_str()).await.unwrap());
    assert_eq!(events.first(), Some(&HistoryEvent::Skipped), "{events:?}");
    assert!(events.contains(&HistoryEvent::Waited), "{events:?}");
    assert_eq!(events.last(), Some(&HistoryEvent::Acquired), "{events:?}");
}

/// Fixture only (fault injection): a trace write that fails never fails the lock operation nor
/// hides a lock held.
#[tokio::test]
async fn a_failed_trace_write_leaves_the_lock_operation_as_it_was() {
    let target = AerospikeTarget::fixture_only().await.unwrap();
    let store = AerospikeStore::connect(config(&target, false))
        .await
        .unwrap();
    let fixture = target.fixture().expect("a fixture");
    let k = key(&target, "trace-down");
    let trace_digest = store.trace_key(&k).unwrap().digest();
    fixture.faults().inject(
        Fault::ResultCode(result_code::SERVER_ERROR),
        Target::Digest(trace_digest),
    );
    let req = Acquire::new(k.clone(), OwnerToken::generate(), Duration::from_secs(30))
        .with_trace(Some(TraceConfig::default()));
    let lease = store
        .try_acquire(&req)
        .await
        .expect("acquired all the same");
    assert!(store.inspect(&k).await.unwrap().is_some(), "and held");
    let refused = Acquire::new(k.clone(), OwnerToken::generate(), Duration::from_secs(30))
        .with_trace(Some(TraceConfig::default()));
    assert!(store
        .try_acquire(&refused)
        .await
        .unwrap_err()
        .is_unavailable());
    store.extend(&lease, Duration::from_secs(30)).await.unwrap();
    assert!(store.release(&lease).await.unwrap());
    // `append_history` (the unlock window's own write) does report the failure.
    let entry = HistoryEntry::new(HistoryEvent::Skipped, &req.token, "late");
    let error = store
        .append_history(&k, &TraceConfig::default(), &entry)
        .await
        .unwrap_err();
    assert!(error.to_string().contains("trace"), "{error}");
    fixture.faults().clear();
    assert!(store.history(&k).await.unwrap().is_empty());
}

/// Fixture only (it counts the data requests): what the trace costs, as docs/AEROSPIKE.md says.
/// One more round trip per traced acquire and release, none per renewal that works, none for an
/// untraced lock.
#[tokio::test]
async fn a_traced_operation_costs_one_more_round_trip() {
    let target = AerospikeTarget::fixture_only().await.unwrap();
    // First-come, so the count is the lock record's and the trace's alone (a fair try-lock reads
    // the waiter line first: one more, in docs/AEROSPIKE.md's fair waiting section).
    let store = AerospikeStore::connect(config(&target, false).fair(false))
        .await
        .unwrap();
    let faults = target.fixture().expect("a fixture").faults();
    faults.inject(Fault::PassThrough, Target::NextRequests(u32::MAX));
    let cycle = |trace: Option<TraceConfig>, entity: &'static str| {
        let req = Acquire::new(
            key(&target, entity),
            OwnerToken::generate(),
            Duration::from_secs(30),
        )
        .with_trace(trace);
        let store = store.clone();
        async move {
            let before = faults.applied();
            let lease = store.try_acquire(&req).await.unwrap();
            let lease = store.extend(&lease, Duration::from_secs(30)).await.unwrap();
            store.release(&lease).await.unwrap();
            faults.applied() - before
        }
    };
    assert_eq!(cycle(None, "plain").await, 3, "create, touch, delete");
    assert_eq!(
        cycle(Some(TraceConfig::default()), "traced").await,
        5,
        "and one history operate after the acquire and after the release"
    );
}
