//! The lock modes' part of the store contract: read-write locks and semaphores.
//!
//! A store without [`Capabilities::shared_modes`](leasehold_core::Capabilities) must answer
//! every shared-mode request with `Unsupported` (checked, never skipped).

use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{
    Acquire, ErrorKind, Lease, LockKey, LockMode, LockStore, OwnerToken, Wait, WaiterId,
};
use tokio::time::Instant;

use super::keys::{fresh_key, LONG};

fn req(key: &LockKey, mode: LockMode, ttl: Duration) -> Acquire {
    Acquire::new(key.clone(), OwnerToken::generate(), ttl).with_mode(mode)
}

fn sem(permits: u32) -> LockMode {
    LockMode::semaphore(permits).expect("valid permits")
}

async fn take<S: LockStore>(store: &S, key: &LockKey, mode: LockMode, ttl: Duration) -> Lease {
    match store.try_acquire(&req(key, mode, ttl)).await {
        Ok(lease) => {
            assert_eq!(lease.mode(), mode, "[{}] lease mode", store.name());
            lease
        }
        Err(e) => panic!(
            "[{}] {mode} acquire of {key} failed: {}",
            store.name(),
            e.chain()
        ),
    }
}

async fn refused<S: LockStore>(store: &S, req: &Acquire) -> ErrorKind {
    match store.try_acquire(req).await {
        Ok(lease) => panic!(
            "[{}] {} acquire of {} must be refused but was granted ({lease:?})",
            store.name(),
            req.mode,
            req.key
        ),
        Err(e) => e.kind(),
    }
}

/// `true` when the store supports shared modes; otherwise checks that it says so and `false`.
async fn supported<S: LockStore>(store: &S, case: &str) -> bool {
    if store.capabilities().shared_modes {
        return true;
    }
    let key = fresh_key(case);
    for mode in [LockMode::Shared, sem(2)] {
        let kind = refused(store, &req(&key, mode, LONG)).await;
        assert_eq!(kind, ErrorKind::Unsupported, "[{}] {mode}", store.name());
    }
    false
}

/// Readers hold together; an exclusive (write) request is refused while any reads; once the last
/// reader leaves the key is free and the writer gets a fencing token; readers are then refused.
pub async fn readers_share_writers_exclude<S: LockStore>(store: &S) {
    if !supported(store, "rw").await {
        return;
    }
    let name = store.name();
    let key = fresh_key("rw");
    let r1 = take(store, &key, LockMode::Shared, LONG).await;
    let r2 = take(store, &key, LockMode::Shared, LONG).await;
    let kind = refused(store, &req(&key, LockMode::Exclusive, LONG)).await;
    assert_eq!(
        kind,
        ErrorKind::LockUnavailable,
        "[{name}] writer vs readers"
    );
    let info = store.inspect(&key).await.unwrap().expect("read-held");
    assert_eq!(info.mode, LockMode::Shared, "[{name}] inspect mode");
    assert_eq!(info.holders.len(), 2, "[{name}] both readers listed");
    assert!(info.is_owned_by(r1.token()) && info.is_owned_by(r2.token()));
    assert!(info
        .ttl_remaining
        .is_some_and(|t| t > Duration::from_secs(20)));

    assert!(store.release(&r1).await.unwrap(), "[{name}] reader release");
    assert!(
        !store.release(&r1).await.unwrap(),
        "[{name}] second release"
    );
    let kind = refused(store, &req(&key, LockMode::Exclusive, LONG)).await;
    assert_eq!(kind, ErrorKind::LockUnavailable, "[{name}] one reader left");
    assert!(store.release(&r2).await.unwrap());
    assert_eq!(store.inspect(&key).await.unwrap(), None, "[{name}] free");

    let writer = take(store, &key, LockMode::Exclusive, LONG).await;
    if store.capabilities().fencing {
        assert!(writer.fencing_token().is_some(), "[{name}] writer fenced");
    }
    let kind = refused(store, &req(&key, LockMode::Shared, LONG)).await;
    assert_eq!(
        kind,
        ErrorKind::LockUnavailable,
        "[{name}] reader vs writer"
    );
    assert!(store.release(&writer).await.unwrap());
    let again = take(store, &key, LockMode::Shared, LONG).await;
    assert!(store.release(&again).await.unwrap());
}

