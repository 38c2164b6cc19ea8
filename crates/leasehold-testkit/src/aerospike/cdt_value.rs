//! Values inside CDTs (map and list bins, and their operations' arguments): msgpack decoding
//! (bounds-checked, depth-limited) and encoding, the server's CDT value order, and how a CDT
//! result travels back in a reply bin. Shared by [`cdt_map`](super::cdt_map) and
//! [`cdt_list`](super::cdt_list).
//!
//! Strings inside a CDT keep the particle-type byte the client prefixes them with (3 string,
//! 4 blob), as the server stores them.

use std::cmp::Ordering;

use super::result_code as rc;
use super::wire::{
    Particle, Reader, PARTICLE_BLOB, PARTICLE_BOOL, PARTICLE_FLOAT, PARTICLE_STRING,
};

/// Particle type of a map bin.
pub(crate) const PARTICLE_MAP: u8 = 19;
/// Particle type of a list bin (and of what multi-item reads answer).
pub(crate) const PARTICLE_LIST: u8 = 20;

/// A write's element exists and the write flags forbid it (map create-only, list add-unique).
pub(crate) const ELEMENT_EXISTS: u8 = 24;
/// A put's key is missing and the write flags forbid creating it.
pub(crate) const ELEMENT_NOT_FOUND: u8 = 23;

/// How deep nested lists and maps may go before a value is refused.
const MAX_DEPTH: usize = 32;

/// A msgpack value as a CDT holds it. Strings keep their particle-type byte.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Mv {
    Nil,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(Vec<u8>),
    Bin(Vec<u8>),
    Array(Vec<Mv>),
    Map(Vec<(Mv, Mv)>),
    Ext(i8, Vec<u8>),
}

impl Mv {
    /// Rank of the value's type in the server's CDT order.
    fn rank(&self) -> u8 {
        match self {
            Mv::Nil => 0,
            Mv::Bool(_) => 1,
            Mv::Int(_) => 2,
            Mv::Str(s) if s.first() == Some(&PARTICLE_BLOB) => 6,
            Mv::Str(_) => 3,
            Mv::Array(_) => 4,
            Mv::Map(_) => 5,
            Mv::Bin(_) => 6,
            Mv::Float(_) => 7,
            Mv::Ext(..) => 8,
        }
    }

    pub(crate) fn cmp(&self, other: &Mv) -> Ordering {
        match (self, other) {
            (Mv::Bool(a), Mv::Bool(b)) => a.cmp(b),
            (Mv::Int(a), Mv::Int(b)) => a.cmp(b),
            (Mv::Float(a), Mv::Float(b)) => a.total_cmp(b),
            (Mv::Str(a), Mv::Str(b)) | (Mv::Bin(a), Mv::Bin(b)) => a.cmp(b),
            (Mv::Array(a), Mv::Array(b)) => cmp_seq(a.iter(), b.iter()),
            (a, b) if a.rank() != b.rank() => a.rank().cmp(&b.rank()),
            _ => Ordering::Equal,
        }
    }
}

fn cmp_seq<'a>(a: impl Iterator<Item = &'a Mv>, b: impl Iterator<Item = &'a Mv>) -> Ordering {
    let (a, b): (Vec<_>, Vec<_>) = (a.collect(), b.collect());
    for (x, y) in a.iter().zip(&b) {
        match x.cmp(y) {
            Ordering::Equal => {}
            other => return other,
        }
    }
    a.len().cmp(&b.len())
}

fn take(r: &mut Reader<'_>, n: usize) -> Result<Vec<u8>, u8> {
    r.bytes(n, "msgpack")
        .map(<[u8]>::to_vec)
        .map_err(|_| rc::PARAMETER_ERROR)
}

