//! Scenarios: loading files (good and each kind of bad), key matching, strict registries, and what
//! a lock call gets from its scenario. The store-down policies against a real Redis server are in
//! `crates/leasehold-redis/tests/scenarios.rs`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::scenario::{
    AcquireMode, LayerSetting, LayerSettings, Scenario, ScenarioError, ScenarioRegistry,
    StoreDownPolicy,
};
use leasehold::{ErrorKind, LockEvent, LockManager, LockOptions};

const GOOD: &str = include_str!("scenarios/good.toml");

fn manager(registry: ScenarioRegistry) -> LockManager {
    LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .scenarios(registry)
        .build()
        .unwrap()
}

#[test]
fn the_issue_example_and_a_full_file_load() {
    let minimal = r#"
[[scenario]]
name = "checkout"
keys = "order-*"          # glob on the entity name
mode = "blocking"         # or "try"
ttl = "5s"
wait = "200ms"
on_store_down = "fail"    # or "proceed"
"#;
    let registry = ScenarioRegistry::from_toml_str(minimal, "minimal.toml").unwrap();
    let checkout = registry.get("checkout").unwrap();
    assert_eq!(checkout.acquire_mode(), AcquireMode::Blocking);
    assert_eq!(checkout.lock_ttl(), Some(Duration::from_secs(5)));
    assert_eq!(checkout.wait_for_lock(), Some(Duration::from_millis(200)));
    assert_eq!(checkout.store_down_policy(), StoreDownPolicy::Fail);
    assert!(!registry.is_strict());

    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../tests/scenarios/good.toml"
    );
    let full = ScenarioRegistry::from_toml_file(path).unwrap();
    assert_eq!(full, ScenarioRegistry::from_toml_str(GOOD, "good").unwrap());
    assert!(full.is_strict());
    let names: Vec<_> = full.iter().map(Scenario::name).collect();
    assert_eq!(names, ["checkout", "feed", "nightly", "hot", "bulk"]);
    let feed = full.get("feed").unwrap();
    assert_eq!(feed.acquire_mode(), AcquireMode::Try);
    assert_eq!(feed.store_down_policy(), StoreDownPolicy::Proceed);
    assert_eq!(
        feed.layer_settings().local_competition,
        Some(LayerSetting::Off)
    );
    let nightly = full.get("nightly").unwrap();
    assert_eq!(nightly.renewal(), Some(true));
    let trace = nightly.trace_config().unwrap();
    assert_eq!(trace.max_entries(), 20);
    assert_eq!(trace.ttl(), Duration::from_secs(3600));
}

/// Each layer takes `true`/`false` or a table of its settings (inline or as a sub-table); a
/// table starts from the layer's defaults.
#[test]
fn a_file_gives_layers_their_settings() {
    use leasehold::layers::{
        GracefulShutdownLayer, LocalCompetitionLayer, ReadbackLayer, ReentrancyLayer,
        UnlockWindowLayer,
    };
    let registry = ScenarioRegistry::from_toml_str(GOOD, "good.toml").unwrap();
    let hot = registry.get("hot").unwrap().layer_settings();
    let expected = LayerSettings::new()
        .readback(ReadbackLayer::new().retries(2))
        .unlock_window(UnlockWindowLayer::new().margin(Duration::from_millis(50)))
        .local_competition(
            LocalCompetitionLayer::new()
                .hand_off(true)
                .max_hand_offs(4)
                .max_hand_off_hold(Duration::from_millis(200)),
        )
        .reentrancy(false)
        .graceful_shutdown(true);
    assert_eq!(*hot, expected);
    assert_eq!(
        hot.describe(),
        "readback=retries(2), unlock_window=margin(50ms), \
         local_competition=hand_off(max 4, 200ms), reentrancy=off, graceful_shutdown=on"
    );
    let lc = hot.local_competition.as_ref().unwrap().config().unwrap();
    assert_eq!(lc.hand_off_limits(), Some((4, Duration::from_millis(200))));

    let bulk = registry.get("bulk").unwrap().layer_settings();
    assert_eq!(
        *bulk,
        LayerSettings::new()
            .local_competition(LocalCompetitionLayer::new().capacity(1000))
            .reentrancy(ReentrancyLayer::new().max_depth(8))
            .graceful_shutdown(
                GracefulShutdownLayer::new()
                    .deadline(Duration::from_secs(2))
                    .purge_interval(Duration::from_millis(250))
            )
    );
    assert_eq!(
        bulk.describe(),
        "local_competition=no_hand_off capacity(1000), reentrancy=max_depth(8), \
         graceful_shutdown=deadline(2s) purge(250ms)"
    );
    // Settings differ from `true`, and from each other.
    assert_ne!(
        LayerSettings::new().readback(true),
        LayerSettings::new().readback(ReadbackLayer::new())
    );
    assert_ne!(
        LayerSettings::new().readback(ReadbackLayer::new().retries(2)),
        LayerSettings::new().readback(ReadbackLayer::new().retries(3))
    );
}

