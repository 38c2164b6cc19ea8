//! The store contract as a test suite: every [`LockStore`] must pass it. The lock modes'
//! cases (read-write locks, semaphores) are in `modes`.
//!
//! Each case is a public async function taking the store under test, so a backend crate runs the
//! whole suite with one macro line in a test file:
//!
//! ```text
//! // tests/conformance.rs of a store crate (needs `tokio` as a dev-dependency)
//! leasehold_testkit::conformance_tests!(async { my_store::MyStore::connect("...").await.unwrap() });
//! ```
//!
//! The factory expression is evaluated once per case; cases use fresh random keys, so factories
//! may share one server. Cases for optional capabilities are never skipped silently: when a store
//! does not declare fencing or listing, the case asserts the store behaves as declared (no fencing
//! token; listing answers `Unsupported`).
//!
//! TTLs are at least one second and expiry is awaited with a bounded poll, so stores whose TTL
//! granularity is a second (Aerospike) pass too.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use leasehold_core::{Acquire, ErrorKind, Lease, LockKey, LockStore, OwnerToken};

mod keys;
mod modes;

pub use keys::fresh_key;
use keys::LONG;
pub use modes::{
    concurrent_permits_never_exceed, modes_conflict, permit_expires_alone, reader_expires_alone,
    readers_share_writers_exclude, semaphore_admits_n, waiting_writer_blocks_new_readers,
};

/// Every case name, in the order [`run_all`] runs them.
pub const CASES: &[&str] = &[
    "acquire_contend_release",
    "release_is_owner_checked",
    "extend_is_owner_checked",
    "ttl_expiry_and_reacquire",
    "stale_token_never_touches_next_holder",
    "inspect_reports_holder_and_ttl",
    "fencing_tokens_grow",
    "listing",
    "concurrent_acquisition_has_one_winner",
    "invalid_ttl_rejected",
    "readers_share_writers_exclude",
    "waiting_writer_blocks_new_readers",
    "reader_expires_alone",
    "semaphore_admits_n",
    "modes_conflict",
    "permit_expires_alone",
    "concurrent_permits_never_exceed",
];

fn req(key: &LockKey, ttl: Duration) -> Acquire {
    Acquire::new(key.clone(), OwnerToken::generate(), ttl)
}

async fn acquire<S: LockStore>(store: &S, key: &LockKey, ttl: Duration) -> Lease {
    match store.try_acquire(&req(key, ttl)).await {
        Ok(lease) => lease,
        Err(e) => panic!(
            "[{}] acquire of free key {key} failed: {}",
            store.name(),
            e.chain()
        ),
    }
}

/// Waits (bounded: 10 s) until `key` is free, polling `inspect`.
async fn await_expiry<S: LockStore>(store: &S, key: &LockKey) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        match store.inspect(key).await {
            Ok(None) => return,
            Ok(Some(_)) if tokio::time::Instant::now() < give_up => {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Ok(Some(info)) => panic!(
                "[{}] {key} still held 10 s after its TTL: {info:?}",
                store.name()
            ),
            Err(e) => panic!("[{}] inspect failed: {}", store.name(), e.chain()),
        }
    }
}

/// Acquire a free key; a second acquire is `LockUnavailable` (with the holder's own token, a
/// second run of the same request: `LockUnavailable` or `InDoubt`, never success); release
/// returns `true`; the key is free again.
pub async fn acquire_contend_release<S: LockStore>(store: &S) {
    let name = store.name();
    let key = fresh_key("acr");
    let lease = acquire(store, &key, LONG).await;
    assert_eq!(lease.key(), &key);
    assert_eq!(lease.ttl(), LONG);

    let err = store.try_acquire(&req(&key, LONG)).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::LockUnavailable, "[{name}] {err}");
    let same_token = Acquire::new(key.clone(), lease.token().clone(), LONG);
    let err = store.try_acquire(&same_token).await.unwrap_err();
    assert!(
        matches!(err.kind(), ErrorKind::LockUnavailable | ErrorKind::InDoubt),
        "[{name}] re-acquire with the holder's own token must not succeed at store level: {err}"
    );

    assert!(store.release(&lease).await.unwrap(), "[{name}] release");
    assert_eq!(store.inspect(&key).await.unwrap(), None, "[{name}] free");
    assert!(
        !store.release(&lease).await.unwrap(),
        "[{name}] a second release finds nothing"
    );
    let again = acquire(store, &key, LONG).await;
    assert!(store.release(&again).await.unwrap());
}

