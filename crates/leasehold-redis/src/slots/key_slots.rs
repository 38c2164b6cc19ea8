//! The slot of a key and of a command: Redis Cluster's hashing (the CRC16 of a key's hash tag),
//! and which commands the direct route takes and where their keys are.
//!
//! A command whose keys all fall in one slot can go straight to that slot's master; anything
//! else (no keys, keys in several slots, a command not listed here) goes through the cluster
//! client.

use redis::{Arg, Cmd};

/// Slots in a Redis Cluster.
pub(crate) const SLOT_COUNT: usize = 16384;

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), the checksum Redis Cluster hashes keys
/// with, one byte at a time through this table.
const CRC16_TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
};

fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        (crc << 8) ^ CRC16_TABLE[usize::from((crc >> 8) as u8 ^ b)]
    })
}

/// The slot of a Redis key: the CRC16 of its hash tag (what lies between the first `{` and the
/// first `}` after it, if not empty), else of the whole key, modulo 16384.
///
/// (`redis::cluster_routing::Slot::for_key` computes the same, but does not give the number,
/// which the slot map is indexed by; the tests check both agree.)
pub(crate) fn key_slot(key: &[u8]) -> u16 {
    let hashed = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        })
        .unwrap_or(key);
    crc16(hashed) % SLOT_COUNT as u16
}

/// Where a command's keys are, for the commands the direct route takes.
#[derive(Clone, Copy)]
enum Keys {
    /// `EVAL`-like: the script or function, the key count, then the keys.
    Counted,
    /// One key, right after the command name.
    First,
    /// Every argument is a key.
    All,
}

/// The commands the direct route takes, where their keys are, and whether they only read (a read
/// whose connection failed may be sent again). Everything else goes through the cluster client.
fn routed(name: &[u8]) -> Option<(Keys, bool)> {
    const TABLE: &[(&str, Keys, bool)] = &[
        ("EVALSHA", Keys::Counted, false),
        ("EVAL", Keys::Counted, false),
        ("FCALL", Keys::Counted, false),
        ("EVALSHA_RO", Keys::Counted, true),
        ("EVAL_RO", Keys::Counted, true),
        ("FCALL_RO", Keys::Counted, true),
        ("GET", Keys::First, true),
        ("LRANGE", Keys::First, true),
        ("LINDEX", Keys::First, true),
        ("LLEN", Keys::First, true),
        ("LPOS", Keys::First, true),
        ("PTTL", Keys::First, true),
        ("TTL", Keys::First, true),
        ("HGET", Keys::First, true),
        ("HGETALL", Keys::First, true),
        ("HLEN", Keys::First, true),
        ("TYPE", Keys::First, true),
        ("STRLEN", Keys::First, true),
        ("SET", Keys::First, false),
        ("GETDEL", Keys::First, false),
        ("INCR", Keys::First, false),
        ("INCRBY", Keys::First, false),
        ("PEXPIRE", Keys::First, false),
        ("EXPIRE", Keys::First, false),
        ("PERSIST", Keys::First, false),
        ("LPUSH", Keys::First, false),
        ("RPUSH", Keys::First, false),
        ("LPOP", Keys::First, false),
        ("RPOP", Keys::First, false),
        ("HSET", Keys::First, false),
        ("HDEL", Keys::First, false),
        ("SPUBLISH", Keys::First, false),
        ("EXISTS", Keys::All, true),
        ("DEL", Keys::All, false),
        ("UNLINK", Keys::All, false),
    ];
    TABLE
        .iter()
        .find(|(known, _, _)| name.eq_ignore_ascii_case(known.as_bytes()))
        .map(|(_, keys, read)| (*keys, *read))
}

