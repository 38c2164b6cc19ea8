//! A Jepsen-style harness for leasehold: a **workload** of worker processes taking one lock and
//! writing to a **fenced resource** under it, a **nemesis** injecting faults into the store's
//! nodes and into the workers, and a **checker** over the recorded histories. The `nemesis`
//! binary runs it and prints the table; `tests/nemesis.rs` runs short schedules of it;
//! docs/RELIABILITY.md has the long runs.
//!
//! One job per module:
//! - [`clock`]: the machine-wide monotonic clock every record is stamped with;
//! - [`resource`]: the fenced resource (and the client pauses it carries out);
//! - [`workload`]: the worker processes' loop and their configuration;
//! - [`deployment`]: the store under test, started on loopback, and each fault injected into it;
//! - [`proxy`]: the black-hole proxy in front of a node;
//! - [`aerospike_node`]: an Aerospike fixture node as a process of its own;
//! - [`schedule`]: the nemesis, the seeded schedule of faults;
//! - [`history`]: the records; [`checker`]: what they show; [`report`]: the table;
//! - [`run`]: a whole run, from starting the deployment to the verdict.
//!
//! The embedded store is not here: it lives inside one process, so worker processes cannot
//! share it (docs/RELIABILITY.md).

pub mod aerospike_node;
pub mod checker;
pub mod clock;
pub mod deployment;
pub mod fault;
pub mod history;
pub mod proxy;
pub mod report;
pub mod resource;
pub mod rng;
pub mod run;
pub mod schedule;
pub mod workload;

/// The environment variable that gives a re-spawned nemesis binary its role
/// ([`workload::ROLE`], [`aerospike_node::ROLE`]).
pub const ROLE_ENV: &str = "NEMESIS_ROLE";