/// Each kind of bad file fails at load, naming the file, the line and the field.
#[test]
fn bad_files_name_the_file_line_and_field() {
    let cases: &[(&str, &str, usize, &str)] = &[
        // not TOML at all
        ("[[scenario]]\nname = \"a\"\nttl = 5s\n", "syntax", 3, "ttl"),
        // a mode that does not exist
        (
            "[[scenario]]\nname = \"a\"\nmode = \"blocky\"\n",
            "mode",
            3,
            "mode",
        ),
        // an unknown field (a typo)
        (
            "[[scenario]]\nname = \"a\"\nwiat = \"1s\"\n",
            "unknown",
            3,
            "wiat",
        ),
        // a value of the wrong type
        (
            "[[scenario]]\nname = \"a\"\nrenew = \"yes\"\n",
            "type",
            3,
            "renew",
        ),
        // a missing name
        ("[[scenario]]\nkeys = \"a-*\"\n", "missing", 1, "name"),
        // not a duration
        (
            "[[scenario]]\nname = \"a\"\n\nttl = \"five seconds\"\n",
            "duration",
            4,
            "ttl",
        ),
        // a TTL out of range
        (
            "[[scenario]]\nname = \"a\"\nttl = \"0s\"\n",
            "zero ttl",
            3,
            "ttl",
        ),
        // a duplicate name
        (
            "[[scenario]]\nname = \"a\"\n[[scenario]]\nname = \"a\"\n",
            "duplicate",
            4,
            "name",
        ),
        // a try-only scenario that waits
        (
            "[[scenario]]\nname = \"a\"\nmode = \"try\"\nwait = \"1s\"\n",
            "try wait",
            4,
            "wait",
        ),
        // renewal not shorter than the TTL
        (
            "[[scenario]]\nname = \"a\"\nttl = \"2s\"\nrenew_every = \"2s\"\n",
            "renew",
            4,
            "renew_every",
        ),
        // renewal with no pause, and no TTL to compare it with
        (
            "[[scenario]]\nname = \"a\"\nrenew_every = \"0s\"\n",
            "above zero",
            3,
            "renew_every",
        ),
        // renewal turned off and timed
        (
            "[[scenario]]\nname = \"a\"\nrenew = false\nrenew_every = \"5s\"\n",
            "renew = false",
            4,
            "renew_every",
        ),
        // the trace turned off and sized
        (
            "[[scenario]]\nname = \"a\"\ntrace = false\ntrace_len = 5\n",
            "trace = false",
            4,
            "trace_len",
        ),
        // an unknown layer
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nreadbak = true\n",
            "layer",
            4,
            "readbak",
        ),
        // a semaphore without its permit count
        (
            "[[scenario]]\nname = \"a\"\nlock = \"semaphore\"\n",
            "semaphore",
            3,
            "permits",
        ),
        // permits on a lock that is not a semaphore
        (
            "[[scenario]]\nname = \"a\"\nlock = \"read\"\npermits = 3\n",
            "permits",
            4,
            "permits",
        ),
        // a permit count out of range
        (
            "[[scenario]]\nname = \"a\"\nlock = \"semaphore\"\npermits = 0\n",
            "zero permits",
            4,
            "permits",
        ),
        // a layer that is neither a bool nor a table
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nreadback = \"yes\"\n",
            "layer type",
            4,
            "readback",
        ),
        // an unknown layer setting (a typo), inline
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nunlock_window = { window = \"50ms\" }\n",
            "layer setting",
            4,
            "window",
        ),
        // an unknown layer setting in a sub-table
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers.readback]\nretries = 1\nretry = 2\n",
            "layer setting table",
            5,
            "retry",
        ),
        // a setting of the wrong type
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nlocal_competition = { hand_off = \"yes\" }\n",
            "setting type",
            4,
            "hand_off",
        ),
        // a negative count (out of range for the type)
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nreadback = { retries = -1 }\n",
            "negative",
            4,
            "retries",
        ),
        // a bad duration
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nunlock_window = { margin = \"fifty\" }\n",
            "layer duration",
            4,
            "margin",
        ),
        // zero where zero is invalid: the layer's setter would raise it silently
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nreentrancy = { max_depth = 0 }\n",
            "zero depth",
            4,
            "max_depth",
        ),
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nlocal_competition = { capacity = 0 }\n",
            "zero capacity",
            4,
            "capacity",
        ),
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers.graceful_shutdown]\npurge_interval = \"0s\"\n",
            "zero purge",
            4,
            "purge_interval",
        ),
        // zero where zero is invalid: checked by the registry (as for code)
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nlocal_competition = { hand_off = true, max_hand_offs = 0 }\n",
            "zero hand-offs",
            4,
            "max_hand_offs",
        ),
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nlocal_competition = { hand_off = true, max_hand_off_hold = \"0ms\" }\n",
            "zero hold",
            4,
            "max_hand_off_hold",
        ),
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\ngraceful_shutdown = { deadline = \"0s\" }\n",
            "zero deadline",
            4,
            "deadline",
        ),
        // out of range: a margin that closes the window before the lock is taken
        (
            "[[scenario]]\nname = \"a\"\nttl = \"1s\"\n[scenario.layers]\nunlock_window = { margin = \"1s\" }\n",
            "margin",
            5,
            "margin",
        ),
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nunlock_window = { margin = \"31days\" }\n",
            "margin range",
            4,
            "margin",
        ),
        // hand-off bounds with hand-off off
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nlocal_competition = { max_hand_offs = 4 }\n",
            "bounds without hand-off",
            4,
            "max_hand_offs",
        ),
        // a process-wide setting
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\ngraceful_shutdown = { exit_code = 3 }\n",
            "exit code",
            4,
            "exit_code",
        ),
        // a trace bound out of range
        (
            "[[scenario]]\nname = \"a\"\ntrace_len = 0\n",
            "trace",
            3,
            "trace_len",
        ),
        // readback retries past the bound
        (
            "[[scenario]]\nname = \"a\"\n[scenario.layers]\nreadback = { retries = 4294967295 }\n",
            "readback retries",
            4,
            "retries",
        ),
    ];
    for (text, what, line, field) in cases {
        let error = ScenarioRegistry::from_toml_str(text, "ops/locks.toml").unwrap_err();
        let message = error.to_string();
        assert!(message.starts_with("ops/locks.toml:"), "{what}: {message}");
        assert_eq!(error.line(), Some(*line), "{what}: {message}");
        // Settings of a layer are located by the column of their value, on the line.
        if text.contains("[scenario.layers") {
            let column = error.column().unwrap_or(0);
            let line_text = text.lines().nth(line - 1).unwrap();
            assert!(
                (1..=line_text.len()).contains(&column),
                "{what}: column {column} off line {line_text:?}: {message}"
            );
            assert!(
                message.starts_with(&format!("ops/locks.toml:{line}:{column}:")),
                "{what}: {message}"
            );
        }
        assert!(
            message.contains(field),
            "{what}: field {field} not in {message}"
        );
    }
    let missing = ScenarioRegistry::from_toml_file("/nonexistent/locks.toml").unwrap_err();
    assert!(matches!(missing, ScenarioError::Read { .. }));
    assert!(missing.to_string().contains("/nonexistent/locks.toml"));
    assert!(std::error::Error::source(&missing).is_some());
}

