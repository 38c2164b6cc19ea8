//! Read-write locks and semaphores on Aerospike: one record per lock (the same key as the
//! exclusive lock record) holding its holders in a map bin, changed by filtered `operate`s.
//!
//! A shared record has `lh_mode` (`shared` or `semaphore:N`), `lh_holders` (owner token → expiry,
//! ms since the Unix epoch) and, for a read-write lock with a waiting writer, `lh_writer` (the
//! marker's expiry). It has none of the Java manager's bins, and the Java manager's create-only
//! write fails on it as on any existing record. The record's own TTL never ends before its
//! longest holder's entry: every write either sets it to the writer's TTL + 1 s when the record
//! has no more left than that, or leaves it alone (see [`Expiry`](expiry::Expiry)).
//! docs/AEROSPIKE.md lists every round trip and why it is safe.
//!
//! One module per part: [`record`] reads the record back and answers `inspect`, [`expiry`] keeps
//! the record's TTL ahead of its holders, [`expressions`] holds the filters and the sweep every
//! write is built from, [`acquire`] takes a read hold or a permit, [`writer`] handles an exclusive
//! request that meets a shared record, and [`release`] releases and extends a hold.

mod acquire;
mod expiry;
mod expressions;
mod record;
mod release;
mod writer;

pub(crate) use record::{is_shared, shared_info};
