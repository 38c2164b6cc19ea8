//! Executing single-record data messages against the store: which kind a data message is, and
//! the reads, writes, deletes, touches and operates on one record (the operations themselves are
//! applied by [`operation`](super::operation), scans run in [`scan`](super::scan)).
//!
//! Semantics follow a real server where the lock store depends on them; where the fixture had
//! to guess, the guess is written next to the code and in the module docs of
//! [`aerospike`](super).

use std::time::Duration;

use tokio::time::Instant;

use super::exp::Filter;
use super::operation::{apply_op, exp_read, OpResult, OP_CDT_READ, OP_EXP_READ, OP_READ, OP_TOUCH};
use super::result_code as rc;
use super::store::{
    clepoch_now_ms, next_generation, Expiry, Record, Store, TTL_DONT_UPDATE, TTL_NAMESPACE_DEFAULT,
    TTL_NEVER,
};
use super::wire::{self, Message, Particle, Reply};
use super::{cdt_list, cdt_map};

/// Namespace settings a command needs.
#[derive(Debug, Clone)]
pub(crate) struct NsConfig {
    pub(crate) namespace: String,
    /// TTL for expiration 0 ("namespace default"); `None` = never expire.
    pub(crate) default_ttl: Option<Duration>,
}

impl NsConfig {
    fn expiry_for(&self, expiration: u32, current: Option<Expiry>) -> Expiry {
        match expiration {
            TTL_NEVER => Expiry::Never,
            TTL_DONT_UPDATE => current.unwrap_or_else(|| self.default_expiry()),
            TTL_NAMESPACE_DEFAULT => self.default_expiry(),
            secs => Expiry::after(Duration::from_secs(u64::from(secs))),
        }
    }

    fn default_expiry(&self) -> Expiry {
        self.default_ttl.map_or(Expiry::Never, Expiry::after)
    }
}

/// What kind of data message this is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Reads, writes, deletes, operates on one record (digest field present).
    Single,
    /// A scan / query over a set (no digest, a query id or partition list).
    Scan,
    /// Several records in one message (the batch-index protocol, see [`super::batch`]).
    Batch,
    /// UDFs, secondary-index queries, batches of another form: not served.
    Unsupported,
}

pub(crate) fn classify(msg: &Message) -> Kind {
    let has = |t| msg.field(t).is_some();
    if has(wire::FIELD_UDF_PACKAGE) || has(wire::FIELD_INDEX_RANGE) {
        Kind::Unsupported
    } else if msg.info1 & wire::INFO1_BATCH != 0 || has(wire::FIELD_BATCH_INDEX) {
        if msg.info1 & wire::INFO1_BATCH != 0 && has(wire::FIELD_BATCH_INDEX) {
            Kind::Batch
        } else {
            Kind::Unsupported
        }
    } else if has(wire::FIELD_DIGEST) {
        Kind::Single
    } else if has(wire::FIELD_QUERY_ID) || has(wire::FIELD_PID_ARRAY) {
        Kind::Scan
    } else {
        Kind::Unsupported
    }
}

/// The digest field as an array, if it is 20 bytes.
pub(crate) fn digest_of(msg: &Message) -> Option<[u8; 20]> {
    msg.field(wire::FIELD_DIGEST)
        .and_then(|d| <[u8; 20]>::try_from(d).ok())
}

pub(super) fn check_namespace(msg: &Message, ns: &NsConfig) -> Result<(), u8> {
    match msg.field(wire::FIELD_NAMESPACE) {
        None => Err(rc::PARAMETER_ERROR),
        Some(n) if n == ns.namespace.as_bytes() => Ok(()),
        Some(_) => Err(rc::NAMESPACE_NOT_FOUND),
    }
}

pub(super) fn filter_of(msg: &Message) -> Result<Option<Filter>, u8> {
    msg.field(wire::FIELD_FILTER_EXP)
        .map(|bytes| {
            Filter::parse(bytes).map_err(|e| {
                tracing::warn!("aerospike fixture: rejecting filter expression: {e}");
                rc::PARAMETER_ERROR
            })
        })
        .transpose()
}