#[test]
fn code_registration_rejects_what_files_reject() {
    let error = ScenarioRegistry::new()
        .with(Scenario::new("a"))
        .unwrap()
        .with(Scenario::new("a"))
        .unwrap_err();
    assert_eq!(error.field(), Some("name"));
    assert!(error.to_string().starts_with("code: scenario `a`"));
    let error = ScenarioRegistry::new()
        .with(Scenario::new("b").keys(""))
        .unwrap_err();
    assert_eq!(error.field(), Some("keys"));
    // Layer settings are checked the same way as a file's.
    use leasehold::layers::{GracefulShutdownLayer, LocalCompetitionLayer, UnlockWindowLayer};
    let never = LocalCompetitionLayer::new().hand_off(true).max_hand_offs(0);
    let error = ScenarioRegistry::new()
        .with(Scenario::new("c").layers(LayerSettings::new().local_competition(never)))
        .unwrap_err();
    assert_eq!(
        error.field(),
        Some("layers.local_competition.max_hand_offs")
    );
    assert_eq!(error.line(), None);
    let closed = UnlockWindowLayer::new().margin(Duration::from_secs(2));
    let error = ScenarioRegistry::new()
        .with(
            Scenario::new("d")
                .ttl(Duration::from_secs(2))
                .layers(LayerSettings::new().unlock_window(closed)),
        )
        .unwrap_err();
    assert_eq!(error.field(), Some("layers.unlock_window.margin"));
    let exit = GracefulShutdownLayer::new().exit_code(3);
    let error = ScenarioRegistry::new()
        .with(Scenario::new("e").layers(LayerSettings::new().graceful_shutdown(exit)))
        .unwrap_err();
    assert_eq!(error.field(), Some("layers.graceful_shutdown.exit_code"));
    // Renewal turned off after its interval was set: the interval would be dropped silently.
    let error = ScenarioRegistry::new()
        .with(
            Scenario::new("f")
                .renew_every(Duration::from_secs(5))
                .renew(false),
        )
        .unwrap_err();
    assert_eq!(error.field(), Some("renew_every"));
}

