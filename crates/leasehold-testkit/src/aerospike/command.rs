//! Executing data messages against the store: single-record reads, writes, deletes, touches and
//! operates, and set scans.
//!
//! Semantics follow a real server where the lock store depends on them; where the fixture had
//! to guess, the guess is written next to the code and in the module docs of
//! [`aerospike`](super).

use std::collections::HashSet;
use std::time::Duration;

use tokio::time::Instant;

use super::exp::{ExpOp, Filter, Val};
use super::result_code as rc;
use super::store::{
    clepoch_now_ms, next_generation, Expiry, Record, Store, TTL_DONT_UPDATE, TTL_NAMESPACE_DEFAULT,
    TTL_NEVER,
};
use super::wire::{self, Message, Op, Particle, Reply};
use super::{cdt_list, cdt_map};

// Operation types.
const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
const OP_CDT_READ: u8 = 3;
const OP_CDT_MODIFY: u8 = 4;
const OP_INCR: u8 = 5;
const OP_EXP_READ: u8 = 7;
const OP_EXP_WRITE: u8 = 8;
const OP_APPEND: u8 = 9;
const OP_PREPEND: u8 = 10;
const OP_TOUCH: u8 = 11;
const OP_DELETE: u8 = 14;

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

fn check_namespace(msg: &Message, ns: &NsConfig) -> Result<(), u8> {
    match msg.field(wire::FIELD_NAMESPACE) {
        None => Err(rc::PARAMETER_ERROR),
        Some(n) if n == ns.namespace.as_bytes() => Ok(()),
        Some(_) => Err(rc::NAMESPACE_NOT_FOUND),
    }
}

fn filter_of(msg: &Message) -> Result<Option<Filter>, u8> {
    msg.field(wire::FIELD_FILTER_EXP)
        .map(|bytes| {
            Filter::parse(bytes).map_err(|e| {
                tracing::warn!("aerospike fixture: rejecting filter expression: {e}");
                rc::PARAMETER_ERROR
            })
        })
        .transpose()
}

fn passes(filter: Option<&Filter>, record: &Record, now: Instant) -> Result<bool, u8> {
    match filter {
        None => Ok(true),
        Some(f) => f.matches(record, now).map_err(|e| {
            tracing::warn!("aerospike fixture: cannot evaluate filter expression: {e}");
            rc::PARAMETER_ERROR
        }),
    }
}

fn reply_for(record: &Record, bins: Vec<(String, Option<Particle>)>) -> Reply {
    Reply {
        generation: u32::from(record.generation),
        void_time: record.expiry.void_time(),
        bins,
        ..Reply::default()
    }
}

