//! Spare leases on a real etcd: the lease of a released hold carries the next hold of the same
//! TTL (no lease grant, no revoke: an uncontended cycle is two transactions), and every hold still
//! has a lease of its own — it expires on its own when its process dies, it is reported lost when
//! that lease is revoked, and a spare that went behind the store's back costs a grant, not a
//! refusal.
//!
//! The test binary is also a lock-holding process: spawned with `LEASEHOLD_SPARE_ENDPOINT` set, it
//! takes a lock, releases it, takes another on the spare lease, prints `held <lease id>` and waits
//! (at most two minutes, so it always ends by itself) to be SIGKILLed.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use leasehold::core::Acquire;
use leasehold::{ErrorKind, Lease, LockKey, LockManager, LockMode, LockOptions, LockStore};
use leasehold::{OwnerToken, Result};
use leasehold_etcd::{EtcdConfig, EtcdStore};
use leasehold_testkit::etcd::EtcdServer;
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

fn key(entity: &str) -> LockKey {
    LockKey::dc("f1", "spares", entity).unwrap()
}

async fn setup() -> (EtcdServer, EtcdStore, etcd_client::Client) {
    let server = EtcdServer::start().expect("start etcd");
    let store = connect(&server.endpoint()).await;
    let raw = etcd_client::Client::connect([server.endpoint()], None)
        .await
        .unwrap();
    (server, store, raw)
}

async fn connect(endpoint: &str) -> EtcdStore {
    EtcdStore::connect(EtcdConfig::new([endpoint]))
        .await
        .expect("connect")
}

async fn acquire(store: &EtcdStore, entity: &str, ttl: Duration) -> Result<Lease> {
    store
        .try_acquire(&Acquire::new(key(entity), OwnerToken::generate(), ttl))
        .await
}