#[tokio::test]
async fn keys_get_the_first_matching_scenario_and_calls_can_name_one() {
    let registry = ScenarioRegistry::new()
        .with(
            Scenario::new("vip")
                .keys("order-vip-*")
                .ttl(Duration::from_secs(7)),
        )
        .unwrap()
        .with(
            Scenario::new("checkout")
                .keys("order-*")
                .ttl(Duration::from_secs(5)),
        )
        .unwrap()
        .with(Scenario::new("reports").ttl(Duration::from_secs(60)))
        .unwrap();
    let locks = manager(registry);

    let vip = locks.try_lock("order-vip-1").await.unwrap();
    assert_eq!(vip.scenario(), "vip");
    assert_eq!(vip.lease().ttl(), Duration::from_secs(7));
    let plain = locks.try_lock("order-2").await.unwrap();
    assert_eq!(plain.scenario(), "checkout");
    assert_eq!(plain.lease().ttl(), Duration::from_secs(5));
    // Unmatched: the manager's defaults (the registry is lenient).
    let other = locks.try_lock("refund-3").await.unwrap();
    assert_eq!(other.scenario(), "default");
    assert_eq!(other.lease().ttl(), leasehold::DEFAULT_LOCK_TTL);
    // Named: that scenario's settings, whatever the key; explicit options still win.
    let named = locks
        .try_lock_with("refund-4", LockOptions::new().scenario("reports"))
        .await
        .unwrap();
    assert_eq!(named.lease().ttl(), Duration::from_secs(60));
    let overridden = locks
        .try_lock_with(
            "refund-5",
            LockOptions::new()
                .scenario("reports")
                .ttl(Duration::from_secs(3)),
        )
        .await
        .unwrap();
    assert_eq!(overridden.lease().ttl(), Duration::from_secs(3));
    // An unregistered name is only a label in a lenient registry.
    let labelled = locks
        .try_lock_with("refund-6", LockOptions::new().scenario("adhoc"))
        .await
        .unwrap();
    assert_eq!(labelled.scenario(), "adhoc");
    for guard in [vip, plain, other, named, overridden, labelled] {
        assert!(guard.release().await.unwrap());
    }
}

#[tokio::test]
async fn a_strict_registry_rejects_unmatched_keys_before_any_store_io() {
    let registry = ScenarioRegistry::from_toml_str(GOOD, "good.toml").unwrap();
    let locks = manager(registry);
    let error = locks.try_lock("refund-1").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert!(error.to_string().contains("matches no scenario"), "{error}");
    let error = locks
        .try_lock_with("order-1", LockOptions::new().scenario("nope"))
        .await
        .unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert!(
        error.to_string().contains("checkout, feed, nightly"),
        "{error}"
    );
    // Nothing reached the store.
    assert!(locks.list("").await.unwrap().is_empty());
}

