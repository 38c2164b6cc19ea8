//! Lease renewal: a short lease stays ours while the guard lives; a stolen lease or an unreachable
//! store marks the guard lost; the renewal task never outlives its guard. Paused time throughout,
//! but for a process paused while its renewal was in flight (a blocked thread, real time).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use leasehold::{
    Error, ErrorKind, Lease, LockEvent, LockManager, LockOptions, LockStore, MemoryStore, Result,
};

/// The embedded store, with extend calls counted and failing on demand (an unreachable store),
/// or blocking its thread past the lease's expiry before its next answer (a process paused, by
/// GC, SIGSTOP or a VM migration, while its extend was in flight).
#[derive(Debug, Default)]
struct Flaky {
    inner: MemoryStore,
    extends: AtomicU32,
    unreachable: AtomicBool,
    pause_next: AtomicBool,
}

impl leasehold::core::LayeredStore for Flaky {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.extends.fetch_add(1, Ordering::SeqCst);
        if self.unreachable.load(Ordering::SeqCst) {
            return Err(Error::connection("cannot reach 127.0.0.1:1"));
        }
        let renewed = self.inner.extend(lease, ttl).await;
        if self.pause_next.swap(false, Ordering::SeqCst) {
            std::thread::sleep(lease.remaining() + Duration::from_millis(100));
        }
        renewed
    }
}

fn setup() -> (LockManager, Arc<Flaky>, Arc<Mutex<Vec<&'static str>>>) {
    let store = Arc::new(Flaky::default());
    let events = Arc::new(Mutex::new(Vec::new()));
    let sink = events.clone();
    // The bare manager: renewal is the guard's, not a layer's, and the thief below contends from
    // the same task.
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .without_layers()
        .store(store.clone())
        .observer(move |e: &LockEvent| sink.lock().unwrap().push(e.name()))
        .build()
        .unwrap();
    (locks, store, events)
}

fn renewing() -> LockOptions {
    LockOptions::new().ttl(Duration::from_secs(3)).renew(true)
}

fn count(events: &Mutex<Vec<&'static str>>, name: &str) -> usize {
    events
        .lock()
        .unwrap()
        .iter()
        .filter(|e| **e == name)
        .count()
}

