//! Read-write locks and semaphores on a real etcd through the manager, with several stores on one
//! cluster standing in for processes (each has its own place in the fair line): a semaphore never
//! admits more than its permits and every waiter gets one; a writer gets in behind readers that
//! overlap continuously; a writer that gave up keeps readers out until its deadline, not its TTL;
//! `inspect` and `list` show every holder and the waiting writer.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use leasehold::core::{Acquire, Wait, WaiterId};
use leasehold::{ErrorKind, LockKey, LockManager, LockMode, LockOptions, LockStore, OwnerToken};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use tokio::time::Instant;

async fn store(server: &EtcdServer, fair: bool) -> EtcdStore {
    EtcdStore::connect(EtcdConfig::from_url(&server.url()).unwrap().fair(fair))
        .await
        .expect("connect")
}

async fn managers(server: &EtcdServer, fair: bool, n: usize) -> Vec<LockManager> {
    let mut managers = Vec::new();
    for _ in 0..n {
        managers.push(
            LockManager::builder()
                .client_id("kinds")
                .farm_id("f1")
                .store(store(server, fair).await)
                .default_layers()
                .build()
                .expect("manager"),
        );
    }
    managers
}

async fn semaphore_admits_its_permits_across_processes(fair: bool) {
    let server = EtcdServer::start().unwrap();
    let (inside, most) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let mut tasks = Vec::new();
    for locks in managers(&server, fair, 3).await {
        for _ in 0..3 {
            let (locks, inside, most) = (locks.clone(), inside.clone(), most.clone());
            tasks.push(tokio::spawn(async move {
                for _ in 0..2 {
                    let opts = LockOptions::new()
                        .mode(LockMode::semaphore(2).unwrap())
                        .wait(Duration::from_secs(60));
                    let guard = locks
                        .lock_with("encoders", opts)
                        .await
                        .expect("every task gets a permit");
                    assert_eq!(guard.fencing_token(), None, "permits are not fenced");
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    inside.fetch_sub(1, Ordering::SeqCst);
                    guard.release().await.expect("release");
                }
            }));
        }
    }
    for task in tasks {
        task.await.unwrap();
    }
    assert_eq!(most.load(Ordering::SeqCst), 2, "two at once, never three");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_admits_its_permits_across_processes_fair() {
    semaphore_admits_its_permits_across_processes(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_semaphore_admits_its_permits_across_processes_first_come() {
    semaphore_admits_its_permits_across_processes(false).await;
}

async fn writer_gets_in_behind_overlapping_readers(fair: bool) {
    let server = EtcdServer::start().unwrap();
    let all = managers(&server, fair, 3).await;
    let stop = Arc::new(AtomicBool::new(false));
    let writer_in = Arc::new(AtomicBool::new(false));
    // Two reader processes, two tasks each: their reads overlap continuously, so without the
    // writer's preference the key would never be free.
    let mut readers = Vec::new();
    for locks in &all[1..] {
        for _ in 0..2 {
            let (locks, stop, writer_in) = (locks.clone(), stop.clone(), writer_in.clone());
            readers.push(tokio::spawn(async move {
                let mut reads = 0u32;
                while !stop.load(Ordering::SeqCst) {
                    let opts = LockOptions::new()
                        .mode(LockMode::Shared)
                        .wait(Duration::from_secs(60));
                    let guard = locks.lock_with("doc", opts).await.expect("reader");
                    assert!(
                        !writer_in.load(Ordering::SeqCst),
                        "a reader with the writer"
                    );
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    guard.release().await.expect("release");
                    reads += 1;
                }
                reads
            }));
        }
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let writer = all[0]
        .lock_with("doc", LockOptions::new().wait(Duration::from_secs(30)))
        .await
        .expect("the writer gets in");
    assert!(writer.fencing_token().is_some(), "writers are fenced");
    writer_in.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(100)).await;
    writer_in.store(false, Ordering::SeqCst);
    writer.release().await.expect("release");
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        assert!(reader.await.unwrap() > 0, "every reader read");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_gets_in_behind_overlapping_readers_fair() {
    writer_gets_in_behind_overlapping_readers(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_gets_in_behind_overlapping_readers_first_come() {
    writer_gets_in_behind_overlapping_readers(false).await;
}

fn request(entity: &str, mode: LockMode, ttl: Duration) -> Acquire {
    Acquire::new(
        LockKey::xdc("kinds", entity).unwrap(),
        OwnerToken::generate(),
        ttl,
    )
    .with_mode(mode)
}

#[tokio::test]
async fn a_writer_that_gave_up_keeps_readers_out_until_its_deadline_not_its_ttl() {
    let server = EtcdServer::start().unwrap();
    let store = store(&server, false).await;
    let long = Duration::from_secs(60);
    let reader = store
        .try_acquire(&request("gave-up", LockMode::Shared, long))
        .await
        .unwrap();
    let writer = request("gave-up", LockMode::Exclusive, long).with_wait(Some(Wait::new(
        Instant::now() + Duration::from_secs(2),
        WaiterId::new(),
    )));
    let err = store.try_acquire(&writer).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockUnavailable);
    let info = store
        .inspect(&writer.key)
        .await
        .unwrap()
        .expect("read-held");
    assert!(info.writer_waiting, "the marker is shown");
    // The writer never comes back. Its marker lives on a lease of its wait (2 s, raised to
    // etcd's minimum), not its 60 s TTL: a new reader gets in long before the TTL.
    let give_up = Instant::now() + Duration::from_secs(15);
    let second = loop {
        match store
            .try_acquire(&request("gave-up", LockMode::Shared, long))
            .await
        {
            Ok(lease) => break lease,
            Err(e) if e.is_unavailable() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the gave-up writer still keeps readers out: {e}"),
        }
    };
    let info = store
        .inspect(&writer.key)
        .await
        .unwrap()
        .expect("read-held");
    assert!(!info.writer_waiting);
    assert_eq!(info.holders.len(), 2);
    assert!(store.release(&reader).await.unwrap());
    assert!(store.release(&second).await.unwrap());
}

#[tokio::test]
async fn a_writer_that_gets_in_takes_the_marker_of_its_earlier_attempts_with_it() {
    let server = EtcdServer::start().unwrap();
    let store = store(&server, false).await;
    let long = Duration::from_secs(60);
    let reader = store
        .try_acquire(&request("marked", LockMode::Shared, long))
        .await
        .unwrap();
    // The manager sends every attempt of one wait with a new token.
    let attempt = || {
        request("marked", LockMode::Exclusive, long)
            .with_wait(Some(Wait::new(Instant::now() + long, WaiterId::new())))
    };
    assert!(store
        .try_acquire(&attempt())
        .await
        .unwrap_err()
        .is_unavailable());
    assert!(store.release(&reader).await.unwrap());
    let writer = store
        .try_acquire(&attempt())
        .await
        .expect("the writer gets in");
    assert!(store.release(&writer).await.unwrap());
    let reader = store
        .try_acquire(&request("marked", LockMode::Shared, long))
        .await
        .expect("no marker of the first attempt keeps readers out");
    assert!(store.release(&reader).await.unwrap());
}

#[tokio::test]
async fn inspect_and_list_show_every_holder_and_the_waiting_writer() {
    let server = EtcdServer::start().unwrap();
    let store = store(&server, true).await;
    let long = Duration::from_secs(60);
    let sem = LockMode::semaphore(3).unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        held.push(
            store
                .try_acquire(&request("pool", sem, long))
                .await
                .unwrap(),
        );
        held.push(
            store
                .try_acquire(&request("doc", LockMode::Shared, long))
                .await
                .unwrap(),
        );
    }
    held.push(
        store
            .try_acquire(&request("plain", LockMode::Exclusive, long))
            .await
            .unwrap(),
    );
    let writer = request("doc", LockMode::Exclusive, long)
        .with_wait(Some(Wait::new(Instant::now() + long, WaiterId::new())));
    assert!(store
        .try_acquire(&writer)
        .await
        .unwrap_err()
        .is_unavailable());

    let locks = store.list("XDC#kinds#").await.unwrap();
    let keys: Vec<&str> = locks.iter().map(|l| l.key.as_str()).collect();
    assert_eq!(keys, ["XDC#kinds#doc", "XDC#kinds#plain", "XDC#kinds#pool"]);
    let (doc, plain, pool) = (&locks[0], &locks[1], &locks[2]);
    assert_eq!(
        (doc.mode, doc.holders.len(), doc.writer_waiting),
        (LockMode::Shared, 2, true)
    );
    assert_eq!(
        (pool.mode, pool.holders.len(), pool.writer_waiting),
        (sem, 2, false)
    );
    assert_eq!(plain.mode, LockMode::Exclusive);
    assert!(plain.fencing_token.is_some() && doc.fencing_token.is_none());
    for lease in &held {
        let info = locks.iter().find(|l| l.key == *lease.key()).unwrap();
        assert!(info.is_owned_by(lease.token()), "{lease:?} listed");
        let inspected = store.inspect(lease.key()).await.unwrap().expect("held");
        assert_eq!(
            (
                inspected.mode,
                inspected.holders.len(),
                inspected.writer_waiting
            ),
            (info.mode, info.holders.len(), info.writer_waiting),
            "inspect agrees with list"
        );
    }
    for lease in held {
        assert!(store.release(&lease).await.unwrap());
    }
    assert!(
        store.list("XDC#kinds#").await.unwrap().is_empty(),
        "a marker alone is no hold"
    );
}