pub(super) fn passes(filter: Option<&Filter>, record: &Record, now: Instant) -> Result<bool, u8> {
    match filter {
        None => Ok(true),
        Some(f) => f.matches(record, now).map_err(|e| {
            tracing::warn!("aerospike fixture: cannot evaluate filter expression: {e}");
            rc::PARAMETER_ERROR
        }),
    }
}

pub(super) fn reply_for(record: &Record, bins: Vec<(String, Option<Particle>)>) -> Reply {
    Reply {
        generation: u32::from(record.generation),
        void_time: record.expiry.void_time(),
        bins,
        ..Reply::default()
    }
}

pub(super) fn all_bins(record: &Record) -> Vec<(String, Option<Particle>)> {
    record
        .bins
        .iter()
        .map(|(n, p)| (n.clone(), Some(p.clone())))
        .collect()
}

/// Executes a single-record message.
pub(crate) fn execute(store: &mut Store, ns: &NsConfig, msg: &Message) -> Reply {
    match execute_inner(store, ns, msg) {
        Ok(reply) => reply,
        Err(code) => Reply::code(code),
    }
}

fn execute_inner(store: &mut Store, ns: &NsConfig, msg: &Message) -> Result<Reply, u8> {
    check_namespace(msg, ns)?;
    let digest = digest_of(msg).ok_or(rc::PARAMETER_ERROR)?;
    let filter = filter_of(msg)?;
    let now = Instant::now();
    let is_write = msg.info2 & wire::INFO2_WRITE != 0;

    if let Some(existing) = store.get_live(&digest, now) {
        // Guess: as on the server, a filter is only evaluated against an existing record; a
        // write that creates the record is not filtered.
        if !passes(filter.as_ref(), existing, now)? {
            return Err(rc::FILTERED_OUT);
        }
    }

    if !is_write {
        let record = store.get_live(&digest, now).ok_or(rc::KEY_NOT_FOUND)?;
        return Ok(read_reply(record, msg, now));
    }
    if msg.info2 & wire::INFO2_DELETE != 0 {
        let record = store.get_live(&digest, now).ok_or(rc::KEY_NOT_FOUND)?;
        check_generation(record, msg)?;
        store.remove(&digest);
        return Ok(Reply::default());
    }
    write(store, ns, msg, digest, now)
}

fn read_reply(record: &Record, msg: &Message, now: Instant) -> Reply {
    if msg.info1 & wire::INFO1_GET_ALL != 0 {
        return reply_for(record, all_bins(record));
    }
    if msg.info1 & wire::INFO1_NOBINDATA != 0 {
        return reply_for(record, Vec::new());
    }
    let respond_all = msg.info2 & wire::INFO2_RESPOND_ALL_OPS != 0;
    let mut bins = Vec::new();
    for op in &msg.ops {
        if op.op_type == OP_READ && !op.name.is_empty() {
            match record.bin(&op.name) {
                Some(p) => bins.push((op.name.clone(), Some(p.clone()))),
                None if respond_all => bins.push((op.name.clone(), None)),
                None => {}
            }
        } else if op.op_type == OP_CDT_READ && cdt_map::is_map_op(op) {
            match cdt_map::read(record, op) {
                Ok(value) => bins.push((op.name.clone(), value)),
                Err(code) => return Reply::code(code),
            }
        } else if op.op_type == OP_CDT_READ && cdt_list::is_list_op(op) {
            match cdt_list::read(record, op) {
                Ok(value) => bins.push((op.name.clone(), value)),
                Err(code) => return Reply::code(code),
            }
        } else if op.op_type == OP_EXP_READ {
            match exp_read(record, op, now) {
                Ok(value) => bins.push((op.name.clone(), value)),
                Err(code) => return Reply::code(code),
            }
        } else if respond_all {
            bins.push((op.name.clone(), None));
        }
    }
    reply_for(record, bins)
}