#[tokio::test(start_paused = true)]
async fn renewal_keeps_a_short_lease_alive() {
    let (locks, store, events) = setup();
    let guard = locks.try_lock_with("job", renewing()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert!(guard.is_held());
    let info = locks.inspect("job").await.unwrap().expect("still held");
    assert!(info.is_owned_by(guard.token()));
    assert!(store.extends.load(Ordering::SeqCst) >= 9, "every ttl/3");
    assert!(count(&events, "renewed") >= 9);
    assert!(guard.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_broken_lock_is_noticed_as_lost() {
    let (locks, store, events) = setup();
    let guard = locks.try_lock_with("job", renewing()).await.unwrap();
    // An operator breaks the lock; someone else takes it.
    store.inner.release(&guard.lease()).await.unwrap();
    let thief = locks.try_lock("job").await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(5), guard.lost())
        .await
        .expect("loss noticed within one renewal interval");
    assert_eq!(lost.kind(), ErrorKind::NotHeld);
    assert!(lost.to_string().contains("no longer ours"), "{lost}");
    assert!(!guard.is_held());
    assert_eq!(count(&events, "lost"), 1);
    assert!(
        !guard.release().await.unwrap(),
        "release of a lost lock deletes nothing"
    );
    assert!(locks
        .inspect("job")
        .await
        .unwrap()
        .unwrap()
        .is_owned_by(thief.token()));
    thief.release().await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_store_loses_the_lock_when_the_lease_runs_out() {
    let (locks, store, _) = setup();
    let guard = locks.try_lock_with("job", renewing()).await.unwrap();
    let acquired = guard.lease();
    store.unreachable.store(true, Ordering::SeqCst);
    let lost = guard.lost().await;
    assert!(
        lost.to_string().contains("before the lease expired"),
        "{lost}"
    );
    assert!(
        tokio::time::Instant::now() >= acquired.expires_at(),
        "declared lost only once the lease may have expired"
    );
    assert!(store.extends.load(Ordering::SeqCst) > 2, "kept retrying");
}

#[tokio::test(start_paused = true)]
async fn a_short_outage_is_ridden_out() {
    let (locks, store, events) = setup();
    let guard = locks.try_lock_with("job", renewing()).await.unwrap();
    store.unreachable.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    store.unreachable.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(guard.is_held());
    assert!(count(&events, "renewed") >= 2);
    assert_eq!(count(&events, "lost"), 0);
    assert!(guard.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn the_renewal_task_ends_with_its_guard() {
    let (locks, store, _) = setup();
    let guard = locks.try_lock_with("a", renewing()).await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    guard.release().await.unwrap();
    let after_release = store.extends.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(store.extends.load(Ordering::SeqCst), after_release);

    let dropped = locks.try_lock_with("b", renewing()).await.unwrap();
    drop(dropped);
    tokio::time::sleep(Duration::from_millis(10)).await;
    let after_drop = store.extends.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(store.extends.load(Ordering::SeqCst), after_drop);
    assert_eq!(
        locks.inspect("b").await.unwrap(),
        None,
        "dropped guard released"
    );
}

#[tokio::test(start_paused = true)]
async fn renewal_can_be_the_manager_default_and_its_interval_is_validated() {
    let store = Arc::new(Flaky::default());
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(store.clone())
        .lock_ttl(Duration::from_secs(3))
        .renewal(true)
        .build()
        .unwrap();
    let guard = locks
        .try_lock_with(
            "job",
            LockOptions::new().renew_every(Duration::from_millis(500)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(2100)).await;
    assert_eq!(store.extends.load(Ordering::SeqCst), 4);
    guard.release().await.unwrap();
    let plain = locks
        .try_lock_with("other", LockOptions::new().renew(false))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        locks.inspect("other").await.unwrap(),
        None,
        "not renewed: expired at its TTL"
    );
    assert!(
        !plain.release().await.unwrap(),
        "expired, so no longer ours"
    );
    for every in [Duration::ZERO, Duration::from_secs(3)] {
        let err = locks
            .try_lock_with("x", LockOptions::new().renew_every(every))
            .await
            .unwrap_err();
        assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    }
}

/// The embedded store, with extends whose answer comes `delay` late: applied before the delay
/// (a slow reply) or after it (a slow request).
#[derive(Debug, Default)]
struct SlowExtend {
    inner: MemoryStore,
    delay: Duration,
    applied_first: bool,
}

impl leasehold::core::LayeredStore for SlowExtend {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        if self.applied_first {
            let renewed = self.inner.extend(lease, ttl).await;
            tokio::time::sleep(self.delay).await;
            return renewed;
        }
        tokio::time::sleep(self.delay).await;
        self.inner.extend(lease, ttl).await
    }
}

/// A manager over `memory` whose extends are applied at once and answered 2.5 s later: with
/// `renewing()`, the renewal at 1 s keeps the record until 4 s and is answered at 3.5 s, after
/// the lease's local expiry (3 s).
fn late_answer_manager(memory: &MemoryStore) -> leasehold::LockManagerBuilder {
    LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(SlowExtend {
            inner: memory.clone(),
            delay: Duration::from_millis(2500),
            applied_first: true,
        })
}

#[tokio::test(start_paused = true)]
async fn a_hanging_renewal_is_declared_lost_when_the_lease_runs_out() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(SlowExtend {
            delay: Duration::from_secs(60),
            ..SlowExtend::default()
        })
        .build()
        .unwrap();
    let guard = locks.try_lock_with("job", renewing()).await.unwrap();
    let expires = guard.lease().expires_at();
    let lost = guard.lost().await;
    assert!(
        lost.to_string().contains("before the lease expired"),
        "{lost}"
    );
    assert_eq!(
        tokio::time::Instant::now(),
        expires,
        "lost exactly when the lease ran out, not when the hung extend returned"
    );
    assert!(!guard.is_held());
}

#[tokio::test(start_paused = true)]
async fn a_renewal_answering_after_the_guard_was_lost_is_released() {
    let memory = MemoryStore::new();
    let locks = late_answer_manager(&memory).build().unwrap();
    // TTL 3 s, renewed at 1 s: the store extends the record to 4 s, the answer comes at 3.5 s,
    // after the guard was declared lost at 3 s.
    let guard = locks.try_lock_with("job", renewing()).await.unwrap();
    let key = guard.key().clone();
    guard.lost().await;
    assert!(
        memory.inspect(&key).await.unwrap().is_some(),
        "extended in the store"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        memory.inspect(&key).await.unwrap(),
        None,
        "released when the late answer came (3.5 s), not left until 4 s"
    );
}

/// The embedded store, with each extend taking 500 ms and every call logged in order.
#[derive(Debug, Default)]
struct LoggedExtend {
    inner: MemoryStore,
    log: Mutex<Vec<&'static str>>,
}

impl leasehold::core::LayeredStore for LoggedExtend {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.log.lock().unwrap().push("extend sent");
        tokio::time::sleep(Duration::from_millis(500)).await;
        let renewed = self.inner.extend(lease, ttl).await;
        self.log.lock().unwrap().push("extend answered");
        renewed
    }
    async fn release(&self, lease: &Lease) -> Result<bool> {
        self.log.lock().unwrap().push("release");
        self.inner.release(lease).await
    }
}

#[tokio::test(start_paused = true)]
async fn a_release_during_an_extend_waits_for_its_answer() {
    let store = Arc::new(LoggedExtend::default());
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .without_layers()
        .store(store.clone())
        .build()
        .unwrap();
    let guard = locks.try_lock_with("a", renewing()).await.unwrap();
    // The first extend goes out at 1 s (a third of the TTL); release while it is in flight.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert_eq!(*store.log.lock().unwrap(), ["extend sent"]);
    assert!(
        guard.release().await.unwrap(),
        "the renewed lease is released"
    );
    assert_eq!(
        *store.log.lock().unwrap(),
        ["extend sent", "extend answered", "release"],
        "the release went out after the extend in flight answered"
    );
    assert_eq!(locks.inspect("a").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn without_renewal_the_guard_knows_when_its_lease_ran_out() {
    let (locks, _store, _) = setup();
    let ttl = Duration::from_secs(3);
    let mut guard = locks
        .try_lock_with("job", LockOptions::new().ttl(ttl).renew(false))
        .await
        .unwrap();
    let acquired = guard.lease();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(guard.is_held(), "within its TTL");
    // An `extend` moves the expiry on, and `lost()` follows it.
    guard.extend(ttl).await.unwrap();
    let extended = guard.lease();
    assert!(extended.expires_at() > acquired.expires_at());
    let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("an unrenewed lease is lost at its TTL");
    assert_eq!(lost.kind(), ErrorKind::NotHeld);
    assert!(lost.to_string().contains("nothing renews it"), "{lost}");
    assert_eq!(
        tokio::time::Instant::now(),
        extended.expires_at(),
        "lost at the extended expiry, not the first one"
    );
    assert!(!guard.is_held(), "past its TTL the key may be another's");
    let thief = locks.try_lock("job").await.expect("the key expired");
    assert!(
        !guard.release().await.unwrap(),
        "nothing of ours to release"
    );
    thief.release().await.unwrap();
}

/// Waits (at most 5 s) until nobody holds `key`.
async fn until_free(locks: &LockManager, key: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while locks.inspect(key).await.unwrap().is_some() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{key} is still held"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_read_after_the_leases_expiry_gives_the_lock_up() {
    let (locks, store, _) = setup();
    store.pause_next.store(true, Ordering::SeqCst);
    let guard = locks
        .try_lock_with(
            "job",
            LockOptions::new()
                .ttl(Duration::from_millis(600))
                .renew(true),
        )
        .await
        .unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(10), guard.lost())
        .await
        .expect("the late renewal is not taken as a renewal");
    assert_eq!(lost.kind(), ErrorKind::NotHeld);
    assert!(
        lost.to_string().contains("after the lease's local expiry"),
        "{lost}"
    );
    assert!(!guard.is_held(), "and it stays not held");
    // The lease the late renewal extended is given up, not left for its TTL.
    until_free(&locks, "job").await;
    let mut guard = guard;
    let refused = guard.extend(Duration::from_secs(1)).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::NotHeld, "{refused}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_extend_read_after_the_leases_expiry_gives_the_lock_up() {
    let (locks, store, _) = setup();
    store.pause_next.store(true, Ordering::SeqCst);
    let mut guard = locks
        .try_lock_with(
            "job",
            LockOptions::new()
                .ttl(Duration::from_millis(300))
                .renew(false),
        )
        .await
        .unwrap();
    let late = guard.extend(Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(late.kind(), ErrorKind::NotHeld, "{late}");
    assert!(late.to_string().contains("only after"), "{late}");
    assert!(!guard.is_held());
    // The 30 s the store granted are given back at once.
    until_free(&locks, "job").await;
}

/// A lease the library gave up itself (a renewal answered after the guard was lost, released
/// when it answered) is released once: the guard's own release sends nothing more. A second
/// release is not harmless through the layers: here reentrancy would count down the outer hold
/// of the same token and delete the record under it.
#[tokio::test(start_paused = true)]
async fn a_lease_given_up_by_a_late_renewal_is_released_once() {
    use leasehold::layers::CountingLayer;
    use leasehold::Holder;
    let counting = CountingLayer::new();
    let counts = counting.counts();
    let memory = MemoryStore::new();
    let locks = late_answer_manager(&memory)
        .layer(counting)
        .build()
        .unwrap();
    let me = Holder::new();
    let outer = locks
        .try_lock_with(
            "job",
            LockOptions::new()
                .ttl(Duration::from_secs(3))
                .renew(false)
                .holder(me),
        )
        .await
        .unwrap();
    // Re-entered by the same holder, renewed: its renewal at 1 s is applied in the store (the
    // record now lasts until 4 s) but answered at 3.5 s, after the lease's 3 s.
    let inner = locks
        .try_lock_with("job", renewing().holder(me))
        .await
        .unwrap();
    inner.lost().await;
    tokio::time::sleep(Duration::from_millis(600)).await;
    // Given up when the late answer came: the inner hold counted down, the outer one keeps the
    // record.
    assert_eq!(counts.releases(), 0);
    let key = outer.key().clone();
    assert!(memory.inspect(&key).await.unwrap().is_some());
    assert_eq!(
        inner.release_outcome().await.unwrap(),
        leasehold::ReleaseOutcome::NotHeld
    );
    assert_eq!(
        counts.releases(),
        0,
        "the outer hold is not counted down again"
    );
    assert!(memory.inspect(&key).await.unwrap().is_some());
    drop(outer);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(counts.releases(), 1, "the outer hold's release deletes it");
    assert_eq!(memory.inspect(&key).await.unwrap(), None);
}

/// An extend on a renewed guard sets the lease renewal keeps: a longer TTL is not undone by the
/// next renewal, and a shorter one is renewed in time (renewal starts again from it).
#[tokio::test(start_paused = true)]
async fn renewal_keeps_the_lease_an_extend_set() {
    let memory = MemoryStore::new();
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(memory.clone())
        .build()
        .unwrap();
    // Longer: 3 s renewed every 1 s, extended to 30 s at 0.5 s.
    let mut longer = locks.try_lock_with("longer", renewing()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    longer.extend(Duration::from_secs(30)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(4500)).await;
    let left = memory
        .inspect(longer.key())
        .await
        .unwrap()
        .and_then(|info| info.ttl_remaining)
        .unwrap();
    assert!(
        left > Duration::from_secs(20),
        "renewed back to 3 s: {left:?}"
    );
    assert!(longer.is_held());
    // Shorter: 30 s renewed every 10 s, extended to 6 s at 1 s: the store would expire it at
    // 7 s, before the renewal due at 10 s.
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).renew(true);
    let mut shorter = locks.try_lock_with("shorter", opts).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    shorter.extend(Duration::from_secs(6)).await.unwrap();
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(shorter.is_held(), "renewed at the new lease's pace");
    assert!(memory.inspect(shorter.key()).await.unwrap().is_some());
    assert!(shorter.release().await.unwrap());
    assert!(longer.release().await.unwrap());
}

/// The embedded store whose extends are applied but answered with a lost reply.
#[derive(Debug, Default)]
struct ExtendAppliedReplyLost {
    inner: MemoryStore,
}

impl leasehold::core::LayeredStore for ExtendAppliedReplyLost {
    type Inner = MemoryStore;
    fn inner(&self) -> &MemoryStore {
        &self.inner
    }
    async fn extend(&self, lease: &Lease, ttl: Duration) -> Result<Lease> {
        self.inner.extend(lease, ttl).await?;
        Err(Error::in_doubt("the extend's reply was lost"))
    }
}

/// An extend to a shorter TTL that fails in doubt may have been applied: the guard's local
/// expiry moves to where the store's may now be, never staying later than it.
#[tokio::test(start_paused = true)]
async fn a_shorter_extend_in_doubt_brings_the_local_expiry_forward() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(ExtendAppliedReplyLost::default())
        .release_retry(Duration::from_millis(500))
        .build()
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).renew(false);
    let mut guard = locks.try_lock_with("job", opts).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let err = guard.extend(Duration::from_secs(5)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InDoubt, "{err}");
    assert!(guard.is_held());
    // The store may expire it 5 s after the first attempt was sent (at 6 s).
    tokio::time::sleep(Duration::from_millis(5100)).await;
    assert!(!guard.is_held(), "held locally past the store's expiry");
    let lost = tokio::time::timeout(Duration::from_millis(10), guard.lost()).await;
    assert!(lost.is_ok(), "lost() agrees");
}

/// A shutdown during a renewal's retries stops them at once: it does not wait for them to run
/// out at the lease's expiry, and the guard says why it is no longer held.
#[tokio::test(start_paused = true)]
async fn a_shutdown_stops_a_renewal_retrying_an_outage() {
    let (locks, store, _) = setup();
    let guard = locks.try_lock_with("job", renewing()).await.unwrap();
    store.unreachable.store(true, Ordering::SeqCst);
    // The renewal due at 1 s fails and retries every 250 ms until the lease's 3 s.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert!(store.extends.load(Ordering::SeqCst) >= 1, "retrying");
    let started = tokio::time::Instant::now();
    // The release at shutdown fails too (the store is unreachable): only the timing matters.
    let _ = locks.shutdown().await;
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "waited for the retries: {:?}",
        started.elapsed()
    );
    let lost = guard.lost().await;
    assert!(lost.to_string().contains("shut down"), "{lost}");
}

/// A renewal cut off at the lease's expiry lands later. The guard, dropped before that, could not
/// let go of the lease itself (its release came past the unlock window and was skipped), so the
/// late renewal is released when it answers: the key is not blocked for a whole new TTL.
#[tokio::test(start_paused = true)]
async fn a_late_renewal_after_a_skipped_guard_release_is_still_released() {
    let memory = MemoryStore::new();
    let locks = late_answer_manager(&memory).build().unwrap();
    // TTL 3 s, renewed at 1 s (the store keeps it until 4 s), answered at 3.5 s.
    let guard = locks.try_lock_with("job", renewing()).await.unwrap();
    let key = guard.key().clone();
    guard.lost().await;
    // At 3 s the unlock window has closed: the guard's release is skipped.
    assert!(!guard.release().await.unwrap());
    assert!(
        memory.inspect(&key).await.unwrap().is_some(),
        "renewed to 4 s"
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        memory.inspect(&key).await.unwrap(),
        None,
        "released when the late renewal answered"
    );
}

/// An extend dropped before its answer may have been applied: the guard's local expiry moves to
/// the earliest the store's may now be, and renewal starts again from there.
#[tokio::test(start_paused = true)]
async fn an_extend_dropped_midway_brings_the_local_expiry_forward() {
    let locks = LockManager::builder()
        .client_id("test")
        .farm_id("f1")
        .store(SlowExtend {
            delay: Duration::from_secs(60),
            applied_first: true,
            ..SlowExtend::default()
        })
        .build()
        .unwrap();
    let opts = LockOptions::new().ttl(Duration::from_secs(30)).renew(true);
    let mut guard = locks.try_lock_with("job", opts).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let cut = tokio::time::timeout(
        Duration::from_millis(100),
        guard.extend(Duration::from_secs(2)),
    )
    .await;
    assert!(cut.is_err(), "the caller stopped waiting");
    assert!(guard.is_held());
    // Applied at 1 s, the store keeps the key until 3 s.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    assert!(!guard.is_held(), "held locally past the store's expiry");
    let lost = tokio::time::timeout(Duration::from_secs(2), guard.lost()).await;
    assert!(lost.is_ok(), "lost() resolves too");
}