#[tokio::test]
async fn the_mode_decides_how_acquire_takes_the_lock() {
    let registry = ScenarioRegistry::new()
        .with(Scenario::new("feed").keys("feed-*").mode(AcquireMode::Try))
        .unwrap()
        .with(
            Scenario::new("checkout")
                .keys("order-*")
                .mode(AcquireMode::Blocking)
                .wait(Duration::from_millis(30)),
        )
        .unwrap();
    let locks = manager(registry);

    // A try-only scenario: `lock` is refused before any I/O, `acquire` makes one attempt.
    let error = locks.lock("feed-1").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::InvalidArgument);
    assert!(error.to_string().contains("try-only"));
    let held = locks.acquire("feed-1").await.unwrap();
    let other = locks.clone();
    let refused = tokio::spawn(async move { other.acquire("feed-1").await.map(drop) });
    assert_eq!(
        refused.await.unwrap().unwrap_err().kind(),
        ErrorKind::LockUnavailable
    );
    held.release().await.unwrap();

    // A blocking scenario waits its own wait, then times out.
    let held = locks.acquire("order-1").await.unwrap();
    let other = locks.clone();
    let waited = tokio::spawn(async move { other.acquire("order-1").await.map(drop) });
    assert_eq!(
        waited.await.unwrap().unwrap_err().kind(),
        ErrorKind::Timeout
    );
    held.release().await.unwrap();
}

/// Zero is exactly what a try waits: a try-only scenario may say `wait = "0s"` (in a file or in
/// code), and still makes one attempt; any other wait stays an error.
#[tokio::test]
async fn a_try_scenario_accepts_a_zero_wait() {
    let file = "[[scenario]]\nname = \"feed\"\nkeys = \"feed-*\"\nmode = \"try\"\nwait = \"0s\"\n";
    let registry = ScenarioRegistry::from_toml_str(file, "zero.toml").unwrap();
    let feed = registry.get("feed").unwrap();
    assert_eq!(feed.acquire_mode(), AcquireMode::Try);
    assert_eq!(feed.wait_for_lock(), Some(Duration::ZERO));
    let in_code = ScenarioRegistry::new()
        .with(
            Scenario::new("t")
                .mode(AcquireMode::Try)
                .wait(Duration::ZERO),
        )
        .unwrap();
    assert_eq!(
        in_code.get("t").unwrap().wait_for_lock(),
        Some(Duration::ZERO)
    );
    let error = ScenarioRegistry::new()
        .with(
            Scenario::new("t")
                .mode(AcquireMode::Try)
                .wait(Duration::from_millis(1)),
        )
        .unwrap_err();
    assert_eq!(error.field(), Some("wait"));

    // It behaves as a try: `acquire` makes one attempt, `lock` is refused.
    let locks = manager(registry);
    let held = locks.acquire("feed-1").await.unwrap();
    let other = locks.clone();
    let refused = tokio::spawn(async move { other.acquire("feed-1").await.map(drop) });
    assert_eq!(
        refused.await.unwrap().unwrap_err().kind(),
        ErrorKind::LockUnavailable
    );
    assert_eq!(
        locks.lock("feed-1").await.unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    held.release().await.unwrap();
}

#[tokio::test]
async fn a_scenario_can_turn_layers_off() {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    let registry = ScenarioRegistry::new()
        .with(
            Scenario::new("raw").keys("raw-*").layers(
                LayerSettings::new()
                    .local_competition(false)
                    .reentrancy(false),
            ),
        )
        .unwrap();
    let locks = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .scenarios(registry)
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.name()))
        .build()
        .unwrap();
    // With local competition (the default), a second task fails fast locally...
    let guard = locks.try_lock("cooked-1").await.unwrap();
    let other = locks.clone();
    let _ = tokio::spawn(async move { other.try_lock("cooked-1").await.map(drop) }).await;
    guard.release().await.unwrap();
    assert!(events.lock().unwrap().contains(&"fast_failed"));
    events.lock().unwrap().clear();
    // ...without it, the attempt reaches the store and is contended there.
    let guard = locks.try_lock("raw-1").await.unwrap();
    let other = locks.clone();
    let _ = tokio::spawn(async move { other.try_lock("raw-1").await.map(drop) }).await;
    guard.release().await.unwrap();
    let seen = events.lock().unwrap().clone();
    assert!(!seen.contains(&"fast_failed"), "{seen:?}");
    assert!(seen.contains(&"contended"), "{seen:?}");
    assert_eq!(locks.shutdown().await.unwrap(), 0);
}

