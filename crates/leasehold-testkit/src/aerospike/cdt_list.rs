//! CDT list operations (operate op types 3 and 4 with a list op code, below 64).
//!
//! A list bin is stored as the server sends it: particle type 20, a msgpack array whose strings
//! carry their particle type as a leading byte (3 string, 4 blob). Only unordered lists are
//! modelled: a policy asking for an ordered list answers `PARAMETER_ERROR` (4).
//!
//! Served, with the server's op codes: `append` (1), `append_items` (2), `insert` (3),
//! `insert_items` (4) with the write flags add-unique (1), insert-bounded (2), no-fail (4) and
//! partial (8); `trim` (10); `clear` (11); `size` (16); `get` (17), `get_range` (18);
//! `get_by_index` (19) and `get_by_index_range` (24) with the return types none (0), count (5),
//! values (7), exists (13), each optionally inverted (`0x10000`, the unselected items). Appends and
//! inserts answer the list's new size, `size` its size, `get` the item, ranges a list.
//!
//! Indexes: a negative index counts from the end (-1 is the last item). A range keeps the part
//! inside the list (a range wholly outside is empty). An insert past the end pads the list with nils, unless insert-bounded is set
//! (`OP_NOT_APPLICABLE`). An add-unique write of a value already there answers `ELEMENT_EXISTS`
//! (24) unless no-fail is set (with partial, the other items are still written). Anything else
//! (contexts, other op codes, index/rank return types) answers `PARAMETER_ERROR`; a list op on a
//! bin of another type `BIN_TYPE_ERROR` (12).
//!
//! Guesses (not checked on a server, see the `aerospike_cdt_list` tests for the ones that are):
//! a single item out of bounds (`get`, `get_by_index`, an insert before the start) answers
//! `OP_NOT_APPLICABLE` (26); a read of a missing bin answers nil (`size` 0); `trim` and `clear` of a missing bin leave it
//! missing; `trim` answers the number of items it removed; a modify op that empties a list leaves
//! the empty list bin.

use std::cmp::Ordering;

use super::cdt_value::{decode_all, encode, to_particle, Mv, ELEMENT_EXISTS, PARTICLE_LIST};
use super::result_code as rc;
use super::store::Record;
use super::wire::{Op, Particle};

const APPEND: i64 = 1;
const APPEND_ITEMS: i64 = 2;
const INSERT: i64 = 3;
const INSERT_ITEMS: i64 = 4;
const TRIM: i64 = 10;
const CLEAR: i64 = 11;
const SIZE: i64 = 16;
const GET: i64 = 17;
const GET_RANGE: i64 = 18;
const GET_BY_INDEX: i64 = 19;
const GET_BY_INDEX_RANGE: i64 = 24;

/// Codes from here on only read the list.
const FIRST_READ: i64 = SIZE;

const RETURN_NONE: i64 = 0;
const RETURN_COUNT: i64 = 5;
const RETURN_VALUES: i64 = 7;
const RETURN_EXISTS: i64 = 13;
const RETURN_INVERTED: i64 = 0x10000;

const WRITE_ADD_UNIQUE: i64 = 1;
const WRITE_INSERT_BOUNDED: i64 = 2;
const WRITE_NO_FAIL: i64 = 4;
const WRITE_PARTIAL: i64 = 8;

/// The op's index is outside the list (or an insert-bounded insert past its end).
const OP_NOT_APPLICABLE: u8 = 26;

/// The longest list the fixture builds (an insert far past the end would pad without limit).
const MAX_ITEMS: usize = 1 << 20;

/// The op code of a CDT operation's payload, if it is a list op (codes 0-63).
fn list_op_code(args: &[Mv]) -> Option<i64> {
    match args.first() {
        Some(Mv::Int(code)) if (0..64).contains(code) => Some(*code),
        _ => None,
    }
}

