//! Filter expressions (field 43): a msgpack-encoded expression tree, evaluated on a record.
//!
//! The client packs an expression as a msgpack array `[op, args...]`; literals are msgpack
//! values, with strings and blobs carrying a leading particle-type byte (3 string, 4 blob) and bin
//! names packed raw. Supported: `eq ne gt ge lt le` (1-6), `and or not` (16-18), integer and
//! float arithmetic `add sub mul div` (20-23) and `min max` (50, 51), `cond` (123), `bin` (81),
//! `bin_type` (82), `key_exists` (71), `set_name` (70), `ttl` (69), `last_update` (66: the
//! record's last-update time in nanoseconds since 1970, from its millisecond value),
//! `since_update` (67: milliseconds from the record's last-update time to now on the wall clock,
//! 0 if the clock is behind it), map reads (`call`, 127: see [`cdt_map`](super::cdt_map)), and
//! integer, float, string, blob, boolean and nil literals. A bin that is missing or of another
//! type than the expression asks for is *unknown*; a comparison or arithmetic with an unknown is
//! unknown, as is an integer division by zero and a `cond` whose reached condition is unknown;
//! and a filter that does not evaluate to `true` filters the record out (as the server does).
//! Anything else is a [`ExpError`], answered with `PARAMETER_ERROR`.
//!
//! The same expressions compute the values of expression operations ([`ExpOp`]: `write_exp`
//! and `read_exp`), evaluated on the record as the operation's earlier operations left it, with
//! the record's metadata as it was before the write (a record being created has last-update
//! time 0, as in the server's fresh index entry).

use thiserror::Error;
use tokio::time::Instant;

use super::cdt_map;
use super::cdt_value::Mv;
use super::store::{clepoch_now_ms, Record, CITRUSLEAF_EPOCH_UNIX_SECS};
use super::wire::{
    Particle, Reader, WireError, PARTICLE_BLOB, PARTICLE_BOOL, PARTICLE_FLOAT, PARTICLE_INTEGER,
    PARTICLE_STRING,
};

/// Why an expression could not be evaluated.
#[derive(Debug, Error, PartialEq, Eq)]
pub(crate) enum ExpError {
    /// The msgpack is malformed.
    #[error("malformed expression: {0}")]
    Wire(#[from] WireError),
    /// A msgpack type the fixture does not read (maps, extensions).
    #[error("unsupported msgpack marker 0x{0:02x}")]
    Marker(u8),
    /// An expression op the fixture does not implement.
    #[error("unsupported expression op {0}")]
    Op(i64),
    /// An op with the wrong number or kind of arguments.
    #[error("malformed arguments for expression op {0}")]
    Args(i64),
    /// Nesting deeper than the fixture follows.
    #[error("expression nested too deeply")]
    Depth,
}

/// A decoded msgpack value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mp {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Vec<u8>),
    Bin(Vec<u8>),
    Array(Vec<Mp>),
}

const MAX_DEPTH: usize = 64;

fn decode(r: &mut Reader<'_>, depth: usize) -> Result<Mp, ExpError> {
    if depth > MAX_DEPTH {
        return Err(ExpError::Depth);
    }
    let m = r.u8("msgpack")?;
    let be = |b: &[u8]| b.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x));
    Ok(match m {
        0x00..=0x7f => Mp::Int(i64::from(m)),
        0xe0..=0xff => Mp::Int(i64::from(m as i8)),
        0x90..=0x9f => array(r, usize::from(m & 0x0f), depth)?,
        0xdc => {
            let n = r.u16("msgpack")?;
            array(r, usize::from(n), depth)?
        }
        0xdd => {
            let n = r.u32("msgpack")?;
            array(r, n as usize, depth)?
        }
        0xa0..=0xbf => Mp::Str(r.bytes(usize::from(m & 0x1f), "msgpack")?.to_vec()),
        0xd9 | 0xc4 => {
            let n = usize::from(r.u8("msgpack")?);
            str_or_bin(m == 0xd9, r.bytes(n, "msgpack")?)
        }
        0xda | 0xc5 => {
            let n = usize::from(r.u16("msgpack")?);
            str_or_bin(m == 0xda, r.bytes(n, "msgpack")?)
        }
        0xdb | 0xc6 => {
            let n = r.u32("msgpack")? as usize;
            str_or_bin(m == 0xdb, r.bytes(n, "msgpack")?)
        }
        0xc0 => Mp::Nil,
        0xc2 => Mp::Bool(false),
        0xc3 => Mp::Bool(true),
        0xcc => Mp::Int(be(r.bytes(1, "msgpack")?) as i64),
        0xcd => Mp::Int(be(r.bytes(2, "msgpack")?) as i64),
        0xce => Mp::Int(be(r.bytes(4, "msgpack")?) as i64),
        // u64 above i64::MAX wraps, as the client's own integers are i64.
        0xcf => Mp::Int(be(r.bytes(8, "msgpack")?) as i64),
        0xd0 => Mp::Int(i64::from(r.u8("msgpack")? as i8)),
        0xd1 => Mp::Int(i64::from(r.u16("msgpack")? as i16)),
        0xd2 => Mp::Int(i64::from(r.u32("msgpack")? as i32)),
        0xd3 => Mp::Int(be(r.bytes(8, "msgpack")?) as i64),
        0xca => Mp::Float(f64::from(f32::from_bits(r.u32("msgpack")?))),
        0xcb => Mp::Float(f64::from_bits(be(r.bytes(8, "msgpack")?))),
        other => return Err(ExpError::Marker(other)),
    })
}