fn decode(r: &mut Reader<'_>, depth: usize) -> Result<Mv, u8> {
    if depth > MAX_DEPTH {
        return Err(rc::PARAMETER_ERROR);
    }
    let m = take(r, 1)?[0];
    let be = |b: &[u8]| b.iter().fold(0u64, |acc, x| (acc << 8) | u64::from(*x));
    let len_of = |b: Vec<u8>| be(&b) as usize;
    Ok(match m {
        0x00..=0x7f => Mv::Int(i64::from(m)),
        0xe0..=0xff => Mv::Int(i64::from(m as i8)),
        0xc0 => Mv::Nil,
        0xc2 => Mv::Bool(false),
        0xc3 => Mv::Bool(true),
        0xcc => Mv::Int(be(&take(r, 1)?) as i64),
        0xcd => Mv::Int(be(&take(r, 2)?) as i64),
        0xce => Mv::Int(be(&take(r, 4)?) as i64),
        0xcf => Mv::Int(be(&take(r, 8)?) as i64),
        0xd0 => Mv::Int(i64::from(take(r, 1)?[0] as i8)),
        0xd1 => Mv::Int(i64::from(be(&take(r, 2)?) as u16 as i16)),
        0xd2 => Mv::Int(i64::from(be(&take(r, 4)?) as u32 as i32)),
        0xd3 => Mv::Int(be(&take(r, 8)?) as i64),
        0xca => Mv::Float(f64::from(f32::from_bits(be(&take(r, 4)?) as u32))),
        0xcb => Mv::Float(f64::from_bits(be(&take(r, 8)?))),
        0xa0..=0xbf => Mv::Str(take(r, usize::from(m & 0x1f))?),
        0xd9 | 0xda | 0xdb | 0xc4 | 0xc5 | 0xc6 => {
            let width = match m {
                0xd9 | 0xc4 => 1,
                0xda | 0xc5 => 2,
                _ => 4,
            };
            let n = len_of(take(r, width)?);
            let bytes = take(r, n)?;
            if m >= 0xd9 {
                Mv::Str(bytes)
            } else {
                Mv::Bin(bytes)
            }
        }
        0xd4..=0xd8 => {
            let n = 1usize << (m - 0xd4);
            let t = take(r, 1)?[0] as i8;
            Mv::Ext(t, take(r, n)?)
        }
        0xc7..=0xc9 => {
            let width = 1usize << (m - 0xc7);
            let n = len_of(take(r, width)?);
            let t = take(r, 1)?[0] as i8;
            Mv::Ext(t, take(r, n)?)
        }
        0x90..=0x9f | 0xdc | 0xdd => {
            let n = match m {
                0xdc => len_of(take(r, 2)?),
                0xdd => len_of(take(r, 4)?),
                _ => usize::from(m & 0x0f),
            };
            let mut items = Vec::with_capacity(n.min(r.remaining()));
            for _ in 0..n {
                items.push(decode(r, depth + 1)?);
            }
            Mv::Array(items)
        }
        0x80..=0x8f | 0xde | 0xdf => {
            let n = match m {
                0xde => len_of(take(r, 2)?),
                0xdf => len_of(take(r, 4)?),
                _ => usize::from(m & 0x0f),
            };
            let mut pairs = Vec::with_capacity(n.min(r.remaining()));
            for _ in 0..n {
                let k = decode(r, depth + 1)?;
                let v = decode(r, depth + 1)?;
                // The first pair of an ordered map is an ext header with a nil value: flags,
                // not an entry.
                if !matches!(k, Mv::Ext(..)) {
                    pairs.push((k, v));
                }
            }
            Mv::Map(pairs)
        }
        _ => return Err(rc::PARAMETER_ERROR),
    })
}

/// Decodes one complete msgpack value.
pub(crate) fn decode_all(bytes: &[u8]) -> Result<Mv, u8> {
    let mut r = Reader::new(bytes);
    let v = decode(&mut r, 0)?;
    if r.remaining() != 0 {
        return Err(rc::PARAMETER_ERROR);
    }
    Ok(v)
}

fn len_header(out: &mut Vec<u8>, n: usize, fix: u8, fix_max: usize, m16: u8, m32: u8) {
    if n <= fix_max {
        out.push(fix | n as u8);
    } else if n <= usize::from(u16::MAX) {
        out.push(m16);
        out.extend_from_slice(&(n as u16).to_be_bytes());
    } else {
        out.push(m32);
        out.extend_from_slice(&(n as u32).to_be_bytes());
    }
}

