//! # leasehold-etcd
//!
//! A [`LockStore`](leasehold_core::LockStore) on etcd v3: the strongly consistent (CP) backend.
//! Every write is committed by a Raft majority before etcd answers, so a lock survives the loss of
//! a minority of the cluster, including its leader — unlike Redis or Aerospike (AP), where a
//! failover can lose an acknowledged lock. See docs/ETCD.md for what it costs.
//!
//! | operation | etcd |
//! |---|---|
//! | acquire | one `Txn`: if the record's `create_revision == 0`, no reader or permit holds (and, fair, no waiter is ahead) put `token` on a lease of the lock's TTL — a spare lease of an earlier hold of this store, or a new one (`LeaseGrant(ttl)` first) when there is none |
//! | read, permit | the same, putting the holder's own key if no holder of another mode, no waiting writer (and, for a permit, nobody took one since the count read just before) |
//! | release | one `Txn`: if the hold's value is our token, delete it; its lease, empty now, is kept as a spare for the next acquisition of the same TTL |
//! | extend, same TTL (renewal) | `LeaseKeepAlive` of the hold's lease, then a read-only `Txn` checking the hold is still our token on that lease |
//! | extend, another TTL | `LeaseGrant(ttl)`, then one `Txn`: if the value is our token, put it again on the new lease (the old one is revoked in the background) |
//! | inspect | one read-only `Txn` (record, holders, waiting writers), then `LeaseTimeToLive` per hold |
//! | list | one `Range` over the prefix, then `LeaseTimeToLive` per hold, concurrently |
//! | wait | a `Watch` (delete events) on the lock's key prefix that wakes a process only for its predecessor in line; fair: a waiter key per process, and the first in line takes the lock on a lease it granted while waiting |
//! | watch changes (observers) | a `Watch` on the key range of the lock record and its reader and permit keys (the line and writers' markers lie outside it), one per lock and process, as etcd's `Election.Observe`: fired when a hold is created or deleted (release, revoke, lease expiry), not on a renewal; it writes nothing, so an observer takes no place in line |
//!
//! ## Record layout
//! - lock: `<prefix><lock key>`, e.g. `leasehold:DC#farm1#orders#order-42`, value = owner token,
//!   attached to its own etcd lease — one hold per lease at any time; a lease is reused only
//!   after its hold was deleted (TTL = the lock's TTL, **rounded up to whole seconds**: etcd
//!   lease TTLs are seconds; a TTL that no lease can hold is `InvalidArgument`). etcd also raises
//!   TTLs below its minimum (1.5× the election timeout, 2 s with the defaults) — the lock then
//!   lives longer in etcd than the client counts on, never shorter.
//! - fencing token: the record's `create_revision`, which etcd makes strictly greater for every
//!   new key in the cluster: hold-ordered and monotonic without a second counter.
//! - readers and permits: `<prefix><lock key>#holder#<mode>#<token>` each, on its own lease;
//!   a blocking writer refused by readers: `<prefix><lock key>#writer#<store id>`, one per
//!   process, on a lease of its wait left (new readers stay out while it lives).
//! - fair waiting: `<prefix><lock key>#waiter#<lease id>` per waiting process, on a waiter lease
//!   the store keeps alive (default 5 s). The oldest waiter key (by create revision) is next;
//!   writers, readers and permits share the line.
//!
//! ## Why `etcd-client`
//! It is the maintained, tokio-native etcd v3 gRPC client (tonic): transactions with range
//! compares, leases, watches, user/password auth and TLS through rustls (cargo feature `tls`).
//! Building it needs `protoc` (Debian's `protobuf-compiler`), because its build script compiles
//! etcd's protobuf definitions. The store keeps one client per member and fails over between
//! them itself (its balanced channel keeps sending to a dead member; docs/ETCD.md, "Clusters").
//!
//! ## Failures
//! Every request goes to the member that answered last, whatever the endpoint order; one that a
//! member refuses or never got goes to the next member, and so does one that is safe to send
//! twice (reads, keep-alives) and got no reply. A write whose reply does not arrive within the
//! response timeout, or whose connection drops after it was sent, is
//! [`ErrorKind::InDoubt`](leasehold_core::ErrorKind::InDoubt) — the readback layer resolves it, on
//! a live member. A cluster that cannot be reached, has no leader, or refuses for now is
//! `Connection`, naming each member tried; wrong credentials or permissions are `StoreSetup`.
//!
//! ## Feature flags
//!
//! | feature | default | what it enables |
//! |---|---|---|
//! | `tls` | off | TLS to etcd through tonic's rustls (with *ring*): `etcds://` URLs, `?tls_ca=` / `tls_cert=` / `tls_key=`, [`EtcdConfig::tls_ca_file`] and [`EtcdConfig::tls_client_cert`]. Without it a TLS configuration is refused with an `InvalidArgument` error naming the feature. |
//!
//! ```no_run
//! use leasehold::LockManager;
//! use leasehold_etcd::{EtcdConfig, EtcdStore};
//!
//! # async fn demo() -> leasehold::Result<()> {
//! let store = EtcdStore::connect(EtcdConfig::from_url("etcd://127.0.0.1:2379")?).await?;
//! let locks = LockManager::builder()
//!     .client_id("orders").farm_id("eu1")
//!     .store(store)
//!     .default_layers()
//!     .build()?;
//! let guard = locks.try_lock("order-42").await?;
//! println!("fencing token {:?}", guard.fencing_token());
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod acquire;
mod ahead;
mod changes;
mod config;
mod connect;
mod deadlines;
mod error;
mod held;
mod info;
mod layout;
mod leases;
mod members;
mod release;
mod renew;
mod resumable_watch;
mod shared;
mod spares;
mod store;
mod waiter_lease;
mod waiting;

pub use config::{
    EtcdConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_LEADER_WAIT, DEFAULT_PREFIX,
    DEFAULT_RESPONSE_TIMEOUT, DEFAULT_WAITER_TIMEOUT,
};
pub use store::EtcdStore;
