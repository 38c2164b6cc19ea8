//! Waiting across processes on a real etcd. The shared suite (`tests/suites/fairness.rs`): every
//! process gets a hot key (none starves), and a crashed waiter leaves the line when its waiter
//! lease lapses. Here: how waiters in line are woken, what becomes of their leases, and that a
//! try never passes the line.

use std::time::{Duration, Instant};

use leasehold::{ErrorKind, LockManager, LockOptions};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use leasehold_testkit::fault_proxy::{FaultProxy, ProxyMode};

#[path = "../../../tests/suites/fairness.rs"]
mod suite;

impl suite::Deployment for EtcdServer {
    const STARVES_AFTER: Duration = Duration::from_secs(30);
    /// The dead waiter is first in line until its waiter lease (5 s) lapses.
    const LAPSES_WITHIN: Duration = Duration::from_secs(30);

    fn start(_: &tokio::runtime::Runtime) -> Self {
        EtcdServer::start().expect("start etcd")
    }

    fn address(&self) -> String {
        self.endpoint()
    }

    async fn manager(endpoint: &str) -> LockManager {
        manager(endpoint).await
    }

    async fn line_length(endpoint: &str, entity: &str) -> usize {
        let mut raw = etcd_client::Client::connect([endpoint], None)
            .await
            .unwrap();
        let line = format!("leasehold:DC#f1#fair#{entity}#waiter#");
        let waiting = raw
            .get(line, Some(etcd_client::GetOptions::new().with_prefix()))
            .await
            .unwrap();
        waiting.count() as usize
    }
}

suite::fairness_suite!(EtcdServer);

async fn manager(endpoint: &str) -> LockManager {
    let store = EtcdStore::connect(EtcdConfig::new([endpoint]))
        .await
        .expect("connect");
    LockManager::builder()
        .client_id("fair")
        .farm_id("f1")
        .store(store)
        .build()
        .expect("manager")
}

/// A manager with its own store (its own place in line, as another process would have) whose
/// store requests are counted.
async fn counted(
    endpoint: &str,
) -> (
    LockManager,
    std::sync::Arc<leasehold::layers::RequestCounts>,
) {
    counted_polling(endpoint, leasehold::DEFAULT_RETRY_INTERVAL).await
}

/// A manager on its own connection whose store requests are counted, polling every `retry` as
/// the safety net under the watch (the default is 1 s; a test that must see the watch alone wake
/// a waiter sets it past the test's length).
async fn counted_polling(
    endpoint: &str,
    retry: Duration,
) -> (
    LockManager,
    std::sync::Arc<leasehold::layers::RequestCounts>,
) {
    let store = EtcdStore::connect(EtcdConfig::new([endpoint]))
        .await
        .expect("connect");
    counted_on(store, retry)
}

/// A counted manager on `store`, polling every `retry` (see [`counted_polling`]).
fn counted_on(
    store: EtcdStore,
    retry: Duration,
) -> (
    LockManager,
    std::sync::Arc<leasehold::layers::RequestCounts>,
) {
    let counting = leasehold::layers::CountingLayer::new();
    let counts = counting.counts();
    let locks = LockManager::builder()
        .client_id("fair")
        .farm_id("f1")
        .retry_interval(retry)
        .store(store)
        .layer(counting)
        .build()
        .expect("manager");
    (locks, counts)
}

/// Longer than any test here runs: a waiter polling this rarely is woken by the watch alone.
const NEVER: Duration = Duration::from_secs(120);

/// How many processes wait in `key`'s line, read straight from etcd.
async fn line_length(raw: &mut etcd_client::Client, key: &str) -> i64 {
    let line = format!("leasehold:DC#f1#fair#{key}#waiter#");
    raw.get(
        line,
        Some(
            etcd_client::GetOptions::new()
                .with_prefix()
                .with_count_only(),
        ),
    )
    .await
    .unwrap()
    .count()
}

/// A private etcd, its endpoint and a raw client to look at it.
async fn private_etcd() -> (EtcdServer, String, etcd_client::Client) {
    let server = EtcdServer::start().expect("start etcd");
    let endpoint = server.endpoint();
    let raw = etcd_client::Client::connect([endpoint.clone()], None)
        .await
        .unwrap();
    (server, endpoint, raw)
}