fn all_bins(record: &Record) -> Vec<(String, Option<Particle>)> {
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

enum OpResult {
    /// A read: the value (or nil) goes in the reply.
    Value(Option<Particle>),
    /// A write: nothing, or a nil when every op is answered.
    Written,
}

fn apply_op(
    record: &mut Record,
    op: &Op,
    deleted: &mut bool,
    now: Instant,
) -> Result<OpResult, u8> {
    match op.op_type {
        OP_READ => Ok(OpResult::Value(if op.name.is_empty() {
            None
        } else {
            record.bin(&op.name).cloned()
        })),
        OP_WRITE => {
            check_bin_name(op)?;
            if op.particle == wire::PARTICLE_NULL {
                record.remove_bin(&op.name);
            } else {
                record.set_bin(&op.name, particle(op));
            }
            Ok(OpResult::Written)
        }
        OP_INCR => {
            check_bin_name(op)?;
            let delta = particle(op).as_i64().ok_or(rc::PARAMETER_ERROR)?;
            let sum = match record.bin(&op.name) {
                None => delta,
                Some(p) => p.as_i64().ok_or(rc::BIN_TYPE_ERROR)?.wrapping_add(delta),
            };
            record.set_bin(&op.name, Particle::int(sum));
            Ok(OpResult::Written)
        }
        OP_APPEND | OP_PREPEND => {
            check_bin_name(op)?;
            if op.particle != wire::PARTICLE_STRING && op.particle != wire::PARTICLE_BLOB {
                return Err(rc::PARAMETER_ERROR);
            }
            let value = match record.bin(&op.name) {
                None => particle(op),
                Some(p) if p.ptype == op.particle => {
                    let mut data = p.data.clone();
                    if op.op_type == OP_APPEND {
                        data.extend_from_slice(&op.value);
                    } else {
                        data.splice(0..0, op.value.iter().copied());
                    }
                    Particle {
                        ptype: p.ptype,
                        data,
                    }
                }
                Some(_) => return Err(rc::BIN_TYPE_ERROR),
            };
            record.set_bin(&op.name, value);
            Ok(OpResult::Written)
        }
        OP_TOUCH => Ok(OpResult::Written),
        OP_EXP_READ => Ok(OpResult::Value(exp_read(record, op, now)?)),
        OP_EXP_WRITE => {
            exp_write(record, op, now)?;
            Ok(OpResult::Written)
        }
        OP_CDT_READ | OP_CDT_MODIFY if cdt_map::is_map_op(op) => {
            Ok(OpResult::Value(cdt_map::apply(record, op)?))
        }
        OP_CDT_READ | OP_CDT_MODIFY if cdt_list::is_list_op(op) => {
            Ok(OpResult::Value(cdt_list::apply(record, op)?))
        }
        OP_DELETE => {
            record.bins.clear();
            *deleted = true;
            Ok(OpResult::Written)
        }
        other => {
            tracing::warn!("aerospike fixture: unsupported operation type {other}");
            Err(rc::PARAMETER_ERROR)
        }
    }
}

// Expression operation flags (`ExpWriteFlags`, `ExpReadFlags`).
const EXP_CREATE_ONLY: i64 = 1;
const EXP_UPDATE_ONLY: i64 = 1 << 1;
const EXP_ALLOW_DELETE: i64 = 1 << 2;
const EXP_POLICY_NO_FAIL: i64 = 1 << 3;
const EXP_EVAL_NO_FAIL: i64 = 1 << 4;

fn parse_exp_op(op: &Op) -> Result<ExpOp, u8> {
    ExpOp::parse(&op.value).map_err(|e| {
        tracing::warn!("aerospike fixture: rejecting expression operation: {e}");
        rc::PARAMETER_ERROR
    })
}

fn evaluate(exp: &ExpOp, record: &Record, now: Instant) -> Result<Val, u8> {
    exp.value(record, now).map_err(|e| {
        tracing::warn!("aerospike fixture: cannot evaluate expression operation: {e}");
        rc::PARAMETER_ERROR
    })
}

/// The particle a value is stored (or answered) as; `None` for nil and unknown.
fn particle_of(value: &Val) -> Option<Particle> {
    let (ptype, data) = match value {
        Val::Int(i) => (wire::PARTICLE_INTEGER, i.to_be_bytes().to_vec()),
        Val::Float(f) => (wire::PARTICLE_FLOAT, f.to_be_bytes().to_vec()),
        Val::Str(s) => (wire::PARTICLE_STRING, s.clone()),
        Val::Blob(b) => (wire::PARTICLE_BLOB, b.clone()),
        Val::Bool(b) => (wire::PARTICLE_BOOL, vec![u8::from(*b)]),
        Val::Nil | Val::Unknown => return None,
    };
    Some(Particle { ptype, data })
}

/// `read_exp`: the expression's value under the op's name. Unknown fails the command with
/// `OP_NOT_APPLICABLE` unless the op says `EVAL_NO_FAIL` (then nil).
fn exp_read(record: &Record, op: &Op, now: Instant) -> Result<Option<Particle>, u8> {
    let exp = parse_exp_op(op)?;
    match evaluate(&exp, record, now)? {
        Val::Unknown if exp.flags & EXP_EVAL_NO_FAIL == 0 => Err(rc::OP_NOT_APPLICABLE),
        value => Ok(particle_of(&value)),
    }
}

/// `write_exp`: the expression's value, computed on the record as the earlier ops left it,
/// written to the op's bin. Unknown fails with `OP_NOT_APPLICABLE` (or writes nothing with
/// `EVAL_NO_FAIL`); nil deletes the bin with `ALLOW_DELETE`, else fails the same way; the bin
/// rules `CREATE_ONLY` (`BIN_EXISTS_ERROR`) and `UPDATE_ONLY` (`BIN_NOT_FOUND`) are skipped
/// silently with `POLICY_NO_FAIL`.
fn exp_write(record: &mut Record, op: &Op, now: Instant) -> Result<(), u8> {
    check_bin_name(op)?;
    let exp = parse_exp_op(op)?;
    let no_fail = exp.flags & EXP_POLICY_NO_FAIL != 0;
    let exists = record.bin(&op.name).is_some();
    if exp.flags & EXP_CREATE_ONLY != 0 && exists {
        return if no_fail {
            Ok(())
        } else {
            Err(rc::BIN_EXISTS_ERROR)
        };
    }
    if exp.flags & EXP_UPDATE_ONLY != 0 && !exists {
        return if no_fail {
            Ok(())
        } else {
            Err(rc::BIN_NOT_FOUND)
        };
    }
    match evaluate(&exp, record, now)? {
        Val::Unknown if exp.flags & EXP_EVAL_NO_FAIL != 0 => Ok(()),
        Val::Unknown => Err(rc::OP_NOT_APPLICABLE),
        Val::Nil if exp.flags & EXP_ALLOW_DELETE != 0 => {
            record.remove_bin(&op.name);
            Ok(())
        }
        Val::Nil if no_fail => Ok(()),
        Val::Nil => Err(rc::OP_NOT_APPLICABLE),
        value => {
            if let Some(p) = particle_of(&value) {
                record.set_bin(&op.name, p);
            }
            Ok(())
        }
    }
}

fn check_bin_name(op: &Op) -> Result<(), u8> {
    if op.name.is_empty() || op.name.len() > 15 {
        return Err(rc::PARAMETER_ERROR);
    }
    Ok(())
}

fn particle(op: &Op) -> Particle {
    Particle {
        ptype: op.particle,
        data: op.value.clone(),
    }
}

/// Executes a scan: every live record of the set (all sets when none is named) in the requested
/// partitions, as a stream of messages ending with one flagged `INFO3_LAST`. Returns the frames
/// to send.
pub(crate) fn scan(store: &Store, ns: &NsConfig, msg: &Message) -> Vec<Vec<u8>> {
    match scan_inner(store, ns, msg) {
        Ok(frames) => frames,
        Err(code) => vec![Reply {
            info3: wire::INFO3_LAST,
            result_code: code,
            ..Reply::default()
        }
        .to_frame()],
    }
}

/// Bytes of messages gathered before a frame is cut.
const FRAME_TARGET: usize = 64 * 1024;

fn scan_inner(store: &Store, ns: &NsConfig, msg: &Message) -> Result<Vec<Vec<u8>>, u8> {
    check_namespace(msg, ns)?;
    if msg.info2 & wire::INFO2_WRITE != 0 {
        // Background scans (query_operate / UDF) are not served.
        return Err(rc::PARAMETER_ERROR);
    }
    let filter = filter_of(msg)?;
    let set = msg
        .field(wire::FIELD_SET)
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .filter(|s| !s.is_empty());
    let partitions = requested_partitions(msg);
    let max_records = msg
        .field(wire::FIELD_MAX_RECORDS)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .filter(|m| *m > 0)
        .unwrap_or(u64::MAX);
    let no_bins = msg.info1 & wire::INFO1_NOBINDATA != 0;
    let names: Vec<&str> = msg
        .ops
        .iter()
        .filter(|op| op.op_type == OP_READ && !op.name.is_empty())
        .map(|op| op.name.as_str())
        .collect();
    let now = Instant::now();
    let mut frames = Vec::new();
    let mut body = Vec::new();
    let mut sent = 0u64;
    for (digest, record) in store.live(set.as_deref(), now) {
        if sent >= max_records {
            break;
        }
        if let Some(parts) = &partitions {
            if !parts.contains(&partition_id(digest)) {
                continue;
            }
        }
        if !passes(filter.as_ref(), record, now)? {
            continue;
        }
        let bins = if no_bins {
            Vec::new()
        } else if names.is_empty() {
            all_bins(record)
        } else {
            names
                .iter()
                .filter_map(|n| record.bin(n).map(|p| ((*n).to_owned(), Some(p.clone()))))
                .collect()
        };
        let mut fields = vec![
            (wire::FIELD_NAMESPACE, ns.namespace.as_bytes().to_vec()),
            (wire::FIELD_DIGEST, digest.to_vec()),
        ];
        if !record.set.is_empty() {
            fields.push((wire::FIELD_SET, record.set.as_bytes().to_vec()));
        }
        if let Some(key) = &record.user_key {
            let mut data = vec![key.ptype];
            data.extend_from_slice(&key.data);
            fields.push((wire::FIELD_KEY, data));
        }
        let mut reply = reply_for(record, bins);
        reply.fields = fields;
        reply.encode_into(&mut body);
        sent += 1;
        if body.len() >= FRAME_TARGET {
            frames.push(wire::frame(wire::TYPE_MESSAGE, &body));
            body.clear();
        }
    }
    Reply {
        info3: wire::INFO3_LAST,
        ..Reply::default()
    }
    .encode_into(&mut body);
    frames.push(wire::frame(wire::TYPE_MESSAGE, &body));
    Ok(frames)
}

/// The partition of a digest, as the client computes it.
pub(crate) fn partition_id(digest: &[u8; 20]) -> u16 {
    (u32::from_le_bytes([digest[0], digest[1], digest[2], digest[3]]) & 0x0fff) as u16
}

/// The partitions a scan asks for (full partitions and the partitions of resume digests);
/// `None` when it names none, meaning all.
fn requested_partitions(msg: &Message) -> Option<HashSet<u16>> {
    let pids = msg.field(wire::FIELD_PID_ARRAY);
    let digests = msg.field(wire::FIELD_DIGEST_ARRAY);
    if pids.is_none() && digests.is_none() {
        return None;
    }
    let mut out = HashSet::new();
    for chunk in pids.unwrap_or_default().chunks_exact(2) {
        out.insert(u16::from_le_bytes([chunk[0], chunk[1]]));
    }
    // Guess: a partially scanned partition (resume digest) is scanned again in full; the
    // client tolerates the repeats.
    for chunk in digests.unwrap_or_default().chunks_exact(20) {
        if let Ok(d) = <[u8; 20]>::try_from(chunk) {
            out.insert(partition_id(&d));
        }
    }
    Some(out)
}