fn array(r: &mut Reader<'_>, n: usize, depth: usize) -> Result<Mp, ExpError> {
    // Every element takes at least one byte: bound the allocation by what is left.
    let mut items = Vec::with_capacity(n.min(r.remaining()));
    for _ in 0..n {
        items.push(decode(r, depth + 1)?);
    }
    Ok(Mp::Array(items))
}

fn str_or_bin(is_str: bool, bytes: &[u8]) -> Mp {
    if is_str {
        Mp::Str(bytes.to_vec())
    } else {
        Mp::Bin(bytes.to_vec())
    }
}

/// An evaluated value; `Unknown` is the server's "unknown" (missing bin, wrong type).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Unknown,
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Vec<u8>),
    Blob(Vec<u8>),
}

/// A parsed filter expression.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Filter(Mp);

impl Filter {
    /// Parses the field-43 payload.
    pub(crate) fn parse(bytes: &[u8]) -> Result<Filter, ExpError> {
        let mut r = Reader::new(bytes);
        let root = decode(&mut r, 0)?;
        if r.remaining() != 0 {
            return Err(ExpError::Wire(WireError::Trailing(r.remaining())));
        }
        Ok(Filter(root))
    }

    /// Whether `record` passes the filter.
    pub(crate) fn matches(&self, record: &Record, now: Instant) -> Result<bool, ExpError> {
        Ok(eval(&self.0, record, now)? == Val::Bool(true))
    }
}

/// An expression operation's payload (`write_exp` / `read_exp`): the msgpack array
/// `[expression, flags]`.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExpOp {
    exp: Mp,
    /// The operation's flags (`ExpWriteFlags` / `ExpReadFlags` bits).
    pub(crate) flags: i64,
}

impl ExpOp {
    /// Parses an expression operation's value.
    pub(crate) fn parse(bytes: &[u8]) -> Result<ExpOp, ExpError> {
        let mut r = Reader::new(bytes);
        let root = decode(&mut r, 0)?;
        if r.remaining() != 0 {
            return Err(ExpError::Wire(WireError::Trailing(r.remaining())));
        }
        match root {
            Mp::Array(mut items) if items.len() == 2 => {
                let Mp::Int(flags) = items[1] else {
                    return Err(ExpError::Args(0));
                };
                Ok(ExpOp {
                    exp: items.swap_remove(0),
                    flags,
                })
            }
            _ => Err(ExpError::Args(0)),
        }
    }

    /// The expression's value on `record`.
    pub(crate) fn value(&self, record: &Record, now: Instant) -> Result<Val, ExpError> {
        eval(&self.exp, record, now)
    }
}

fn literal(m: &Mp) -> Val {
    match m {
        Mp::Nil => Val::Nil,
        Mp::Bool(b) => Val::Bool(*b),
        Mp::Int(i) => Val::Int(*i),
        Mp::Float(f) => Val::Float(*f),
        Mp::Str(s) => match s.split_first() {
            Some((&PARTICLE_STRING, rest)) => Val::Str(rest.to_vec()),
            Some((&PARTICLE_BLOB, rest)) => Val::Blob(rest.to_vec()),
            _ => Val::Str(s.clone()),
        },
        Mp::Bin(b) => Val::Blob(b.clone()),
        Mp::Array(_) => Val::Unknown,
    }
}

