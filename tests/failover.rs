//! The manager rides out a failover, against a scripted store on paused time: a blocking acquire
//! retries a down store within its wait, an attempt in doubt is undone, a try-lock answers at
//! once, `on_store_down = proceed` proceeds only once the wait is spent, and a guard's release
//! retries within its budget. The same against a real redis-server behind a fault proxy is in
//! `crates/leasehold-redis/tests/failover_manager.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::core::Attempt;
use leasehold::observe::LockTrace;
use leasehold::scenario::{AcquireMode, Scenario, ScenarioRegistry, StoreDownPolicy};
use leasehold::{Error, ErrorKind, LockEvent, LockManager, LockOptions};
use leasehold_testkit::scripted::{reply_lost, Op, ScriptedStore};
use tokio::time::Instant;

fn refused() -> Error {
    Error::connection("cannot reach 127.0.0.1:1").with_source(std::io::Error::other("refused"))
}

type Events = Arc<Mutex<Vec<LockEvent>>>;

/// A manager over `store` without renewal, recording its events (and keeping a lock trace).
fn manager(store: &ScriptedStore, registry: ScenarioRegistry) -> (LockManager, Events, LockTrace) {
    let events: Events = Arc::default();
    let sink = events.clone();
    let trace = LockTrace::new(64);
    let locks = LockManager::builder()
        .observer(trace.clone())
        .client_id("test")
        .farm_id("f1")
        .store(store.clone())
        .renewal(false)
        .scenarios(registry)
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.clone()))
        .build()
        .unwrap();
    (locks, events, trace)
}

#[tokio::test(start_paused = true)]
async fn a_blocking_acquire_retries_a_down_store_and_gets_the_lock_once_it_is_back() {
    let store = ScriptedStore::new();
    store
        .expect_acquire(Err(refused()))
        .expect_acquire(Err(Error::new(ErrorKind::RetriesExhausted, "TRYAGAIN")))
        .expect_acquire(Err(refused()))
        .grant_acquire()
        .expect_release(Ok(true));
    let (locks, events, _) = manager(&store, ScenarioRegistry::new());
    let guard = locks
        .lock_with("k", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(guard.is_held());
    let attempts = events.lock().unwrap().iter().find_map(|e| match e {
        LockEvent::Acquired { attempts, .. } => Some(*attempts),
        _ => None,
    });
    assert_eq!(attempts, Some(4));
    assert!(guard.release().await.unwrap());
    store.verify();
}

#[tokio::test(start_paused = true)]
async fn an_attempt_in_doubt_is_undone_before_the_wait_goes_on() {
    let store = ScriptedStore::new();
    // In doubt, and the readback fails too: the attempt may have taken the lock.
    store
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Err(refused()))
        .grant_acquire()
        .expect_release(Ok(true))
        .expect_release(Ok(true));
    let (locks, _, _) = manager(&store, ScenarioRegistry::new());
    let guard = locks
        .lock_with("k", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    // Let the background undo run.
    tokio::time::sleep(Duration::from_millis(10)).await;
    let calls = store.calls();
    let acquires: Vec<_> = calls.iter().filter(|c| c.op == Op::Acquire).collect();
    let releases: Vec<_> = calls.iter().filter(|c| c.op == Op::Release).collect();
    assert_eq!(acquires.len(), 2);
    assert_eq!(releases.len(), 1, "the in-doubt attempt was undone");
    assert_eq!(releases[0].token, acquires[0].token, "with its own token");
    assert_ne!(
        acquires[1].token, acquires[0].token,
        "each attempt has a fresh token"
    );
    assert_eq!(Some(guard.token()), acquires[1].token.as_ref());
    assert!(guard.release().await.unwrap());
    store.verify();
}

#[tokio::test(start_paused = true)]
async fn a_store_down_for_the_whole_wait_reports_the_last_store_error_and_a_try_answers_at_once() {
    let store = ScriptedStore::new();
    for _ in 0..100 {
        store.expect_acquire(Err(refused()));
    }
    let (locks, events, _) = manager(&store, ScenarioRegistry::new());
    let wait = Duration::from_secs(2);
    let started = Instant::now();
    let err = locks
        .lock_with("k", LockOptions::new().wait(wait))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    assert!(started.elapsed() >= wait);
    let attempts = store.count(Op::Acquire);
    assert!(attempts > 2, "{attempts}");
    assert!(events.lock().unwrap().iter().any(|e| matches!(
        e,
        LockEvent::AcquireFailed { error: ErrorKind::Connection, attempts: n, .. } if *n as usize == attempts
    )));

    let started = Instant::now();
    let err = locks.try_lock("k").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection);
    assert_eq!(started.elapsed(), Duration::ZERO, "no sleep on paused time");
    assert_eq!(store.count(Op::Acquire), attempts + 1);
}

