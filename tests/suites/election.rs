//! The job-lock and election behaviour every store runs (included by each store's
//! `tests/election.rs` with `#[path]`): a job lock released early is kept for the rest of its
//! period, then expires; candidates on separate managers (one connection each, as separate
//! processes) elect one leader at a time with growing terms, hand leadership over at once on
//! resign, drop or shutdown, see `lost()` when their lock is broken, and `observe` sees every
//! change in order.
//!
//! A store's test file implements [`Fleet`] and invokes `election_suite!`.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::{Stream, StreamExt};

use leasehold::{ErrorKind, Leader, LockManager, LockOptions, LockStore, ReleaseOutcome};

/// A deployment of one store that hands out instances of a fleet: each its own manager and
/// connection, as separate processes would have.
pub(crate) trait Fleet {
    /// A new instance.
    fn instance(&self) -> Pin<Box<dyn Future<Output = LockManager> + Send + '_>>;

    /// Whether the store announces grants and releases
    /// ([`LockStore::watch_changes`](leasehold::LockStore::watch_changes)), so observers see a
    /// change without polling.
    fn announces_changes(&self) -> bool {
        true
    }
}

/// One test per behaviour below, each on a deployment of its own made by `$setup` (an async
/// expression whose value implements [`Fleet`]). The including file names this module `suite`.
macro_rules! election_suite {
    ($setup:expr) => {
        suite::election_suite!(@tests $setup;
            a_job_lock_released_early_keeps_other_instances_out_until_its_period_ends,
            a_job_lock_released_after_its_period_is_freed_at_once,
            of_n_candidates_exactly_one_leads_at_a_time_and_terms_grow,
            resigning_dropping_or_shutting_down_hands_leadership_over_before_the_ttl,
            a_leader_whose_lock_is_broken_sees_lost,
            observe_sees_every_change_in_order,
            observe_sees_each_change_as_announced_with_the_leaders_label,
            observe_sees_a_leader_that_died_once_its_lease_runs_out,
        );
    };
    (@tests $setup:expr; $($name:ident,)*) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $name() {
                let fleet = $setup;
                suite::$name(&fleet).await;
            }
        )*
    };
}
pub(crate) use election_suite;

pub(crate) async fn a_job_lock_released_early_keeps_other_instances_out_until_its_period_ends(
    fleet: &impl Fleet,
) {
    let a = fleet.instance().await;
    let b = fleet.instance().await;
    let period = Duration::from_secs(2);

    let guard = a
        .try_lock_with("nightly", LockOptions::new().hold_at_least(period))
        .await
        .unwrap();
    let outcome = guard.release_outcome().await.unwrap();
    let ReleaseOutcome::Kept { left } = outcome else {
        panic!("released at once after the grant, yet {outcome:?}");
    };
    assert!(left <= period);
    // The record lives on with the rest of the period as the store's TTL.
    let info = b.inspect("nightly").await.unwrap().expect("kept");
    assert!(info.ttl_remaining.expect("a TTL") <= period);
    // The job's process shuts down and exits: the lock stays for the rest of the period.
    a.shutdown().await.unwrap();
    let err = b.try_lock("nightly").await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");

    // Then the store expires it and the next period's run gets it.
    let next = b
        .lock_with("nightly", LockOptions::new().wait(Duration::from_secs(20)))
        .await
        .expect("free once the period has passed");
    assert_eq!(
        next.release_outcome().await.unwrap(),
        ReleaseOutcome::Released
    );
}