/// Encodes `v` as msgpack.
pub(crate) fn encode(v: &Mv, out: &mut Vec<u8>) {
    match v {
        Mv::Nil => out.push(0xc0),
        Mv::Bool(b) => out.push(if *b { 0xc3 } else { 0xc2 }),
        Mv::Int(i) if (0..=0x7f).contains(i) => out.push(*i as u8),
        Mv::Int(i) if (-32..0).contains(i) => out.push(*i as i8 as u8),
        Mv::Int(i) if *i >= 0 => {
            out.push(0xcf);
            out.extend_from_slice(&(*i as u64).to_be_bytes());
        }
        Mv::Int(i) => {
            out.push(0xd3);
            out.extend_from_slice(&i.to_be_bytes());
        }
        Mv::Float(f) => {
            out.push(0xcb);
            out.extend_from_slice(&f.to_bits().to_be_bytes());
        }
        Mv::Str(s) => {
            if s.len() < 32 {
                out.push(0xa0 | s.len() as u8);
            } else if s.len() < 256 {
                out.push(0xd9);
                out.push(s.len() as u8);
            } else {
                len_header(out, s.len(), 0, 0, 0xda, 0xdb);
            }
            out.extend_from_slice(s);
        }
        Mv::Bin(b) => {
            if b.len() < 256 {
                out.push(0xc4);
                out.push(b.len() as u8);
            } else {
                len_header(out, b.len(), 0, 0, 0xc5, 0xc6);
            }
            out.extend_from_slice(b);
        }
        Mv::Array(items) => {
            len_header(out, items.len(), 0x90, 15, 0xdc, 0xdd);
            for item in items {
                encode(item, out);
            }
        }
        Mv::Map(pairs) => {
            len_header(out, pairs.len(), 0x80, 15, 0xde, 0xdf);
            for (k, v) in pairs {
                encode(k, out);
                encode(v, out);
            }
        }
        Mv::Ext(t, data) => {
            out.push(0xc7);
            out.push(data.len().min(255) as u8);
            out.push(*t as u8);
            out.extend_from_slice(&data[..data.len().min(255)]);
        }
    }
}

/// A CDT result as a reply bin: scalars as their particles, lists and maps as msgpack.
pub(crate) fn to_particle(v: &Mv) -> Option<Particle> {
    let with = |ptype, data| Some(Particle { ptype, data });
    match v {
        Mv::Nil => None,
        Mv::Int(i) => Some(Particle::int(*i)),
        Mv::Bool(b) => with(PARTICLE_BOOL, vec![u8::from(*b)]),
        Mv::Float(f) => with(PARTICLE_FLOAT, f.to_bits().to_be_bytes().to_vec()),
        Mv::Str(s) => match s.split_first() {
            Some((&t, rest)) => with(t, rest.to_vec()),
            None => with(PARTICLE_STRING, Vec::new()),
        },
        Mv::Bin(b) => with(PARTICLE_BLOB, b.clone()),
        Mv::Array(_) | Mv::Map(_) | Mv::Ext(..) => {
            let mut data = Vec::new();
            encode(v, &mut data);
            let ptype = if matches!(v, Mv::Map(_)) {
                PARTICLE_MAP
            } else {
                PARTICLE_LIST
            };
            with(ptype, data)
        }
    }
}

/// What the CDT modules' tests build their records and operations from.
#[cfg(test)]
pub(super) mod test_support {
    use super::super::store::{Expiry, Record};
    use super::super::wire::{Op, PARTICLE_BLOB, PARTICLE_STRING};
    use super::{encode, Mv};

    /// A string value as the client sends it.
    pub(in super::super) fn s(text: &str) -> Mv {
        let mut bytes = vec![PARTICLE_STRING];
        bytes.extend_from_slice(text.as_bytes());
        Mv::Str(bytes)
    }

    /// An empty record that never expires.
    pub(in super::super) fn record() -> Record {
        Record {
            set: "s".into(),
            user_key: None,
            bins: vec![],
            generation: 1,
            expiry: Expiry::Never,
            last_update_ms: 1,
        }
    }

    /// A CDT operation of `op_type` on bin `bin` with `args`.
    pub(in super::super) fn cdt_op(bin: &str, op_type: u8, args: Vec<Mv>) -> Op {
        let mut value = Vec::new();
        encode(&Mv::Array(args), &mut value);
        Op {
            op_type,
            particle: PARTICLE_BLOB,
            name: bin.into(),
            value,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::s;
    use super::*;

    #[test]
    fn msgpack_round_trips() {
        let v = Mv::Map(vec![
            (s("a"), Mv::Int(-5)),
            (s("b"), Mv::Int(1 << 40)),
            (s(&"x".repeat(40)), Mv::Array(vec![Mv::Nil, Mv::Bool(true)])),
        ]);
        let mut out = Vec::new();
        encode(&v, &mut out);
        assert_eq!(decode_all(&out), Ok(v));
        assert!(decode_all(&out[..out.len() - 1]).is_err());
    }

    #[test]
    fn lengths_past_the_end_and_deep_nesting_are_refused() {
        // A list header claiming 2^32-1 items with none following.
        assert!(decode_all(&[0xdd, 0xff, 0xff, 0xff, 0xff]).is_err());
        // A string header claiming 65535 bytes with 2 following.
        assert!(decode_all(&[0xda, 0xff, 0xff, 0x03, 0x61]).is_err());
        let deep = vec![0x91; MAX_DEPTH + 2];
        assert!(decode_all(&deep).is_err());
        assert!(decode_all(&[0xc1]).is_err(), "never-used marker");
    }
}