/// A blocking writer (deadline set) refused by readers keeps new readers out; once the readers
/// leave, it gets in. A try-only writer does not.
pub async fn waiting_writer_blocks_new_readers<S: LockStore>(store: &S) {
    if !supported(store, "wpref").await {
        return;
    }
    let name = store.name();
    let key = fresh_key("wpref");
    let reader = take(store, &key, LockMode::Shared, LONG).await;
    // A try-only writer leaves no mark: readers still enter.
    refused(store, &req(&key, LockMode::Exclusive, LONG)).await;
    let second = take(store, &key, LockMode::Shared, LONG).await;
    assert!(store.release(&second).await.unwrap());

    let waiting = req(&key, LockMode::Exclusive, LONG)
        .with_wait(Some(Wait::new(Instant::now() + LONG, WaiterId::new())));
    assert_eq!(refused(store, &waiting).await, ErrorKind::LockUnavailable);
    let kind = refused(store, &req(&key, LockMode::Shared, LONG)).await;
    assert_eq!(
        kind,
        ErrorKind::LockUnavailable,
        "[{name}] a new reader must not pass a waiting writer"
    );
    let info = store.inspect(&key).await.unwrap().expect("read-held");
    assert!(
        info.writer_waiting,
        "[{name}] inspect shows the waiting writer"
    );
    assert!(store.release(&reader).await.unwrap());
    let writer = store.try_acquire(&waiting).await.expect("writer served");
    assert!(store.release(&writer).await.unwrap());
}

/// Each reader's hold expires on its own: a crashed reader frees only its share.
pub async fn reader_expires_alone<S: LockStore>(store: &S) {
    if !supported(store, "rexp").await {
        return;
    }
    let name = store.name();
    let key = fresh_key("rexp");
    let short = take(store, &key, LockMode::Shared, Duration::from_secs(1)).await;
    let long = take(store, &key, LockMode::Shared, LONG).await;
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let info = store
            .inspect(&key)
            .await
            .unwrap()
            .expect("long reader holds");
        if !info.is_owned_by(short.token()) {
            assert!(info.is_owned_by(long.token()), "[{name}] long reader kept");
            break;
        }
        assert!(
            Instant::now() < give_up,
            "[{name}] short reader never expired"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let err = store.extend(&short, LONG).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::NotHeld,
        "[{name}] expired reader extend"
    );
    assert!(
        !store.release(&short).await.unwrap(),
        "[{name}] expired reader release"
    );
    let extended = store
        .extend(&long, LONG)
        .await
        .expect("live reader extends");
    assert_eq!(extended.mode(), LockMode::Shared);
    assert!(store.release(&long).await.unwrap());
    assert_eq!(store.inspect(&key).await.unwrap(), None);
}

/// A semaphore of N admits N holders; the next is refused until one leaves; a foreign token
/// releases nothing.
pub async fn semaphore_admits_n<S: LockStore>(store: &S) {
    if !supported(store, "sem").await {
        return;
    }
    let name = store.name();
    let key = fresh_key("sem");
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(take(store, &key, sem(3), LONG).await);
    }
    let kind = refused(store, &req(&key, sem(3), LONG)).await;
    assert_eq!(kind, ErrorKind::LockUnavailable, "[{name}] fourth permit");
    let info = store.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.mode, sem(3), "[{name}] inspect mode");
    assert_eq!(info.holders.len(), 3, "[{name}] every holder listed");

    let impostor = held[0].clone().with_token(OwnerToken::generate());
    assert!(
        !store.release(&impostor).await.unwrap(),
        "[{name}] foreign release"
    );
    let err = store.extend(&impostor, LONG).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "[{name}] foreign extend");
    assert!(store.release(&held.remove(0)).await.unwrap());
    held.push(take(store, &key, sem(3), LONG).await);
    for lease in held {
        assert!(store.release(&lease).await.unwrap());
    }
    assert_eq!(store.inspect(&key).await.unwrap(), None, "[{name}] free");
}