/// The etcd lease a hold lives on (the record, or a reader's or permit's own key).
async fn lease_of(raw: &mut etcd_client::Client, store: &EtcdStore, lease: &Lease) -> i64 {
    let found = raw
        .get(
            store.lock_key(lease.key()),
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let hold = found
        .kvs()
        .iter()
        .find(|kv| kv.value() == lease.token().as_str().as_bytes())
        .expect("the hold is in etcd");
    hold.lease()
}

/// Every lease etcd holds now.
async fn leases(raw: &mut etcd_client::Client) -> HashSet<i64> {
    raw.leases()
        .await
        .unwrap()
        .leases()
        .iter()
        .map(|lease| lease.id())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_lease_carries_the_next_hold_of_its_ttl_without_a_grant() {
    let (_server, store, mut raw) = setup().await;
    let first = acquire(&store, "first", TTL).await.unwrap();
    let spare = lease_of(&mut raw, &store, &first).await;
    assert!(store.release(&first).await.unwrap());
    let before = leases(&mut raw).await;
    assert!(before.contains(&spare), "the released hold's lease is kept");

    // The next hold of that TTL, of another key, goes on it: no new lease, and the fencing
    // token is still greater (a new record's create revision).
    let second = acquire(&store, "second", TTL).await.unwrap();
    assert_eq!(lease_of(&mut raw, &store, &second).await, spare);
    assert_eq!(leases(&mut raw).await, before, "no lease granted");
    assert!(second.fencing_token() > first.fencing_token());

    // A renewal keeps it alive (a keep-alive of the lease it is on), and the hold stays on it.
    let renewed = store.extend(&second, TTL).await.expect("renewed");
    assert_eq!(lease_of(&mut raw, &store, &renewed).await, spare);
    assert!(store.release(&renewed).await.unwrap());

    // Any lock kind: a reader's own key goes on it too.
    let reader = store
        .try_acquire(
            &Acquire::new(key("read"), OwnerToken::generate(), TTL).with_mode(LockMode::Shared),
        )
        .await
        .unwrap();
    assert_eq!(lease_of(&mut raw, &store, &reader).await, spare);

    // Another TTL is another lease (a keep-alive renews a lease to the TTL it was granted with).
    let other_ttl = acquire(&store, "ten", Duration::from_secs(10))
        .await
        .unwrap();
    let ten = lease_of(&mut raw, &store, &other_ttl).await;
    assert_ne!(ten, spare);
    assert!(!before.contains(&ten), "granted for it");
    assert!(store.release(&reader).await.unwrap());
    assert!(store.release(&other_ttl).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_is_used_only_while_young_and_a_keep_alive_keeps_it_young() {
    let (_server, store, mut raw) = setup().await;
    // 30 s: a spare carries a hold up to 3 s after its count started. The sleeps below leave
    // 1.5 s either side of that bound, so a slow machine cannot flip an outcome.
    let ttl = Duration::from_secs(30);

    // Idle past a tenth of its TTL: the next hold gets a new lease, and the old one is revoked.
    let first = acquire(&store, "idle", ttl).await.unwrap();
    let idle = lease_of(&mut raw, &store, &first).await;
    assert!(store.release(&first).await.unwrap());
    tokio::time::sleep(Duration::from_millis(3300)).await;
    let second = acquire(&store, "idle", ttl).await.unwrap();
    let fresh = lease_of(&mut raw, &store, &second).await;
    assert_ne!(fresh, idle, "too old to carry a hold");
    let give_up = Instant::now() + Duration::from_secs(5);
    while leases(&mut raw).await.contains(&idle) {
        assert!(Instant::now() < give_up, "the stale spare is revoked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Held 2 s without a renewal, then released: the keep-alive sent then restarts its count,
    // so 1.5 s later (3.5 s after its grant, past the bound counted from the grant) it still
    // carries the next hold, whose TTL counts from that keep-alive.
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let released_at = Instant::now();
    assert!(store.release(&second).await.unwrap());
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let third = acquire(&store, "kept", ttl).await.unwrap();
    assert_eq!(lease_of(&mut raw, &store, &third).await, fresh);
    assert!(
        third.expires_at() >= released_at + ttl,
        "the hold counts its TTL from the keep-alive sent at the release, not from the grant"
    );
    assert!(store.release(&third).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holds_taken_together_never_share_a_lease() {
    let (_server, store, mut raw) = setup().await;
    let take = |names: Vec<String>| {
        let store = store.clone();
        async move {
            let attempts = names.into_iter().map(|name| {
                let store = store.clone();
                async move { acquire(&store, &name, TTL).await.unwrap() }
            });
            futures::future::join_all(attempts).await
        }
    };
    let mut held = take((0..6).map(|i| format!("a{i}")).collect()).await;
    for lease in held.drain(..3) {
        assert!(store.release(&lease).await.unwrap());
    }
    // Three spares and six new holds, all at once: three holds take the spares, three get new
    // leases, and no two share one.
    held.extend(take((0..6).map(|i| format!("b{i}")).collect()).await);
    let mut seen = HashSet::new();
    for lease in &held {
        let id = lease_of(&mut raw, &store, lease).await;
        assert!(seen.insert(id), "lease {id} carries two holds");
    }
    assert_eq!(seen.len(), 9);
    for lease in held {
        assert!(store.release(&lease).await.unwrap());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_on_a_reused_lease_is_lost_when_that_lease_is_revoked_and_only_it() {
    let (_server, store, mut raw) = setup().await;
    let locks = LockManager::builder()
        .client_id("spares")
        .farm_id("f1")
        .store(store.clone())
        .build()
        .unwrap();
    let short = || LockOptions::new().ttl(Duration::from_secs(3)).renew(true);
    let first = locks.try_lock_with("first", short()).await.unwrap();
    let spare = lease_of(&mut raw, &store, &first.lease()).await;
    assert!(first.release().await.unwrap());
    let reused = locks.try_lock_with("reused", short()).await.unwrap();
    assert_eq!(lease_of(&mut raw, &store, &reused.lease()).await, spare);
    let other = locks.try_lock_with("other", short()).await.unwrap();
    let other_lease = lease_of(&mut raw, &store, &other.lease()).await;
    assert_ne!(other_lease, spare);

    raw.lease_revoke(spare).await.unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(10), reused.lost())
        .await
        .expect("the next renewal notices");
    assert_eq!(lost.kind(), ErrorKind::NotHeld, "{lost}");
    assert_eq!(store.inspect(&key("reused")).await.unwrap(), None);

    // The other hold, renewed all along on its own lease, is untouched, past its first TTL.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let info = store
        .inspect(&key("other"))
        .await
        .unwrap()
        .expect("still held");
    assert!(info.is_owned_by(other.token()));
    assert_eq!(
        lease_of(&mut raw, &store, &other.lease()).await,
        other_lease
    );
    assert!(other.release().await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spare_revoked_behind_the_stores_back_costs_a_grant_not_a_refusal() {
    let (_server, store, mut raw) = setup().await;
    let first = acquire(&store, "first", TTL).await.unwrap();
    let spare = lease_of(&mut raw, &store, &first).await;
    assert!(store.release(&first).await.unwrap());
    raw.lease_revoke(spare).await.unwrap();

    let second = acquire(&store, "second", TTL)
        .await
        .expect("granted on a new lease, not refused");
    let now_on = lease_of(&mut raw, &store, &second).await;
    assert_ne!(now_on, spare);
    assert!(store.release(&second).await.unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_revokes_the_spare_leases() {
    let (_server, store, mut raw) = setup().await;
    let held = acquire(&store, "held", TTL).await.unwrap();
    let spare = lease_of(&mut raw, &store, &held).await;
    assert!(store.release(&held).await.unwrap());
    assert!(leases(&mut raw).await.contains(&spare));
    store.shutdown().await.unwrap();
    assert!(!leases(&mut raw).await.contains(&spare));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_try_cancelled_while_its_transaction_is_in_flight_leaves_nothing_held() {
    let (server, store, mut raw) = setup().await;
    let first = acquire(&store, "first", TTL).await.unwrap();
    let spare = lease_of(&mut raw, &store, &first).await;
    assert!(store.release(&first).await.unwrap());

    // etcd paused: the try takes the spare and sends its transaction, which gets no answer; the
    // caller gives up and the spare is revoked. Resumed, etcd applies the two in some order:
    // either way the lock is not held and the spare is gone.
    server.pause().unwrap();
    let gave_up = tokio::time::timeout(
        Duration::from_millis(300),
        acquire(&store, "cancelled", TTL),
    )
    .await;
    server.resume().unwrap();
    assert!(gave_up.is_err(), "no answer while etcd is paused");

    let give_up = Instant::now() + Duration::from_secs(10);
    while leases(&mut raw).await.contains(&spare) {
        assert!(Instant::now() < give_up, "the spare is revoked");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(store.inspect(&key("cancelled")).await.unwrap(), None);
    let again = acquire(&store, "cancelled", TTL).await.expect("free");
    assert!(store.release(&again).await.unwrap());
}

/// The child: a hold on a spare lease, then nothing (no renewal) until it is killed.
async fn holder(endpoint: String) {
    let store = connect(&endpoint).await;
    let mut raw = etcd_client::Client::connect([endpoint], None)
        .await
        .unwrap();
    let ttl = Duration::from_secs(3);
    let first = acquire(&store, "warm-up", ttl).await.unwrap();
    let spare = lease_of(&mut raw, &store, &first).await;
    assert!(store.release(&first).await.unwrap());
    let held = acquire(&store, "orphan", ttl).await.unwrap();
    assert_eq!(
        lease_of(&mut raw, &store, &held).await,
        spare,
        "on the spare"
    );
    println!("held {spare}");
    tokio::time::sleep(Duration::from_secs(120)).await;
}

#[test]
fn a_hold_on_a_reused_lease_expires_on_its_own_when_its_process_dies() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    if let Ok(endpoint) = std::env::var("LEASEHOLD_SPARE_ENDPOINT") {
        runtime.block_on(holder(endpoint));
        return;
    }
    let server = EtcdServer::start().expect("etcd");
    let store = runtime.block_on(connect(&server.endpoint()));
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_hold_on_a_reused_lease_expires_on_its_own_when_its_process_dies",
            "--nocapture",
        ])
        .env("LEASEHOLD_SPARE_ENDPOINT", server.endpoint())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the holder");
    let stdout = child.stdout.take().unwrap();
    let held = BufReader::new(stdout)
        .lines()
        .map_while(std::result::Result::ok)
        .find_map(|line| line.trim().strip_prefix("held ").map(str::to_owned));
    assert!(held.is_some(), "the holder took its lock on a spare lease");
    child.kill().unwrap(); // SIGKILL: no release, no revoke
    child.wait().unwrap();
    let killed = Instant::now();

    runtime.block_on(async {
        let info = store.inspect(&key("orphan")).await.unwrap();
        assert!(info.is_some(), "still held right after the kill");
        // Its lease counts from the warm-up's grant: it lapses within the 3 s TTL of that (etcd's
        // own expiry checks add a little), and then another owner takes the lock.
        while store.inspect(&key("orphan")).await.unwrap().is_some() {
            // A give-up bound only (ten times the TTL): the lease lapses within its 3 s.
            assert!(
                killed.elapsed() < Duration::from_secs(30),
                "the hold expires with its lease"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let taken = acquire(&store, "orphan", TTL).await.expect("free again");
        assert!(store.release(&taken).await.unwrap());
    });
}