/// A release with a token that does not own the record deletes nothing and returns `false`.
pub async fn release_is_owner_checked<S: LockStore>(store: &S) {
    let name = store.name();
    let key = fresh_key("roc");
    let lease = acquire(store, &key, LONG).await;
    let impostor = lease.clone().with_token(OwnerToken::generate());
    assert!(
        !store.release(&impostor).await.unwrap(),
        "[{name}] foreign token released"
    );
    let info = store.inspect(&key).await.unwrap().expect("still held");
    assert!(info.is_owned_by(lease.token()), "[{name}] owner changed");
    assert!(store.release(&lease).await.unwrap());
}

/// Extend resets the TTL only for the owner; a foreign token gets `NotHeld` and changes nothing.
pub async fn extend_is_owner_checked<S: LockStore>(store: &S) {
    let name = store.name();
    let key = fresh_key("eoc");
    let lease = acquire(store, &key, Duration::from_secs(5)).await;
    let impostor = lease.clone().with_token(OwnerToken::generate());
    let err = store.extend(&impostor, LONG).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::NotHeld, "[{name}] {err}");
    let ttl = store.inspect(&key).await.unwrap().unwrap().ttl_remaining;
    assert!(
        ttl.is_some_and(|t| t <= Duration::from_secs(5)),
        "[{name}] impostor extended: {ttl:?}"
    );

    let renewed = store.extend(&lease, Duration::from_secs(60)).await.unwrap();
    assert_eq!(renewed.token(), lease.token());
    assert_eq!(renewed.ttl(), Duration::from_secs(60));
    assert_eq!(renewed.fencing_token(), lease.fencing_token());
    assert!(renewed.acquired_at() >= lease.acquired_at());
    let ttl = store.inspect(&key).await.unwrap().unwrap().ttl_remaining;
    assert!(
        ttl.is_some_and(|t| t > Duration::from_secs(30)),
        "[{name}] extend did not reset the TTL: {ttl:?}"
    );
    assert!(store.release(&renewed).await.unwrap());
    let err = store.extend(&lease, LONG).await.unwrap_err();
    assert_eq!(
        err.kind(),
        ErrorKind::NotHeld,
        "[{name}] extend of a released lock"
    );
}

/// A record disappears after its TTL and the key can be acquired again.
pub async fn ttl_expiry_and_reacquire<S: LockStore>(store: &S) {
    let name = store.name();
    let key = fresh_key("ttl");
    let first = acquire(store, &key, Duration::from_secs(1)).await;
    assert!(
        store.try_acquire(&req(&key, LONG)).await.is_err(),
        "[{name}] held before TTL"
    );
    await_expiry(store, &key).await;
    let second = acquire(store, &key, LONG).await;
    assert_ne!(second.token(), first.token());
    assert!(store.release(&second).await.unwrap());
}

/// After a lease expires and another owner takes the key, the old token can neither release nor
/// extend the new holder's record.
pub async fn stale_token_never_touches_next_holder<S: LockStore>(store: &S) {
    let name = store.name();
    let key = fresh_key("stale");
    let old = acquire(store, &key, Duration::from_secs(1)).await;
    await_expiry(store, &key).await;
    let new = acquire(store, &key, LONG).await;
    assert!(
        !store.release(&old).await.unwrap(),
        "[{name}] stale release succeeded"
    );
    assert_eq!(
        store.extend(&old, LONG).await.unwrap_err().kind(),
        ErrorKind::NotHeld
    );
    let info = store.inspect(&key).await.unwrap().expect("new holder kept");
    assert!(
        info.is_owned_by(new.token()),
        "[{name}] new holder lost its lock"
    );
    assert!(store.release(&new).await.unwrap());
}