pub(crate) async fn a_job_lock_released_after_its_period_is_freed_at_once(fleet: &impl Fleet) {
    let a = fleet.instance().await;
    let guard = a
        .try_lock_with(
            "quick",
            LockOptions::new().hold_at_least(Duration::from_millis(200)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        guard.release_outcome().await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(a.inspect("quick").await.unwrap(), None);
}

/// Election lease: short enough that a lost leader learns quickly (renewal every second).
const ELECTION_TTL: Duration = Duration::from_secs(3);
/// Bounds every wait of these tests, so a broken election fails instead of hanging.
const BOUND: Duration = Duration::from_secs(60);

fn election() -> LockOptions {
    LockOptions::new().ttl(ELECTION_TTL).wait(BOUND)
}

pub(crate) async fn of_n_candidates_exactly_one_leads_at_a_time_and_terms_grow(fleet: &impl Fleet) {
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut candidates = Vec::new();
    for _ in 0..4 {
        let locks = fleet.instance().await;
        let (leading, terms) = (leading.clone(), terms.clone());
        candidates.push(tokio::spawn(async move {
            for _ in 0..2 {
                let leadership = locks.campaign_with("primary", election()).await.unwrap();
                assert_eq!(
                    leading.fetch_add(1, Ordering::SeqCst),
                    0,
                    "two leaders at once"
                );
                terms
                    .lock()
                    .unwrap()
                    .push(leadership.term().expect("fenced"));
                tokio::time::sleep(Duration::from_millis(200)).await;
                leading.fetch_sub(1, Ordering::SeqCst);
                assert!(leadership.resign().await.unwrap());
            }
        }));
    }
    for candidate in candidates {
        candidate.await.unwrap();
    }
    let terms = terms.lock().unwrap().clone();
    assert_eq!(terms.len(), 8);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms grow: {terms:?}"
    );
}

pub(crate) async fn resigning_dropping_or_shutting_down_hands_leadership_over_before_the_ttl(
    fleet: &impl Fleet,
) {
    // A long lease: only a resignation can hand leadership over within the test's bound.
    let long = || LockOptions::new().ttl(Duration::from_secs(300)).wait(BOUND);
    let campaign = |locks: &LockManager| {
        let locks = locks.clone();
        tokio::spawn(async move { locks.campaign_with("primary", long()).await })
    };
    let a = fleet.instance().await;
    let b = fleet.instance().await;
    let c = fleet.instance().await;

    let first = a.campaign_with("primary", long()).await.unwrap();
    let first_term = first.term();
    let waiting = campaign(&b);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(first.resign().await.unwrap());
    let second = waiting.await.unwrap().expect("leads after the resignation");
    assert!(second.term() > first_term);

    let waiting = campaign(&c);
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(second);
    let third = waiting.await.unwrap().expect("leads after the drop");
    let third_term = third.term();

    // The leader's manager shuts down (a rolling restart): it resigns.
    let waiting = campaign(&a);
    tokio::time::sleep(Duration::from_millis(300)).await;
    c.shutdown().await.unwrap();
    let lost = tokio::time::timeout(BOUND, third.lost())
        .await
        .expect("lost on shutdown");
    assert_eq!(lost.kind(), ErrorKind::NotHeld);
    let fourth = waiting.await.unwrap().expect("leads after the shutdown");
    assert!(fourth.is_leader());
    assert!(fourth.term() > third_term);
}

pub(crate) async fn a_leader_whose_lock_is_broken_sees_lost(fleet: &impl Fleet) {
    let a = fleet.instance().await;
    let b = fleet.instance().await;
    let leadership = a.campaign_with("primary", election()).await.unwrap();
    // An operator force-releases the election lock (an owner-checked delete with its token),
    // straight in the store.
    assert!(b.store().release(&leadership.lease()).await.unwrap());
    let usurper = b.campaign_with("primary", election()).await.unwrap();
    let lost = tokio::time::timeout(BOUND, leadership.lost())
        .await
        .expect("lost is signalled at the next renewal");
    assert_eq!(lost.kind(), ErrorKind::NotHeld, "{lost}");
    assert!(!leadership.is_leader());
    assert!(usurper.term() > leadership.term());
    assert!(!leadership.resign().await.unwrap());
}

/// The next change an observer sees, within the test's bound.
async fn next<S>(changes: &mut S) -> Option<Leader>
where
    S: Stream<Item = leasehold::Result<Option<Leader>>> + Unpin,
{
    tokio::time::timeout(BOUND, changes.next())
        .await
        .expect("a change")
        .expect("the stream goes on")
        .expect("read")
}

pub(crate) async fn observe_sees_every_change_in_order(fleet: &impl Fleet) {
    let watcher = fleet.instance().await;
    let mut changes = Box::pin(watcher.observe_every("primary", Duration::from_millis(50)));
    assert_eq!(next(&mut changes).await, None, "nobody leads yet");
    let mut terms = Vec::new();
    for _ in 0..3 {
        let locks = fleet.instance().await;
        let leadership = locks.campaign_with("primary", election()).await.unwrap();
        terms.push(leadership.term());
        let seen = next(&mut changes).await.expect("a leader");
        assert_eq!(&seen.token, leadership.token());
        assert_eq!(seen.term, leadership.term());
        assert_eq!(seen.pid, Some(std::process::id()));
        // Held for several intervals, so no change is between two reads.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(leadership.resign().await.unwrap());
        assert_eq!(next(&mut changes).await, None);
    }
    assert!(terms.windows(2).all(|w| w[0] < w[1]), "{terms:?}");
}

/// How soon an announced change must reach an observer that would otherwise not read for an
/// hour: well under the observer's backstop, so only an announcement explains it.
const ANNOUNCED: Duration = Duration::from_millis(1500);

/// The read interval of an observer: an hour where the store announces changes (so every change
/// seen within [`ANNOUNCED`] was announced), 50 ms where it does not.
fn observer_interval(fleet: &impl Fleet) -> Duration {
    if fleet.announces_changes() {
        Duration::from_secs(3600)
    } else {
        Duration::from_millis(50)
    }
}

/// The next change an observer sees within [`ANNOUNCED`].
async fn announced<S>(changes: &mut S) -> Option<Leader>
where
    S: Stream<Item = leasehold::Result<Option<Leader>>> + Unpin,
{
    tokio::time::timeout(ANNOUNCED, changes.next())
        .await
        .expect("the change announced at once")
        .expect("the stream goes on")
        .expect("read")
}

pub(crate) async fn observe_sees_each_change_as_announced_with_the_leaders_label(
    fleet: &impl Fleet,
) {
    let watcher = fleet.instance().await;
    let mut changes = Box::pin(watcher.observe_every("announced", observer_interval(fleet)));
    assert_eq!(announced(&mut changes).await, None, "nobody leads yet");
    for round in 0..3 {
        let locks = fleet.instance().await;
        let address = format!("http://10.0.0.{round}:8080/#leader");
        let leadership = locks
            .campaign_with("announced", election().label(address.as_str()))
            .await
            .unwrap();
        let seen = announced(&mut changes).await.expect("a leader");
        assert_eq!(&seen.token, leadership.token(), "round {round}");
        assert_eq!(seen.label.as_deref(), Some(address.as_str()));
        assert_eq!(seen.pid, Some(std::process::id()));
        let read = locks.leader("announced").await.unwrap().expect("leads");
        assert_eq!(read.label.as_deref(), Some(address.as_str()));
        assert!(leadership.resign().await.unwrap());
        assert_eq!(announced(&mut changes).await, None, "round {round}");
    }
    // An observer takes no place in the line: a candidate leads at once.
    let locks = fleet.instance().await;
    let leadership = tokio::time::timeout(
        ANNOUNCED,
        locks.campaign_with("announced", election().wait(Duration::ZERO)),
    )
    .await
    .expect("at once")
    .expect("nobody ahead of it");
    assert!(announced(&mut changes).await.is_some());
    drop(leadership);
    assert_eq!(announced(&mut changes).await, None, "a dropped leadership");
}

pub(crate) async fn observe_sees_a_leader_that_died_once_its_lease_runs_out(fleet: &impl Fleet) {
    let watcher = fleet.instance().await;
    let mut changes = Box::pin(watcher.observe_every("orphaned", observer_interval(fleet)));
    assert_eq!(announced(&mut changes).await, None, "nobody leads yet");
    // A leader that dies without resigning: its lock is never renewed nor released, as after a
    // SIGKILL (the guard is leaked, so nothing releases it).
    let dying = fleet.instance().await;
    let key = dying.election_key("orphaned").unwrap();
    let ttl = Duration::from_secs(2);
    let guard = dying
        .try_lock_with(key, LockOptions::new().ttl(ttl).renew(false))
        .await
        .unwrap();
    let token = guard.token().clone();
    std::mem::forget(guard);
    let seen = announced(&mut changes).await.expect("a leader");
    assert_eq!(seen.token, token);
    // Seen gone once its lease runs out: by the store's expiry announcement, or by the read the
    // observer makes when the lease it saw lapses.
    let gone = tokio::time::timeout(ttl + ANNOUNCED, changes.next())
        .await
        .expect("seen gone once its lease ran out")
        .expect("the stream goes on")
        .expect("read");
    assert_eq!(gone, None);
}
