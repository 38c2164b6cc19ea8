//! Test tools for leasehold and for its users' own CI.
//!
//! - [`aerospike`]: a small Aerospike server that speaks the real wire protocol on loopback, with
//!   fault injection, so the real `aerospike` client can be tested without a cluster.
//! - [`etcd`]: a private one-member `etcd` per test, on free loopback ports, killed on drop.
//! - [`redis`]: a private `redis-server` per test, on a free loopback port, killed on drop.
//! - [`fleet`]: several OS processes contending for one key in a test, for fairness checks.
//! - [`fault_proxy`]: a loopback TCP proxy that delays or loses replies, for in-doubt tests.
//! - [`conformance`]: the store contract as a test suite; every store runs it
//!   ([`conformance_tests!`]).
//! - [`scripted`]: a scripted store, the test double layers are tested against.
//! - [`tls`]: a private CA with server and client certificates, for TLS tests.

pub mod aerospike;
pub mod conformance;
pub mod etcd;
pub mod etcd_cluster;
pub mod fault_proxy;
pub mod fleet;
pub mod process;
pub mod redis;
pub mod redis_cluster;
pub mod scripted;
pub mod tls;