/// The one slot every key of `cmd` is in, and whether `cmd` only reads; `None` for a command the
/// direct route does not take (unknown, keyless, or keys in several slots).
pub(crate) fn single_slot(cmd: &Cmd) -> Option<(u16, bool)> {
    let mut args = cmd.args_iter().map(|arg| match arg {
        Arg::Simple(bytes) => Some(bytes),
        // A cursor argument (SCAN-like commands) is nothing the direct route takes.
        _ => None,
    });
    let (keys, read) = routed(args.next()??)?;
    let mut slot = None;
    let mut same = |key: &[u8]| {
        let this = key_slot(key);
        match slot {
            None => {
                slot = Some(this);
                true
            }
            Some(seen) => seen == this,
        }
    };
    match keys {
        Keys::Counted => {
            args.next()??;
            let count: usize = std::str::from_utf8(args.next()??).ok()?.parse().ok()?;
            for _ in 0..count {
                if !same(args.next()??) {
                    return None;
                }
            }
        }
        Keys::First => {
            if !same(args.next()??) {
                return None;
            }
        }
        Keys::All => {
            for key in args {
                if !same(key?) {
                    return None;
                }
            }
        }
    }
    slot.map(|slot| (slot, read))
}

/// Whether `cmd` is `SCRIPT LOAD`.
pub(super) fn is_script_load(cmd: &Cmd) -> bool {
    let mut args = cmd.args_iter().map(|arg| match arg {
        Arg::Simple(bytes) => bytes,
        _ => &[],
    });
    args.next()
        .is_some_and(|name| name.eq_ignore_ascii_case(b"SCRIPT"))
        && args
            .next()
            .is_some_and(|sub| sub.eq_ignore_ascii_case(b"LOAD"))
}

#[cfg(test)]
mod tests {
    use redis::cluster_routing::Slot;

    use super::*;

    #[test]
    fn the_slot_of_a_key_is_redis_clusters() {
        // The check value of CRC16/XMODEM, and slots Redis documents.
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        // An empty tag hashes the whole key; so does an unclosed one.
        assert_eq!(key_slot(b"foo{}{bar}"), crc16(b"foo{}{bar}") % 16384);
        assert_eq!(key_slot(b"foo{bar"), crc16(b"foo{bar") % 16384);
        for i in 0..20_000 {
            let key = format!("leasehold:fence:{{DC#f1#app#k{i}}}");
            assert_eq!(
                Slot::new(key_slot(key.as_bytes())),
                Some(Slot::for_key(&key)),
                "{key}"
            );
        }
    }

    #[test]
    fn a_lock_script_has_the_slot_of_its_hash_tag() {
        let mut script = redis::cmd("EVALSHA");
        script
            .arg("0123abcd")
            .arg(3)
            .arg("p:{DC#f#a#k}")
            .arg("p:fence:{DC#f#a#k}")
            .arg("p:queue:{DC#f#a#k}")
            .arg("token")
            .arg(30_000);
        assert_eq!(single_slot(&script), Some((key_slot(b"DC#f#a#k"), false)));
        let read = redis::cmd("LRANGE")
            .arg("p:trace:{DC#f#a#k}")
            .arg(0)
            .arg(-1)
            .clone();
        assert_eq!(single_slot(&read), Some((key_slot(b"DC#f#a#k"), true)));
        let del = redis::cmd("del").arg("{a}1").arg("{a}2").clone();
        assert_eq!(single_slot(&del), Some((key_slot(b"a"), false)));
    }

    #[test]
    fn commands_without_one_slot_take_the_cluster_client() {
        let spread = redis::cmd("DEL").arg("a").arg("b").clone();
        assert_ne!(key_slot(b"a"), key_slot(b"b"));
        assert_eq!(single_slot(&spread), None);
        let keyless = redis::cmd("EVALSHA").arg("0123").arg(0).clone();
        assert_eq!(single_slot(&keyless), None);
        assert!(is_script_load(
            &redis::cmd("script").arg("load").arg("return 1").clone()
        ));
        assert!(!is_script_load(&redis::cmd("SCRIPT").arg("FLUSH").clone()));
        for cmd in [
            redis::cmd("SCAN").arg(0).clone(),
            redis::cmd("WAIT").arg(1).arg(100).clone(),
            redis::cmd("SCRIPT").arg("LOAD").arg("return 1").clone(),
            redis::cmd("SSUBSCRIBE").arg("{a}").clone(),
            redis::cmd("CLUSTER").arg("SLOTS").clone(),
        ] {
            assert_eq!(single_slot(&cmd), None, "{:?}", cmd.args_iter().next());
        }
        // A key count beyond the arguments is not a command to route.
        let short = redis::cmd("EVALSHA").arg("0123").arg(2).arg("{a}1").clone();
        assert_eq!(single_slot(&short), None);
    }
}