/// Inspect shows the owner token and a remaining TTL no longer than requested; `None` when free.
pub async fn inspect_reports_holder_and_ttl<S: LockStore>(store: &S) {
    let name = store.name();
    let key = fresh_key("insp");
    assert_eq!(store.inspect(&key).await.unwrap(), None, "[{name}] free");
    let lease = acquire(store, &key, Duration::from_secs(20)).await;
    let info = store.inspect(&key).await.unwrap().expect("held");
    assert_eq!(info.key, key);
    assert!(info.is_owned_by(lease.token()), "[{name}] {info:?}");
    let ttl = info.ttl_remaining.expect("lock records expire");
    assert!(
        ttl <= Duration::from_secs(20) && ttl >= Duration::from_secs(10),
        "[{name}] remaining TTL {ttl:?} for a 20 s lease"
    );
    assert!(info.acquired_at.is_some(), "[{name}] acquisition time");
    if store.capabilities().fencing {
        assert_eq!(info.fencing_token, lease.fencing_token());
    }
    assert!(store.release(&lease).await.unwrap());
}

/// With the fencing capability, tokens strictly grow per key across acquisitions (also across
/// release and expiry); without it, leases carry none.
pub async fn fencing_tokens_grow<S: LockStore>(store: &S) {
    let name = store.name();
    let key = fresh_key("fence");
    if !store.capabilities().fencing {
        let lease = acquire(store, &key, LONG).await;
        assert_eq!(
            lease.fencing_token(),
            None,
            "[{name}] declares no fencing but returned a token"
        );
        store.release(&lease).await.unwrap();
        return;
    }
    let mut last = 0;
    for _ in 0..5 {
        let lease = acquire(store, &key, LONG).await;
        let fence = lease.fencing_token().expect("fencing store returns tokens");
        assert!(fence > last, "[{name}] fencing token {fence} after {last}");
        last = fence;
        assert!(store.release(&lease).await.unwrap());
    }
    let lease = acquire(store, &key, Duration::from_secs(1)).await;
    assert!(lease.fencing_token().unwrap() > last);
    last = lease.fencing_token().unwrap();
    await_expiry(store, &key).await;
    let lease = acquire(store, &key, LONG).await;
    assert!(
        lease.fencing_token().unwrap() > last,
        "[{name}] fence grows across expiry"
    );
    store.release(&lease).await.unwrap();
}

/// With the listing capability, `list(prefix)` shows exactly the held locks under the prefix with
/// owner and TTL; without it, `list` answers `Unsupported`.
pub async fn listing<S: LockStore>(store: &S) {
    let name = store.name();
    if !store.capabilities().listing {
        let err = store.list("").await.unwrap_err();
        assert_eq!(err.kind(), ErrorKind::Unsupported, "[{name}] {err}");
        return;
    }
    let run = uuid::Uuid::new_v4().simple().to_string();
    let keys: Vec<LockKey> = (0..3)
        .map(|i| LockKey::dc("conf", "listing", &format!("{run}-{i}")).unwrap())
        .collect();
    let mut leases = Vec::new();
    for key in &keys {
        leases.push(acquire(store, key, LONG).await);
    }
    store.release(&leases.pop().unwrap()).await.unwrap();
    let prefix = format!("DC#conf#listing#{run}");
    let listed = store.list(&prefix).await.unwrap();
    let mut got: Vec<&str> = listed.iter().map(|i| i.key.as_str()).collect();
    got.sort_unstable();
    assert_eq!(
        got,
        [keys[0].as_str(), keys[1].as_str()],
        "[{name}] listing"
    );
    for (info, lease) in listed.iter().zip(&leases) {
        assert!(info.is_owned_by(lease.token()), "[{name}] {info:?}");
        assert!(info.ttl_remaining.is_some_and(|t| t <= LONG));
    }
    for lease in &leases {
        store.release(lease).await.unwrap();
    }
}

/// Many tasks race for one key for several rounds: exactly one wins each round.
pub async fn concurrent_acquisition_has_one_winner<S: LockStore>(store: &S) {
    let name = store.name();
    let key = fresh_key("race");
    let store = Arc::new(store);
    for round in 0..5 {
        let attempts = (0..16).map(|_| {
            let store = store.clone();
            let key = key.clone();
            async move { store.try_acquire(&req(&key, LONG)).await }
        });
        let results = futures::future::join_all(attempts).await;
        let mut winners = Vec::new();
        for result in results {
            match result {
                Ok(lease) => winners.push(lease),
                Err(e) => assert_eq!(
                    e.kind(),
                    ErrorKind::LockUnavailable,
                    "[{name}] loser error: {e}"
                ),
            }
        }
        assert_eq!(winners.len(), 1, "[{name}] round {round} winners");
        let tokens: HashSet<_> = winners.iter().map(|l| l.token().clone()).collect();
        assert_eq!(tokens.len(), 1);
        assert!(store.release(&winners[0]).await.unwrap());
    }
}