#[tokio::test]
async fn a_scenario_fixes_the_lock_kind() {
    let registry = ScenarioRegistry::from_toml_str(
        "[[scenario]]\nname = \"encode\"\nkeys = \"video-*\"\nlock = \"semaphore\"\npermits = 2\nmode = \"try\"\n\n[[scenario]]\nname = \"catalog\"\nkeys = \"catalog-*\"\nlock = \"read\"\n",
        "kinds.toml",
    )
    .unwrap();
    assert_eq!(
        registry.get("encode").unwrap().lock_kind(),
        leasehold::LockMode::semaphore(2).unwrap()
    );
    let locks = manager(registry);
    let a = locks.acquire("video-1").await.unwrap();
    let b = locks.acquire("video-1").await.unwrap();
    assert_eq!(a.mode(), leasehold::LockMode::Semaphore { permits: 2 });
    assert!(
        locks.acquire("video-1").await.unwrap_err().is_unavailable(),
        "two permits only"
    );
    let r1 = locks.acquire("catalog-1").await.unwrap();
    assert_eq!(r1.mode(), leasehold::LockMode::Shared);
    // A call's own kind wins over the scenario's: the write side of the read lock.
    let other = leasehold::LockOptions::new().holder(leasehold::Holder::new());
    let err = locks
        .try_lock_with("catalog-1", other.mode(leasehold::LockMode::Exclusive))
        .await
        .unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    drop((a, b, r1));
}

/// An observer that keeps event names.
fn recorder() -> (
    Arc<Mutex<Vec<&'static str>>>,
    impl Fn(&LockEvent) + Send + Sync,
) {
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    (events, move |e: &LockEvent| {
        sink.lock().unwrap().push(e.name())
    })
}

/// Whether a release with a local waiter in line hands the lease over (no store round trip).
async fn hands_off(locks: &LockManager, entity: &str, events: &Mutex<Vec<&'static str>>) -> bool {
    events.lock().unwrap().clear();
    let guard = locks.lock(entity).await.unwrap();
    let other = locks.clone();
    let entity_owned = entity.to_owned();
    let waiter = tokio::spawn(async move { other.lock(entity_owned.as_str()).await });
    // Let the waiter take its place in the line.
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(guard.release().await.unwrap());
    let taken = waiter.await.unwrap().unwrap();
    assert!(taken.release().await.unwrap());
    let seen = events.lock().unwrap().clone();
    seen.contains(&"handed_off")
}

/// A scenario's own local-competition settings reach its locks: one with hand-off on hands off
/// (`LockEvent::HandedOff`), one without does not; `true` keeps the builder's configuration and a
/// scenario that does not mention the layer keeps the manager's.
#[tokio::test(start_paused = true)]
async fn a_scenarios_hand_off_setting_reaches_its_locks() {
    use leasehold::layers::LocalCompetitionLayer;
    // The manager without hand-off (the default); a file scenario turns it on.
    let registry = ScenarioRegistry::from_toml_str(
        "[[scenario]]\nname = \"hot\"\nkeys = \"hot-*\"\n[scenario.layers]\n\
         local_competition = { hand_off = true, max_hand_offs = 4, max_hand_off_hold = \"200ms\" }\n",
        "hot.toml",
    )
    .unwrap();
    let (events, observer) = recorder();
    let locks = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .scenarios(registry)
        .observer(observer)
        .build()
        .unwrap();
    assert!(hands_off(&locks, "hot-1", &events).await);
    assert!(!hands_off(&locks, "cold-1", &events).await);
    assert_eq!(locks.shutdown().await.unwrap(), 0);

    // The manager with hand-off; scenarios turn it off by configuration, keep it with `true`.
    let registry = ScenarioRegistry::new()
        .with(
            Scenario::new("plain")
                .keys("plain-*")
                .layers(LayerSettings::new().local_competition(LocalCompetitionLayer::new())),
        )
        .unwrap()
        .with(
            Scenario::new("kept").keys("kept-*").layers(
                LayerSettings::new()
                    .local_competition(true)
                    .reentrancy(false),
            ),
        )
        .unwrap();
    let (events, observer) = recorder();
    let locks = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .local_competition(LocalCompetitionLayer::new().hand_off(true))
        .scenarios(registry)
        .observer(observer)
        .build()
        .unwrap();
    assert!(!hands_off(&locks, "plain-1", &events).await);
    assert!(hands_off(&locks, "kept-1", &events).await);
    assert!(hands_off(&locks, "other-1", &events).await);
    assert_eq!(locks.shutdown().await.unwrap(), 0);
}

