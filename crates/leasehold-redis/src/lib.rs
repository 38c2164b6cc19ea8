//! # leasehold-redis
//!
//! A [`LockStore`](leasehold_core::LockStore) on Redis: every lock operation is one round trip,
//! atomic on the server.
//!
//! | operation | Redis |
//! |---|---|
//! | acquire | fair (default): a script that lets only the first entry in the key's waiter queue take it (`SET NX PX`, `INCR` of the fence counter), else queues this process (strict FIFO: this waiting call) and returns the holder's TTL left; `fair(false)`: the same script without the line (`SET NX PX`, plus `INCR` of the fence counter when fencing is on); readers and semaphore permits: a field each in the key's hash. A grant of a lock taken with `Acquire::announce` (an election's) `PUBLISH`es the new holder's token on the key's change channel, in the same script |
//! | release | a script: `DEL` only if the value is our token (a reader or permit: its field), then, for an announced lock, `PUBLISH` the token on the key's change channel; fair: and, when someone is next in line, `PUBLISH` the next entry's id on its process's channel |
//! | extend | a script: `PEXPIRE` only if the value is our token (no holder changes: nothing is announced) |
//! | watch changes | `SUBSCRIBE` to the key's change channel on the store's subscriber connection (one subscription per key and store, shared by its watches, ended with the last); never queues |
//! | inspect | a script: token and fencing token (an exclusive hold's value carries both), `PTTL` |
//! | list | `SCAN MATCH <prefix><filter>*` (never `KEYS`), then the inspect script for each key found, concurrently on the multiplexed connection |
//!
//! ## Key layout
//! - lock: `<prefix><lock key>`, e.g. `leasehold:DC#farm1#orders#order-42`, value = owner token,
//!   expiry = the lease TTL (milliseconds);
//! - fence counter: `<prefix>fence:<lock key>`, kept for the TTL of the hold that started it and
//!   started again from the server's clock once gone (see docs/FENCING.md), so nothing of a key
//!   outlives its locks;
//! - fair waiting: the waiter queue `<prefix>queue:<lock key>` (a list), waiter deadlines
//!   `<prefix>queue-deadline:<lock key>` (a hash), and one channel per waiting process,
//!   `<prefix>released:<Redis lock key>:<process id>`, e.g.
//!   `leasehold:released:leasehold:DC#farm1#orders#order-42:<process id>`
//!   (one subscriber connection per store; see docs/REDIS.md). An entry is a process (the
//!   store's id) by default, one waiting call (`<store id>#<n>`) with
//!   [`RedisConfig::strict_fifo`];
//! - change announcements: the channel `<prefix>changed:<Redis lock key>`
//!   ([`RedisStore::change_channel`]), on which every grant and release of a lock taken with
//!   `Acquire::announce` (an election's) publishes its token for readers of who holds the lock
//!   (the election's observers); other locks never pay for a `PUBLISH`.
//!
//! On a Redis Cluster both kinds of channel are sharded (`SPUBLISH`/`SSUBSCRIBE`) and carry the
//! lock's hash tag, so each announcement stays on the lock's shard.
//!
//! The prefix defaults to `leasehold:`. Lock keys always start with `DC#` or `XDC#`, so they can
//! never collide with the `fence:`, `queue:`, `queue-deadline:`, `released:` or `changed:`
//! namespaces.
//!
//! ## Connections and failures
//! One server: one multiplexed connection managed by `redis::aio::ConnectionManager`, which
//! reconnects by itself after a server restart. Sentinel (`redis+sentinel://`): one multiplexed
//! connection to the master the sentinels name under the highest configuration epoch, used only
//! once it answers `ROLE` as a master; on `READONLY`, a lost connection or a timeout it is dropped
//! and the sentinels are asked again at once (a command `READONLY` refused is sent once more to
//! the new master). Redis
//! Cluster (`redis+cluster://`): every key of one lock shares a hash tag, and each operation goes
//! from the caller's task straight to its slot's master over one multiplexed connection per master
//! ([`RedisConfig::direct_routing`]); redirections, failovers and unreachable nodes fall back to
//! the redis crate's cluster client, and errors name the node and slot. Scripts are called by SHA1 and reloaded transparently after a
//! restart or `SCRIPT FLUSH`. A write whose reply does not arrive within the response timeout, or
//! whose connection drops after it was sent, is [`ErrorKind::InDoubt`](leasehold_core::ErrorKind::InDoubt)
//! — the readback layer resolves it. A connection that cannot be made is `Connection`.
//!
//! ## Feature flags
//!
//! | feature | default | what it enables |
//! |---|---|---|
//! | `tls` | off | TLS: `rediss://` URLs (and `rediss+cluster://`, `rediss+sentinel://`), through rustls with the webpki root certificates; a private CA and a client certificate with [`RedisConfig::tls_ca_file`] and [`RedisConfig::tls_client_cert`]. Without it a `rediss://` URL is refused with an `InvalidArgument` error naming the feature. |
//!
//! ```no_run
//! use leasehold::LockManager;
//! use leasehold_redis::{RedisConfig, RedisStore};
//!
//! # async fn demo() -> leasehold::Result<()> {
//! let store = RedisStore::connect(RedisConfig::new("redis://127.0.0.1:6379").prefix("myapp:")).await?;
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
mod config;
mod connect;
mod connection;
mod error;
mod info;
mod layout;
mod queue;
mod release;
mod reply;
mod scripts;
mod sentinel;
mod slots;
mod store;
mod topology;
mod waiting;

pub use config::{
    RedisConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_MASTER_WAIT, DEFAULT_PREFIX,
    DEFAULT_RESPONSE_TIMEOUT, DEFAULT_WAITER_TIMEOUT,
};
pub use store::RedisStore;
