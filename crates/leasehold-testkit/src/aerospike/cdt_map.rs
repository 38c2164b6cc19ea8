//! CDT map operations (operate op types 3 and 4 with a map op code) and map read calls in filter
//! expressions (`[127, type, 0, [op, return type, args...], [81, 5, bin]]`).
//!
//! A map bin is stored as the server sends it: particle type 19, a msgpack map whose strings carry
//! their particle type as a leading byte (3 string, 4 blob). Entries are kept in key order: the
//! server answers an unordered map in canonical key order too, without the key-ordered flag.
//!
//! Served, with the server's op codes: `put` (67) with the write flags create-only (1),
//! update-only (2), no-fail (4); `clear` (75); `remove_by_key` (76), `remove_by_key_interval`
//! (84), `remove_by_value_interval` (86); `size` (96); `get_by_key` (97), `get_by_key_interval`
//! (103), `get_by_value_interval` (105). Return types: none (0), count (5), key (6), value (7),
//! exists (13), each optionally inverted (`0x10000`, the unselected items). Interval ops take
//! `begin` inclusive and `end` exclusive; a nil `begin` is "from the lowest", an absent `end` is
//! "to the highest". Values compare in the server's CDT order: nil, bool, integer, string, list,
//! map, blob, float. Anything else (contexts, other op codes, index/rank return types, key-value
//! returns, ordered-map policies' persisted index) answers `PARAMETER_ERROR` (4); a map op on a
//! bin of another type `BIN_TYPE_ERROR` (12). A put refused by its write flags answers
//! `ELEMENT_EXISTS` (24) or `ELEMENT_NOT_FOUND` (23), unless no-fail is set.
//!
//! Guesses (not checked on a server): a map op on a missing bin reads as an empty map (reads
//! answer nil, removes remove nothing); a modify op that empties a map leaves the empty map bin.

use std::cmp::Ordering;

use super::cdt_value::{
    decode_all, encode, to_particle, Mv, ELEMENT_EXISTS, ELEMENT_NOT_FOUND, PARTICLE_MAP,
};
use super::result_code as rc;
use super::store::Record;
use super::wire::{Op, Particle};

const PUT: i64 = 67;
const CLEAR: i64 = 75;
const REMOVE_BY_KEY: i64 = 76;
const REMOVE_BY_KEY_INTERVAL: i64 = 84;
const REMOVE_BY_VALUE_INTERVAL: i64 = 86;
const SIZE: i64 = 96;
const GET_BY_KEY: i64 = 97;
const GET_BY_KEY_INTERVAL: i64 = 103;
const GET_BY_VALUE_INTERVAL: i64 = 105;

const RETURN_NONE: i64 = 0;
const RETURN_COUNT: i64 = 5;
const RETURN_KEY: i64 = 6;
const RETURN_VALUE: i64 = 7;
const RETURN_EXISTS: i64 = 13;
const RETURN_INVERTED: i64 = 0x10000;

const WRITE_CREATE_ONLY: i64 = 1;
const WRITE_UPDATE_ONLY: i64 = 2;
const WRITE_NO_FAIL: i64 = 4;

/// The op code of a CDT operation's payload, if it is a map op (codes 64-127).
fn map_op_code(args: &[Mv]) -> Option<i64> {
    match args.first() {
        Some(Mv::Int(code)) if (64..128).contains(code) => Some(*code),
        _ => None,
    }
}

/// Whether `op` (op type 3 or 4) carries a map operation. Lists use codes below 64.
pub(crate) fn is_map_op(op: &Op) -> bool {
    match decode_all(&op.value) {
        Ok(Mv::Array(items)) => map_op_code(&items).is_some(),
        _ => false,
    }
}

/// A map's entries, in key order.
type Pairs = Vec<(Mv, Mv)>;

/// The map in `record`'s bin `name`: `None` when the bin is missing.
fn load(record: &Record, name: &str) -> Result<Option<Vec<(Mv, Mv)>>, u8> {
    match record.bin(name) {
        None => Ok(None),
        Some(p) if p.ptype == PARTICLE_MAP => match decode_all(&p.data)? {
            Mv::Map(pairs) => Ok(Some(pairs)),
            _ => Err(rc::BIN_TYPE_ERROR),
        },
        Some(_) => Err(rc::BIN_TYPE_ERROR),
    }
}

fn store(record: &mut Record, name: &str, mut pairs: Vec<(Mv, Mv)>) {
    pairs.sort_by(|a, b| a.0.cmp(&b.0));
    let mut data = Vec::new();
    encode(&Mv::Map(pairs), &mut data);
    record.set_bin(
        name,
        Particle {
            ptype: PARTICLE_MAP,
            data,
        },
    );
}

fn int_arg(args: &[Mv], i: usize) -> Result<i64, u8> {
    match args.get(i) {
        Some(Mv::Int(n)) => Ok(*n),
        _ => Err(rc::PARAMETER_ERROR),
    }
}

