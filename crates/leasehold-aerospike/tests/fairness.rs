//! Fair waiting across processes on Aerospike, through the wire fixture or a real cluster
//! (`AEROSPIKE_HOSTS`, never skipped). The shared suite (`tests/suites/fairness.rs`): every process
//! gets a hot key (none starves), a crashed waiter drops out of the line by its waiter timeout.
//! Here: a try-lock never passes a queued process, the line is served in arrival order, and a
//! process that takes the key while other tasks of it wait goes to the end of the line. Set
//! suffixes are unique per run, so a persistent cluster's earlier records never interfere.

use std::time::{Duration, Instant};

use aerospike::{Bins, Client, ClientPolicy, Key, ReadPolicy, Value, WritePolicy};
use leasehold::core::{Acquire, Wait, WaiterId};
use leasehold::{ErrorKind, LockKey, LockManager, LockStore, OwnerToken};
use leasehold_aerospike::layout::{queue_set, GRANTED_BIN, LINE_BIN};
use leasehold_aerospike::{AerospikeConfig, AerospikeStore};

mod common;
use common::{Deployment, Place};

#[path = "../../../tests/suites/fairness.rs"]
mod suite;

const FARM: &str = "f1";

/// What the fairness tests need beyond the shared place: stores, managers, and reads and writes
/// beside the store.
impl Place {
    async fn store(
        &self,
        config: impl FnOnce(AerospikeConfig) -> AerospikeConfig,
    ) -> AerospikeStore {
        AerospikeStore::connect(config(self.config(FARM).max_error_rate(0)))
            .await
            .expect("connect")
    }

    async fn manager(
        &self,
        config: impl FnOnce(AerospikeConfig) -> AerospikeConfig,
    ) -> LockManager {
        LockManager::builder()
            .client_id("fair")
            .farm_id(FARM)
            .store(self.store(config).await)
            .default_layers()
            .build()
            .expect("manager")
    }

    /// How many places `entity`'s line holds (lapsed ones included), read with a plain client.
    async fn line_len(&self, entity: &str) -> usize {
        match self.queue_bin(entity, LINE_BIN).await {
            Some(Value::HashMap(m)) => m.len(),
            Some(Value::OrderedMap(m)) => m.len(),
            _ => 0,
        }
    }

    /// One bin of `entity`'s queue record (`None`: no record, or no such bin), read with a plain
    /// client.
    async fn queue_bin(&self, entity: &str, bin: &str) -> Option<Value> {
        let client = self.client().await;
        let set = queue_set(&format!("DC#{FARM}#{}", self.suffix));
        let key = self.key(set, entity);
        let value = match client.get(&ReadPolicy::default(), &key, Bins::All).await {
            Ok(record) => record.bins.get(bin).cloned(),
            Err(_) => None,
        };
        client.close().await.ok();
        value
    }

    /// Deletes `entity`'s lock record with a plain client (a release the store does not see).
    async fn delete_lock(&self, entity: &str) {
        let client = self.client().await;
        let key = self.key(format!("DC#{FARM}#{}", self.suffix), entity);
        client
            .delete(&WritePolicy::default(), &key)
            .await
            .expect("delete the lock record");
        client.close().await.ok();
    }

    async fn client(&self) -> Client {
        let mut policy = ClientPolicy::default();
        if let Some((user, password)) = common::credentials() {
            policy.auth_mode = aerospike::policy::AuthMode::Internal(user, password);
        }
        Client::new(&policy, &self.hosts).await.expect("client")
    }

    fn key(&self, set: String, entity: &str) -> Key {
        Key::new(
            self.namespace.clone(),
            set,
            Value::from(format!("fair#{entity}")),
        )
        .unwrap()
    }
}

impl suite::Deployment for Deployment {
    const STARVES_AFTER: Duration = Duration::from_secs(20);
    /// The dead waiter is first in line until its place lapses (its waiter timeout, 5 s).
    const LAPSES_WITHIN: Duration = Duration::from_secs(15);

    fn start(runtime: &tokio::runtime::Runtime) -> Self {
        Deployment::on(runtime, "fair")
    }

    fn address(&self) -> String {
        self.place.encode()
    }

    async fn manager(place: &str) -> LockManager {
        Place::decode(place).manager(|c| c).await
    }