/// Scenario `tight`: keys `tight-*`, a 1 s TTL, an unlock window of 600 ms.
fn tight_window() -> ScenarioRegistry {
    ScenarioRegistry::from_toml_str(
        "[[scenario]]\nname = \"tight\"\nkeys = \"tight-*\"\nttl = \"1s\"\n\
         [scenario.layers]\nunlock_window = { margin = \"600ms\" }\n",
        "tight.toml",
    )
    .unwrap()
}

/// A scenario's unlock-window margin decides which late releases are skipped.
#[tokio::test(start_paused = true)]
async fn a_scenarios_unlock_window_margin_decides_what_is_skipped() {
    let registry = tight_window();
    let (events, observer) = recorder();
    let locks = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .scenarios(registry)
        .observer(observer)
        .build()
        .unwrap();
    let one_second = LockOptions::new().ttl(Duration::from_secs(1));
    let tight = locks.try_lock("tight-1").await.unwrap();
    let plain = locks.try_lock_with("plain-1", one_second).await.unwrap();
    assert_eq!(tight.lease().ttl(), Duration::from_secs(1));
    tokio::time::sleep(Duration::from_millis(500)).await;
    // 500 ms into a 1 s lease: past the scenario's 600 ms margin, within the default 150 ms one.
    assert!(
        !tight.release().await.unwrap(),
        "skipped: the window closed"
    );
    assert!(plain.release().await.unwrap(), "sent: the window is open");
    let seen = events.lock().unwrap().clone();
    assert_eq!(
        seen.iter().filter(|e| **e == "release_skipped").count(),
        1,
        "{seen:?}"
    );
}

/// A scenario's readback retries decide how often an in-doubt acquire is sent again.
#[tokio::test]
async fn a_scenarios_readback_retries_reach_its_locks() {
    use leasehold_testkit::scripted::{reply_lost, Op, ScriptedStore};
    let registry = ScenarioRegistry::from_toml_str(
        "[[scenario]]\nname = \"patient\"\nkeys = \"patient-*\"\n\
         [scenario.layers]\nreadback = { retries = 2 }\n\n\
         [[scenario]]\nname = \"once\"\nkeys = \"once-*\"\n\
         [scenario.layers]\nreadback = { retries = 0 }\n",
        "readback.toml",
    )
    .unwrap();
    let scripted = ScriptedStore::new();
    let locks = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .store(scripted.clone())
        .without_layers()
        .readback(true) // the manager's: one retry
        .scenarios(registry)
        .build()
        .unwrap();

    // Two lost replies: the manager's single retry would give up; the scenario's two do not.
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Ok(None))
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Ok(None))
        .grant_acquire()
        .expect_release(Ok(true));
    let guard = locks.try_lock("patient-1").await.unwrap();
    assert!(guard.release().await.unwrap());
    assert_eq!(
        scripted.ops(),
        [
            Op::Acquire,
            Op::Inspect,
            Op::Acquire,
            Op::Inspect,
            Op::Acquire,
            Op::Release
        ]
    );

    // No retry: read back, never sent again. The write could still land late, so the manager
    // undoes the attempt (an owner-checked release of its token, in the background).
    let scripted_before = scripted.ops().len();
    scripted
        .expect_acquire(Err(reply_lost()))
        .expect_inspect(Ok(None))
        .expect_release(Ok(false));
    let error = locks.try_lock("once-1").await.unwrap_err();
    assert_eq!(error.kind(), ErrorKind::RetriesExhausted, "{error}");
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(
        scripted.ops()[scripted_before..],
        [Op::Acquire, Op::Inspect, Op::Release]
    );
    scripted.verify();
}