/// A zero TTL (which some stores would read as "no expiry") and an absurd one are rejected with
/// `InvalidArgument`, and nothing is written.
pub async fn invalid_ttl_rejected<S: LockStore>(store: &S) {
    let name = store.name();
    let key = fresh_key("badttl");
    for ttl in [Duration::ZERO, Duration::from_secs(365 * 24 * 3600)] {
        let err = store.try_acquire(&req(&key, ttl)).await.unwrap_err();
        assert_eq!(
            err.kind(),
            ErrorKind::InvalidArgument,
            "[{name}] ttl {ttl:?}: {err}"
        );
    }
    assert_eq!(
        store.inspect(&key).await.unwrap(),
        None,
        "[{name}] nothing written"
    );
    let lease = acquire(store, &key, LONG).await;
    let err = store.extend(&lease, Duration::ZERO).await.unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument, "[{name}] {err}");
    store.release(&lease).await.unwrap();
}

/// Runs every case in order against one store (for a one-shot check, e.g. against a real cluster).
pub async fn run_all<S: LockStore>(store: &S) {
    acquire_contend_release(store).await;
    release_is_owner_checked(store).await;
    extend_is_owner_checked(store).await;
    ttl_expiry_and_reacquire(store).await;
    stale_token_never_touches_next_holder(store).await;
    inspect_reports_holder_and_ttl(store).await;
    fencing_tokens_grow(store).await;
    listing(store).await;
    concurrent_acquisition_has_one_winner(store).await;
    invalid_ttl_rejected(store).await;
    readers_share_writers_exclude(store).await;
    waiting_writer_blocks_new_readers(store).await;
    reader_expires_alone(store).await;
    semaphore_admits_n(store).await;
    modes_conflict(store).await;
    permit_expires_alone(store).await;
    concurrent_permits_never_exceed(store).await;
}

/// Generates one `#[tokio::test]` per conformance case, each building its store with `$factory`
/// (an expression evaluating to a future of the store). The calling crate needs `tokio` (with the
/// `macros` and `rt-multi-thread` features) as a dev-dependency.
///
/// ```text
/// leasehold_testkit::conformance_tests!(async { leasehold::MemoryStore::new() });
/// ```
///
/// When the store needs something kept alive next to it (a server process, a fixture), give a
/// factory of `(store, guard)` with `with_guard:`; the guard is dropped after the case:
///
/// ```text
/// leasehold_testkit::conformance_tests!(with_guard: async {
///     let server = leasehold_testkit::redis::RedisServer::start().unwrap();
///     (connect(server.url()).await, server)
/// });
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (with_guard: $factory:expr) => {
        $crate::conformance_tests!(@guarded $factory;
            acquire_contend_release,
            release_is_owner_checked,
            extend_is_owner_checked,
            ttl_expiry_and_reacquire,
            stale_token_never_touches_next_holder,
            inspect_reports_holder_and_ttl,
            fencing_tokens_grow,
            listing,
            concurrent_acquisition_has_one_winner,
            invalid_ttl_rejected,
            readers_share_writers_exclude,
            waiting_writer_blocks_new_readers,
            reader_expires_alone,
            semaphore_admits_n,
            modes_conflict,
            permit_expires_alone,
            concurrent_permits_never_exceed,
        );
    };
    (@guarded $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let (store, _guard) = $factory.await;
                $crate::conformance::$case(&store).await;
            }
        )*
    };
    ($factory:expr) => {
        $crate::conformance_tests!(@cases $factory;
            acquire_contend_release,
            release_is_owner_checked,
            extend_is_owner_checked,
            ttl_expiry_and_reacquire,
            stale_token_never_touches_next_holder,
            inspect_reports_holder_and_ttl,
            fencing_tokens_grow,
            listing,
            concurrent_acquisition_has_one_winner,
            invalid_ttl_rejected,
            readers_share_writers_exclude,
            waiting_writer_blocks_new_readers,
            reader_expires_alone,
            semaphore_admits_n,
            modes_conflict,
            permit_expires_alone,
            concurrent_permits_never_exceed,
        );
    };
    (@cases $factory:expr; $($case:ident),* $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let store = $factory.await;
                $crate::conformance::$case(&store).await;
            }
        )*
    };
}
