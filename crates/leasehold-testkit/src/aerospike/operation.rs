//! Applying the operations of a write or operate message to a record, one after the other: bin
//! reads and writes, add, append and prepend, touch, delete, and the expression operations
//! (`read_exp`, `write_exp`); CDT map and list operations go to [`cdt_map`] and [`cdt_list`].
//! Kept apart from the command so that what one operation does reads in one place.

use tokio::time::Instant;

use super::exp::{ExpOp, Val};
use super::result_code as rc;
use super::store::Record;
use super::wire::{self, Op, Particle};
use super::{cdt_list, cdt_map};

// Operation types.
pub(super) const OP_READ: u8 = 1;
const OP_WRITE: u8 = 2;
pub(super) const OP_CDT_READ: u8 = 3;
const OP_CDT_MODIFY: u8 = 4;
const OP_INCR: u8 = 5;
pub(super) const OP_EXP_READ: u8 = 7;
const OP_EXP_WRITE: u8 = 8;
const OP_APPEND: u8 = 9;
const OP_PREPEND: u8 = 10;
pub(super) const OP_TOUCH: u8 = 11;
const OP_DELETE: u8 = 14;

pub(super) enum OpResult {
    /// A read: the value (or nil) goes in the reply.
    Value(Option<Particle>),
    /// A write: nothing, or a nil when every op is answered.
    Written,
}

pub(super) fn apply_op(
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
pub(super) fn exp_read(record: &Record, op: &Op, now: Instant) -> Result<Option<Particle>, u8> {
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