fn particle_val(p: &Particle) -> Val {
    match p.ptype {
        PARTICLE_INTEGER => p.as_i64().map_or(Val::Unknown, Val::Int),
        PARTICLE_FLOAT => <[u8; 8]>::try_from(p.data.as_slice())
            .map_or(Val::Unknown, |b| Val::Float(f64::from_be_bytes(b))),
        PARTICLE_STRING => Val::Str(p.data.clone()),
        PARTICLE_BLOB => Val::Blob(p.data.clone()),
        PARTICLE_BOOL => Val::Bool(p.data.first().is_some_and(|b| *b != 0)),
        _ => Val::Unknown,
    }
}

/// The particle type an expression type (`ExpType`) reads.
fn particle_for_exp_type(exp_type: i64) -> Option<u8> {
    match exp_type {
        1 => Some(PARTICLE_BOOL),
        2 => Some(PARTICLE_INTEGER),
        3 => Some(PARTICLE_STRING),
        6 => Some(PARTICLE_BLOB),
        7 => Some(PARTICLE_FLOAT),
        _ => None,
    }
}

fn raw_name(m: &Mp) -> Option<String> {
    match m {
        Mp::Str(s) => String::from_utf8(s.clone()).ok(),
        _ => None,
    }
}

fn eval(m: &Mp, record: &Record, now: Instant) -> Result<Val, ExpError> {
    let items = match m {
        Mp::Array(items) => items,
        other => return Ok(literal(other)),
    };
    let (op, args) = match items.split_first() {
        Some((Mp::Int(op), args)) => (*op, args),
        _ => return Ok(Val::Unknown),
    };
    match op {
        1..=6 => {
            let [l, r] = args else {
                return Err(ExpError::Args(op));
            };
            let (l, r) = (eval(l, record, now)?, eval(r, record, now)?);
            Ok(compare(op, &l, &r))
        }
        16 | 17 => {
            // and / or: false (true) wins over unknown, as a three-valued logic.
            let mut saw_unknown = false;
            for a in args {
                match eval(a, record, now)? {
                    Val::Bool(b) if b == (op == 17) => return Ok(Val::Bool(b)),
                    Val::Bool(_) => {}
                    _ => saw_unknown = true,
                }
            }
            Ok(if saw_unknown {
                Val::Unknown
            } else {
                Val::Bool(op == 16)
            })
        }
        18 => {
            let [a] = args else {
                return Err(ExpError::Args(op));
            };
            Ok(match eval(a, record, now)? {
                Val::Bool(b) => Val::Bool(!b),
                _ => Val::Unknown,
            })
        }
        81 => {
            let [Mp::Int(exp_type), name] = args else {
                return Err(ExpError::Args(op));
            };
            let name = raw_name(name).ok_or(ExpError::Args(op))?;
            let want = particle_for_exp_type(*exp_type).ok_or(ExpError::Args(op))?;
            Ok(match record.bin(&name) {
                Some(p) if p.ptype == want => particle_val(p),
                _ => Val::Unknown,
            })
        }
        82 => {
            let [name] = args else {
                return Err(ExpError::Args(op));
            };
            let name = raw_name(name).ok_or(ExpError::Args(op))?;
            Ok(Val::Int(
                record.bin(&name).map_or(0, |p| i64::from(p.ptype)),
            ))
        }
        20..=23 | 50 | 51 => {
            if args.is_empty() || (op == 23 && args.len() < 2) {
                return Err(ExpError::Args(op));
            }
            let mut values = Vec::with_capacity(args.len());
            for a in args {
                values.push(eval(a, record, now)?);
            }
            Ok(arithmetic(op, &values))
        }
        123 => {
            // cond: condition, value pairs, then the default value.
            if args.len() < 3 || args.len() % 2 == 0 {
                return Err(ExpError::Args(op));
            }
            for pair in args[..args.len() - 1].chunks_exact(2) {
                match eval(&pair[0], record, now)? {
                    Val::Bool(true) => return eval(&pair[1], record, now),
                    Val::Bool(false) => {}
                    _ => return Ok(Val::Unknown),
                }
            }
            eval(&args[args.len() - 1], record, now)
        }
        66 => {
            let unix_ms = CITRUSLEAF_EPOCH_UNIX_SECS * 1000 + record.last_update_ms;
            Ok(Val::Int(
                i64::try_from(unix_ms.saturating_mul(1_000_000)).unwrap_or(i64::MAX),
            ))
        }
        67 => {
            let now_ms = clepoch_now_ms();
            let since = now_ms.saturating_sub(record.last_update_ms);
            Ok(Val::Int(i64::try_from(since).unwrap_or(i64::MAX)))
        }
        127 if is_map_call(args) => eval_map_call(args, record),
        71 => Ok(Val::Bool(record.user_key.is_some())),
        70 => Ok(Val::Str(record.set.as_bytes().to_vec())),
        69 => {
            Ok(Val::Int(record.expiry.remaining(now).map_or(-1, |d| {
                i64::try_from(d.as_secs()).unwrap_or(i64::MAX)
            })))
        }
        other => Err(ExpError::Op(other)),
    }
}