/// Waits (bounded) until `n` processes wait in `key`'s line.
async fn until_queued(raw: &mut etcd_client::Client, key: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while line_length(raw, key).await < n {
        assert!(
            Instant::now() < deadline,
            "{n} processes never queued on {key}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_wakes_the_next_in_line_not_everyone_behind_it() {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("line").await.expect("free");

    // Five processes queue one after another, each taking the lock and letting it go at once;
    // the last one, queued behind all of them, is the one watched.
    const AHEAD: i64 = 5;
    let mut ahead = Vec::new();
    for place in 1..=AHEAD {
        let (locks, _) = counted(&endpoint).await;
        ahead.push(tokio::spawn(async move {
            let guard = locks
                .lock_with("line", LockOptions::new().wait(Duration::from_secs(30)))
                .await
                .expect("its turn comes");
            guard.release().await.expect("release");
        }));
        until_queued(&mut raw, "line", place).await;
    }
    // It never polls: every attempt it makes is one the watch woke it for.
    let (last, counts) = counted_polling(&endpoint, NEVER).await;
    let waiting = tokio::spawn(async move {
        let guard = last
            .lock_with("line", LockOptions::new().wait(Duration::from_secs(60)))
            .await
            .expect("its turn comes");
        guard.release().await.expect("release");
    });
    until_queued(&mut raw, "line", AHEAD + 1).await;
    let queued = counts.acquires();

    held.release().await.expect("release");
    for waiter in ahead {
        waiter.await.expect("each waiter ahead got its turn");
    }
    waiting.await.expect("the last waiter got its turn");

    // Five hand-overs ahead of it deleted ten keys under the lock (each holder's record and each
    // taker's place). Woken by all of them it would have asked ten times; woken only when the
    // one just ahead of it left and then by the release it waited for, it asks two or three
    // times (the first deletion after it queued wakes it to read its line; once if that release
    // came before its look), and never polls. On a loaded machine the hints can each wake it once
    // more (a deletion seen before its read of the line lands, a hold gone after it): seen once at
    // 4 in the full suite on 2 cores. Half the wake-everyone count still tells the two apart.
    let asked = counts.acquires() - queued;
    assert!(
        (1..=5).contains(&asked),
        "the last waiter asked {asked} times during five hand-overs ahead of it"
    );
}

/// The lease of the (one) waiter key in `key`'s line.
async fn waiter_lease(raw: &mut etcd_client::Client, key: &str) -> i64 {
    let line = format!("leasehold:DC#f1#fair#{key}#waiter#");
    let found = raw
        .get(line, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .unwrap();
    found.kvs().first().expect("a waiter key in line").lease()
}

/// Every lease etcd holds now.
async fn leases(raw: &mut etcd_client::Client) -> std::collections::HashSet<i64> {
    raw.leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|lease| lease.id())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_in_line_takes_its_turn_on_the_lease_it_granted_while_waiting() {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("spare").await.expect("free");
    let (waiter, _) = counted(&endpoint).await;
    let (tx, rx) = tokio::sync::oneshot::channel();
    let waiting = tokio::spawn(async move {
        let guard = waiter
            .lock_with("spare", LockOptions::new().wait(Duration::from_secs(30)))
            .await
            .expect("its turn comes");
        let _ = tx.send(());
        tokio::time::sleep(Duration::from_secs(60)).await; // hold until the test ends
        drop(guard);
    });
    until_queued(&mut raw, "spare", 1).await;
    let before_its_turn = leases(&mut raw).await;

    held.release().await.expect("release");
    rx.await.expect("the waiter took the lock");
    let record = raw.get("leasehold:DC#f1#fair#spare", None).await.unwrap();
    let lease = record.kvs().first().expect("the waiter's hold").lease();
    assert!(
        before_its_turn.contains(&lease),
        "the hand-over granted a new lease ({lease}) instead of using the one kept in line"
    );
    waiting.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_gives_up_revokes_the_lease_it_kept() {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("given-up").await.expect("free");
    let holding = leases(&mut raw).await;
    let (waiter, _) = counted(&endpoint).await;
    let waiting = tokio::spawn(async move {
        waiter
            .lock_with("given-up", LockOptions::new().wait(Duration::from_secs(2)))
            .await
    });
    until_queued(&mut raw, "given-up", 1).await;
    let session = std::collections::HashSet::from([waiter_lease(&mut raw, "given-up").await]);
    let refused = waiting.await.unwrap().expect_err("held all along");
    assert_eq!(refused.kind(), ErrorKind::Timeout);
    // What is left of the waiter is its waiter lease (kept alive for the next wait); the lease
    // its refused attempt kept for its turn is revoked (in the background: poll for it).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let extra: std::collections::HashSet<i64> = leases(&mut raw)
            .await
            .difference(&holding)
            .copied()
            .collect();
        if extra == session {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "leases {extra:?} are left of the waiter; only its waiter lease {session:?} should be"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_whose_name_extends_anothers_does_not_wake_its_waiters() {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("look").await.expect("free");
    let (waiter, counts) = counted(&endpoint).await;
    let waiting = tokio::spawn(async move {
        waiter
            .lock_with("look", LockOptions::new().wait(Duration::from_secs(30)))
            .await
            .expect("its turn comes")
            .release()
            .await
            .expect("release");
    });
    until_queued(&mut raw, "look", 1).await;
    // Its read of the line (after joining) is done once it asked twice; from then on only a
    // deletion under `look` may wake it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while counts.acquires() < 2 {
        assert!(
            Instant::now() < deadline,
            "the waiter never looked at its line"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let asked = counts.acquires();
    // `look2`'s record sits under `look`'s watch prefix: ten releases of it.
    for _ in 0..10 {
        holder
            .try_lock("look2")
            .await
            .unwrap()
            .release()
            .await
            .unwrap();
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        counts.acquires() - asked <= 1,
        "ten releases of another lock woke the waiter {} times",
        counts.acquires() - asked
    );
    held.release().await.unwrap();
    waiting.await.expect("the waiter got its turn");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_during_a_broken_watch_still_wakes_the_waiter_once_it_is_back() {
    let (server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("gap").await.expect("free");

    // The waiter reaches etcd through a proxy that can cut it off, and never polls: only its
    // watch can tell it the lock is free.
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let store = EtcdStore::connect(EtcdConfig::new([proxy.addr().to_string()]))
        .await
        .expect("connect through the proxy");
    let (waiter, counts) = counted_on(store, NEVER);
    let waiting = tokio::spawn(async move {
        waiter
            .lock_with("gap", LockOptions::new().wait(Duration::from_secs(60)))
            .await
            .map(|guard| guard.fencing_token())
    });
    until_queued(&mut raw, "gap", 1).await;
    let asked = counts.acquires();

    // Its connection (and with it the watch stream) is cut; the lock is released in the gap;
    // then the connection comes back. The deletion happened while nothing watched.
    proxy.set_mode(ProxyMode::Refuse);
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.release().await.expect("release");
    tokio::time::sleep(Duration::from_millis(700)).await;
    proxy.set_mode(ProxyMode::Pass);

    // The watch resumes where it broke, etcd replays the release, and the waiter takes the lock:
    // long before its 120 s poll, and without an attempt during the cut (which would have failed
    // the wait with a connection error).
    let taken = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the replayed release woke the waiter")
        .unwrap();
    assert!(taken.is_ok(), "the waiter's wait failed: {taken:?}");
    assert!(
        counts.acquires() - asked <= 2,
        "{} attempts after the cut: one woken by the replayed release should do",
        counts.acquires() - asked
    );
}

/// A process waits on `key` behind a holder, polling never; its waiter lease is then revoked
/// (what etcd does when a process could not keep it alive for its TTL), so its place goes while
/// it still counts on it. `read_first`: it has read its line before (so the release alone makes
/// it take its turn, without a read that would see the place gone).
async fn lapsed_place_then_release(key: &'static str, read_first: bool) {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock(key).await.expect("free");
    let ahead = if read_first {
        // Someone ahead of it who gives up: its leaving wakes the waiter, which reads its line
        // and learns it is first.
        let (ahead, _) = counted(&endpoint).await;
        let gives_up = tokio::spawn(async move {
            ahead
                .lock_with(key, LockOptions::new().wait(Duration::from_secs(1)))
                .await
                .expect_err("held all along")
        });
        until_queued(&mut raw, key, 1).await;
        Some(gives_up)
    } else {
        None
    };
    let (waiter, counts) = counted_polling(&endpoint, NEVER).await;
    let waiting = tokio::spawn(async move {
        waiter
            .lock_with(key, LockOptions::new().wait(Duration::from_secs(60)))
            .await
            .map(|guard| guard.fencing_token())
    });
    until_queued(&mut raw, key, if read_first { 2 } else { 1 }).await;
    if let Some(gives_up) = ahead {
        let asked = counts.acquires();
        assert_eq!(gives_up.await.unwrap().kind(), ErrorKind::Timeout);
        until_queued_exactly(&mut raw, key, 1).await;
        let deadline = Instant::now() + Duration::from_secs(10);
        while counts.acquires() == asked {
            assert!(Instant::now() < deadline, "the waiter never read its line");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let session = waiter_lease(&mut raw, key).await;
    raw.lease_revoke(session).await.unwrap();
    until_queued_exactly(&mut raw, key, 0).await;

    // The release wakes it (first in line, as far as it knows): it finds its place gone, and
    // instead of waiting for a poll that never comes, it joins again (on a new waiter lease) and
    // takes the lock.
    held.release().await.expect("release");
    let taken = tokio::time::timeout(Duration::from_secs(30), waiting)
        .await
        .expect("the waiter took the free lock after its place lapsed")
        .unwrap();
    assert!(taken.is_ok(), "the waiter's wait failed: {taken:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_place_lapsed_joins_the_line_again_and_takes_its_turn() {
    lapsed_place_then_release("lapsed", false).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_place_lapsed_after_it_learned_it_was_first_joins_again() {
    lapsed_place_then_release("lapsed-first", true).await;
}

/// Waits (bounded) until exactly `n` processes wait in `key`'s line.
async fn until_queued_exactly(raw: &mut etcd_client::Client, key: &str, n: i64) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while line_length(raw, key).await != n {
        assert!(
            Instant::now() < deadline,
            "the line of {key} never held {n} waiters"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A plain try asks etcd only whether the record exists. Refused with the record gone (in a
/// hand-over, the line is not empty) it reads why after its transaction: it is refused, not
/// failed, it writes nothing, and once the line is empty the same try is granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_is_refused_while_the_lock_is_free_but_another_process_is_in_line() {
    let (_server, endpoint, mut raw) = private_etcd().await;
    let key = "in-line";
    let record = format!("leasehold:DC#f1#fair#{key}");
    // Another process's place, as its waiter key stands in line: on its own lease.
    let lease = raw.lease_grant(30, None).await.unwrap().id();
    let place = format!("{record}#waiter#{lease:x}");
    raw.put(
        place.as_str(),
        "another-process",
        Some(etcd_client::PutOptions::new().with_lease(lease)),
    )
    .await
    .unwrap();
    let locks = manager(&endpoint).await;
    let refused = locks
        .try_lock(key)
        .await
        .expect_err("a try passed the line");
    assert_eq!(refused.kind(), ErrorKind::LockUnavailable, "{refused}");
    let held = raw.get(record.as_str(), None).await.unwrap();
    assert_eq!(held.count(), 0, "the refused try wrote the record");
    assert_eq!(line_length(&mut raw, key).await, 1, "the line changed");

    raw.delete(place.as_str(), None).await.unwrap();
    let guard = locks.try_lock(key).await.expect("free, nobody in line");
    assert!(guard.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_dropped_before_etcd_confirms_it_leaves_no_waiter_registered() {
    use leasehold::LockStore;
    let (server, endpoint, mut raw) = private_etcd().await;
    let (holder, _) = counted(&endpoint).await;
    let held = holder.try_lock("unconfirmed").await.expect("free");
    let store = EtcdStore::connect(EtcdConfig::new([endpoint.as_str()]))
        .await
        .expect("connect");
    let (waiter, _) = counted_on(store.clone(), leasehold::DEFAULT_RETRY_INTERVAL);
    let key = waiter.key("unconfirmed").unwrap();
    // etcd answers nothing while paused: the watch is asked for, and its caller gives up before
    // etcd confirms it.
    server.pause().unwrap();
    let dropped = tokio::time::timeout(Duration::from_millis(100), store.watch(&key)).await;
    server.resume().unwrap();
    assert!(dropped.is_err(), "the caller stopped waiting");
    // A wait of its own now, which joins the line and gives up: had the dropped watch stayed
    // registered, the process would still count a waiter on the key, and its place would stay
    // in line (on its waiter lease, kept alive) after every wait ended.
    let refused = waiter
        .lock_with(
            "unconfirmed",
            LockOptions::new().wait(Duration::from_secs(1)),
        )
        .await
        .expect_err("held all along");
    assert_eq!(refused.kind(), ErrorKind::Timeout, "{refused}");
    let deadline = Instant::now() + Duration::from_secs(3);
    while line_length(&mut raw, "unconfirmed").await != 0 {
        assert!(
            Instant::now() < deadline,
            "a place is left in line after every wait ended"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    held.release().await.unwrap();
}

/// A blocking attempt of `store`'s wait on `entity`, by a new owner.
fn blocking_attempt(
    entity: &str,
    watch: &leasehold::core::ReleaseWatch,
) -> leasehold::core::Acquire {
    let key = leasehold::LockKey::dc("f1", "fair", entity).unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    leasehold::core::Acquire::new(
        key,
        leasehold::OwnerToken::generate(),
        Duration::from_secs(60),
    )
    .with_wait(Some(leasehold::core::Wait::new(deadline, watch.waiter())))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_blocking_attempt_whose_reply_is_lost_leaves_no_place_in_line() {
    use leasehold::core::Attempt;
    use leasehold::{LockKey, LockStore};

    let (server, endpoint, mut raw) = private_etcd().await;
    let holder = EtcdStore::connect(EtcdConfig::new([endpoint.as_str()]))
        .await
        .expect("connect");
    let proxy = FaultProxy::start(server.addr()).await.unwrap();
    let store = EtcdStore::connect(
        EtcdConfig::new([proxy.addr().to_string()]).response_timeout(Duration::from_millis(500)),
    )
    .await
    .expect("connect through the proxy");
    let hold = |entity: &str| {
        leasehold::core::Acquire::new(
            LockKey::dc("f1", "fair", entity).unwrap(),
            leasehold::OwnerToken::generate(),
            Duration::from_secs(60),
        )
    };
    let first = holder.try_acquire(&hold("lost-first")).await.unwrap();
    let second = holder.try_acquire(&hold("lost")).await.unwrap();
    // A wait elsewhere first: the process's waiter lease is granted and its place taken, so the
    // attempt below has nothing to ask before its transaction.
    let watch = store.watch(first.key()).await;
    let refused = store
        .acquire(&blocking_attempt("lost-first", &watch))
        .await
        .unwrap();
    assert!(matches!(refused, Attempt::Refused { .. }), "{refused:?}");
    drop(watch);
    until_queued_exactly(&mut raw, "lost-first", 0).await;
    // And a lease of its own to put a hold on, from a hold it released (no grant either).
    let spare = store.try_acquire(&hold("lost-spare")).await.unwrap();
    assert!(store.release(&spare).await.unwrap());

    // The attempt is applied (refused: the key is held, so its waiter key joins the line) and
    // its reply lost: in doubt.
    let watch = store.watch(second.key()).await;
    proxy.set_mode(ProxyMode::DropReplies);
    let err = store
        .acquire(&blocking_attempt("lost", &watch))
        .await
        .unwrap_err();
    assert!(err.is_in_doubt(), "{err}");
    proxy.set_mode(ProxyMode::Pass);
    assert_eq!(line_length(&mut raw, "lost").await, 1, "the attempt joined");

    // The wait ends there; its place goes with it (the waiter lease lives on with the process,
    // so nothing else would take it out).
    drop(watch);
    until_queued_exactly(&mut raw, "lost", 0).await;
    assert!(holder.release(&second).await.unwrap());
    assert!(holder.release(&first).await.unwrap());
}
