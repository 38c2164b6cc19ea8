//! Job locks and elections on Aerospike, through the wire fixture or a real cluster
//! (`AEROSPIKE_HOSTS`, never skipped). A job lock released early is kept (a record TTL of the
//! rest of its period, whole seconds rounded up) and then expires. Candidates on separate
//! managers (one client each, as separate processes) elect one leader at a time with growing
//! terms, and a resignation hands leadership over at once. Client ids are unique per run, so a
//! persistent cluster's earlier records never interfere.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use leasehold::{LockManager, LockOptions, ReleaseOutcome};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
use leasehold_testkit::aerospike::AerospikeTarget;

const FARM: &str = "farm1";
/// Bounds every wait of these tests, so a broken election fails instead of hanging.
const BOUND: Duration = Duration::from_secs(60);

async fn target() -> AerospikeTarget {
    let target = AerospikeTarget::from_env()
        .await
        .expect("start the fixture");
    eprintln!("running against {target}");
    target
}

/// A client id of its own for this run.
fn client_id(what: &str) -> String {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .subsec_nanos();
    format!("{what}{:x}{nanos:x}", std::process::id())
}

/// One "process" of the fleet: its own manager and client.
async fn instance(target: &AerospikeTarget, client: &str) -> LockManager {
    let mut config = AerospikeConfig::new(target.hosts(), target.namespace(), FARM);
    if let Some((user, password)) = target.credentials() {
        config = config.credentials(user, password);
    }
    let store = AerospikeStore::connect(config).await.expect("connect");
    LockManager::builder()
        .client_id(client)
        .farm_id(FARM)
        .store(store)
        .default_layers()
        .build()
        .expect("manager")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_lock_released_early_keeps_other_instances_out_until_its_period_ends() {
    let target = target().await;
    let client = client_id("jobs");
    let a = instance(&target, &client).await;
    let b = instance(&target, &client).await;
    let period = Duration::from_secs(2);

    let guard = a
        .try_lock_with("nightly", LockOptions::new().hold_at_least(period))
        .await
        .unwrap();
    let outcome = guard.release_outcome().await.unwrap();
    assert!(
        matches!(outcome, ReleaseOutcome::Kept { left } if left <= period),
        "released at once after the grant, yet {outcome:?}"
    );
    // The job's process shuts down and exits: the lock stays for the rest of the period.
    a.shutdown().await.unwrap();
    let err = b.try_lock("nightly").await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    let next = b
        .lock_with("nightly", LockOptions::new().wait(BOUND))
        .await
        .expect("free once the period has passed");
    assert_eq!(
        next.release_outcome().await.unwrap(),
        ReleaseOutcome::Released
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn of_n_candidates_exactly_one_leads_at_a_time_and_terms_grow() {
    let target = target().await;
    let client = client_id("elect");
    let leading = Arc::new(AtomicUsize::new(0));
    let terms = Arc::new(Mutex::new(Vec::new()));
    let mut candidates = Vec::new();
    for _ in 0..3 {
        let locks = instance(&target, &client).await;
        let (leading, terms) = (leading.clone(), terms.clone());
        candidates.push(tokio::spawn(async move {
            for _ in 0..2 {
                let opts = LockOptions::new().ttl(Duration::from_secs(3)).wait(BOUND);
                let leadership = locks.campaign_with("primary", opts).await.unwrap();
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
    assert_eq!(terms.len(), 6);
    assert!(
        terms.windows(2).all(|w| w[0] < w[1]),
        "terms grow: {terms:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resignation_hands_leadership_over_before_the_ttl() {
    let target = target().await;
    let client = client_id("resign");
    let a = instance(&target, &client).await;
    let b = instance(&target, &client).await;
    // A long lease: only the resignation can hand leadership over within the test's bound.
    let long = || LockOptions::new().ttl(Duration::from_secs(300)).wait(BOUND);
    let first = a.campaign_with("primary", long()).await.unwrap();
    let first_term = first.term();
    let waiting = tokio::spawn(async move { b.campaign_with("primary", long()).await });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(first.resign().await.unwrap());
    let second = waiting.await.unwrap().expect("leads after the resignation");
    assert!(second.term() > first_term);
    let leader = a.leader("primary").await.unwrap().expect("a leader");
    assert_eq!(&leader.token, second.token());
    assert!(second.resign().await.unwrap());
    assert_eq!(a.leader("primary").await.unwrap(), None);
}