/// `add sub mul div min max` over evaluated arguments: all integers or all floats, else
/// unknown; integers wrap on overflow, and an integer division by zero is unknown.
fn arithmetic(op: i64, values: &[Val]) -> Val {
    if let Some(ints) = values
        .iter()
        .map(|v| match v {
            Val::Int(i) => Some(*i),
            _ => None,
        })
        .collect::<Option<Vec<i64>>>()
    {
        let mut acc = ints[0];
        for &x in &ints[1..] {
            acc = match op {
                20 => acc.wrapping_add(x),
                21 => acc.wrapping_sub(x),
                22 => acc.wrapping_mul(x),
                23 if x == 0 => return Val::Unknown,
                23 => acc.wrapping_div(x),
                50 => acc.min(x),
                _ => acc.max(x),
            };
        }
        // A lone argument: `sub` negates it, `div` needs two (checked by the caller).
        if op == 21 && ints.len() == 1 {
            acc = acc.wrapping_neg();
        }
        return Val::Int(acc);
    }
    if let Some(floats) = values
        .iter()
        .map(|v| match v {
            Val::Float(f) => Some(*f),
            _ => None,
        })
        .collect::<Option<Vec<f64>>>()
    {
        let mut acc = floats[0];
        for &x in &floats[1..] {
            acc = match op {
                20 => acc + x,
                21 => acc - x,
                22 => acc * x,
                23 => acc / x,
                50 => acc.min(x),
                _ => acc.max(x),
            };
        }
        if op == 21 && floats.len() == 1 {
            acc = -acc;
        }
        return Val::Float(acc);
    }
    Val::Unknown
}

fn compare(op: i64, l: &Val, r: &Val) -> Val {
    use std::cmp::Ordering;
    let ord: Option<Ordering> = match (l, r) {
        (Val::Int(a), Val::Int(b)) => Some(a.cmp(b)),
        (Val::Float(a), Val::Float(b)) => a.partial_cmp(b),
        (Val::Str(a), Val::Str(b)) | (Val::Blob(a), Val::Blob(b)) => Some(a.cmp(b)),
        (Val::Bool(a), Val::Bool(b)) => Some(a.cmp(b)),
        (Val::Nil, Val::Nil) => Some(Ordering::Equal),
        _ => None,
    };
    let Some(ord) = ord else {
        return Val::Unknown;
    };
    Val::Bool(match op {
        1 => ord == Ordering::Equal,
        2 => ord != Ordering::Equal,
        3 => ord == Ordering::Greater,
        4 => ord != Ordering::Less,
        5 => ord == Ordering::Less,
        _ => ord != Ordering::Greater,
    })
}

/// A decoded msgpack value as a CDT value (what a map op reads its arguments as).
fn from_mp(m: &Mp) -> Mv {
    match m {
        Mp::Nil => Mv::Nil,
        Mp::Bool(b) => Mv::Bool(*b),
        Mp::Int(i) => Mv::Int(*i),
        Mp::Float(f) => Mv::Float(*f),
        Mp::Str(s) => Mv::Str(s.clone()),
        Mp::Bin(b) => Mv::Bin(b.clone()),
        Mp::Array(items) => Mv::Array(items.iter().map(from_mp).collect()),
    }
}

