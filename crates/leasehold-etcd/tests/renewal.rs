//! Renewal on a real etcd: an extend for the TTL the hold's lease was granted with (what the
//! watchdog sends) is a keep-alive of that lease, checked against the hold afterwards; an extend
//! to another TTL moves the hold to a new lease.

use std::time::Duration;

use leasehold::core::Acquire;
use leasehold::{ErrorKind, LockKey, LockStore, OwnerToken};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;

fn key(entity: &str) -> LockKey {
    LockKey::dc("f1", "renewal", entity).unwrap()
}

async fn setup() -> (EtcdServer, EtcdStore, etcd_client::Client) {
    let server = EtcdServer::start().expect("start etcd");
    let store = EtcdStore::connect(EtcdConfig::new([server.endpoint()]))
        .await
        .expect("connect");
    let raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    (server, store, raw)
}

/// The etcd lease the record of `key` lives on.
async fn record_lease(raw: &mut etcd_client::Client, store: &EtcdStore, key: &LockKey) -> i64 {
    let record = raw.get(store.lock_key(key), None).await.unwrap();
    record.kvs().first().expect("the record").lease()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_for_the_granted_ttl_keeps_the_same_lease_alive() {
    let (_server, store, mut raw) = setup().await;
    let four = Duration::from_secs(4);
    let lease = store
        .try_acquire(&Acquire::new(key("kept"), OwnerToken::generate(), four))
        .await
        .unwrap();
    let first = record_lease(&mut raw, &store, lease.key()).await;

    // Renewed every second until well past its first TTL: still held, on the same etcd lease
    // (only a keep-alive keeps a lease past its TTL; a move would have put the hold on another).
    let mut lease = lease;
    for _ in 0..6 {
        tokio::time::sleep(Duration::from_secs(1)).await;
        lease = store.extend(&lease, four).await.expect("renewed");
    }
    assert_eq!(record_lease(&mut raw, &store, lease.key()).await, first);
    let info = store.inspect(lease.key()).await.unwrap().expect("held");
    assert!(info.is_owned_by(lease.token()));

    // Another TTL cannot be a keep-alive: the hold moves to a new lease, and the next renewal
    // for that TTL keeps the new one alive.
    let ten = Duration::from_secs(10);
    lease = store.extend(&lease, ten).await.expect("extended");
    let moved = record_lease(&mut raw, &store, lease.key()).await;
    assert_ne!(moved, first, "a new lease for the new TTL");
    lease = store.extend(&lease, ten).await.expect("renewed");
    assert_eq!(record_lease(&mut raw, &store, lease.key()).await, moved);
    assert!(store.release(&lease).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_finds_a_hold_that_is_gone_even_when_its_lease_is_alive() {
    let (_server, store, mut raw) = setup().await;
    let ttl = Duration::from_secs(30);

    // The operator revoked the lease: the keep-alive finds no lease.
    let revoked = store
        .try_acquire(&Acquire::new(key("revoked"), OwnerToken::generate(), ttl))
        .await
        .unwrap();
    let id = record_lease(&mut raw, &store, revoked.key()).await;
    raw.lease_revoke(id).await.unwrap();
    let err = store.extend(&revoked, ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");

    // The operator deleted the record: the lease is alive and the keep-alive succeeds, but the
    // hold is not there any more.
    let deleted = store
        .try_acquire(&Acquire::new(key("deleted"), OwnerToken::generate(), ttl))
        .await
        .unwrap();
    raw.delete(store.lock_key(deleted.key()), None)
        .await
        .unwrap();
    let err = store.extend(&deleted, ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");

    // Deleted and taken by another owner: still not ours, and the other's hold is untouched.
    let first = store
        .try_acquire(&Acquire::new(key("retaken"), OwnerToken::generate(), ttl))
        .await
        .unwrap();
    raw.delete(store.lock_key(first.key()), None).await.unwrap();
    let second = store
        .try_acquire(&Acquire::new(key("retaken"), OwnerToken::generate(), ttl))
        .await
        .unwrap();
    let err = store.extend(&first, ttl).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "{err}");
    let info = store.inspect(second.key()).await.unwrap().expect("held");
    assert!(info.is_owned_by(second.token()));
    assert!(store.release(&second).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_follows_a_hold_moved_to_another_lease_behind_its_back() {
    let (_server, store, mut raw) = setup().await;
    let ttl = Duration::from_secs(30);
    let lease = store
        .try_acquire(&Acquire::new(key("moved"), OwnerToken::generate(), ttl))
        .await
        .unwrap();
    let first = record_lease(&mut raw, &store, lease.key()).await;
    // What an extend whose reply was lost (or a concurrent one) leaves: our token, on a lease the
    // store does not know, and the old lease gone.
    let other = raw.lease_grant(30, None).await.unwrap().id();
    raw.put(
        store.lock_key(lease.key()),
        lease.token().as_str(),
        Some(etcd_client::PutOptions::new().with_lease(other)),
    )
    .await
    .unwrap();
    raw.lease_revoke(first).await.unwrap();

    let renewed = store
        .extend(&lease, ttl)
        .await
        .expect("still ours: renewed, not reported lost");
    let info = store.inspect(renewed.key()).await.unwrap().expect("held");
    assert!(info.is_owned_by(lease.token()));
    // And the next renewal keeps the lease it is on now alive.
    let now_on = record_lease(&mut raw, &store, lease.key()).await;
    store.extend(&renewed, ttl).await.expect("renewed again");
    assert_eq!(record_lease(&mut raw, &store, lease.key()).await, now_on);
}