fn check_generation(record: &Record, msg: &Message) -> Result<(), u8> {
    let current = u32::from(record.generation);
    if msg.info2 & wire::INFO2_GENERATION != 0 && msg.generation != current {
        return Err(rc::GENERATION_ERROR);
    }
    if msg.info2 & wire::INFO2_GENERATION_GT != 0 && msg.generation <= current {
        return Err(rc::GENERATION_ERROR);
    }
    Ok(())
}

fn user_key_of(msg: &Message) -> Option<Particle> {
    let key = msg.field(wire::FIELD_KEY)?;
    let (ptype, data) = key.split_first()?;
    Some(Particle {
        ptype: *ptype,
        data: data.to_vec(),
    })
}

fn write(
    store: &mut Store,
    ns: &NsConfig,
    msg: &Message,
    digest: [u8; 20],
    now: Instant,
) -> Result<Reply, u8> {
    let replace = msg.info3 & (wire::INFO3_CREATE_OR_REPLACE | wire::INFO3_REPLACE_ONLY) != 0;
    let existing = store.get_live(&digest, now).map(|r| r.clone());
    match &existing {
        Some(record) => {
            if msg.info2 & wire::INFO2_CREATE_ONLY != 0 {
                return Err(rc::KEY_EXISTS);
            }
            check_generation(record, msg)?;
        }
        None => {
            // Guess: a generation check against an absent record passes and the write creates
            // the record (the server only compares generations of existing records).
            if msg.info3 & (wire::INFO3_UPDATE_ONLY | wire::INFO3_REPLACE_ONLY) != 0 {
                return Err(rc::KEY_NOT_FOUND);
            }
            if msg.ops.iter().any(|op| op.op_type == OP_TOUCH) {
                return Err(rc::KEY_NOT_FOUND);
            }
        }
    }
    let set = String::from_utf8_lossy(msg.field(wire::FIELD_SET).unwrap_or_default()).into_owned();
    let mut record = existing.clone().unwrap_or(Record {
        set,
        user_key: None,
        bins: Vec::new(),
        generation: 0,
        expiry: Expiry::Never,
        // As in the server's fresh index entry: expressions of this write see 0.
        last_update_ms: 0,
    });
    if replace {
        record.bins.clear();
    }
    if let Some(key) = user_key_of(msg) {
        record.user_key = Some(key);
    }
    let respond_all = msg.info2 & wire::INFO2_RESPOND_ALL_OPS != 0;
    let mut results: Vec<(String, Option<Particle>)> = Vec::new();
    let mut deleted = false;
    for op in &msg.ops {
        let result = apply_op(&mut record, op, &mut deleted, now)?;
        match result {
            OpResult::Value(v) => results.push((op.name.clone(), v)),
            OpResult::Written if respond_all => results.push((op.name.clone(), None)),
            OpResult::Written => {}
        }
    }
    if record.bins.is_empty() && (deleted || existing.is_none() || !msg.ops.is_empty()) {
        // A record left without bins is deleted, as on the server.
        if existing.is_some() {
            store.remove(&digest);
        }
        return Ok(Reply {
            bins: if msg.info1 & wire::INFO1_GET_ALL != 0 {
                Vec::new()
            } else {
                results
            },
            ..Reply::default()
        });
    }
    record.generation = next_generation(record.generation);
    record.expiry = ns.expiry_for(msg.expiration, existing.as_ref().map(|r| r.expiry));
    // Set once the ops ran: their expressions saw the previous last-update time.
    record.last_update_ms = clepoch_now_ms();
    let bins = if msg.info1 & wire::INFO1_GET_ALL != 0 {
        all_bins(&record)
    } else {
        results
    };
    let reply = reply_for(&record, bins);
    store.insert(digest, record);
    Ok(reply)
}