    async fn line_length(place: &str, entity: &str) -> usize {
        Place::decode(place).line_len(entity).await
    }
}

suite::fairness_suite!(Deployment);

fn blocking(key: &LockKey) -> Acquire {
    Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(30)).with_wait(Some(
        Wait::new(
            tokio::time::Instant::now() + Duration::from_secs(30),
            WaiterId::new(),
        ),
    ))
}

fn trying(key: &LockKey) -> Acquire {
    Acquire::new(key.clone(), OwnerToken::generate(), Duration::from_secs(30))
}

#[tokio::test]
async fn the_line_is_served_in_order_and_a_try_lock_passes_nobody() {
    let target = common::current_target().await;
    let place = Place::new(&target, "fair");
    let key = LockKey::dc(FARM, "fair", "ordered").unwrap();
    let (a, b, c, d) = (
        place.store(|c| c).await,
        place.store(|c| c).await,
        place.store(|c| c).await,
        place.store(|c| c).await,
    );
    let held = a.try_acquire(&trying(&key)).await.expect("free");
    // B, then C queue (each refused once while A holds).
    for store in [&b, &c] {
        let refused = store.acquire(&blocking(&key)).await.unwrap();
        assert!(!refused.is_granted());
        assert!(
            refused.retry_after().is_some(),
            "the line says when to look again"
        );
    }
    a.release(&held).await.unwrap();

    // The lock record is free, but B and C wait: a try-lock (D) and the later C do not pass B.
    let refused = d.try_acquire(&trying(&key)).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::LockUnavailable, "{refused}");
    assert_eq!(a.inspect(&key).await.unwrap(), None, "nothing was written");
    let refused = c.try_acquire(&blocking(&key)).await.unwrap_err();
    assert_eq!(refused.kind(), ErrorKind::LockUnavailable);

    // B's turn; it leaves the line, and its lease says another process waits.
    let b_lease = b
        .try_acquire(&blocking(&key))
        .await
        .expect("B is first in line");
    assert!(b_lease.is_contended(), "C waits behind B");
    b.release(&b_lease).await.unwrap();
    // A newcomer (D, blocking) queues behind C.
    d.try_acquire(&blocking(&key)).await.unwrap_err();
    let c_lease = c.try_acquire(&blocking(&key)).await.expect("C is next");
    c.release(&c_lease).await.unwrap();
    let d_lease = d.try_acquire(&blocking(&key)).await.expect("then D");
    assert!(!d_lease.is_contended(), "nobody else waits");
    d.release(&d_lease).await.unwrap();
    assert_eq!(place.line_len("ordered").await, 0, "everyone left the line");

    // Nobody waits: a try-lock takes the key.
    let free = d.try_acquire(&trying(&key)).await.expect("nobody waits");
    d.release(&free).await.unwrap();
}

#[tokio::test]
async fn a_lapsed_place_blocks_nobody() {
    let target = common::current_target().await;
    let place = Place::new(&target, "fair");
    let key = LockKey::dc(FARM, "fair", "lapsing").unwrap();
    let holder = place.store(|c| c).await;
    let gone = place
        .store(|c| c.waiter_timeout(Duration::from_millis(200)))
        .await;
    let other = place.store(|c| c).await;
    let held = holder.try_acquire(&trying(&key)).await.unwrap();
    gone.try_acquire(&blocking(&key)).await.unwrap_err();
    holder.release(&held).await.unwrap();
    // `gone` never asks again: past its 200 ms waiter timeout its place counts for nothing, and
    // the next taker sweeps it.
    tokio::time::sleep(Duration::from_millis(400)).await;
    let lease = other
        .try_acquire(&blocking(&key))
        .await
        .expect("the lapsed place blocks nobody");
    assert!(!lease.is_contended());
    other.release(&lease).await.unwrap();
    assert_eq!(
        place.line_len("lapsing").await,
        0,
        "swept, and the taker left"
    );
}

