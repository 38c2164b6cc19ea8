//! A small Aerospike server speaking the real wire protocol on loopback, with fault injection.
//!
//! [`AerospikeFixture`] serves one namespace from memory on a free port, so the real `aerospike`
//! client (3.x, async) connects to it exactly as it connects to a one-node cluster: no login, the
//! usual seed check and tend over info commands, then single-record commands and scans over data
//! messages. Tests reach the failures a cluster produces (timeouts, dropped connections, lost
//! replies, error codes, a stalled server) through [`Faults`].
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use leasehold_testkit::aerospike::{AerospikeFixture, Fault, Target};
//!
//! let fixture = AerospikeFixture::builder().namespace("locks").start().await?;
//! let hosts = fixture.host_string(); // "127.0.0.1:PORT", for aerospike::Client::new
//! // ... connect a client to `hosts`, write records to set "leases" ...
//! fixture.faults().inject(Fault::DropReply, Target::NextRequests(1));
//! assert_eq!(fixture.record_count("leases"), 0);
//! fixture.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! The binary `aerospike-fixture --bind 127.0.0.1:3000 --namespace test` serves the same
//! fixture until SIGINT/SIGTERM and prints `listening on <addr>` once ready.
//!
//! With [`AerospikeFixtureBuilder::tls`] it speaks TLS only (tokio-rustls), as a node with a TLS
//! service does; clients connect with `host:tls_name:port`.
//!
//! # Protocol subset
//!
//! - Framing: 8-byte proto header (version 2, type, 48-bit length);
//!   info frames (type 1) and data messages (type 3) with the 22-byte message header, fields
//!   and operations. Compressed messages (type 4) are not served: the client only sends them
//!   when a policy enables compression, and such a connection is closed.
//! - Info: `node`, `cluster-name`, `build` (`7.2.0.1`), `partition-generation`,
//!   `peers-generation`, `peers-clear-std` (no peers), `replicas` (all 4096 partitions on this
//!   node, one replica, AP regime — or none, or no table, with
//!   [`AerospikeFixture::set_partitions`]), `namespaces`, `features`; anything else answers
//!   empty.
//! - Single-record messages: put (write ops) with record-exists actions (update, create-only,
//!   update-only, replace, replace-only), generation policies (none, expect-equal,
//!   expect-greater), expiration (namespace default, seconds, never, don't-update); get (all
//!   bins, header only, named bins), exists, delete (with generation check), touch, and operate
//!   with read, write, add (integer), append/prepend (string, blob), touch and delete ops,
//!   expression ops (`write_exp` computing a bin from an expression, `read_exp`), and CDT
//!   map ops (`cdt_map`: put, clear, get/remove by key, key interval, value interval, size) and
//!   CDT list ops (`cdt_list`: append, insert, trim, clear, size, get, get by index or index
//!   range), with one result per op in order when the client sets respond-all-ops. The user key is stored
//!   when the client sends it (`send_key`).
//! - Batch messages (the batch-index protocol of `Client::batch`): rows that read (all bins,
//!   named bins, header only, read operations), write or operate, or delete, each with its own
//!   attributes (record-exists action, generation check, expiration, send-key, filter; repeated
//!   rows), run as the single-record commands they describe and answered row by row, each answer
//!   carrying the row's index, then a last message. Faults apply to a batch as one request; a
//!   result-code fault answers only the rows whose record it targets.
//! - Filter expressions (field 43) on reads, writes, deletes, operates and scans, and the
//!   expressions of expression ops: comparisons of bins, literals, `and`/`or`/`not`, `cond`,
//!   integer and float `add`/`sub`/`mul`/`div`/`min`/`max`, `bin_type`, `key_exists`,
//!   `set_name`, `ttl`, `last_update` and `since_update` (each record keeps its last-update time
//!   in milliseconds on the wall clock, as the server's index does), and map reads (get by key,
//!   key or value interval, size) on map bins. A record
//!   the filter rejects answers `FILTERED_OUT` (27); an unsupported expression answers
//!   `PARAMETER_ERROR` (4).
//! - Scans: the client's partition scan (`query` with a statement without index filter) of a
//!   set, or of the whole namespace; every live record of the requested partitions, with
//!   digest, set, user key (if stored), bins, generation and void time, then a last message.
//! - Security messages (frame type 2), with [`AerospikeFixtureBuilder::credentials`]: `LOGIN`
//!   with user and bcrypt credential (answers a session token and TTL) and `AUTHENTICATE` with a
//!   token; without a user, a login answers `SECURITY_NOT_ENABLED`.
//! - Not served (answered `PARAMETER_ERROR`): UDF (single or as batch rows), secondary-index
//!   queries, background queries, CDT bit/HLL operations, list ops by value or rank,
//!   user and role administration.
//!
//! Result codes are the server's ([`result_code`]).
//!
//! # Guesses
//!
//! Where the server's behaviour could not be checked against a server, the fixture does this.
//! The ones marked *checked on a cluster* are exercised by tests that run against a real server
//! when `AEROSPIKE_HOSTS` is set ([`AerospikeTarget`]; the list is in docs/AEROSPIKE.md):
//!
//! - Generation starts at 1 when a record is created and increases by one on every write
//!   (touch included); it is 16 bits on the wire of a real server and wraps from 65535 to 1,
//!   never 0.
//! - A generation check (expect-equal or expect-greater) against an absent record passes: the
//!   write creates the record (expect-equal 0: *checked on a cluster*, the Java manager's write). A delete of an absent record is `KEY_NOT_FOUND` (2) whatever
//!   the generation.
//! - A filter expression is only evaluated against an existing record; a write that creates a
//!   record is not filtered.
//! - Expiration is always enabled (as with `nsup-period` set): a write with a TTL never fails
//!   because expiry is disabled. Expiration 0 uses the namespace default TTL, which is
//!   "never" unless [`AerospikeFixtureBuilder::default_ttl`] sets one. A record past its void
//!   time is invisible to every command at once (*checked on a cluster* for reads and creates).
//! - A write that leaves a record without bins deletes it.
//! - The expressions of a write's ops see the record's last-update time from before the write
//!   (0 for a record the write creates, as in a fresh index entry), and the write sets it to the
//!   wall clock once its ops ran; `since_update` is the wall clock minus that time, 0 when the
//!   clock is behind it. So `last_update / 10^6 + since_update` is the clock in milliseconds
//!   since 1970 whether the record existed or not. A `cond` whose condition is unknown is
//!   unknown; an expression op whose value is unknown answers `OP_NOT_APPLICABLE` (26).
//! - The rows of a batch run one after another in the request's order, each answered whatever
//!   the others' results (a server may run them in parallel: any order is one the fixture could
//!   have chosen); a row's write is the single-record write with the same attributes (*checked on
//!   a cluster*: create-only and filtered rows, header reads, reads of absent records).
//! - A scan resuming a partially scanned partition rescans the whole partition.
//! - `add` on a bin holding a non-integer answers `BIN_TYPE_ERROR` (12); an `add` with a
//!   non-integer value answers `PARAMETER_ERROR` (4).
//! - With a user: a wrong user or password answers `INVALID_CREDENTIAL` (65) to the login; info
//!   requests are answered before a login, data messages answer `NOT_AUTHENTICATED` (80) until
//!   the connection logged in or authenticated with a token.

mod admin;
mod batch;
mod cdt_list;
mod cdt_map;
mod cdt_value;
mod command;
mod exp;
mod faults;
mod fixture;
mod info;
mod operation;
pub mod result_code;
mod scan;
mod server;
mod store;
mod target;
mod wire;

pub use faults::{Fault, FaultId, Faults, Partitions, Target};
pub use fixture::{
    AerospikeFixture, AerospikeFixtureBuilder, BinValue, StoredRecord, DEFAULT_CLUSTER_NAME,
    DEFAULT_NAMESPACE,
};
pub use target::{AerospikeTarget, HOSTS_ENV, NAMESPACE_ENV, PASSWORD_ENV, USER_ENV};