/// Which entries an op selects, by position.
fn select(pairs: &[(Mv, Mv)], code: i64, args: &[Mv]) -> Result<Vec<bool>, u8> {
    let in_range = |v: &Mv, begin: &Mv, end: Option<&Mv>| {
        (matches!(begin, Mv::Nil) || v.cmp(begin) != Ordering::Less)
            && end.is_none_or(|e| v.cmp(e) == Ordering::Less)
    };
    let selected = match code {
        GET_BY_KEY | REMOVE_BY_KEY => {
            let key = args.get(2).ok_or(rc::PARAMETER_ERROR)?;
            pairs
                .iter()
                .map(|(k, _)| k.cmp(key) == Ordering::Equal)
                .collect()
        }
        GET_BY_KEY_INTERVAL | REMOVE_BY_KEY_INTERVAL => {
            let begin = args.get(2).ok_or(rc::PARAMETER_ERROR)?;
            let end = args.get(3);
            pairs.iter().map(|(k, _)| in_range(k, begin, end)).collect()
        }
        GET_BY_VALUE_INTERVAL | REMOVE_BY_VALUE_INTERVAL => {
            let begin = args.get(2).ok_or(rc::PARAMETER_ERROR)?;
            let end = args.get(3);
            pairs.iter().map(|(_, v)| in_range(v, begin, end)).collect()
        }
        _ => return Err(rc::PARAMETER_ERROR),
    };
    Ok(selected)
}

/// The result of a selection, as the return type asks.
fn result_of(
    pairs: &[(Mv, Mv)],
    selected: &[bool],
    return_type: i64,
    single: bool,
) -> Result<Mv, u8> {
    let picked: Vec<&(Mv, Mv)> = pairs
        .iter()
        .zip(selected)
        .filter(|(_, s)| **s)
        .map(|(p, _)| p)
        .collect();
    let one_or_list = |items: Vec<Mv>| {
        if single {
            items.into_iter().next().unwrap_or(Mv::Nil)
        } else {
            Mv::Array(items)
        }
    };
    Ok(match return_type & !RETURN_INVERTED {
        RETURN_NONE => Mv::Nil,
        RETURN_COUNT => Mv::Int(picked.len() as i64),
        RETURN_EXISTS => Mv::Bool(!picked.is_empty()),
        RETURN_KEY => one_or_list(picked.iter().map(|(k, _)| k.clone()).collect()),
        RETURN_VALUE => one_or_list(picked.iter().map(|(_, v)| v.clone()).collect()),
        _ => return Err(rc::PARAMETER_ERROR),
    })
}

/// Runs a map op on a map (`None`: the bin is missing). Returns the op's result and the map to
/// store, if the op modified it.
fn run(current: Option<Pairs>, args: &[Mv]) -> Result<(Mv, Option<Pairs>), u8> {
    let code = map_op_code(args).ok_or(rc::PARAMETER_ERROR)?;
    let existed = current.is_some();
    let mut pairs = current.unwrap_or_default();
    match code {
        SIZE => Ok((Mv::Int(pairs.len() as i64), None)),
        CLEAR => Ok((Mv::Nil, existed.then(Vec::new))),
        PUT => {
            let key = args.get(1).ok_or(rc::PARAMETER_ERROR)?.clone();
            let value = args.get(2).cloned().unwrap_or(Mv::Nil);
            if args.get(3).is_some_and(|a| !matches!(a, Mv::Int(0))) {
                // An ordered map or a persisted index: not modelled.
                return Err(rc::PARAMETER_ERROR);
            }
            let flags = match args.get(4) {
                None => 0,
                Some(Mv::Int(f)) => *f,
                Some(_) => return Err(rc::PARAMETER_ERROR),
            };
            let slot = pairs
                .iter()
                .position(|(k, _)| k.cmp(&key) == Ordering::Equal);
            let refused = match slot {
                Some(_) if flags & WRITE_CREATE_ONLY != 0 => Some(ELEMENT_EXISTS),
                None if flags & WRITE_UPDATE_ONLY != 0 => Some(ELEMENT_NOT_FOUND),
                _ => None,
            };
            if let Some(code) = refused {
                if flags & WRITE_NO_FAIL != 0 {
                    return Ok((Mv::Int(pairs.len() as i64), None));
                }
                return Err(code);
            }
            match slot {
                Some(i) => pairs[i].1 = value,
                None => pairs.push((key, value)),
            }
            Ok((Mv::Int(pairs.len() as i64), Some(pairs)))
        }
        GET_BY_KEY
        | GET_BY_KEY_INTERVAL
        | GET_BY_VALUE_INTERVAL
        | REMOVE_BY_KEY
        | REMOVE_BY_KEY_INTERVAL
        | REMOVE_BY_VALUE_INTERVAL => {
            let return_type = int_arg(args, 1)?;
            let mut selected = select(&pairs, code, args)?;
            if return_type & RETURN_INVERTED != 0 {
                selected.iter_mut().for_each(|s| *s = !*s);
            }
            let single =
                matches!(code, GET_BY_KEY | REMOVE_BY_KEY) && return_type & RETURN_INVERTED == 0;
            let result = result_of(&pairs, &selected, return_type, single)?;
            if code < SIZE {
                if !existed {
                    return Ok((result, None));
                }
                let mut keep = selected.iter().map(|s| !*s);
                pairs.retain(|_| keep.next().unwrap_or(true));
                return Ok((result, Some(pairs)));
            }
            Ok((result, None))
        }
        _ => Err(rc::PARAMETER_ERROR),
    }
}