#[tokio::test]
async fn a_process_whose_other_tasks_wait_goes_to_the_end_of_the_line_and_leaves_with_them() {
    let target = common::current_target().await;
    let place = Place::new(&target, "fair");
    let key = LockKey::dc(FARM, "fair", "requeue").unwrap();
    let (holder, b, c) = (
        place.store(|c| c).await,
        place.store(|c| c).await,
        place.store(|c| c).await,
    );
    let held = holder.try_acquire(&trying(&key)).await.unwrap();
    // Two tasks of B wait (two watches); B queues, then C.
    let (first, second) = (b.watch(&key).await, b.watch(&key).await);
    assert!(first.is_live(), "fair waiting registers the waiter");
    b.try_acquire(&blocking(&key)).await.unwrap_err();
    c.try_acquire(&blocking(&key)).await.unwrap_err();
    holder.release(&held).await.unwrap();

    let b_lease = b.try_acquire(&blocking(&key)).await.expect("B first");
    assert!(b_lease.is_contended());
    drop(first); // that task has the lock; the other still waits
    b.release(&b_lease).await.unwrap();
    // B went back to the end, behind C.
    b.try_acquire(&blocking(&key)).await.unwrap_err();
    let c_lease = c
        .try_acquire(&blocking(&key))
        .await
        .expect("C before B's second turn");
    c.release(&c_lease).await.unwrap();
    assert_eq!(place.line_len("requeue").await, 1, "B still waits");

    // B's last waiter gives up: B leaves the line (in the background) and blocks nobody.
    drop(second);
    let deadline = Instant::now() + Duration::from_secs(10);
    while place.line_len("requeue").await != 0 {
        assert!(Instant::now() < deadline, "B never left the line");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let free = c.try_acquire(&trying(&key)).await.expect("nobody waits");
    c.release(&free).await.unwrap();
}

#[tokio::test]
async fn a_head_waits_out_a_holder_it_knows_but_never_its_own_past_hold() {
    let target = common::current_target().await;
    let place = Place::new(&target, "fair");
    let key = LockKey::dc(FARM, "fair", "estimate").unwrap();
    let (x, a, b, c) = (
        place.store(|c| c).await,
        place.store(|c| c).await,
        place.store(|c| c).await,
        place.store(|c| c).await,
    );
    // A learns that it holds the key for about half a second: a hold granted while B waited.
    let held = x.try_acquire(&trying(&key)).await.unwrap();
    a.try_acquire(&blocking(&key)).await.unwrap_err();
    b.try_acquire(&blocking(&key)).await.unwrap_err();
    x.release(&held).await.unwrap();
    let a_lease = a.try_acquire(&blocking(&key)).await.expect("A first");
    assert!(a_lease.is_contended(), "B waits");
    tokio::time::sleep(Duration::from_millis(500)).await;
    a.release(&a_lease).await.unwrap();
    let b_lease = b.try_acquire(&blocking(&key)).await.expect("B next");
    b.release(&b_lease).await.unwrap();

    // A takes the key again and publishes that estimate. C, the head now, does not ask the lock
    // record while A's hold should last: its look is the line's read alone.
    let a_lease = a.try_acquire(&blocking(&key)).await.expect("nobody waits");
    let before = target.fixture().map(|f| f.requests());
    let refused = c.acquire(&blocking(&key)).await.unwrap();
    assert!(!refused.is_granted(), "{refused:?}");
    assert!(refused.retry_after().is_some(), "at A's expected release");
    if let (Some(before), Some(fixture)) = (before, target.fixture()) {
        assert_eq!(
            fixture.requests() - before,
            1,
            "one read of the line, nothing sent to the lock record"
        );
    }
    // A releases well before its estimate says: it clears its grant time from the line (in the
    // background), so C's next look tries the free lock record instead of waiting it out.
    a.release(&a_lease).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while place.queue_bin("estimate", GRANTED_BIN).await.is_some() {
        assert!(Instant::now() < deadline, "A never cleared its grant time");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let c_lease = c.try_acquire(&blocking(&key)).await.expect("C next");
    c.release(&c_lease).await.unwrap();

    // The line shows A's own last grant and its estimate (the release that clears them may not
    // have landed yet: here it never runs, the lease being released by a plain client): A,
    // asking again, knows that hold is over and takes the free key at once.
    a.try_acquire(&blocking(&key)).await.expect("nobody waits");
    place.delete_lock("estimate").await;
    let a_lease = a
        .try_acquire(&blocking(&key))
        .await
        .expect("not kept waiting by its own hold estimate");
    a.release(&a_lease).await.unwrap();
    assert_eq!(
        place.line_len("estimate").await,
        0,
        "everyone left the line"
    );
}