/// Whether `op` (op type 3 or 4) carries a list operation. Maps use codes 64-127.
pub(crate) fn is_list_op(op: &Op) -> bool {
    match decode_all(&op.value) {
        Ok(Mv::Array(items)) => list_op_code(&items).is_some(),
        _ => false,
    }
}

/// The list in `record`'s bin `name`: `None` when the bin is missing.
fn load(record: &Record, name: &str) -> Result<Option<Vec<Mv>>, u8> {
    match record.bin(name) {
        None => Ok(None),
        Some(p) if p.ptype == PARTICLE_LIST => match decode_all(&p.data)? {
            Mv::Array(items) => Ok(Some(items)),
            _ => Err(rc::BIN_TYPE_ERROR),
        },
        Some(_) => Err(rc::BIN_TYPE_ERROR),
    }
}

fn store(record: &mut Record, name: &str, items: Vec<Mv>) {
    let mut data = Vec::new();
    encode(&Mv::Array(items), &mut data);
    record.set_bin(
        name,
        Particle {
            ptype: PARTICLE_LIST,
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

/// An optional trailing integer argument (a policy's order or flags): 0 when absent.
fn opt_int_arg(args: &[Mv], i: usize) -> Result<i64, u8> {
    match args.get(i) {
        None => Ok(0),
        Some(_) => int_arg(args, i),
    }
}

/// The items of a `*_items` argument.
fn items_arg(args: &[Mv], i: usize) -> Result<Vec<Mv>, u8> {
    match args.get(i) {
        Some(Mv::Array(items)) if !items.is_empty() => Ok(items.clone()),
        _ => Err(rc::PARAMETER_ERROR),
    }
}

/// The position of one item: a negative index counts from the end.
fn item_index(len: usize, index: i64) -> Result<usize, u8> {
    let len = i64::try_from(len).map_err(|_| rc::PARAMETER_ERROR)?;
    let resolved = if index < 0 { len + index } else { index };
    if (0..len).contains(&resolved) {
        Ok(resolved as usize)
    } else {
        Err(OP_NOT_APPLICABLE)
    }
}

/// The positions `[begin, end)` a range selects, clipped to the list; `count` absent: to the end.
fn range(len: usize, index: i64, count: Option<i64>) -> Result<(usize, usize), u8> {
    let n = i64::try_from(len).map_err(|_| rc::PARAMETER_ERROR)?;
    let start = if index < 0 { n + index } else { index };
    let end = match count {
        None => n,
        Some(c) if c < 0 => return Err(rc::PARAMETER_ERROR),
        Some(c) => start.saturating_add(c),
    };
    let clip = |i: i64| i.clamp(0, n) as usize;
    Ok((clip(start), clip(end.max(start))))
}

/// Adds `values` at `at` (the end for an append), under the write `flags`. Returns the new list,
/// or `None` when no-fail dropped the write.
fn add(
    mut items: Vec<Mv>,
    at: Option<i64>,
    values: Vec<Mv>,
    flags: i64,
) -> Result<Option<Vec<Mv>>, u8> {
    let mut values = values;
    if flags & WRITE_ADD_UNIQUE != 0 {
        let present = |v: &Mv| items.iter().any(|i| i.cmp(v) == Ordering::Equal);
        if values.iter().any(present) {
            if flags & WRITE_NO_FAIL == 0 {
                return Err(ELEMENT_EXISTS);
            }
            if flags & WRITE_PARTIAL == 0 {
                return Ok(None);
            }
            values.retain(|v| !present(v));
        }
    }
    let len = i64::try_from(items.len()).map_err(|_| rc::PARAMETER_ERROR)?;
    let position = match at {
        None => len,
        Some(index) if index < 0 && len + index < 0 => return Err(OP_NOT_APPLICABLE),
        Some(index) if index < 0 => len + index,
        Some(index) => index,
    };
    if position > len {
        if flags & WRITE_INSERT_BOUNDED != 0 {
            return if flags & WRITE_NO_FAIL != 0 {
                Ok(None)
            } else {
                Err(OP_NOT_APPLICABLE)
            };
        }
        let padded = usize::try_from(position).map_err(|_| rc::PARAMETER_ERROR)?;
        if padded + values.len() > MAX_ITEMS {
            return Err(rc::PARAMETER_ERROR);
        }
        items.resize(padded, Mv::Nil);
    }
    let position = position as usize;
    items.splice(position..position, values);
    Ok(Some(items))
}

/// The result of selecting `[begin, end)` (or its complement), as the return type asks.
fn selected(items: &[Mv], (begin, end): (usize, usize), return_type: i64) -> Result<Mv, u8> {
    let inverted = return_type & RETURN_INVERTED != 0;
    let picked: Vec<Mv> = items
        .iter()
        .enumerate()
        .filter(|(i, _)| (begin..end).contains(i) != inverted)
        .map(|(_, v)| v.clone())
        .collect();
    Ok(match return_type & !RETURN_INVERTED {
        RETURN_NONE => Mv::Nil,
        RETURN_COUNT => Mv::Int(picked.len() as i64),
        RETURN_EXISTS => Mv::Bool(!picked.is_empty()),
        RETURN_VALUES => Mv::Array(picked),
        _ => return Err(rc::PARAMETER_ERROR),
    })
}

/// Runs a list op on a list (`None`: the bin is missing). Returns the op's result and the list to
/// store, if the op modified it.
fn run(current: Option<Vec<Mv>>, args: &[Mv]) -> Result<(Mv, Option<Vec<Mv>>), u8> {
    let code = list_op_code(args).ok_or(rc::PARAMETER_ERROR)?;
    let existed = current.is_some();
    let items = current.unwrap_or_default();
    let len = items.len();
    let written = |list: Option<Vec<Mv>>, before: &[Mv]| {
        let size = list.as_ref().map_or(before.len(), Vec::len);
        (Mv::Int(size as i64), list)
    };
    match code {
        APPEND | APPEND_ITEMS => {
            let values = if code == APPEND {
                vec![args.get(1).cloned().ok_or(rc::PARAMETER_ERROR)?]
            } else {
                items_arg(args, 1)?
            };
            if opt_int_arg(args, 2)? != 0 {
                return Err(rc::PARAMETER_ERROR); // an ordered list: not modelled
            }
            let flags = opt_int_arg(args, 3)?;
            let before = items.clone();
            Ok(written(add(items, None, values, flags)?, &before))
        }
        INSERT | INSERT_ITEMS => {
            let index = int_arg(args, 1)?;
            let values = if code == INSERT {
                vec![args.get(2).cloned().ok_or(rc::PARAMETER_ERROR)?]
            } else {
                items_arg(args, 2)?
            };
            let flags = opt_int_arg(args, 3)?;
            let before = items.clone();
            Ok(written(add(items, Some(index), values, flags)?, &before))
        }
        TRIM => {
            let (begin, end) = range(len, int_arg(args, 1)?, Some(int_arg(args, 2)?))?;
            if !existed {
                return Ok((Mv::Int(0), None));
            }
            let kept = items[begin..end].to_vec();
            Ok((Mv::Int((len - kept.len()) as i64), Some(kept)))
        }
        CLEAR => Ok((Mv::Nil, existed.then(Vec::new))),
        SIZE => Ok((Mv::Int(len as i64), None)),
        GET | GET_BY_INDEX => {
            if !existed {
                return Ok((Mv::Nil, None));
            }
            let (return_type, index) = if code == GET {
                (RETURN_VALUES, int_arg(args, 1)?)
            } else {
                (int_arg(args, 1)?, int_arg(args, 2)?)
            };
            let at = item_index(len, index)?;
            let result = match selected(&items, (at, at + 1), return_type)? {
                // One item selected: the item itself, not a list of one.
                Mv::Array(mut one) if return_type & RETURN_INVERTED == 0 => {
                    one.pop().unwrap_or(Mv::Nil)
                }
                other => other,
            };
            Ok((result, None))
        }
        GET_RANGE | GET_BY_INDEX_RANGE => {
            if !existed {
                return Ok((Mv::Nil, None));
            }
            let (return_type, index, count) = if code == GET_RANGE {
                (RETURN_VALUES, int_arg(args, 1)?, args.get(2))
            } else {
                (int_arg(args, 1)?, int_arg(args, 2)?, args.get(3))
            };
            let count = match count {
                None => None,
                Some(Mv::Int(c)) => Some(*c),
                Some(_) => return Err(rc::PARAMETER_ERROR),
            };
            let result = selected(&items, range(len, index, count)?, return_type)?;
            Ok((result, None))
        }
        _ => Err(rc::PARAMETER_ERROR),
    }
}

fn op_args(op: &Op) -> Result<Vec<Mv>, u8> {
    if op.name.is_empty() || op.name.len() > 15 {
        return Err(rc::PARAMETER_ERROR);
    }
    match decode_all(&op.value)? {
        Mv::Array(items) if list_op_code(&items).is_some() => Ok(items),
        // Contexts (`[0xff, [ctx...], [op...]]`) are not served.
        _ => Err(rc::PARAMETER_ERROR),
    }
}

/// Applies a list op (from an operate) to `record`; the result goes in the reply.
pub(crate) fn apply(record: &mut Record, op: &Op) -> Result<Option<Particle>, u8> {
    let args = op_args(op)?;
    let (result, updated) = run(load(record, &op.name)?, &args)?;
    if let Some(items) = updated {
        store(record, &op.name, items);
    }
    Ok(to_particle(&result))
}

/// A list read op in a read-only operate: nothing is stored, and a modify op is refused.
pub(crate) fn read(record: &Record, op: &Op) -> Result<Option<Particle>, u8> {
    let args = op_args(op)?;
    if list_op_code(&args).unwrap_or_default() < FIRST_READ {
        return Err(rc::PARAMETER_ERROR);
    }
    let (result, _) = run(load(record, &op.name)?, &args)?;
    Ok(to_particle(&result))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aerospike::cdt_value::test_support::{cdt_op, record, s};

    fn op(op_type: u8, args: Vec<Mv>) -> Op {
        cdt_op("l", op_type, args)
    }

    fn list(rec: &Record) -> Vec<Mv> {
        load(rec, "l").unwrap().unwrap_or_default()
    }

    fn int(p: Result<Option<Particle>, u8>) -> Option<i64> {
        p.unwrap().and_then(|p| p.as_i64())
    }

    #[test]
    fn insert_at_the_front_and_trim_keep_the_newest() {
        let mut rec = record();
        for (n, text) in ["a", "b", "c", "d"].into_iter().enumerate() {
            let size = apply(
                &mut rec,
                &op(4, vec![Mv::Int(INSERT), Mv::Int(0), s(text), Mv::Int(0)]),
            );
            assert_eq!(int(size), Some(n as i64 + 1));
        }
        let removed = apply(
            &mut rec,
            &op(4, vec![Mv::Int(TRIM), Mv::Int(0), Mv::Int(3)]),
        );
        assert_eq!(int(removed), Some(1));
        assert_eq!(list(&rec), vec![s("d"), s("c"), s("b")]);
        let size = read(&rec, &op(3, vec![Mv::Int(SIZE)]));
        assert_eq!(int(size), Some(3));
    }

    #[test]
    fn ranges_clip_and_single_items_are_bounds_checked() {
        let mut rec = record();
        let items = Mv::Array((1..=5).map(Mv::Int).collect());
        apply(&mut rec, &op(4, vec![Mv::Int(APPEND_ITEMS), items])).unwrap();
        let range = |args: Vec<Mv>| {
            let p = read(&rec, &op(3, args)).unwrap().expect("a list");
            decode_all(&p.data).unwrap()
        };
        let values = Mv::Int(RETURN_VALUES);
        assert_eq!(
            range(vec![
                Mv::Int(GET_BY_INDEX_RANGE),
                values.clone(),
                Mv::Int(-2)
            ]),
            Mv::Array(vec![Mv::Int(4), Mv::Int(5)])
        );
        assert_eq!(
            range(vec![
                Mv::Int(GET_BY_INDEX_RANGE),
                values,
                Mv::Int(3),
                Mv::Int(10)
            ]),
            Mv::Array(vec![Mv::Int(4), Mv::Int(5)]),
            "partly outside: the part inside"
        );
        let count = read(
            &rec,
            &op(
                3,
                vec![
                    Mv::Int(GET_BY_INDEX_RANGE),
                    Mv::Int(RETURN_COUNT | RETURN_INVERTED),
                    Mv::Int(0),
                    Mv::Int(2),
                ],
            ),
        );
        assert_eq!(int(count), Some(3));
        assert_eq!(
            int(read(&rec, &op(3, vec![Mv::Int(GET), Mv::Int(-1)]))),
            Some(5)
        );
        assert_eq!(
            read(&rec, &op(3, vec![Mv::Int(GET), Mv::Int(5)])),
            Err(OP_NOT_APPLICABLE)
        );
        assert_eq!(
            read(&rec, &op(3, vec![Mv::Int(APPEND), Mv::Int(1)])),
            Err(rc::PARAMETER_ERROR),
            "no writes in a read"
        );
    }

    #[test]
    fn write_flags_pad_bound_and_keep_unique() {
        let mut rec = record();
        apply(&mut rec, &op(4, vec![Mv::Int(APPEND), s("x")])).unwrap();
        let bounded = op(
            4,
            vec![
                Mv::Int(INSERT),
                Mv::Int(3),
                s("y"),
                Mv::Int(WRITE_INSERT_BOUNDED),
            ],
        );
        assert_eq!(apply(&mut rec, &bounded), Err(OP_NOT_APPLICABLE));
        let padded = apply(&mut rec, &op(4, vec![Mv::Int(INSERT), Mv::Int(3), s("y")]));
        assert_eq!(int(padded), Some(4));
        assert_eq!(list(&rec), vec![s("x"), Mv::Nil, Mv::Nil, s("y")]);
        let unique = |flags| op(4, vec![Mv::Int(APPEND), s("x"), Mv::Int(0), Mv::Int(flags)]);
        assert_eq!(
            apply(&mut rec, &unique(WRITE_ADD_UNIQUE)),
            Err(ELEMENT_EXISTS)
        );
        let size = apply(&mut rec, &unique(WRITE_ADD_UNIQUE | WRITE_NO_FAIL));
        assert_eq!(int(size), Some(4), "dropped, not failed");
        apply(&mut rec, &op(4, vec![Mv::Int(CLEAR)])).unwrap();
        assert_eq!(list(&rec), Vec::<Mv>::new(), "the empty list stays");
        let ordered = op(4, vec![Mv::Int(APPEND), s("x"), Mv::Int(1), Mv::Int(0)]);
        assert_eq!(apply(&mut rec, &ordered), Err(rc::PARAMETER_ERROR));
    }

    #[test]
    fn a_list_op_on_another_type_is_a_bin_type_error_and_garbage_is_refused() {
        let mut rec = record();
        rec.set_bin("l", Particle::int(1));
        let r = apply(&mut rec, &op(4, vec![Mv::Int(APPEND), s("a")]));
        assert_eq!(r, Err(rc::BIN_TYPE_ERROR));
        let mut garbage = op(4, vec![]);
        garbage.value = vec![0x92, 0x01]; // an array of two with one item
        assert_eq!(apply(&mut record(), &garbage), Err(rc::PARAMETER_ERROR));
        let missing = read(&record(), &op(3, vec![Mv::Int(SIZE)]));
        assert_eq!(int(missing), Some(0));
    }
}