/// Expression type of a map (`ExpType::MAP`), as a `bin` expression names it.
const EXP_TYPE_MAP: i64 = 5;
/// Expression type of an integer.
const EXP_TYPE_INT: i64 = 2;

/// Whether a `call` expression's arguments are a map read (module flags 0, a map op code).
fn is_map_call(args: &[Mp]) -> bool {
    matches!(args, [_, Mp::Int(0), Mp::Array(op), _] if matches!(op.first(), Some(Mp::Int(c)) if (64..128).contains(c)))
}

/// Evaluates a map read `call` in an expression: `[type, flags, [op, args...], bin]` where `bin`
/// is `[81, 5, name]`. A missing bin or one of another type is unknown, as is a single result
/// whose type is not the one the expression declares.
fn eval_map_call(args: &[Mp], record: &Record) -> Result<Val, ExpError> {
    let [Mp::Int(exp_type), Mp::Int(0), Mp::Array(op), bin] = args else {
        return Err(ExpError::Args(127));
    };
    let name = match bin {
        Mp::Array(b) => match b.as_slice() {
            [Mp::Int(81), Mp::Int(EXP_TYPE_MAP), Mp::Str(name)] => {
                String::from_utf8(name.clone()).map_err(|_| ExpError::Args(127))?
            }
            _ => return Err(ExpError::Args(127)),
        },
        _ => return Err(ExpError::Args(127)),
    };
    let args: Vec<Mv> = op.iter().map(from_mp).collect();
    if !cdt_map::is_read_op(&args) {
        return Err(ExpError::Op(127));
    }
    let Some(result) = cdt_map::read_bin(record, &name, &args) else {
        return Ok(Val::Unknown);
    };
    let result = result.map_err(|_| ExpError::Args(127))?;
    Ok(match (result, *exp_type) {
        (Mv::Int(i), EXP_TYPE_INT) => Val::Int(i),
        (Mv::Int(_), _) | (_, EXP_TYPE_INT) => Val::Unknown,
        (Mv::Bool(b), _) => Val::Bool(b),
        (Mv::Float(f), _) => Val::Float(f),
        (Mv::Str(s), _) => match s.split_first() {
            Some((&PARTICLE_STRING, rest)) => Val::Str(rest.to_vec()),
            Some((&PARTICLE_BLOB, rest)) => Val::Blob(rest.to_vec()),
            _ => Val::Unknown,
        },
        (Mv::Nil, _) => Val::Nil,
        _ => Val::Unknown,
    })
}

#[cfg(test)]
mod tests {
    use super::super::store::Expiry;
    use super::*;

    fn record() -> Record {
        Record {
            set: "s".into(),
            user_key: None,
            bins: vec![
                (
                    "owner".into(),
                    Particle {
                        ptype: PARTICLE_STRING,
                        data: b"me".to_vec(),
                    },
                ),
                ("n".into(), Particle::int(5)),
            ],
            generation: 1,
            expiry: Expiry::Never,
            last_update_ms: 1,
        }
    }

    // [1, [81, 3, "owner"], "\x03me"]
    const OWNER_IS_ME: &[u8] = &[
        0x93, 0x01, 0x93, 0x51, 0x03, 0xa5, b'o', b'w', b'n', b'e', b'r', 0xa3, 0x03, b'm', b'e',
    ];

    #[test]
    fn string_equality() {
        let f = Filter::parse(OWNER_IS_ME).unwrap();
        assert!(f.matches(&record(), Instant::now()).unwrap());
        let mut other = record();
        other.bins[0].1.data = b"you".to_vec();
        assert!(!f.matches(&other, Instant::now()).unwrap());
        other.bins.remove(0);
        assert!(!f.matches(&other, Instant::now()).unwrap());
    }

    #[test]
    fn logic_and_ints() {
        // [16, [1, [81, 2, "n"], 5], [18, [1, [81, 2, "n"], 6]]]
        let bytes = [
            0x93, 0x10, 0x93, 0x01, 0x93, 0x51, 0x02, 0xa1, b'n', 0x05, 0x92, 0x12, 0x93, 0x01,
            0x93, 0x51, 0x02, 0xa1, b'n', 0x06,
        ];
        let f = Filter::parse(&bytes).unwrap();
        assert!(f.matches(&record(), Instant::now()).unwrap());
    }