#[tokio::test(start_paused = true)]
async fn a_refusal_last_is_a_timeout_even_after_store_errors() {
    let store = ScriptedStore::new();
    store.expect_acquire(Err(refused()));
    for _ in 0..100 {
        store.refuse_acquire();
    }
    let (locks, _, _) = manager(&store, ScenarioRegistry::new());
    let err = locks
        .lock_with("k", LockOptions::new().wait(Duration::from_secs(1)))
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
}

#[tokio::test(start_paused = true)]
async fn proceed_on_store_down_waits_out_the_wait_first_and_a_try_proceeds_at_once() {
    let registry = ScenarioRegistry::new()
        .with(
            Scenario::new("feed")
                .keys("feed-*")
                .wait(Duration::from_secs(1))
                .on_store_down(StoreDownPolicy::Proceed),
        )
        .unwrap()
        .with(
            Scenario::new("poll")
                .keys("poll-*")
                .mode(AcquireMode::Try)
                .on_store_down(StoreDownPolicy::Proceed),
        )
        .unwrap();
    let store = ScriptedStore::new();
    // Down for a moment, then back: the blocking call gets the real lock.
    store
        .expect_acquire(Err(refused()))
        .grant_acquire()
        .expect_release(Ok(true));
    let (locks, events, _) = manager(&store, registry);
    let guard = locks.acquire("feed-1").await.unwrap();
    assert!(!guard.is_unprotected(), "the failover was ridden out");
    assert!(guard.release().await.unwrap());

    // Down for the whole wait: proceeds without the lock, once the wait is spent.
    for _ in 0..100 {
        store.expect_acquire(Err(refused()));
    }
    let started = Instant::now();
    let guard = locks.acquire("feed-2").await.unwrap();
    assert!(guard.is_unprotected());
    assert!(started.elapsed() >= Duration::from_secs(1));
    let before = store.count(Op::Acquire);

    // A try-only scenario proceeds after its one attempt.
    let started = Instant::now();
    let guard = locks.acquire("poll-1").await.unwrap();
    assert!(guard.is_unprotected());
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(store.count(Op::Acquire), before + 1);
    let proceeded = events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| matches!(e, LockEvent::ProceededWithoutLock { .. }))
        .count();
    assert_eq!(proceeded, 2);
}

