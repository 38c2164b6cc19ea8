//! Scenarios on a real redis-server: each store-down policy against a server the test stops, and
//! the lock trace (history) written in the same scripts and read back, bounded and expiring.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::core::{Acquire, HistoryEvent, TraceConfig};
use leasehold::scenario::{AcquireMode, Scenario, ScenarioRegistry, StoreDownPolicy};
use leasehold::{ErrorKind, LockEvent, LockKey, LockManager, LockOptions, LockStore, OwnerToken};
use leasehold_redis::{RedisConfig, RedisStore};
use leasehold_testkit::redis::RedisServer;

async fn connect(server: &RedisServer, fair: bool) -> RedisStore {
    RedisStore::connect(
        RedisConfig::new(server.url())
            .response_timeout(Duration::from_millis(300))
            .connect_timeout(Duration::from_millis(300))
            .fair(fair),
    )
    .await
    .expect("connect")
}

#[tokio::test]
async fn fail_closes_and_proceed_opens_with_an_alert_every_time() {
    let mut server = RedisServer::start().expect("redis-server");
    let store = connect(&server, true).await;
    let alerts = Arc::new(Mutex::new(Vec::new()));
    let sink = alerts.clone();
    let registry = ScenarioRegistry::new()
        .with(Scenario::new("payments").keys("pay-*"))
        .unwrap()
        .with(
            Scenario::new("feed")
                .keys("feed-*")
                .mode(AcquireMode::Try)
                .on_store_down(StoreDownPolicy::Proceed),
        )
        .unwrap();
    let locks = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .store(store)
        .scenarios(registry)
        .observer(move |e: &LockEvent| {
            if let LockEvent::ProceededWithoutLock { scenario, .. } = e {
                sink.lock().unwrap().push(scenario.to_string());
            }
        })
        .build()
        .unwrap();
    // Up: both scenarios take real locks.
    let guard = locks.acquire("feed-1").await.unwrap();
    assert!(!guard.is_unprotected());
    assert!(guard.release().await.unwrap());

    server.stop();

    // Down, fail (the default): the error, and no guard.
    let error = locks
        .lock_with("pay-1", LockOptions::new().wait(Duration::from_millis(100)))
        .await
        .unwrap_err();
    assert!(
        matches!(
            error.kind(),
            ErrorKind::Connection | ErrorKind::RetriesExhausted | ErrorKind::InDoubt
        ),
        "{error}"
    );
    // Down, proceed: a guard that holds nothing, and an alert each time.
    for _ in 0..2 {
        let guard = locks.acquire("feed-2").await.unwrap();
        assert!(guard.is_unprotected());
        assert!(!guard.is_held());
        assert_eq!(guard.scenario(), "feed");
        assert!(!guard.release().await.unwrap());
    }
    assert_eq!(*alerts.lock().unwrap(), ["feed", "feed"]);
}

fn key(entity: &str) -> LockKey {
    LockKey::dc("eu1", "trace", entity).unwrap()
}

async fn check_trace_on(fair: bool) {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server, fair).await;
    let trace = TraceConfig::new(3, Duration::from_secs(60)).unwrap();
    let k = key(if fair { "fair" } else { "plain" });
    let req = || {
        Acquire::new(k.clone(), OwnerToken::generate(), Duration::from_secs(30))
            .with_trace(Some(trace))
    };

    let first = req();
    let lease = store.try_acquire(&first).await.unwrap();
    assert_eq!(lease.trace(), Some(&trace));
    let refused = req();
    assert!(store
        .try_acquire(&refused)
        .await
        .unwrap_err()
        .is_unavailable());
    assert!(store.release(&lease).await.unwrap());
    assert!(!store.release(&lease).await.unwrap());

    // Newest first, bounded to 3: the first `acquired` was trimmed away.
    let history = store.history(&k).await.unwrap();
    let events: Vec<_> = history.iter().map(|e| e.event).collect();
    assert_eq!(
        events,
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
    server.command(&["DEL", &store.lock_key(&k)]).unwrap();
    let error = store
        .extend(&lease, Duration::from_secs(30))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::NotHeld);
    assert_eq!(
        store.history(&k).await.unwrap()[0].event,
        HistoryEvent::Lost
    );

    // Expiring: the list carries the trace TTL, renewed by each write.
    let pttl: i64 = server
        .command(&["PTTL", &store.trace_key(&k)])
        .unwrap()
        .trim_start_matches(':')
        .parse()
        .unwrap();
    assert!(pttl > 0 && pttl <= 60_000, "{pttl}");
    server
        .command(&["PEXPIRE", &store.trace_key(&k), "1"])
        .unwrap();
    let gone = async {
        while !store.history(&k).await.unwrap().is_empty() {
            tokio::task::yield_now().await;
        }
    };
    tokio::time::timeout(Duration::from_secs(5), gone)
        .await
        .unwrap();

    // Untraced operations write nothing.
    let other = key("untraced");
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
}

#[tokio::test]
async fn the_trace_is_written_by_the_scripts_and_read_back() {
    check_trace_on(true).await;
}

#[tokio::test]
async fn the_trace_is_written_without_fair_waiting_too() {
    check_trace_on(false).await;
}

#[tokio::test]
async fn a_traced_scenario_records_waits_and_skipped_releases_through_the_manager() {
    let server = RedisServer::start().expect("redis-server");
    let store = connect(&server, true).await;
    let registry = ScenarioRegistry::new()
        .with(
            Scenario::new("jobs")
                .keys("job-*")
                .ttl(Duration::from_millis(300))
                .wait(Duration::from_millis(50))
                .trace(TraceConfig::default()),
        )
        .unwrap();
    let locks = LockManager::builder()
        .client_id("trace")
        .farm_id("eu1")
        .store(store)
        .scenarios(registry)
        .local_competition(false)
        .build()
        .unwrap();
    let holder = locks.acquire("job-1").await.unwrap();
    // Another manager (another instance) waits and gives up.
    let other = LockManager::builder()
        .client_id("trace")
        .farm_id("eu1")
        .store(connect(&server, true).await)
        .scenarios(locks.scenarios().clone())
        .build()
        .unwrap();
    assert_eq!(
        other.acquire("job-1").await.unwrap_err().kind(),
        ErrorKind::Timeout
    );
    // The holder releases after its unlock window closed: skipped, and recorded.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!holder.release().await.unwrap());
    let events: Vec<_> = locks
        .history("job-1")
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event)
        .collect();
    assert_eq!(events.first(), Some(&HistoryEvent::Skipped), "{events:?}");
    assert!(events.contains(&HistoryEvent::Waited), "{events:?}");
    assert_eq!(events.last(), Some(&HistoryEvent::Acquired), "{events:?}");
}
