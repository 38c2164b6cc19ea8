//! # leasehold-aerospike
//!
//! A [`LockStore`](leasehold_core::LockStore) on Aerospike whose records are the Java distributed
//! lock manager's, so a Java service and a Rust service contend for the same lock in the same
//! namespace. See `docs/AEROSPIKE.md` for the layout, round trips and error mapping.
//!
//! | lock | Aerospike |
//! |---|---|
//! | set | `DC#<farmId>#<setSuffix>` or `XDC#<setSuffix>` |
//! | user key | the lock id `<clientId>#<entityId>` (sent, so listing can name it) |
//! | bins | `<farmId>##data` = 1, `<farmId>##uat` = acquisition epoch ms (the Java manager's); `lh_token` = owner token, `lh_fence` = fencing token when the verified fence steps took it (leasehold's, ignored by Java) |
//! | expiration | the TTL in whole seconds, rounded up (never 0 = "namespace default") |
//! | fence record | record `<lock set>#fence` / lock id: `lh_counter` (the last fencing token), `lh_owner` (the owner token that took it with the generation-checked step); expires the hold's TTL after its last increment, and an absent counter starts from the server's clock in microseconds |
//! | waiter line (fair) | record `<lock set>#queue` / lock id: `lh_line` (map waiter id → [ticket µs, deadline µs]), `lh_granted`, `lh_hold` |
//! | readers, permits | same record key, own format: `lh_mode` (`shared` / `semaphore:N`), `lh_holders` (map token → expiry ms), `lh_writer` (waiting writer); changed by filtered `operate`s |
//! | lock history (traced keys) | record `<lock set>#trace` / lock id, list bin `lh_trace` (newest first, bounded), expires the trace TTL after its last write |
//!
//! ## Feature flags
//!
//! | feature | default | what it enables |
//! |---|---|---|
//! | `tls` | off | TLS to the cluster, through rustls with *ring*: [`AerospikeConfig::tls_name`], [`AerospikeConfig::tls_ca_file`] and [`AerospikeConfig::tls_client_cert`]. Without it a TLS configuration is refused with an `InvalidArgument` error naming the feature. |
//!
//! ```no_run
//! use leasehold::LockManager;
//! use leasehold_aerospike::{AerospikeConfig, AerospikeStore};
//!
//! # async fn demo() -> leasehold::Result<()> {
//! let store = AerospikeStore::connect(AerospikeConfig::new("127.0.0.1:3000", "test", "farm1")).await?;
//! let locks = LockManager::builder()
//!     .client_id("orders").farm_id("farm1")
//!     .store(store)
//!     .default_layers()
//!     .build()?;
//! let guard = locks.try_lock("order-42").await?;
//! guard.release().await?;
//! # Ok(()) }
//! ```
#![forbid(unsafe_code)]

mod acquire;
mod cancel;
mod config;
mod error;
mod fencing;
mod info;
pub mod layout;
mod line;
mod queue;
mod refused;
mod release;
mod retry;
mod shared;
mod store;
#[cfg(feature = "tls")]
mod tls;
mod trace;
mod waiting;

pub use config::{
    AerospikeConfig, DEFAULT_CONNECT_TIMEOUT, DEFAULT_PORT, DEFAULT_RETRIES, DEFAULT_RETRY_BUDGET,
    DEFAULT_RETRY_DELAY, DEFAULT_SET_SUFFIX, DEFAULT_WAITER_TIMEOUT,
};
pub use store::AerospikeStore;