/// Callers that disagree on a key's kind get `ModeConflict`, not a silent change: another permit
/// count, a semaphore against a read-write lock, a semaphore against an exclusive hold.
pub async fn modes_conflict<S: LockStore>(store: &S) {
    if !supported(store, "conflict").await {
        return;
    }
    let name = store.name();
    let key = fresh_key("conflict");
    let permit = take(store, &key, sem(2), LONG).await;
    for mode in [sem(3), LockMode::Shared, LockMode::Exclusive] {
        let kind = refused(store, &req(&key, mode, LONG)).await;
        assert_eq!(
            kind,
            ErrorKind::ModeConflict,
            "[{name}] {mode} on semaphore(2)"
        );
    }
    assert!(store.release(&permit).await.unwrap());

    let reader = take(store, &key, LockMode::Shared, LONG).await;
    let kind = refused(store, &req(&key, sem(2), LONG)).await;
    assert_eq!(
        kind,
        ErrorKind::ModeConflict,
        "[{name}] semaphore on a read lock"
    );
    assert!(store.release(&reader).await.unwrap());

    let owner = take(store, &key, LockMode::Exclusive, LONG).await;
    let kind = refused(store, &req(&key, sem(2), LONG)).await;
    assert_eq!(
        kind,
        ErrorKind::ModeConflict,
        "[{name}] semaphore on an exclusive lock"
    );
    assert!(store.release(&owner).await.unwrap());
    // Once free, the key may be used as any kind again.
    let permit = take(store, &key, sem(5), LONG).await;
    assert!(store.release(&permit).await.unwrap());
}

/// A permit's expiry frees exactly that permit; the old holder can neither extend nor release it.
pub async fn permit_expires_alone<S: LockStore>(store: &S) {
    if !supported(store, "pexp").await {
        return;
    }
    let name = store.name();
    let key = fresh_key("pexp");
    let crashed = take(store, &key, sem(2), Duration::from_secs(1)).await;
    let alive = take(store, &key, sem(2), LONG).await;
    let give_up = Instant::now() + Duration::from_secs(10);
    let next = loop {
        match store.try_acquire(&req(&key, sem(2), LONG)).await {
            Ok(lease) => break lease,
            Err(e) if e.is_unavailable() && Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("[{name}] the expired permit never came back: {}", e.chain()),
        }
    };
    assert!(
        !store.release(&crashed).await.unwrap(),
        "[{name}] expired permit release"
    );
    assert_eq!(
        store.extend(&crashed, LONG).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    let info = store.inspect(&key).await.unwrap().expect("held");
    assert!(info.is_owned_by(alive.token()) && info.is_owned_by(next.token()));
    assert!(store.release(&alive).await.unwrap());
    assert!(store.release(&next).await.unwrap());
}

/// Twenty concurrent requests for a semaphore of 3 permits: exactly three are granted.
pub async fn concurrent_permits_never_exceed<S: LockStore>(store: &S) {
    if !supported(store, "prace").await {
        return;
    }
    let name = store.name();
    let key = fresh_key("prace");
    let store = Arc::new(store);
    let attempts = (0..20).map(|_| {
        let (store, key) = (store.clone(), key.clone());
        async move { store.try_acquire(&req(&key, sem(3), LONG)).await }
    });
    let outcomes = futures::future::join_all(attempts).await;
    let mut granted = Vec::new();
    for outcome in outcomes {
        match outcome {
            Ok(lease) => granted.push(lease),
            Err(e) => assert_eq!(e.kind(), ErrorKind::LockUnavailable, "[{name}] {e}"),
        }
    }
    assert_eq!(granted.len(), 3, "[{name}] exactly the permits are granted");
    for lease in granted {
        assert!(store.release(&lease).await.unwrap());
    }
}