    #[test]
    fn malformed_input_is_an_error() {
        assert!(Filter::parse(&OWNER_IS_ME[..5]).is_err());
        assert!(Filter::parse(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
        assert_eq!(
            Filter::parse(&[0x91, 0x7f])
                .unwrap()
                .matches(&record(), Instant::now()),
            Err(ExpError::Op(127))
        );
        let mut deep = vec![0x91; 100];
        deep.push(0x01);
        assert_eq!(Filter::parse(&deep), Err(ExpError::Depth));
    }

    fn call(op: i64, args: Vec<Mp>) -> Mp {
        let mut items = vec![Mp::Int(op)];
        items.extend(args);
        Mp::Array(items)
    }

    fn int_bin(name: &str) -> Mp {
        call(81, vec![Mp::Int(2), Mp::Str(name.as_bytes().to_vec())])
    }

    fn value(m: &Mp, record: &Record) -> Val {
        eval(m, record, Instant::now()).unwrap()
    }

    #[test]
    fn arithmetic_cond_and_unknowns() {
        let r = record();
        let n_plus_one = call(20, vec![int_bin("n"), Mp::Int(1)]);
        assert_eq!(value(&n_plus_one, &r), Val::Int(6));
        assert_eq!(value(&call(21, vec![Mp::Int(7)]), &r), Val::Int(-7));
        assert_eq!(
            value(&call(23, vec![Mp::Int(7), Mp::Int(2)]), &r),
            Val::Int(3)
        );
        assert_eq!(
            value(&call(23, vec![Mp::Int(7), Mp::Int(0)]), &r),
            Val::Unknown
        );
        assert_eq!(
            value(&call(22, vec![int_bin("missing"), Mp::Int(2)]), &r),
            Val::Unknown
        );
        assert_eq!(
            value(&call(51, vec![Mp::Int(3), int_bin("n")]), &r),
            Val::Int(5)
        );
        // cond: the first true condition's value, else the default; an unknown condition
        // makes the whole unknown.
        let n_is = |v| call(1, vec![int_bin("n"), Mp::Int(v)]);
        let pick = |c: Mp| call(123, vec![c, Mp::Int(10), Mp::Int(20)]);
        assert_eq!(value(&pick(n_is(5)), &r), Val::Int(10));
        assert_eq!(value(&pick(n_is(4)), &r), Val::Int(20));
        let unknown = call(1, vec![int_bin("missing"), Mp::Int(1)]);
        assert_eq!(value(&pick(unknown), &r), Val::Unknown);
        assert_eq!(
            eval(&call(123, vec![Mp::Int(1), Mp::Int(2)]), &r, Instant::now()),
            Err(ExpError::Args(123))
        );
    }

    #[test]
    fn last_update_plus_since_update_is_the_clock_for_new_and_old_records() {
        // last_update / 1000 + since_update * 1000: microseconds since 1970.
        let clock = call(
            20,
            vec![
                call(23, vec![call(66, vec![]), Mp::Int(1_000)]),
                call(22, vec![call(67, vec![]), Mp::Int(1_000)]),
            ],
        );
        let fresh = Record {
            last_update_ms: 0,
            ..record()
        };
        let written = Record {
            last_update_ms: clepoch_now_ms() - 5_000,
            ..record()
        };
        let ahead = Record {
            last_update_ms: clepoch_now_ms() + 60_000,
            ..record()
        };
        let before = (CITRUSLEAF_EPOCH_UNIX_SECS * 1000 + clepoch_now_ms()) as i64 * 1_000;
        let (Val::Int(a), Val::Int(b), Val::Int(c)) = (
            value(&clock, &fresh),
            value(&clock, &written),
            value(&clock, &ahead),
        ) else {
            panic!("integers");
        };
        let after = (CITRUSLEAF_EPOCH_UNIX_SECS * 1000 + clepoch_now_ms()) as i64 * 1_000;
        assert!((before..=after).contains(&a), "{before} <= {a} <= {after}");
        assert!((before..=after).contains(&b), "{before} <= {b} <= {after}");
        // A last update ahead of the clock: since_update is 0, the sum is that time.
        assert_eq!(
            c,
            (CITRUSLEAF_EPOCH_UNIX_SECS * 1000 + ahead.last_update_ms) as i64 * 1_000
        );
    }
}