#[tokio::test(start_paused = true)]
async fn a_guards_release_retries_and_when_the_store_stays_down_says_the_lock_is_left_to_expire() {
    let store = ScriptedStore::new();
    store
        .grant_acquire()
        .expect_release(Err(refused()))
        .expect_release(Err(reply_lost()))
        .expect_inspect(Err(refused()))
        .expect_release(Ok(true));
    let (locks, events, trace) = manager(&store, ScenarioRegistry::new());
    let guard = locks
        .try_lock_with("k", LockOptions::new().ttl(Duration::from_secs(5)))
        .await
        .unwrap();
    assert!(
        guard.release().await.unwrap(),
        "released once the store was back"
    );
    store.verify();

    store.grant_acquire();
    for _ in 0..100 {
        store.expect_release(Err(refused()));
    }
    let ttl = Duration::from_secs(2);
    let guard = locks
        .try_lock_with("k", LockOptions::new().ttl(ttl))
        .await
        .unwrap();
    let err = guard.release().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection);
    assert!(err.to_string().contains("left to expire in"), "{err}");
    let left = events.lock().unwrap().iter().find_map(|e| match e {
        LockEvent::LeftToExpire {
            error, expires_in, ..
        } => Some((*error, *expires_in)),
        _ => None,
    });
    let (kind, expires_in) = left.expect("a LeftToExpire event");
    assert_eq!(kind, ErrorKind::Connection);
    assert!(expires_in < ttl);
    let entry = trace
        .entries()
        .into_iter()
        .find(|e| e.event == "left_to_expire")
        .expect("in the lock trace");
    assert!(
        entry.detail.contains("left to expire in"),
        "{}",
        entry.detail
    );
}

/// An attempt in doubt whose write lands after its undo (a paused server applies it late) would
/// hold the lock for nobody until its TTL: the wait recognises its own token as the holder,
/// releases it, and takes the lock.
#[tokio::test(start_paused = true)]
async fn an_attempt_that_lands_after_its_undo_is_released_when_the_wait_finds_it_holding() {
    let store = ScriptedStore::new();
    let first: Arc<Mutex<Option<leasehold::OwnerToken>>> = Arc::default();
    let key = leasehold::LockKey::dc("f1", "test", "k").unwrap();
    let seen = first.clone();
    store
        // In doubt, and the readback cannot tell.
        .expect_acquire_with(move |req| {
            *seen.lock().unwrap() = Some(req.token.clone());
            Err(reply_lost())
        })
        .expect_inspect(Err(refused()))
        // Its undo finds nothing yet: the write has not landed.
        .expect_release(Ok(false))
        // Then it lands: the next attempt is refused, and the holder is that first attempt.
        .expect_acquire(Ok(Attempt::refused()));
    let holder = first.clone();
    let held = key.clone();
    store
        .expect_inspect_with(move |_| {
            Ok(Some(leasehold::LockInfo::new(
                held,
                holder.lock().unwrap().clone(),
            )))
        })
        .expect_release(Ok(true))
        .grant_acquire()
        .expect_release(Ok(true));
    let (locks, _, _) = manager(&store, ScenarioRegistry::new());
    let guard = locks
        .lock_with("k", LockOptions::new().wait(Duration::from_secs(5)))
        .await
        .unwrap();
    let first = first.lock().unwrap().clone().unwrap();
    let released: Vec<_> = store
        .calls()
        .into_iter()
        .filter(|c| c.op == Op::Release)
        .map(|c| c.token.unwrap())
        .collect();
    assert_eq!(
        released,
        [first.clone(), first],
        "undone, then released once it landed"
    );
    assert!(guard.release().await.unwrap());
    store.verify();
}

#[tokio::test(start_paused = true)]
async fn a_failed_multi_lock_that_cannot_give_its_keys_back_says_so() {
    let store = ScriptedStore::new();
    store
        .grant_acquire()
        .refuse_acquire()
        .expect_release(Err(Error::new(
            ErrorKind::Internal,
            "the server refused the script",
        )));
    let (locks, events, _) = manager(&store, ScenarioRegistry::new());
    let err = locks.try_lock_all(["m-1", "m-2"]).await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("had taken 1 key(s)") && text.contains("could not release"),
        "{text}"
    );
    assert!(!text.contains("and released them"), "{text}");
    assert!(
        text.contains("the server refused the script"),
        "the release's cause: {text}"
    );
    let left = events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::LeftToExpire { .. }));
    assert!(left, "the key left behind is reported");
    store.verify();
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_sweeps_every_scenario_stack_at_once_and_names_what_each_left() {
    use leasehold::layers::GracefulShutdownLayer;
    use leasehold::scenario::LayerSettings;

    let store = ScriptedStore::new();
    // Both releases hang: each stack's sweep ends at its 2 s deadline.
    store
        .grant_acquire()
        .grant_acquire()
        .expect_release_after(std::future::pending(), Ok(true))
        .expect_release_after(std::future::pending(), Ok(true));
    let own = |name: &str, keys: &str| {
        Scenario::new(name).keys(keys).layers(
            LayerSettings::new()
                .graceful_shutdown(GracefulShutdownLayer::new().deadline(Duration::from_secs(2))),
        )
    };
    let registry = ScenarioRegistry::new()
        .with(own("feeds", "feed-*"))
        .unwrap()
        .with(own("polls", "poll-*"))
        .unwrap();
    let (locks, _, _) = manager(&store, registry);
    let feed = locks.try_lock("feed-1").await.unwrap();
    let poll = locks.try_lock("poll-1").await.unwrap();
    let started = Instant::now();
    let err = locks.shutdown().await.unwrap_err();
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "the two 2 s sweeps ran one after the other: {took:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("feed-1") && text.contains("poll-1"),
        "both stacks' keys named: {text}"
    );
    drop((feed, poll));
}

