use super::*;
use crate::layers::test_support::{events, req};
use crate::ErrorKind;
use leasehold_testkit::scripted::{Op, ScriptedStore};

fn tracking(scripted: &ScriptedStore) -> (GracefulShutdown<ScriptedStore>, events::Seen) {
    let (wiring, seen) = events::wiring();
    let store = GracefulShutdownLayer::new()
        .purge_interval(Duration::from_millis(100))
        .layer_wired(scripted.clone(), &wiring);
    (store, seen)
}

#[tokio::test(start_paused = true)]
async fn tracks_acquired_forgets_released() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .grant_acquire()
        .expect_release(Ok(true));
    let (store, _) = tracking(&scripted);
    let a = store.try_acquire(&req("a", 10_000)).await.unwrap();
    store.try_acquire(&req("b", 10_000)).await.unwrap();
    assert_eq!(store.tracked(), 2);
    store.release(&a).await.unwrap();
    assert_eq!(store.tracked(), 1);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn background_purge_drops_expired_entries() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_acquire();
    let (store, _) = tracking(&scripted);
    store.try_acquire(&req("a", 150)).await.unwrap();
    store.try_acquire(&req("b", 10_000)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(350)).await;
    assert_eq!(store.tracked(), 1, "the purge task removed the expired one");
    assert_eq!(store.purge_expired(), 0);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn shutdown_releases_every_live_lock_then_refuses() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_acquire().grant_acquire();
    let (store, seen) = tracking(&scripted);
    store.try_acquire(&req("a", 10_000)).await.unwrap();
    store.try_acquire(&req("b", 10_000)).await.unwrap();
    store.try_acquire(&req("expired", 50)).await.unwrap();
    tokio::time::advance(Duration::from_millis(60)).await;
    scripted.expect_release(Ok(true)).expect_release(Ok(true));
    assert_eq!(store.shutdown().await.unwrap(), 2);
    assert_eq!(
        scripted.count(Op::Release),
        2,
        "the expired lock is not released"
    );
    assert_eq!(scripted.count(Op::Shutdown), 1, "inner store shut down too");
    assert_eq!(
        seen.names(),
        ["released_at_shutdown", "released_at_shutdown"]
    );
    let err = store.try_acquire(&req("c", 1000)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn shutdown_counts_only_what_was_released() {
    let scripted = ScriptedStore::new();
    scripted.grant_acquire().grant_acquire().grant_acquire();
    let (store, seen) = tracking(&scripted);
    for k in ["a", "b", "c"] {
        store.try_acquire(&req(k, 10_000)).await.unwrap();
    }
    scripted
        .expect_release(Ok(true))
        .expect_release(Ok(false))
        .expect_release(Err(Error::connection("down")));
    // One released, one no longer ours, one failed: the failed one is named, with its cause.
    let err = store.shutdown().await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection, "{err}");
    let text = err.to_string();
    assert!(text.contains("released 1 lock(s) but not "), "{text}");
    assert!(text.contains("until their TTL"), "{text}");
    assert!(
        err.chain().to_string().contains("down"),
        "the cause kept: {err}"
    );
    assert_eq!(seen.names(), ["released_at_shutdown"]);
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn shutdown_respects_its_deadline() {
    let hung = ScriptedStore::new();
    hung.grant_acquire();
    let store = GracefulShutdownLayer::new()
        .deadline(Duration::from_secs(1))
        .layer(NeverRelease(hung.clone()));
    let lease = store.try_acquire(&req("b", 60_000)).await.unwrap();
    let started = Instant::now();
    let err = store.shutdown().await.unwrap_err();
    assert_eq!(
        started.elapsed(),
        Duration::from_secs(1),
        "gave up at the deadline"
    );
    assert_eq!(err.kind(), ErrorKind::Timeout, "{err}");
    assert!(
        err.to_string().contains(lease.key().as_str()),
        "names the lock left behind: {err}"
    );
    assert!(err.to_string().contains("shutdown deadline"), "{err}");
    hung.verify();
}

#[cfg(feature = "signal")]
#[test]
fn signal_handler_needs_a_runtime_and_installs_once() {
    let locks = crate::LockManager::builder()
        .client_id("c")
        .farm_id("f")
        .graceful_shutdown(GracefulShutdownLayer::default())
        .build()
        .unwrap();
    let err = locks.install_signal_handler().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Internal, "outside a runtime: {err}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let _signalled = locks.install_signal_handler().unwrap();
        let again = locks.install_signal_handler().unwrap_err();
        assert_eq!(
            again.kind(),
            ErrorKind::Internal,
            "one handler per process: {again}"
        );
        assert!(
            again.to_string().contains("call LockManager::shutdown"),
            "says what to do instead: {again}"
        );
    });
}