fn op_args(op: &Op) -> Result<Vec<Mv>, u8> {
    match decode_all(&op.value)? {
        Mv::Array(items) if map_op_code(&items).is_some() => Ok(items),
        // Contexts (`[0xff, [ctx...], [op...]]`) are not served.
        _ => Err(rc::PARAMETER_ERROR),
    }
}

/// Applies a map op (from an operate) to `record`; the result goes in the reply.
pub(crate) fn apply(record: &mut Record, op: &Op) -> Result<Option<Particle>, u8> {
    if op.name.is_empty() || op.name.len() > 15 {
        return Err(rc::PARAMETER_ERROR);
    }
    let args = op_args(op)?;
    let (result, updated) = run(load(record, &op.name)?, &args)?;
    if let Some(pairs) = updated {
        store(record, &op.name, pairs);
    }
    Ok(to_particle(&result))
}

/// A map read op in a read-only operate: nothing is stored.
pub(crate) fn read(record: &Record, op: &Op) -> Result<Option<Particle>, u8> {
    let args = op_args(op)?;
    let code = map_op_code(&args).unwrap_or_default();
    if code == PUT || code == CLEAR || code < SIZE {
        return Err(rc::PARAMETER_ERROR);
    }
    let (result, _) = run(load(record, &op.name)?, &args)?;
    Ok(to_particle(&result))
}

/// Whether `args` (an op code and its arguments) is a map read op, one a `call` expression may
/// run.
pub(crate) fn is_read_op(args: &[Mv]) -> bool {
    !matches!(map_op_code(args), Some(64..=95) | None)
}

/// Runs the map read op `args` on bin `name` of `record`: `None` when the bin is missing or not a
/// map, else the op's result or the result code it failed with.
pub(crate) fn read_bin(record: &Record, name: &str, args: &[Mv]) -> Option<Result<Mv, u8>> {
    let current = match load(record, name) {
        Ok(Some(pairs)) => pairs,
        _ => return None,
    };
    Some(run(Some(current), args).map(|(result, _)| result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aerospike::cdt_value::test_support::{cdt_op, record, s};

    fn op(op_type: u8, args: Vec<Mv>) -> Op {
        cdt_op("m", op_type, args)
    }

    #[test]
    fn put_remove_and_ranges() {
        let mut rec = record();
        for (k, v) in [("a", 10), ("b", 20), ("c", 30)] {
            let r = apply(
                &mut rec,
                &op(4, vec![Mv::Int(PUT), s(k), Mv::Int(v), Mv::Int(0)]),
            );
            assert!(r.unwrap().is_some());
        }
        let count = |rec: &Record, begin, end: Option<i64>| {
            let mut args = vec![Mv::Int(GET_BY_VALUE_INTERVAL), Mv::Int(RETURN_COUNT), begin];
            args.extend(end.map(Mv::Int));
            read(rec, &op(3, args)).unwrap().and_then(|p| p.as_i64())
        };
        assert_eq!(count(&rec, Mv::Int(20), None), Some(2));
        assert_eq!(count(&rec, Mv::Nil, Some(20)), Some(1));
        let removed = apply(
            &mut rec,
            &op(
                4,
                vec![
                    Mv::Int(REMOVE_BY_VALUE_INTERVAL),
                    Mv::Int(RETURN_COUNT),
                    Mv::Nil,
                    Mv::Int(25),
                ],
            ),
        );
        assert_eq!(removed.unwrap().and_then(|p| p.as_i64()), Some(2));
        let value = apply(
            &mut rec,
            &op(
                4,
                vec![Mv::Int(REMOVE_BY_KEY), Mv::Int(RETURN_VALUE), s("c")],
            ),
        );
        assert_eq!(value.unwrap().and_then(|p| p.as_i64()), Some(30));
        assert_eq!(count(&rec, Mv::Nil, None), Some(0), "the empty map stays");
        let missing = apply(
            &mut rec,
            &op(
                4,
                vec![Mv::Int(PUT), s("z"), Mv::Int(1), Mv::Int(0), Mv::Int(2)],
            ),
        );
        assert_eq!(missing, Err(ELEMENT_NOT_FOUND));
    }

    #[test]
    fn a_map_op_on_another_type_is_a_bin_type_error() {
        let mut rec = record();
        rec.set_bin("m", Particle::int(1));
        let r = apply(&mut rec, &op(4, vec![Mv::Int(PUT), s("a"), Mv::Int(1)]));
        assert_eq!(r, Err(rc::BIN_TYPE_ERROR));
    }
}