#[tokio::test(start_paused = true)]
async fn a_slow_store_that_refuses_to_the_end_times_out_and_never_proceeds_without_the_lock() {
    let registry = ScenarioRegistry::new()
        .with(
            Scenario::new("feed")
                .keys("feed-*")
                .wait(Duration::from_millis(300))
                .on_store_down(StoreDownPolicy::Proceed),
        )
        .unwrap();
    let store = ScriptedStore::new();
    // Every answer takes 50 ms (a remote store), and every one refuses: the key is held. The
    // last look, at the deadline, gets a backoff step (10 ms), less than an answer takes.
    for _ in 0..100 {
        // The delay starts when the attempt is sent.
        let answer_time = async { tokio::time::sleep(Duration::from_millis(50)).await };
        store.expect_acquire_after(answer_time, |_| Ok(Attempt::refused()));
    }
    for _ in 0..10 {
        store.expect_release(Ok(false));
    }
    let (locks, events, _) = manager(&store, registry);
    let err = locks.acquire("feed-1").await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    let proceeded = events
        .lock()
        .unwrap()
        .iter()
        .any(|e| matches!(e, LockEvent::ProceededWithoutLock { .. }));
    assert!(
        !proceeded,
        "ran without the lock while another owner held it"
    );
}

/// A shutdown while a multi-lock's last key is being granted ends the renewal of the key taken
/// before it, which marks that guard lost. Without the graceful-shutdown layer (which refuses
/// the grant itself) the call then fails as `ShutDown`, saying so, and gives every key back: not
/// as `NotHeld` blaming a lease too short for the wait.
#[tokio::test(start_paused = true)]
async fn a_shutdown_while_a_multi_lock_takes_its_keys_fails_it_as_a_shutdown() {
    let store = ScriptedStore::new();
    let (open, gate) = tokio::sync::oneshot::channel::<()>();
    let granting = store.clone();
    store
        .grant_acquire()
        .expect_acquire_after(
            async {
                let _ = gate.await;
            },
            move |req| Ok(granting.lease_for(req).into()),
        )
        .expect_release(Ok(true))
        .expect_release(Ok(true));
    // Renewal on: the shutdown ends it, and that marks the first key's guard lost.
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(store.clone())
        .without_layers()
        .build()
        .unwrap();
    let taking = tokio::spawn({
        let locks = locks.clone();
        async move { locks.lock_all(["m-1", "m-2"]).await.map(drop) }
    });
    while store.count(Op::Acquire) < 2 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // The shutdown waits for the acquisition in flight; the gate opens once it has begun.
    let shutting = tokio::spawn({
        let locks = locks.clone();
        async move { locks.shutdown().await }
    });
    tokio::time::sleep(Duration::from_millis(10)).await;
    open.send(()).unwrap();
    let err = taking.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("shut down") && text.contains("every key was given back"),
        "{text}"
    );
    shutting.await.unwrap().unwrap();
    store.verify();
}