/// What the signal's shutdown did reaches the application: a clean sweep, and one that left a
/// lock behind (the exit status stays the configured one; the error names the key).
#[cfg(feature = "signal")]
#[tokio::test(start_paused = true)]
async fn a_signal_shutdown_reports_what_it_left_behind() {
    let manager = |scripted: &ScriptedStore| {
        crate::LockManager::builder()
            .client_id("c")
            .farm_id("f")
            .store(scripted.clone())
            .graceful_shutdown(GracefulShutdownLayer::new().exit_code(143))
            .build()
            .unwrap()
    };
    let signal = |locks: &crate::LockManager| {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let signalled = locks.shut_down_on_signal(&tokio::runtime::Handle::current(), rx);
        tx.send(()).unwrap();
        signalled
    };

    let clean = ScriptedStore::new();
    clean.grant_acquire().expect_release(Ok(true));
    let locks = manager(&clean);
    let guard = locks.try_lock("kept").await.unwrap();
    let outcome = signal(&locks).outcome().await;
    assert_eq!(outcome.exit_code, 143);
    assert_eq!(outcome.shutdown.unwrap(), 1, "the live lock released");
    drop(guard);
    clean.verify();

    let failing = ScriptedStore::new();
    failing
        .grant_acquire()
        .expect_release(Err(Error::new(ErrorKind::StoreSetup, "permission denied")));
    let locks = manager(&failing);
    let guard = locks.try_lock("report-7f3").await.unwrap();
    let outcome = signal(&locks).outcome().await;
    assert_eq!(outcome.exit_code, 143, "the configured status");
    let err = outcome.shutdown.unwrap_err();
    assert!(
        err.to_string().contains("report-7f3"),
        "names the key: {err}"
    );
    assert!(
        err.chain().to_string().contains("permission denied"),
        "the cause kept: {err}"
    );
    drop(guard);
    failing.verify();
}

/// A store whose release never completes.
#[derive(Debug)]
struct NeverRelease(ScriptedStore);

impl crate::core::LayeredStore for NeverRelease {
    type Inner = ScriptedStore;
    fn inner(&self) -> &ScriptedStore {
        &self.0
    }
    async fn release(&self, _: &Lease) -> Result<bool> {
        futures::future::pending().await
    }
}

#[tokio::test(start_paused = true)]
async fn acquisition_landing_after_the_sweep_is_given_back() {
    let scripted = ScriptedStore::new();
    let (gate_tx, gate_rx) = tokio::sync::oneshot::channel::<()>();
    let s = scripted.clone();
    scripted.expect_acquire_after(
        async move {
            let _ = gate_rx.await;
        },
        move |r| Ok(s.lease_for(r).into()),
    );
    scripted.expect_release(Ok(true));
    let (store, _) = tracking(&scripted);
    let store = Arc::new(store);
    let s2 = store.clone();
    let in_flight = tokio::spawn(async move { s2.try_acquire(&req("late", 10_000)).await });
    tokio::task::yield_now().await;
    assert_eq!(store.shutdown().await.unwrap(), 0);
    gate_tx.send(()).unwrap();
    let err = in_flight.await.unwrap().unwrap_err();
    assert_eq!(err.kind(), ErrorKind::ShutDown);
    assert_eq!(scripted.count(Op::Release), 1, "given back at once");
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn a_failed_release_stays_tracked_and_shutdown_releases_it() {
    let scripted = ScriptedStore::new();
    scripted
        .grant_acquire()
        .expect_release(Err(Error::connection("scripted: connection reset")))
        .expect_release(Ok(true));
    let (store, seen) = tracking(&scripted);
    let lease = store.try_acquire(&req("a", 10_000)).await.unwrap();
    let err = store.release(&lease).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Connection);
    assert_eq!(store.tracked(), 1, "the lock may still be in the store");
    assert_eq!(store.shutdown().await.unwrap(), 1);
    assert_eq!(seen.names(), ["released_at_shutdown"]);
    assert_eq!(scripted.calls()[2].token.as_ref(), Some(lease.token()));
    scripted.verify();
}

#[tokio::test(start_paused = true)]
async fn an_extend_landing_after_the_purge_is_tracked_again() {
    let scripted = ScriptedStore::new();
    let (open, rx) = tokio::sync::oneshot::channel::<()>();
    scripted
        .grant_acquire()
        .expect_extend_after(
            async move {
                let _ = rx.await;
            },
            |lease, ttl| Ok(lease.renewed(ttl, Instant::now())),
        )
        .expect_release(Ok(true));
    let (store, _) = tracking(&scripted);
    let store = Arc::new(store);
    let lease = store.try_acquire(&req("a", 1000)).await.unwrap();
    tokio::time::advance(Duration::from_millis(900)).await;
    let extending = {
        let (store, lease) = (store.clone(), lease.clone());
        tokio::spawn(async move { store.extend(&lease, Duration::from_secs(10)).await })
    };
    tokio::task::yield_now().await;
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_eq!(store.purge_expired(), 1, "expired as far as the layer knew");
    open.send(()).unwrap();
    extending.await.unwrap().unwrap();
    assert_eq!(store.tracked(), 1, "the store holds it for 10 s more");
    assert_eq!(
        store.shutdown().await.unwrap(),
        1,
        "so the shutdown releases it"
    );
    scripted.verify();
}
