//! Job locks on the embedded store: a guard taken with `hold_at_least` and released (or dropped)
//! before its period keeps the lock for the rest of the period, then the key is free; released
//! after the period it is freed at once. Paused time throughout.

use std::time::Duration;

use leasehold::{LockManager, LockOptions, ReleaseOutcome};

fn manager() -> LockManager {
    LockManager::builder()
        .client_id("jobs")
        .farm_id("f1")
        .build()
        .expect("manager")
}

const PERIOD: Duration = Duration::from_secs(60);

#[tokio::test(start_paused = true)]
async fn a_job_finishing_early_keeps_others_out_until_the_period_ends() {
    let locks = manager();
    let guard = locks
        .try_lock_with("nightly", LockOptions::new().hold_at_least(PERIOD))
        .await
        .unwrap();
    assert_eq!(guard.hold_at_least(), Some(PERIOD));
    tokio::time::sleep(Duration::from_secs(10)).await;

    let outcome = guard.release_outcome().await.unwrap();
    let ReleaseOutcome::Kept { left } = outcome else {
        panic!("released within the period, yet {outcome:?}");
    };
    assert_eq!(left, Duration::from_secs(50));
    let info = locks
        .inspect("nightly")
        .await
        .unwrap()
        .expect("still taken");
    assert!(info.ttl_remaining.unwrap() <= Duration::from_secs(50));

    // Another instance of the job, later in the same period: refused.
    tokio::time::sleep(Duration::from_secs(49)).await;
    let err = locks.try_lock("nightly").await.unwrap_err();
    assert!(err.is_unavailable(), "{err}");

    // Once the period has passed the key is free.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(locks.inspect("nightly").await.unwrap(), None);
    let next = locks
        .try_lock("nightly")
        .await
        .expect("the next period's run");
    assert!(next.release().await.unwrap());
}

#[tokio::test(start_paused = true)]
async fn a_release_after_the_period_frees_the_lock_at_once() {
    let locks = manager();
    // Renewed (no explicit TTL): the job outlives the watchdog's lease several times over.
    let guard = locks
        .try_lock_with(
            "long-job",
            LockOptions::new()
                .ttl(Duration::from_secs(3))
                .renew(true)
                .hold_at_least(Duration::from_secs(5)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(12)).await;
    assert!(guard.is_held(), "renewal kept it past its TTL");
    assert_eq!(
        guard.release_outcome().await.unwrap(),
        ReleaseOutcome::Released
    );
    assert_eq!(locks.inspect("long-job").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_renewed_job_released_early_is_kept_past_its_ttl_until_the_period_ends() {
    let locks = manager();
    let guard = locks
        .try_lock_with(
            "renewed",
            LockOptions::new()
                .ttl(Duration::from_secs(2))
                .renew(true)
                .hold_at_least(Duration::from_secs(20)),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    // `release` says true: the lock was ours (and is kept for the rest of the period).
    assert!(guard.release().await.unwrap());
    // Renewal is stopped, yet the lease outlives its 2 s TTL: it was set to the rest.
    tokio::time::sleep(Duration::from_secs(14)).await;
    assert!(locks
        .try_lock("renewed")
        .await
        .unwrap_err()
        .is_unavailable());
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(locks.try_lock("renewed").await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_dropped_guard_keeps_its_hold_period_too() {
    let locks = manager();
    let guard = locks
        .lock_with("dropped", LockOptions::new().hold_at_least(PERIOD))
        .await
        .unwrap();
    drop(guard);
    // Let the background release run.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(locks
        .try_lock("dropped")
        .await
        .unwrap_err()
        .is_unavailable());
    tokio::time::sleep(PERIOD).await;
    assert!(locks.try_lock("dropped").await.is_ok());
}

#[tokio::test(start_paused = true)]
async fn a_lease_that_already_expired_is_reported_not_held() {
    let locks = manager();
    let guard = locks
        .try_lock_with(
            "expired",
            LockOptions::new()
                .ttl(Duration::from_secs(1))
                .hold_at_least(PERIOD),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    // Someone else took it after the expiry: the hold period must not touch their lock.
    let other = locks.try_lock("expired").await.unwrap();
    assert_eq!(
        guard.release_outcome().await.unwrap(),
        ReleaseOutcome::NotHeld
    );
    let info = locks.inspect("expired").await.unwrap().expect("held");
    assert!(info.is_owned_by(other.token()));
}

#[tokio::test]
async fn an_absurd_period_is_refused_before_any_store_io() {
    let locks = manager();
    let err = locks
        .try_lock_with(
            "absurd",
            LockOptions::new().hold_at_least(Duration::from_secs(86_400 * 31)),
        )
        .await
        .unwrap_err();
    assert_eq!(err.kind(), leasehold::ErrorKind::InvalidArgument);
    assert_eq!(locks.inspect("absurd").await.unwrap(), None);
}

#[tokio::test(start_paused = true)]
async fn a_cron_loop_in_one_task_runs_its_job_once_per_period() {
    let locks = manager();
    let opts = || LockOptions::new().hold_at_least(PERIOD);
    let mut runs = 0;
    // Every 10 s for two periods, the same task tries to run the job: a job lock is not
    // reentrant, so the kept lock refuses its own holder too.
    for _ in 0..12 {
        match locks.try_lock_with("cron", opts()).await {
            Ok(guard) => {
                runs += 1;
                assert!(guard.release().await.unwrap());
            }
            Err(err) => assert!(err.is_unavailable(), "{err}"),
        }
        tokio::time::sleep(Duration::from_secs(10)).await;
    }
    assert_eq!(runs, 2);
}

#[tokio::test(start_paused = true)]
async fn a_shutdown_after_the_job_does_not_cut_its_period_short() {
    // A cron process: takes the lock, runs the job, releases, shuts down and exits.
    let store = leasehold::MemoryStore::new();
    let process = |store: leasehold::MemoryStore| {
        LockManager::builder()
            .client_id("jobs")
            .farm_id("f1")
            .store(store)
            .default_layers()
            .build()
            .expect("manager")
    };
    let cron = process(store.clone());
    let guard = cron
        .try_lock_with("nightly", LockOptions::new().hold_at_least(PERIOD))
        .await
        .unwrap();
    assert!(matches!(
        guard.release_outcome().await.unwrap(),
        ReleaseOutcome::Kept { .. }
    ));
    assert_eq!(
        cron.shutdown().await.unwrap(),
        0,
        "nothing left to give back"
    );

    // The next instance, a little later in the same period: refused.
    let next = process(store);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(next.try_lock("nightly").await.unwrap_err().is_unavailable());
    tokio::time::sleep(PERIOD).await;
    assert!(next.try_lock("nightly").await.is_ok());
}