#[test]
fn a_layer_that_cannot_work_with_the_ttl_fails_the_build() {
    use leasehold::layers::UnlockWindowLayer;
    let wide = || UnlockWindowLayer::new().margin(Duration::from_secs(5));
    // The manager's own stack.
    let err = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .lock_ttl(Duration::from_secs(2))
        .unlock_window(wide())
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(
        err.to_string().contains("unlock_window.margin")
            && err.to_string().contains("every release would be skipped"),
        "{err}"
    );
    // A scenario without a TTL of its own gets the manager's: its window is checked against it.
    let registry = ScenarioRegistry::new()
        .with(
            Scenario::new("wide")
                .keys("w-*")
                .layers(LayerSettings::new().unlock_window(wide())),
        )
        .unwrap();
    let err = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .lock_ttl(Duration::from_secs(2))
        .scenarios(registry.clone())
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("scenario `wide`"), "{err}");
    // A scenario without layers of its own goes through the manager's: its TTL meets them.
    let short = ScenarioRegistry::new()
        .with(
            Scenario::new("short")
                .keys("s-*")
                .ttl(Duration::from_secs(2)),
        )
        .unwrap();
    let err = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .lock_ttl(Duration::from_secs(30))
        .unlock_window(wide())
        .scenarios(short)
        .build()
        .unwrap_err();
    assert!(err.to_string().contains("scenario `short`"), "{err}");
    // With a TTL longer than the window, both build.
    LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .lock_ttl(Duration::from_secs(30))
        .unlock_window(wide())
        .scenarios(registry)
        .build()
        .unwrap();
}

/// A scenario's renewal period meets the TTL its locks get when the manager is built: a scenario
/// without a TTL of its own renews the manager's, and a period not shorter than that would fail
/// every call of it. A manager's own readback retries past their bound fail the build too.
#[test]
fn a_renewal_period_or_readback_retries_that_cannot_work_fail_the_build() {
    let slow = ScenarioRegistry::from_toml_str(
        "[[scenario]]\nname = \"reports\"\nkeys = \"r-*\"\nrenew_every = \"2m\"\n",
        "ops/locks.toml",
    )
    .expect("alone, the scenario has no TTL to compare its period with");
    let build = |ttl: Duration| {
        LockManager::builder()
            .client_id("shop")
            .farm_id("eu1")
            .lock_ttl(ttl)
            .scenarios(slow.clone())
            .build()
    };
    let err = build(Duration::from_secs(90)).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    let message = err.to_string();
    assert!(
        message.contains("scenario `reports`") && message.contains("renew_every"),
        "{message}"
    );
    build(Duration::from_secs(600)).expect("a manager TTL longer than the period");

    let err = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .readback(leasehold::layers::ReadbackLayer::new().retries(u32::MAX))
        .build()
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(err.to_string().contains("readback.retries"), "{err}");
}

/// A TTL given with the call meets the unlock window of the stack its lock goes through, before
/// anything is sent: a lease the window would never let go of is refused, not taken.
#[tokio::test]
async fn a_call_ttl_the_unlock_window_cannot_work_with_is_refused_before_io() {
    use leasehold_testkit::scripted::ScriptedStore;
    let registry = tight_window();
    let scripted = ScriptedStore::new();
    let locks = LockManager::builder()
        .client_id("shop")
        .farm_id("eu1")
        .store(scripted.clone())
        .scenarios(registry)
        .build()
        .unwrap();
    let refused = |ttl_ms: u64, key: &'static str| {
        let locks = locks.clone();
        async move {
            let opts = LockOptions::new().ttl(Duration::from_millis(ttl_ms));
            let err = locks.try_lock_with(key, opts).await.unwrap_err();
            assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
            assert!(
                err.to_string().contains("every release would be skipped"),
                "{err}"
            );
            assert!(err.key().is_some_and(|k| k.ends_with(key)), "{err}");
        }
    };
    // The manager's stack: the default 150 ms margin.
    refused(150, "plain-1").await;
    // A scenario with its own window: 600 ms.
    refused(500, "tight-1").await;
    assert!(scripted.ops().is_empty(), "{:?}", scripted.ops());
    // Longer than the window: taken; and an extend to a TTL the window closes on is refused.
    scripted.grant_acquire();
    let opts = LockOptions::new().ttl(Duration::from_millis(200));
    let mut guard = locks.try_lock_with("plain-2", opts).await.unwrap();
    let err = guard.extend(Duration::from_millis(100)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{err}");
    assert!(
        err.to_string().contains("every release would be skipped"),
        "{err}"
    );
    scripted.expect_release(Ok(true));
    assert!(guard.release().await.unwrap());
    scripted.verify();
}
